"""A reward function that fails is named in one line: the function, the row (uid and template) that raises
it alone, and what it returned or needs; a wrapped reward keeps its name, and an async one stays async.
"""

from __future__ import annotations

import functools
import math
import re

import datasets
import fault_harness
import pytest
import torch

from prompt_aug import reward_checks


def _reward_kwargs(n: int = 4) -> dict:
    """What TRL passes a reward function, for a round of ``n`` completions."""
    return {
        "prompts": [f"p{i}" for i in range(n)], "completions": [f"c{i}" for i in range(n)],
        "completion_ids": [[i] for i in range(n)], "uid": [f"synthetic-42-0000{i}" for i in range(n)],
        "template": ["abel", "abel", "open-r1", "open-r1"][:n], "trainer_state": None,
        "log_extra": lambda *a: None, "log_metric": lambda *a: None,
    }  # fmt: skip


def test_a_checked_reward_names_the_function_and_the_row_it_fails_on():
    checked = reward_checks.checked_reward(fault_harness.raises_on_one_row, "raises_on_one_row")
    with pytest.raises(reward_checks.RewardFunctionError) as err:
        checked(**_reward_kwargs())
    message = str(err.value)
    assert re.fullmatch(
        r"reward function 'raises_on_one_row' raised ZeroDivisionError: float division by zero at "
        r"fault_harness\.py:\d+ on the completion of row uid 'synthetic-42-00003', template 'open-r1'",
        message,
    ), message
    assert isinstance(err.value.__cause__, ZeroDivisionError)

    def batch_only(completions, **kwargs):  # fails only on a whole round: no row to blame
        if len(completions) > 1:
            raise KeyError("group")
        return [0.0]

    with pytest.raises(reward_checks.RewardFunctionError, match="no single row raises it alone"):
        reward_checks.checked_reward(batch_only, "batch_only")(**_reward_kwargs())


def test_a_reward_needing_an_argument_no_column_gives_is_named_with_the_columns_there_are():
    def need_difficulty(completions, difficulty, scale=1.0, **kwargs):
        return [scale * d for d in difficulty]

    with pytest.raises(reward_checks.RewardFunctionError) as err:
        reward_checks.checked_reward(need_difficulty, "need_difficulty")(**_reward_kwargs())
    assert str(err.value) == (
        "reward function 'need_difficulty' needs `difficulty`, which no column of the training data gives; "
        "reward functions receive the columns ['template', 'uid'] and TRL's prompts, completions, "
        "completion_ids, trainer_state, log_extra, log_metric: add the column to the data (or to a mixture "
        "source's `columns`) or give the argument a default"
    )

    # The same for an async reward function.
    async def need_difficulty_async(completions, difficulty, **kwargs):
        return [float(d) for d in difficulty]

    import asyncio

    checked = reward_checks.checked_reward(need_difficulty_async, "need_difficulty_async")
    with pytest.raises(
        reward_checks.RewardFunctionError, match=r"'need_difficulty_async' needs `difficulty`, which"
    ):
        asyncio.run(checked(**_reward_kwargs()))

    # Before the model loads, a wrapper is read for what it takes, not for what it wraps.
    def exact(completions, solution, **kwargs):
        return [float(c == s) for c, s in zip(completions, solution, strict=True)]

    @functools.wraps(exact)
    def adapted(completions, answer, **kwargs):
        return exact(completions, solution=answer)

    reward_checks.check_reward_arguments([adapted], ["exact"], ["question", "answer", "uid"])
    # So is the same wrapper mapped to other scores.
    from rewards.mapped import mapped_correctness

    exact_pm1 = mapped_correctness(adapted, 1.0, -1.0, name="exact_pm1")
    reward_checks.check_reward_arguments([exact_pm1], ["exact_pm1"], ["question", "answer", "uid"])
    with pytest.raises(reward_checks.RewardFunctionError, match=r"'exact' needs `solution`"):
        reward_checks.check_reward_arguments([exact], ["exact"], ["question", "answer", "uid"])

    # A correctness reward mapped to other scores (correctness_pm5) needs what the correctness reward needs.
    from rewards.registry import REGISTRY

    with pytest.raises(reward_checks.RewardFunctionError, match=r"'correctness_pm5' needs `answer`"):
        reward_checks.check_reward_arguments([REGISTRY["correctness_pm5"]], ["correctness_pm5"], ["question"])

    # Without **kwargs, a function refuses what TRL passes besides what it names: said before the model loads.
    def brevity(completions, difficulty):
        return [-len(c) / d for c, d in zip(completions, difficulty, strict=True)]

    with pytest.raises(reward_checks.RewardFunctionError) as err:
        reward_checks.check_reward_arguments(
            [brevity], ["brevity"], ["question", "answer", "uid", "difficulty"]
        )
    assert str(err.value).startswith("reward function 'brevity' takes no **kwargs")
    assert "`answer`, `completion_ids`, `log_extra`" in str(err.value)
    assert str(err.value).endswith("add **kwargs to its signature")

    # A TypeError of the function's own is reported as a fault of the function, with its row.
    def typo(completions, **kwargs):
        return [len(c) + "1" for c in completions]

    with pytest.raises(
        reward_checks.RewardFunctionError, match=r"raised TypeError: .* on the completion of row"
    ):
        reward_checks.checked_reward(typo, "typo")(**_reward_kwargs())


@pytest.mark.parametrize(
    "func, expected",
    [
        (
            fault_harness.nan_reward,
            "returned nan for row uid 'synthetic-42-00002', template 'open-r1'; return a finite",
        ),
        (fault_harness.short_reward, "returned 3 rewards for 4 completions (row uid 'synthetic-42-00000'"),
        (
            lambda completions, **kw: ["1"] * len(completions),
            "returned '1' (str) for row uid 'synthetic-42-00000'",
        ),
        (lambda completions, **kw: 1.0, "returned a float, not a list of one reward per completion"),
        (lambda completions, **kw: torch.tensor(1.0), "returned a Tensor, not a list of one reward per"),
    ],
)
def test_a_checked_reward_names_a_nan_a_wrong_length_and_a_non_number(func, expected):
    with pytest.raises(reward_checks.RewardFunctionError, match=re.escape(expected)):
        reward_checks.checked_reward(func, "f")(**_reward_kwargs())


def test_a_checked_reward_hands_back_numbers_and_none_as_returned():
    ok = reward_checks.checked_reward(lambda completions, **kw: [None, 1, 0.5, True], "ok")
    assert ok(**_reward_kwargs()) == [None, 1, 0.5, True]  # None is TRL's "missing", not a fault


def test_a_checked_async_reward_stays_async_and_is_checked():
    import asyncio

    from trl.trainer.utils import is_async_callable

    async def async_nan(completions, **kwargs):
        return [math.nan] * len(completions)

    checked = reward_checks.checked_reward(async_nan, "async_nan")
    assert is_async_callable(checked)
    with pytest.raises(
        reward_checks.RewardFunctionError, match="'async_nan' returned nan for row uid 'synthetic-42-00000'"
    ):
        asyncio.run(checked(**_reward_kwargs()))

    async def async_raises_on_row_3(completions, uid, **kwargs):
        await asyncio.sleep(0)  # really suspends: the row-by-row search is awaited, not run at once
        if "synthetic-42-00003" in uid:
            raise ValueError("cannot grade")
        return [0.0] * len(completions)

    with pytest.raises(
        reward_checks.RewardFunctionError,
        match=r"'async_raises' raised ValueError: cannot grade at test_reward_checks\.py:\d+ on the "
        r"completion of row uid 'synthetic-42-00003'",
    ):
        asyncio.run(reward_checks.checked_reward(async_raises_on_row_3, "async_raises")(**_reward_kwargs()))


def test_an_async_correctness_reward_mapped_to_other_scores_stays_async():
    import asyncio

    from trl.trainer.utils import is_async_callable

    from rewards.mapped import mapped_correctness

    async def judge(completions, answer, **kwargs):  # a remote judge, say
        await asyncio.sleep(0)
        return [None if a == "?" else float(c == a) for c, a in zip(completions, answer, strict=True)]

    judge_pm5 = mapped_correctness(judge, 5.0, -5.0, name="judge_pm5")
    assert is_async_callable(judge_pm5)  # TRL awaits it with the round's other async rewards
    checked = reward_checks.checked_reward(judge_pm5, "judge_pm5")
    assert is_async_callable(checked)
    kwargs = {**_reward_kwargs(3), "completions": ["4", "5", "6"], "answer": ["4", "4", "?"]}
    assert asyncio.run(checked(**kwargs)) == [5.0, -5.0, None]


def test_the_trainer_keeps_the_reward_functions_and_names_it_was_given(tiny_model_dir, tmp_path):
    from trl import GRPOConfig
    from trl.trainer.utils import get_callable_name

    from prompt_aug.trainer import PromptAugGRPOTrainer

    class Scorer:
        def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)

    given = [fault_harness.nan_reward, functools.partial(fault_harness.short_reward), Scorer()]
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=4)  # fmt: skip
    dataset = datasets.Dataset.from_dict({"question": ["What is 1 + 1?"], "answer": ["2"]})
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=given, args=args, train_dataset=dataset
    )
    assert all(a is b for a, b in zip(trainer.reward_funcs, given, strict=True))
    assert (
        trainer.reward_func_names
        == [get_callable_name(f) for f in given]
        == ["nan_reward", "short_reward", "Scorer"]
    )


def test_the_shuffled_correctness_control_needs_the_answer_column_as_correctness_does():
    from rewards.controls import shuffled_correctness_reward
    from rewards.registry import correctness_reward

    for func in (correctness_reward, shuffled_correctness_reward):
        with pytest.raises(reward_checks.RewardFunctionError, match=r"needs `answer`, which no column"):
            reward_checks.check_reward_arguments([func], [func.__name__], ["question", "uid"])


def test_a_mapped_correctness_reward_keeps_a_nan_for_the_checks_to_name_and_pickles():
    import pickle

    from rewards.mapped import mapped_correctness
    from rewards.registry import REGISTRY

    def broken(completions, **kwargs):  # a NaN is a fault of the reward, not a wrong answer
        return [1.0, math.nan, 0.0, None][: len(completions)]

    mapped = mapped_correctness(broken, 5.0, -5.0, name="broken_pm5")
    assert mapped(["a", "b", "c", "d"])[::2] == [5.0, -5.0] and math.isnan(mapped(["a", "b"])[1])
    with pytest.raises(reward_checks.RewardFunctionError, match="'broken_pm5' returned nan for row uid"):
        reward_checks.checked_reward(mapped, "broken_pm5")(**_reward_kwargs())
    # Picklable (TRL's async GRPO scores in a spawned process), and a partial is named by its function.
    pm5 = pickle.loads(pickle.dumps(REGISTRY["correctness_pm5"]))
    assert pm5.__name__ == "correctness_pm5_reward"
    assert pm5(["\\boxed{4}", "\\boxed{5}"], answer=["4"] * 2) == [5.0, -5.0]
    partial_pm1 = mapped_correctness(functools.partial(REGISTRY["correctness"]), 1.0, -1.0)
    assert partial_pm1.__name__ == "correctness_reward_mapped"
    assert partial_pm1(["\\boxed{4}"], answer=["5"]) == [-1.0]
