"""The augmenting collator: one template per GRPO group, on every process, every epoch, after resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from launch import torchrun

from prompt_aug.collator import PromptAugmentationCollator
from prompt_aug.demo.smoke import synthetic_problems
from prompt_aug.templates import load_templates

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bank():
    return load_templates()


def _round(rows, num_generations):
    # What TRL's RepeatSampler hands over: each row repeated num_generations times, consecutively.
    return [dict(row) for row in rows for _ in range(num_generations)]


def test_one_template_per_row_within_a_round(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=3)
    out = collator(_round(synthetic_problems(64), 8), epoch=0)
    by_uid: dict[str, set] = {}
    for row in out:
        by_uid.setdefault(row["uid"], set()).add((row["template"], row["prompt"]))
        assert row["prompt"].endswith(bank[row["template"]].prefill)
        assert row["question"] in row["prompt"]
    assert all(len(v) == 1 for v in by_uid.values())
    assert len({row["template"] for row in out}) > 5  # and the round mixes templates


def test_a_new_epoch_redraws(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=3)
    rows = synthetic_problems(200)
    first = [r["template"] for r in collator(rows, epoch=0)]
    second = [r["template"] for r in collator(rows, epoch=1)]
    changed = sum(a != b for a, b in zip(first, second))
    # With 13 uniform templates about 12/13 of the rows change; allow wide slack.
    assert changed > 150


def test_draws_are_near_uniform(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=0)
    counts = Counter(collator.draw(f"row-{i}").name for i in range(13_000))
    assert set(counts) == set(bank)
    # Expected 1000 each; binomial sd ~30, so 150 is a 5-sigma bound.
    assert all(abs(n - 1000) < 150 for n in counts.values()), counts


def test_weighted_draws_follow_the_weights(bank, tokenizer):
    templates = [bank["qwen-math"], bank["open-r1"]]
    collator = PromptAugmentationCollator(templates, tokenizer, weights=[3, 1], seed=0)
    counts = Counter(collator.draw(f"row-{i}").name for i in range(8000))
    assert abs(counts["qwen-math"] / 8000 - 0.75) < 0.03


@pytest.mark.parametrize("weights", [[-1, 2], [0, 0], [float("nan"), 1], [1, float("inf")], [1e308, 1e308]])
def test_weights_that_cannot_be_drawn_from_are_refused_in_one_line(bank, tokenizer, weights):
    templates = [bank["qwen-math"], bank["open-r1"]]
    with pytest.raises(ValueError) as err:
        PromptAugmentationCollator(templates, tokenizer, weights=weights)
    assert str(err.value).startswith(f"weights {weights}: give finite non-negative numbers")
    assert "\n" not in str(err.value)
    assert PromptAugmentationCollator(templates, tokenizer, weights=[0, 1]).draw("q").name == "open-r1"


def test_draws_do_not_depend_on_the_process(bank, tokenizer):
    # A fresh interpreter with another hash salt stands in for another rank or a resumed run.
    here = [
        PromptAugmentationCollator(list(bank.values()), tokenizer, seed=7).draw(f"u{i}", 2).name
        for i in range(50)
    ]
    code = (
        "import json; from prompt_aug.templates import load_templates;"
        "from prompt_aug.collator import PromptAugmentationCollator;"
        "c = PromptAugmentationCollator(list(load_templates().values()), None, seed=7);"
        "print(json.dumps([c.draw(f'u{i}', 2).name for i in range(50)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = json.loads(subprocess.check_output([sys.executable, "-c", code], env=env, cwd=REPO, text=True))
    assert here == there


def test_eval_mode_uses_the_fixed_template(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=0)
    out = collator(synthetic_problems(30), epoch=0, training=False)
    assert {r["template"] for r in out} == {"qwen-math"}


def test_a_row_without_question_or_prompt_is_named(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer)
    with pytest.raises(KeyError, match="neither a `question` nor a `prompt`.*'answer', 'problem'"):
        collator([{"problem": "1+1?", "answer": "2"}])


def test_rows_with_missing_ids_are_drawn_by_their_questions_and_a_missing_question_is_named(bank, tokenizer):
    # A dataset handed to the trainer directly may hold a uid column of None (or NaN, from pandas): each
    # such row is drawn by its question, as a row without the column is, not all by the one id "None".
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=42)
    questions = [f"What is {i} + {i}?" for i in range(40)]
    missing = [None if i % 2 else float("nan") for i in range(40)]
    drawn = collator([{"question": q, "uid": u} for q, u in zip(questions, missing)])
    assert [r["template"] for r in drawn] == [
        r["template"] for r in collator([{"question": q} for q in questions])
    ]
    assert len({r["template"] for r in drawn}) > 5
    for question in (None, float("nan")):
        with pytest.raises(ValueError, match=r"^a row's `question` is missing \((None|nan)\); drop the row"):
            collator([{"question": question, "uid": "a"}])


def test_format_rules_travel_in_the_row_and_are_never_overwritten(bank, tokenizer):
    collator = PromptAugmentationCollator(list(bank.values()), tokenizer, seed=1)
    for row in collator(synthetic_problems(40)):
        template = bank[row["template"]]
        assert (row["answer_rule"], row["format_markers"]) == (template.answer, list(template.markers))
    with pytest.raises(ValueError, match=r"\['template'\]"):
        collator([{"question": "1+1?", "uid": "a", "template": "mine"}])


@pytest.mark.slow
def test_two_process_run_keeps_groups_on_one_template_across_ranks(tmp_path):
    # 3 rows per process-batch of 6 completions with 4 rollouts per question: the middle question's
    # group is split between rank 0 and rank 1 in every round.
    out = tmp_path / "run"
    cmd = [
        *torchrun(2),
        "-m", "prompt_aug.train", "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"),
        "--output_dir", str(out), "--log_completions", "true", "--max_steps", "4",
        "--per_device_train_batch_size", "3", "--steps_per_generation", "2", "--num_generations", "4",
        "--save_strategy", "no",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (result.stdout + result.stderr).count(
        "questions per round"
    ) == 1  # rank 0 only prints the arithmetic
    records = pd.concat(pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet")))
    groups = records.groupby(["step", "uid"])
    assert (groups["template"].nunique() == 1).all()
    assert (groups.size() == 4).all()
    assert (groups["process"].nunique() == 2).any(), "no group straddled the two ranks"
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any(k.startswith("templates/") for entry in history for k in entry)


def test_templates_that_share_a_name_but_differ_are_refused_naming_it(bank, tokenizer):
    # Rows carry only their template's name: the reward prompts of a conversational dataset and the
    # per-template metrics are looked up by it, so one name must mean one template.
    from dataclasses import replace

    louder = replace(bank["qwen-math"], system="Answer in French. " + bank["qwen-math"].system)
    refusal = (
        "^two templates named 'qwen-math' \\(of templates and eval_template\\) differ in system; give each"
    )
    with pytest.raises(ValueError, match=refusal):
        PromptAugmentationCollator([bank["qwen-math"], bank["abel"]], tokenizer, eval_template=louder)
    with pytest.raises(ValueError, match=refusal):
        PromptAugmentationCollator([bank["qwen-math"], louder], tokenizer)
    # The evaluation template may be one of the drawn templates, as the trainer's default collator has it.
    drawn = [bank["qwen-math"], bank["abel"]]
    collator = PromptAugmentationCollator(drawn, tokenizer, eval_template=bank["qwen-math"])
    rows = collator([{"question": "1+1?"}], training=False)
    prompts, _ = collator.conversational_reward_inputs(rows, ["2"])
    assert prompts == [bank["qwen-math"].messages("1+1?")]


def test_a_template_is_found_by_name_among_the_drawn_and_the_evaluation_template(tokenizer):
    """Rows carry their template's name alone: the lookup knows the evaluation template too, and an unknown
    name is refused naming every template it knows."""
    bank = load_templates()
    collator = PromptAugmentationCollator(
        [bank["abel"], bank["open-r1"]], tokenizer, eval_template=bank["qwen-math"]
    )
    assert collator.template_named("qwen-math") == bank["qwen-math"]
    assert collator.template_named("open-r1") == bank["open-r1"]
    with pytest.raises(KeyError) as err:
        collator.template_named("nope")
    assert err.value.args[0] == (
        "template 'nope' is neither drawn from nor the evaluation template: ['abel', 'open-r1', 'qwen-math']"
    )
