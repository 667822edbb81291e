"""`PromptAugGRPOTrainer` as a drop-in for TRL's `GRPOTrainer`, and the one contract between the
collator and the rewards.

The training scenarios build the trainer the way TRL's own tests build `GRPOTrainer`: a model path
(here a tiny model built in code instead of a Hub id), reward functions, a `GRPOConfig`, a
prompt-only dataset, and nothing of ours. Each trains for a few steps on CPU (a few seconds each).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from prompt_aug.collator import PromptAugmentationCollator, augmentation_refusal, row_question, row_uid
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.templates import TemplateError, load_templates
from prompt_aug.trainer import PromptAugGRPOTrainer
from prompt_aug.trl_seam import completion_logs
from rewards import (
    BUILTIN_FORMATS,
    FormatRules,
    correctness_reward,
    format_reward,
    grade,
    strict_correctness_reward,
)

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is 2 + 3?",
    "Compute 7 - 4.",
    "What is 6 times 7?",
    "Evaluate 2^5.",
    "What is 10 / 4?",
    "Solve x + 1 = 3.",
]
FORMAT_COLUMNS = {"template", "answer_rule", "format_markers"}


def standard_prompt_only() -> Dataset:
    return Dataset.from_dict({"prompt": QUESTIONS})


def conversational_prompt_only() -> Dataset:
    prompts = [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}] for q in QUESTIONS
    ]
    return Dataset.from_dict({"prompt": prompts})


def distinct_characters(completions, **kwargs):
    """A reward with spread on a random model: how many distinct characters a text completion uses."""
    return [float(len(set(c))) for c in completions]


def distinct_characters_chat(completions, **kwargs):
    """The same reward written for TRL's conversational format."""
    return [float(len(set(c[0]["content"]))) for c in completions]


def length_reward(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def config(tmp_path, **overrides) -> GRPOConfig:
    return GRPOConfig(**{**config_values(tmp_path), **overrides})


def config_values(tmp_path) -> dict:
    return {
        "output_dir": str(tmp_path), "learning_rate": 0.1, "per_device_train_batch_size": 3,
        "num_generations": 3, "max_completion_length": 8, "report_to": "none", "max_steps": 2,
        "save_strategy": "no", "logging_steps": 1,
        "use_cpu": True, "bf16": False,  # TRL's tests run where bf16 is available; here on CPU
    }  # fmt: skip


def train_and_assert_weights_moved(trainer) -> None:
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved, "no parameter changed"


# -- 1. constructed with TRL's arguments alone ------------------------------------------------------


def test_trl_arguments_alone_train_with_the_builtin_bank_and_args_seed(tiny_model_dir, tmp_path):
    args = config(tmp_path, seed=11)
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=distinct_characters,
        args=args,
        train_dataset=standard_prompt_only(),
    )
    collator = trainer.prompt_collator
    assert [t.name for t in collator.templates] == list(load_templates())
    assert collator.seed == 11 and collator.tokenizer is trainer.processing_class
    train_and_assert_weights_moved(trainer)
    assert any(k.startswith("templates/") for entry in trainer.state.log_history for k in entry)


def test_trls_arguments_given_by_position_build_the_trainer(tiny_model_dir, tmp_path):
    args = config(tmp_path)
    data = standard_prompt_only()
    trainer = PromptAugGRPOTrainer(str(tiny_model_dir), distinct_characters, args, data, data)
    assert (trainer.args, trainer.train_dataset, trainer.eval_dataset) == (args, data, data)


def test_a_prompt_aug_config_sets_the_trainer_and_is_a_grpo_config(tiny_model_dir, tmp_path):
    from prompt_aug import PromptAugGRPOConfig
    from prompt_aug import PromptAugGRPOTrainer as Exported

    values = config_values(tmp_path)
    args = PromptAugGRPOConfig(
        **{**values, "seed": 5}, templates=["abel", "formal"], template_weights=[3.0, 1.0],
        eval_template="formal", skip_minibatch_ratio_above=2.0, wandb_completions_rows=4,
        dynamic_sampling=True, dynamic_sampling_max_passes=2,
    )  # fmt: skip
    assert isinstance(args, GRPOConfig) and Exported is PromptAugGRPOTrainer
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=distinct_characters,
        args=args,
        train_dataset=standard_prompt_only(),
    )
    collator = trainer.prompt_collator
    assert [t.name for t in collator.templates] == ["abel", "formal"] and collator._cumulative == [0.75, 1.0]
    assert collator.eval_template.name == "formal" and collator.seed == 5
    assert trainer.features.minibatch_skip.threshold == 2.0 and trainer.wandb_completions_rows == 4
    assert trainer.features.dynamic_sampling is not None and trainer.features.dynamic_sampling.max_passes == 2
    off = PromptAugGRPOConfig(**values, prompt_augmentation=False)
    plain = PromptAugGRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=distinct_characters,
        args=off,
        train_dataset=standard_prompt_only(),
    )
    assert plain.prompt_collator is None and plain.features.dynamic_sampling is None


def test_a_processing_class_without_chat_template_says_how_to_turn_augmentation_off(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain.chat_template = None
    with pytest.raises(TemplateError, match="prompt_augmentation=False"):
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=distinct_characters, args=config(tmp_path),
            train_dataset=standard_prompt_only(), processing_class=plain,
        )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"args_overrides": {"reward_weights": [1.0, 2.0]}}, "Number of reward weights"),
        ({"train_dataset": None}, "`train_dataset` is required"),
    ],
)
def test_trl_value_errors_surface_as_trl_errors(tiny_model_dir, tmp_path, kwargs, message):
    args = config(tmp_path, **kwargs.get("args_overrides", {}))
    dataset = kwargs.get("train_dataset", standard_prompt_only())
    for cls in (GRPOTrainer, PromptAugGRPOTrainer):
        with pytest.raises(ValueError, match=message):
            cls(model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args, train_dataset=dataset)


def test_a_trainer_built_without_init_generates_as_trl(monkeypatch):
    # TRL's own tests build a GRPOTrainer with object.__new__, set what TRL's generation step reads, and call
    # that step alone; ours must then take TRL's path, not fail on an attribute its __init__ sets.
    trainer = object.__new__(PromptAugGRPOTrainer)
    monkeypatch.setattr(trainer, "trl_generate_round", lambda prompts: ("trl", prompts))
    assert trainer.generate_round(["p"]) == ("trl", ["p"])


# -- 2. TRL-standard datasets; conversational data stays conversational for the user's code ---------


def test_standard_prompt_gives_the_question_and_a_stable_uid(tokenizer):
    collator = PromptAugmentationCollator(list(load_templates().values()), tokenizer, seed=0)
    rows = collator([{"prompt": q} for q in QUESTIONS], epoch=0)
    assert [r["question"] for r in rows] == QUESTIONS
    assert all(q in r["prompt"] for q, r in zip(QUESTIONS, rows))
    # The derived uid depends on the question only: the same in a fresh interpreter with another hash salt.
    code = f"from prompt_aug.collator import row_uid; print(row_uid({{}}, {QUESTIONS[0]!r}))"
    there = subprocess.check_output(
        [sys.executable, "-c", code], cwd=REPO, text=True, env={**os.environ, "PYTHONHASHSEED": "99"}
    )
    assert rows[0]["uid"] == there.strip() == row_uid({}, QUESTIONS[0])
    assert len({r["uid"] for r in rows}) == len(QUESTIONS)


def test_conversational_dataset_stays_conversational_for_reward_functions(tiny_model_dir, tmp_path):
    seen = {}

    def chat_reward(prompts, completions, **kwargs):
        seen.setdefault("prompts", prompts)
        seen.setdefault("completions", completions)
        seen.setdefault("kwargs", kwargs)
        return distinct_characters_chat(completions)

    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=chat_reward, args=config(tmp_path, log_completions=True),
        train_dataset=conversational_prompt_only(),
    )  # fmt: skip
    train_and_assert_weights_moved(trainer)
    bank = load_templates()
    for prompt, completion, name, question in zip(
        seen["prompts"], seen["completions"], seen["kwargs"]["template"], seen["kwargs"]["question"]
    ):
        # The messages the question was asked in: the template's turns around the dataset's last user turn
        # (the template replaces the dataset's system turn).
        assert question in QUESTIONS
        assert prompt == bank[name].messages(question)
        assert isinstance(completion, list) and completion[0]["role"] == "assistant"
        assert isinstance(completion[0]["content"], str)
    assert FORMAT_COLUMNS <= set(seen["kwargs"])
    # Generation itself ran from the rendered text, prefill included.
    logged = list(completion_logs(trainer)["prompt"])
    assert logged and all(isinstance(p, str) and p.endswith(bank[n].prefill) for p, n in
                          zip(logged, completion_logs(trainer)["extra"]["template"]))  # fmt: skip


def test_columns_named_like_conversations_are_data_and_completions_stay_text(tiny_model_dir, tmp_path):
    # TRL reads `messages`, `chosen` and `rejected` as conversations; beside a question (as the recipes' rows
    # give it) they are a user's extra columns, passed through, and the completions stay text.
    seen = {}

    def reward(completions, messages, chosen, **kwargs):
        seen.setdefault("completions", completions)
        seen.setdefault("messages", messages)
        seen.setdefault("chosen", chosen)
        return distinct_characters(completions)

    rows = Dataset.from_dict({
        "question": QUESTIONS,
        "messages": [[{"role": "user", "content": q}] for q in QUESTIONS],
        "chosen": [[] for _ in QUESTIONS],
    })  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=reward, args=config(tmp_path), train_dataset=rows
    )
    trainer.train()
    assert seen["completions"] and all(isinstance(c, str) for c in seen["completions"])
    asked = [q for q in QUESTIONS if [{"role": "user", "content": q}] in seen["messages"]]
    assert asked and seen["chosen"][0] == []


# -- 3. augmentation off ---------------------------------------------------------------------------


@pytest.mark.parametrize("make_dataset", [standard_prompt_only, conversational_prompt_only])
def test_augmentation_off_hands_reward_functions_what_grpotrainer_does(
    tiny_model_dir, tmp_path, make_dataset
):
    received = {}

    def recorder(key):
        def reward(prompts, completions, **kwargs):
            received.setdefault(key, (prompts, sorted(kwargs)))
            return [0.0] * len(completions)

        return reward

    for key, cls, config_class, extra in (
        ("trl", GRPOTrainer, GRPOConfig, {}),
        (
            "ours",
            PromptAugGRPOTrainer,
            PromptAugGRPOConfig,
            {"prompt_augmentation": False, "stop_tokens": []},
        ),
    ):
        values = {**config_values(tmp_path / key), "max_steps": 1, "seed": 3, **extra}
        trainer = cls(
            model=str(tiny_model_dir), reward_funcs=recorder(key), args=config_class(**values),
            train_dataset=make_dataset(),
        )  # fmt: skip
        trainer.train()
    assert received["ours"] == received["trl"]
    assert not FORMAT_COLUMNS & set(received["ours"][1])
    assert not any(k.startswith("templates/") for entry in trainer.state.log_history for k in entry)


def test_a_collator_with_augmentation_off_is_refused(tiny_model_dir, tmp_path, tokenizer):
    collator = PromptAugmentationCollator(list(load_templates().values()), tokenizer)
    with pytest.raises(ValueError, match="prompt_augmentation=False"):
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=distinct_characters,
            args=PromptAugGRPOConfig(**config_values(tmp_path), prompt_augmentation=False),
            train_dataset=standard_prompt_only(), prompt_collator=collator,
        )  # fmt: skip


@pytest.mark.slow
def test_recipe_key_turns_augmentation_off(tmp_path):
    # ~25 s: the smoke recipe for 2 steps.
    import pandas as pd

    from prompt_aug import train

    out = tmp_path / "run"
    train.main([
        "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"), "--output_dir", str(out), "--max_steps", "2",
        "--save_strategy", "no", "--prompt_augmentation", "false",
    ])  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert not any(k.startswith("templates/") for entry in history for k in entry)
    records = pd.concat(pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet")))
    assert "uid" not in records.columns
    qwen = load_templates()["qwen-math"]
    first = records["prompt"].iloc[0]  # TRL logs the conversational prompt as messages
    assert first[0] == {"role": "system", "content": qwen.system}


# -- 4. one contract between collator and rewards --------------------------------------------------


def test_rewards_import_nothing_from_prompt_aug():
    code = (
        "import sys, rewards.registry; from rewards import grade; grade('\\\\boxed{1}', '1', 'open-r1');"
        "print(sorted(m for m in sys.modules if m.startswith('prompt_aug')))"
    )
    assert subprocess.check_output([sys.executable, "-c", code], cwd=REPO, text=True).strip() == "[]"
    for path in (REPO / "rewards").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "prompt_aug" for n in names), path


def test_builtin_format_table_equals_the_template_bank():
    bank = load_templates()
    assert {n: FormatRules(t.answer, t.markers) for n, t in bank.items()} == BUILTIN_FORMATS


CLASHING_BANK = "- {name: open-r1, user: 'Q: {question}', answer: boxed, markers: ['Answer:']}\n"


def test_a_custom_bank_with_builtin_names_does_not_change_how_builtin_names_grade(tmp_path, tokenizer):
    tagged = "<think>\nx\n</think>\n<answer>\n\\boxed{7}\n</answer>"
    before = grade(tagged, "7", "open-r1", strict=True)
    (tmp_path / "bank.yaml").write_text(CLASHING_BANK)
    custom = load_templates(tmp_path / "bank.yaml")
    assert grade(tagged, "7", "open-r1", strict=True) == before
    assert before.format_score == 1.0 and before.correct

    # Rows drawn from the custom bank carry its rules, and the rewards grade by them.
    rows = PromptAugmentationCollator(list(custom.values()), tokenizer)(
        [{"question": "3+4?", "uid": "a", "answer": "7"}]
    )
    columns = {k: [rows[0][k]] for k in ("template", "answer_rule", "format_markers")}
    assert format_reward([tagged], **columns) == [0.0]  # the custom marker "Answer:" is missing
    assert format_reward(["Answer: \\boxed{7}"], **columns) == [1.0]
    assert strict_correctness_reward(["no tags, \\boxed{7}"], answer=["7"], **columns) == [1.0]
    assert strict_correctness_reward(["no tags, \\boxed{7}"], answer=["7"], template=["open-r1"]) == [0.0]


def test_an_unknown_template_name_without_rules_says_what_to_pass():
    with pytest.raises(KeyError, match="answer_rule"):
        correctness_reward(["\\boxed{7}"], answer=["7"], template=["my-own"])


# -- 5. TRL-style scenarios ------------------------------------------------------------------------


def test_eval_dataset_uses_the_evaluation_template(tiny_model_dir, tmp_path):
    args = config(tmp_path, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=3)
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=standard_prompt_only(), eval_dataset=standard_prompt_only(),
    )  # fmt: skip
    train_and_assert_weights_moved(trainer)
    evaluated = [h for h in trainer.state.log_history if "eval_loss" in h or "eval_reward" in h]
    assert evaluated, trainer.state.log_history
    assert {k for k in evaluated[0] if k.startswith("eval_templates/")} >= {"eval_templates/qwen-math/count"}
    assert not [k for k in evaluated[0] if k.startswith("eval_templates/") and "qwen-math" not in k]


def marked(dataset: Dataset, mark: str) -> Dataset:
    return dataset.map(lambda row: {"prompt": f"{mark} {row['prompt']}"})


def test_an_evaluation_writes_every_completion_to_its_own_records_and_table(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("COLUMNS", "200")  # the console table's width: whole words in each cell
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    import pandas as pd
    import wandb

    args = config(
        tmp_path / "run", eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=3,
        log_completions=True, logging_steps=2, report_to="wandb",
    )  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=standard_prompt_only(), eval_dataset=marked(standard_prompt_only(), "EVAL"),
    )  # fmt: skip
    try:
        trainer.train()
        printed = capsys.readouterr().out
        trainer.evaluate()  # again at the last step
    finally:
        wandb.finish()  # the Trainer leaves the run open; later tests must not log into it
        wandb.teardown()  # nor keep this test's WANDB_DIR, which wandb reads once per process
    records = tmp_path / "run" / "completions"
    trained = pd.read_parquet(records / "completions_00002.parquet")
    assert len(trained) and not trained["prompt"].str.contains("EVAL").any()  # the training step's own rows
    evaluated = pd.read_parquet(records / "eval_completions_00002.parquet")
    assert len(evaluated) == len(QUESTIONS) * 3  # every question of the set, each of its completions
    assert evaluated["prompt"].str.contains("EVAL").all()
    assert set(evaluated["template"]) == {"qwen-math"}
    entry = next(h for h in trainer.state.log_history if "eval_loss" in h)
    assert set(evaluated["round"]) == {entry["round"]}
    tables = list(tmp_path.glob("wandb/offline-run-*/files/media/table/eval_completions_*.table.json"))
    assert [len(json.loads(t.read_text())["data"]) for t in tables] == [len(evaluated)] * 2
    assert "EVAL" in printed  # printed, as TRL prints a training step's records
    # The second evaluation at the last step has a file of its own: the first one's records are kept.
    assert len(pd.read_parquet(records / "eval_completions_00002-2.parquet")) == len(evaluated)


def test_each_set_of_a_dict_of_evaluation_sets_has_its_own_records(tiny_model_dir, tmp_path):
    import pandas as pd

    args = config(
        tmp_path, eval_strategy="steps", eval_steps=1, max_steps=1, per_device_eval_batch_size=3,
        log_completions=True,
    )  # fmt: skip
    sets = {name: marked(standard_prompt_only().select(range(3)), name.upper()) for name in ("easy", "hard")}
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=standard_prompt_only(), eval_dataset=sets,
    )  # fmt: skip
    trainer.train()
    for name in sets:
        rows = pd.read_parquet(tmp_path / "completions" / f"eval_{name}_completions_00001.parquet")
        assert len(rows) == 9 and rows["prompt"].str.contains(name.upper()).all(), name
    assert (
        not pd.read_parquet(tmp_path / "completions" / "completions_00001.parquet")["prompt"]
        .str.contains("EASY|HARD")
        .any()
    )


def test_an_image_column_is_refused_by_dataset_and_name_under_augmentation(tiny_model_dir, tmp_path):
    with_image = standard_prompt_only().add_column("image", [None] * len(QUESTIONS))
    with pytest.raises(ValueError, match=r"train_dataset has a column 'image'.*prompt_augmentation=False"):
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=distinct_characters, args=config(tmp_path),
            train_dataset=with_image,
        )  # fmt: skip
    pictures = standard_prompt_only().add_column("images", [[]] * (len(QUESTIONS) - 1) + [["a.png"]])
    with pytest.raises(ValueError, match=r"eval_dataset\['hard'\] has a column 'images'"):
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=distinct_characters, args=config(tmp_path),
            train_dataset=standard_prompt_only(),
            eval_dataset={"easy": standard_prompt_only(), "hard": pictures},
        )  # fmt: skip
    figure = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Its area?"}]}]
    with pytest.raises(
        ValueError, match=r"train_dataset's first `prompt` has image content in its user turn"
    ):
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=distinct_characters, args=config(tmp_path),
            train_dataset=Dataset.from_dict({"prompt": [figure]}),
        )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"^the row's `prompt` has image content .*prompt_augmentation=False"
    ):
        row_question({"prompt": figure})  # a later row, when its round comes
    asked = Dataset.from_dict({"question": ["Its area?"], "prompt": [figure]})  # the question is asked
    refusal = partial(augmentation_refusal, tools=None, environment_factories=None, rollout_func=None)
    assert refusal(asked, None) is None
    streamed = standard_prompt_only().add_column("images", [[]] * len(QUESTIONS)).to_iterable_dataset()
    assert refusal(streamed, None) is None  # its rows cannot be read here; TRL ignores empty lists
    empty_lists = standard_prompt_only().add_column("images", [[]] * len(QUESTIONS))  # TRL ignores them
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=config(tmp_path, max_steps=1),
        train_dataset=empty_lists,
    )  # fmt: skip
    trainer.train()


def test_several_reward_functions_and_two_iterations(tiny_model_dir, tmp_path):
    args = config(tmp_path, num_iterations=2, max_steps=4, reward_weights=[1.0, 0.5, 1.0])
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=[distinct_characters, format_reward, length_reward],
        args=args, train_dataset=standard_prompt_only(),
    )  # fmt: skip
    train_and_assert_weights_moved(trainer)
    keys = {k for entry in trainer.state.log_history for k in entry}
    assert {"rewards/distinct_characters/mean", "rewards/format_reward/mean"} <= keys
    assert any(k.startswith("templates/") and k.endswith("/format") for k in keys)


# -- 4. every trainer-level key of the config works without prompt-aug-train ---------------------------


def test_a_trainer_built_from_the_config_alone_evaluates_fires_the_guard_and_stops_where_told(
    tiny_model_dir, tmp_path
):
    import pandas as pd

    from prompt_aug.evaluation.callback import EvalCallback
    from prompt_aug.extensions.collapse import CollapseGuard
    from prompt_aug.extensions.stabilisers import OptimizerResetCallback

    questions = tmp_path / "sums.jsonl"
    rows = [{"question": "Compute $2 + 3$.", "answer": "5"}, {"question": "Compute $1 + 1$.", "answer": "2"}]
    pd.DataFrame(rows).to_json(questions, orient="records", lines=True)
    args = PromptAugGRPOConfig(
        **{**config_values(tmp_path / "out"), "max_steps": 8},
        eval_benchmarks=[str(questions)], eval_every_steps=1, eval_max_tokens=4,
        collapse_entropy_floor=100.0, collapse_entropy_rounds=1, collapse_entropy_action="stop",
        stop_tokens=["<|im_end|>"], beta=0.04, sync_ref_model=True, ref_model_sync_steps=1,
        reset_optimizer_on_ref_sync=True,
    )  # fmt: skip
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=standard_prompt_only(),
    )  # fmt: skip
    callbacks = trainer.callback_handler.callbacks
    kinds = [type(c) for c in callbacks]
    assert EvalCallback in kinds and CollapseGuard in kinds and OptimizerResetCallback in kinds
    assert kinds.index(EvalCallback) < kinds.index(CollapseGuard)  # the guard sees eval/* keys
    im_end = trainer.processing_class.convert_tokens_to_ids("<|im_end|>")
    assert im_end in trainer.eos_token_ids and im_end in trainer.generation_config.eos_token_id
    trainer.train()
    # An entropy floor every round breaks stops the run at the first round, not at max_steps.
    assert trainer.state.global_step == 1  # of max_steps 8
    guard = next(c for c in callbacks if isinstance(c, CollapseGuard))
    assert [f.signal for f in guard.fired] == ["entropy"] and "collapse guard stopped" in guard.stop_message
    assert any("eval/macro" in entry for entry in trainer.state.log_history)
    reset = next(c for c in callbacks if isinstance(c, OptimizerResetCallback))
    assert reset.reset_steps == [1]


def test_an_evaluator_passed_in_callbacks_is_the_runs_evaluator_not_a_second_one(tiny_model_dir, tmp_path):
    # prompt-aug-train builds the evaluator (loading its question sets) before the model loads, to fail
    # early, and hands it over: the trainer must use it, first, rather than load the sets again.
    import pandas as pd

    from prompt_aug.evaluation.callback import EvalCallback, evaluator_from_args
    from prompt_aug.extensions.collapse import CollapseGuard

    questions = tmp_path / "sums.jsonl"
    pd.DataFrame([{"question": "Compute $2 + 3$.", "answer": "5"}]).to_json(
        questions, orient="records", lines=True
    )
    args = PromptAugGRPOConfig(
        **config_values(tmp_path / "out"),
        eval_benchmarks=[str(questions)], eval_every_steps=1, eval_max_tokens=4,
        collapse_entropy_floor=0.1, collapse_entropy_rounds=1,
    )  # fmt: skip
    evaluator = evaluator_from_args(args)
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=distinct_characters, args=args,
        train_dataset=standard_prompt_only(), callbacks=[evaluator],
    )  # fmt: skip
    callbacks = trainer.callback_handler.callbacks
    evaluators = [c for c in callbacks if isinstance(c, EvalCallback)]
    assert evaluators == [evaluator] and evaluators[0] is evaluator
    kinds = [type(c) for c in callbacks]
    assert kinds.index(EvalCallback) < kinds.index(CollapseGuard)


# -- 6. what TRL runs on messages: tools, environments, a rollout function ----------------------------


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class AddingEnvironment:
    """A TRL environment: an observation for the user turn, a tool and a reward."""

    def reset(self, **kwargs):
        return " Use the tool."

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    def get_reward(self):
        return 1.0


def rollout_from_messages(prompts, trainer):
    """A TRL rollout function for a conversational dataset: it templates the messages itself."""
    tokenizer = trainer.processing_class
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    prompt_ids = [tokenizer(t)["input_ids"] for t in texts]
    completions = [[1, 2, 3]] * len(prompts)
    return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": [[0.0] * 3] * len(prompts)}


@pytest.mark.parametrize(
    "argument, extra",
    [
        ("tools", {"tools": [add], "reward_funcs": length_reward}),
        ("environment_factory", {"environment_factory": AddingEnvironment, "reward_funcs": None}),
        ("rollout_func", {"rollout_func": rollout_from_messages, "reward_funcs": length_reward}),
    ],
)
def test_tools_environments_and_a_rollout_on_messages_are_refused_by_name_under_augmentation(
    tiny_model_dir, tmp_path, monkeypatch, argument, extra
):
    # TRL runs them on a prompt's messages; augmentation hands TRL rendered text, on which TRL fails inside
    # the first round. With augmentation off they train as TRL does.
    import trl
    from transformers import AutoTokenizer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates/qwen2_5.jinja").read_text()
    dataset = conversational_prompt_only()
    kwargs = {"model": str(tiny_model_dir), "train_dataset": dataset, "processing_class": tokenizer, **extra}
    with pytest.raises(ValueError, match=rf"PromptAugGRPOTrainer: {argument}.*prompt_augmentation=False"):
        PromptAugGRPOTrainer(args=config(tmp_path / "on", max_steps=1), **kwargs)
    values = {**config_values(tmp_path / "off"), "max_steps": 1}
    off = PromptAugGRPOConfig(**values, prompt_augmentation=False)
    trainer = PromptAugGRPOTrainer(args=off, **kwargs)
    trainer.train()
    assert trainer.state.global_step == 1
