"""A recipe can name a reward of its own by import path (``package.module:function``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from rewards.registry import correctness_reward, get_reward_funcs


def test_registered_names_and_import_paths_resolve():
    funcs = get_reward_funcs(["correctness", "rewards.registry:format_reward"])
    assert funcs[0] is correctness_reward
    assert funcs[1](["no tags"], template=["open-r1"]) == [0.0]


@pytest.mark.parametrize(
    "name, message",
    [("correctnes", "unknown reward_funcs"), ("no_such_module:f", "no_such_module"),
     ("rewards.registry:nope", "nope"), ("rewards.registry:REGISTRY", "not a function"),
     ("os.path:basename", r"'os.path:basename' is not a reward function: it takes \(p\)")],
)  # fmt: skip
def test_bad_reward_names_are_named(name, message):
    with pytest.raises(ValueError, match=message):
        get_reward_funcs([name])


@pytest.mark.parametrize(
    "path, advice",
    [
        ("trl.rewards.get_soft_overlong_punishment", "name get_soft_overlong_punishment, which is made for"),
        ("trl.rewards:get_soft_overlong_punishment", "name get_soft_overlong_punishment, which is made for"),
        ("trl.rewards.get_repetition_penalty_reward", "my_reward = get_repetition_penalty_reward(...)"),
        (
            "trl.rewards.accuracy_rewards:get_cosine_scaled_reward",
            "my_reward = get_cosine_scaled_reward(...)",
        ),
    ],
)
def test_a_reward_factory_named_by_import_path_is_refused_with_what_to_name(path, advice):
    # A factory takes none of TRL's reward arguments: called as the reward, every round would raise.
    with pytest.raises(ValueError) as refused:
        get_reward_funcs([path])
    message = str(refused.value)
    assert message.startswith(f"reward_funcs: {path!r} is not a reward function: it takes (")
    assert advice in message and "\n" not in message


def test_the_overlong_penalty_by_name_is_the_reward_its_factory_makes():
    (penalty,) = get_reward_funcs(["get_soft_overlong_punishment"], max_completion_length=64)
    # 64 tokens, the last 16 ramped: 10 tokens are free, 56 cost (48 - 56) / 16.
    assert penalty(completions=["a", "b"], completion_ids=[[1] * 10, [1] * 56]) == [0.0, -0.5]


def test_a_partial_of_a_trl_reward_reads_this_packages_rows(tmp_path, monkeypatch):
    # TRL's rewards take `solution` and conversational completions; a partial of one (to set its options)
    # is TRL's reward as much as the bare function is.
    name = "my_partial_trl_rewards"
    (tmp_path / f"{name}.py").write_text(
        "import functools\n"
        "from trl.rewards import reasoning_accuracy_reward\n"
        "after_think = functools.partial(reasoning_accuracy_reward, reasoning_delimiters=['</think>'])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (reward,) = get_reward_funcs([f"{name}:after_think"])
    assert reward.__name__ == "reasoning_accuracy_reward"  # the name TRL logs it under
    completions = ["<think>\\boxed{5}</think> so \\boxed{4}", "<think>\\boxed{4}</think> so \\boxed{5}"]
    assert reward(completions=completions, answer=["4", "4"]) == [1.0, 0.0]


def test_a_module_of_the_launch_folder_named_as_an_installed_package_is_refused(tmp_path, monkeypatch):
    # open-r1's rewards.py beside the recipe defines format_reward, as the installed `rewards` package does:
    # `rewards.format_reward` would be the installed one, scoring the user's completions by other rules.
    (tmp_path / "rewards.py").write_text("def format_reward(completions, **kwargs):\n    return [0.5]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for path in ("rewards.format_reward", "rewards:format_reward"):
        with pytest.raises(ValueError) as refused:
            get_reward_funcs([path])
        installed, mine = sys.modules["rewards"].__file__, tmp_path.resolve() / "rewards.py"
        assert str(refused.value) == (
            f"reward_funcs: cannot load {path!r}: 'rewards' is the installed {installed}, not your {mine}; "
            "rename yours (for example to my_rewards) and name it so in reward_funcs"
        )
    # A folder of that name is the installed package meant: a folder of data, or a copy of the package (a
    # second clone of this repository launched from, with its own `rewards/`).
    (tmp_path / "rewards.py").unlink()
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "notes.txt").write_text("a folder of data, not a package")
    assert [f.__name__ for f in get_reward_funcs(["trl.rewards.think_format_reward"])] == [
        "think_format_reward"
    ]
    shutil.copytree(Path(installed).parent, tmp_path / "rewards")
    names = ["rewards.controls:shuffled_correctness_reward", "rewards.registry.format_reward"]
    assert [f.__name__ for f in get_reward_funcs(names)] == ["shuffled_correctness_reward", "format_reward"]


def test_the_overlong_penalty_is_daposs_at_its_edges():
    # DAPO (eq. 13): 0 up to L_max - L_cache, then linear down to -1 at L_max, and -1 beyond.
    (penalty,) = get_reward_funcs(
        ["get_soft_overlong_punishment"], max_completion_length=64, soft_punish_cache=16
    )
    lengths = [0, 48, 49, 56, 63, 64, 65]
    scores = penalty(completions=["x"] * len(lengths), completion_ids=[[1] * n for n in lengths])
    assert scores == pytest.approx([0.0, 0.0, -1 / 16, -0.5, -15 / 16, -1.0, -1.0])


def test_trls_rewards_that_read_no_gold_score_rows_without_one():
    # The overlong penalty and the think format read no `solution`: a row with no gold still has a length and
    # a format (only a reward that grades against the gold has nothing to score there).
    overlong, think, accuracy = get_reward_funcs(
        ["get_soft_overlong_punishment", "think_format_reward", "accuracy_reward"], max_completion_length=64
    )
    golds = [None, ["4", "5"], "4", []]
    completions = ["<think>a</think> \\boxed{4}"] * 4
    assert overlong(completions=completions, completion_ids=[[1] * 56] * 4, answer=golds) == [-0.5] * 4
    assert think(completions=completions, answer=golds) == [1.0] * 4
    assert accuracy(completions=completions, answer=golds) == [None, 1.0, 1.0, None]


def test_a_trl_reward_over_several_golds_logs_one_table_value_per_completion():
    # TRL's accuracy_reward logs its `solution`, `gold_parsed` and `answer_parsed` columns on every call;
    # called once per gold, it would log each column several times over, and the completions table's columns
    # would no longer be one value per completion. Each row's values are those of the gold that scored it.
    (accuracy,) = get_reward_funcs(["accuracy_reward"])
    logged: dict[str, list] = {}
    scores = accuracy(
        completions=["\\boxed{4}", "\\boxed{5}", "\\boxed{6}"],
        answer=[["3", "4"], "5", ["7", "8"]],
        log_extra=lambda column, values: logged.setdefault(column, []).extend(values),
    )
    assert scores == [1.0, 1.0, 0.0]
    assert {column: len(values) for column, values in logged.items()} == {
        "solution": 3, "gold_parsed": 3, "answer_parsed": 3,
    }  # fmt: skip
    assert logged["solution"] == ["$4$", "$5$", "$7$"]  # the gold that scored it; the first where none did


def test_a_gold_with_an_escaped_dollar_sign_is_graded_by_trls_rewards():
    # MATH writes money as \$18.90: an escaped dollar sign, not a math delimiter; read as one, the gold
    # parsed to nothing and the row was not scored.
    from rewards.registry import trl_solution

    (accuracy,) = get_reward_funcs(["accuracy_reward"])
    assert trl_solution("\\$18.90") == "$\\$18.90$"
    assert accuracy(completions=["So \\boxed{18.90}.", "So \\boxed{18}."], answer=["\\$18.90"] * 2) == [
        1.0,
        0.0,
    ]


def test_a_trl_reward_over_several_golds_logs_its_metrics_once_per_round():
    from rewards.registry import TRLConvention

    def graded(completions, solution, log_metric=None, **kwargs):  # a TRL reward that logs a metric per call
        log_metric("graded", float(len(solution)))
        return [float(c[0]["content"] in s) for c, s in zip(completions, solution, strict=True)]

    metrics: list = []
    scores = TRLConvention(graded)(
        ["4", "5"], answer=[["3", "4"], "5"], log_metric=lambda name, value: metrics.append((name, value))
    )
    assert scores == [1.0, 1.0] and metrics == [("graded", 2.0)]
