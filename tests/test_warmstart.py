"""The learning demo's warm start and before/after table (the fast parts; tests/test_learn.py trains)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from prompt_aug.demo import DemoArguments
from prompt_aug.demo.smoke import addition_problems
from prompt_aug.demo.warmstart import (
    METRICS,
    BeforeAfter,
    draw_targets,
    prepare,
    split_heldout,
    target_text,
    warm_start,
)
from prompt_aug.templates import load_templates
from rewards.grading.grade import grade

TEMPLATES = list(load_templates().values())


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_well_formed_target_is_right_and_full_format_and_the_other_is_right_without_markers(template):
    good = grade(target_text(template, "Compute $4 + 5$.", "9", True), "9", template, strict=True)
    assert good.correct and good.format_score == 1.0
    bad = grade(target_text(template, "Compute $4 + 5$.", "9", False), "9", template)
    assert bad.correct and bad.format_score == (1.0 if not template.markers else 0.0)


def test_warm_start_targets_box_the_right_answer_at_the_asked_share_and_always_work_it_right():
    import itertools
    import re

    rows = addition_problems()
    draws = list(
        itertools.islice(draw_targets(rows, TEMPLATES, wellformed=0.5, answer_correct=0.3, seed=0), 2000)
    )
    right = well = 0
    for i, j, text in draws:
        a, b = (int(d) for d in re.search(r"(\d) \+ (\d) = ", text).groups())
        assert f"{a} + {b} = {a + b}." in text and rows[i]["question"] == f"Compute ${a} + {b}$."
        graded = grade(text, rows[i]["answer"], TEMPLATES[j])
        right += graded.correct
        well += bool(TEMPLATES[j].markers) and graded.format_score == 1.0
    marker_draws = sum(bool(TEMPLATES[j].markers) for _, j, _ in draws)
    assert 0.25 < right / len(draws) < 0.35  # 0.3 asked; the other boxes never hold the gold
    assert 0.45 < well / marker_draws < 0.55


def test_warm_start_targets_of_rows_with_several_golds_box_the_first_of_them():
    """A dataset whose answer column holds lists (several acceptable golds): the target boxes one gold, as a
    right answer is written, never the list's text."""
    import itertools

    rows = [{"question": "Compute $2 + 3$.", "answer": ["5", "5.0"]}]
    draws = draw_targets(rows, TEMPLATES[:1], wellformed=0.0, answer_correct=1.0, seed=0)
    texts = {text for _, _, text in itertools.islice(draws, 5)}
    assert texts == {"2 + 3 = 5. \\boxed{5}"}
    assert grade(texts.pop(), rows[0]["answer"], TEMPLATES[0], strict=True).correct


def test_heldout_questions_are_kept_apart_and_drawn_by_seed():
    import datasets

    rows = datasets.Dataset.from_list(addition_problems())
    trained, held = split_heldout(rows, 10, seed=0)
    assert len(trained) == 45 and len(held) == 10
    assert not set(trained["uid"]) & set(held["uid"])
    assert (
        held["uid"] == split_heldout(rows, 10, seed=0)[1]["uid"] != split_heldout(rows, 10, seed=1)[1]["uid"]
    )
    with pytest.raises(ValueError, match="heldout_questions=55"):
        split_heldout(rows, 55, seed=0)


def test_a_heldout_question_is_trained_under_no_row_of_it():
    """A question the dataset holds twice (the synthetic set repeats its powers) is held out whole: neither
    copy is trained on, and the held-out questions are distinct."""
    import datasets

    rows = [{"question": f"Evaluate ${b}^{{2}}$.", "answer": str(b * b), "uid": f"{b}-{c}"}
            for c in range(2) for b in range(2, 8)]  # fmt: skip
    dataset = datasets.Dataset.from_list(rows)
    for seed in range(5):
        trained, held = split_heldout(dataset, 2, seed=seed)
        assert len(set(held["question"])) == 2 and len(trained) == 8
        assert not set(trained["question"]) & set(held["question"])
    with pytest.raises(ValueError) as err:
        split_heldout(dataset, 6, seed=0)
    assert str(err.value) == (
        "heldout_questions=6 leaves no training questions (the dataset has 12 rows, 6 questions); lower it"
    )


def test_warm_start_changes_the_weights_and_lowers_the_loss(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = model.model.embed_tokens.weight.detach().clone()
    losses = warm_start(model, tokenizer, addition_problems(), TEMPLATES, steps=60, batch_size=8,
                        learning_rate=1e-2, wellformed=0.5, seed=0)  # fmt: skip
    assert len(losses) == 60 and sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert not torch.equal(model.model.embed_tokens.weight, before)


def test_a_cached_warm_start_leaves_what_training_it_again_leaves(tiny_model_dir, tokenizer, tmp_path):
    """The second run of the same warm start loads the first's weights: the same floats, losses and random
    stream as training it would leave; another seed is another warm start."""
    from prompt_aug.demo.warmstart import cached_warm_start

    rows = addition_problems()
    settings = {"steps": 12, "batch_size": 4, "learning_rate": 1e-2, "wellformed": 0.5, "seed": 0}
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    losses = warm_start(trained, tokenizer, rows, TEMPLATES, **settings)
    stream = torch.random.get_rng_state()
    first = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert cached_warm_start(first, tokenizer, rows, TEMPLATES, tmp_path, **settings) == (losses, None)
    second = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(123)
    again, loaded = cached_warm_start(second, tokenizer, rows, TEMPLATES, tmp_path, **settings)
    assert again == losses and loaded is not None and loaded.parent == tmp_path
    for (name, value), expected in zip(second.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(value, expected), name
    assert torch.equal(torch.random.get_rng_state(), stream) and second.training
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert (
        cached_warm_start(other, tokenizer, rows, TEMPLATES, tmp_path, **{**settings, "seed": 1})[1] is None
    )
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")  # other floats
    assert cached_warm_start(eager, tokenizer, rows, TEMPLATES, tmp_path, **settings)[1] is None
    assert len(list(tmp_path.glob("warmstart-*.pt"))) == 3


def test_before_after_table_has_every_template_and_both_question_sets(tiny_model_dir, tokenizer, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = addition_problems()
    check = BeforeAfter(
        TEMPLATES[:4], {"trained": rows[:3], "held-out": rows[3:5]}, max_tokens=4, temperature=1.0, seed=0
    )
    state = torch.random.get_rng_state()
    check.measure("before", model, tokenizer)
    assert torch.equal(torch.random.get_rng_state(), state)  # scoring leaves training's random stream alone
    check.measure("after", model, tokenizer)
    table = check.write(tmp_path).read_text()
    for t in TEMPLATES[:4]:
        assert f"| {t.name} |" in table
    assert (
        "trained correctness | trained strict | trained format "
        "| held-out correctness | held-out strict | held-out format" in table
    )
    assert (tmp_path / "before_after.json").is_file()
    assert "| **marker templates** |" in table and "nan" not in table
    written = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert written == rows[3:5]  # the held-out questions, as prompt-aug-eval --benchmarks reads them


def test_strict_column_needs_the_box_and_lenient_does_not(tiny_model_dir, tokenizer, monkeypatch):
    """The same completions, graded both ways: a bare answer is lenient-correct only."""
    from prompt_aug.demo import warmstart

    texts = iter(["The answer is 5.", "so \\boxed{5}"])
    monkeypatch.setattr(
        warmstart.HFBackend,
        "generate",
        lambda self, prompts, seeds, **kw: [[(next(texts), None)] for _ in prompts],
    )
    rows = [{"question": "What is $2 + 3$?", "answer": "5"}]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    bare = warmstart.score(model, tokenizer, rows, TEMPLATES[:1], max_tokens=4, temperature=1.0, seed=0)
    boxed = warmstart.score(model, tokenizer, rows, TEMPLATES[:1], max_tokens=4, temperature=1.0, seed=0)
    name = TEMPLATES[0].name
    assert (bare[name]["correctness"], bare[name]["strict"]) == (1.0, 0.0)
    assert (boxed[name]["correctness"], boxed[name]["strict"]) == (1.0, 1.0)


def test_before_after_table_of_templates_without_markers_has_no_marker_mean(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = [t for t in TEMPLATES if not t.markers][:1]
    check = BeforeAfter(plain, {"trained": addition_problems()[:2]}, max_tokens=2, temperature=1.0, seed=0)
    check.measure("before", model, tokenizer)
    check.measure("after", model, tokenizer)
    table = check.table()
    assert "| **all templates** |" in table and "marker templates" not in table and "nan" not in table


def test_before_after_json_of_templates_without_markers_is_valid_json_without_a_marker_mean(
    tiny_model_dir, tokenizer, tmp_path
):
    """As the table: no marker mean where the bank has no marker template, and no NaN, which is no JSON."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain = [t for t in TEMPLATES if not t.markers][:1]
    check = BeforeAfter(plain, {"trained": addition_problems()[:2]}, max_tokens=2, temperature=1.0, seed=0)
    check.measure("before", model, tokenizer)
    check.measure("after", model, tokenizer)
    check.write(tmp_path)

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    summary = json.loads((tmp_path / "before_after.json").read_text(), parse_constant=refuse)["summary"]
    assert sorted(summary) == sorted(f"{w}/trained/{m}" for w in ("before", "after") for m in METRICS)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # The warm start trains the base in memory; a LoRA adapter records the base on disk, without it.
        (["--use_peft", "true"], "error: warmstart_steps with use_peft:"),
        (
            ["--warmstart_batch_size", "0"],
            "error: command line: warmstart_batch_size: must be at least 1, got 0",
        ),
    ],
)
def test_a_warm_start_the_recipe_cannot_run_is_refused_before_anything_loads(tmp_path, extra, expected):
    from prompt_aug import train

    out = tmp_path / "run"
    recipe = Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml"
    with pytest.raises(SystemExit) as err:
        train.main(["--config", str(recipe), "--output_dir", str(out), "--warmstart_steps", "5", *extra])
    message = str(err.value.code)
    assert message.startswith(f"prompt-aug-train: {expected}") and "\n" not in message and not out.exists()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("warmstart_steps", -1, "warmstart_steps: must be at least 0, got -1"),
        ("warmstart_batch_size", 0, "warmstart_batch_size: must be at least 1, got 0"),
        ("warmstart_learning_rate", 0.0, "warmstart_learning_rate: must be a finite number above 0, got 0.0"),
        ("warmstart_learning_rate", float("inf"), "warmstart_learning_rate: must be a finite number above 0"),
        (
            "warmstart_wellformed",
            7.0,
            "warmstart_wellformed: a share of the warm-start targets, must be from",
        ),
        ("warmstart_answer_correct", -1.0, "warmstart_answer_correct: a share of the warm-start targets"),
        ("warmstart_answer_correct", float("nan"), "warmstart_answer_correct: a share of the warm-start"),
        ("heldout_questions", -5, "heldout_questions: must be at least 0, got -5"),
    ],
)
def test_a_demo_key_out_of_its_range_is_refused_naming_it(key, value, expected):
    with pytest.raises(ValueError) as err:
        DemoArguments(**{key: value})
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_a_warm_start_cache_that_is_or_lies_under_a_file_is_refused_at_parse(tmp_path):
    taken = tmp_path / "cache"
    taken.write_text("keep")
    for cache in (taken, taken / "inner"):
        with pytest.raises(ValueError) as err:
            DemoArguments(warmstart_steps=5, warmstart_cache=str(cache))
        assert str(err.value) == (
            f"warmstart_cache: {taken} is a file, not a folder; give a folder, or none for no cache"
        )
    assert DemoArguments(warmstart_steps=5, warmstart_cache="none").warmstart_cache == "none"
    assert taken.read_text() == "keep"


def test_heldout_questions_without_before_after_are_kept_out_and_said_to_be(caplog):
    """A scorer of one's own (bench/ablation.py) draws them again: kept out of training, and a log line says
    this run scores none of them."""
    import logging
    from types import SimpleNamespace

    import datasets

    rows = datasets.Dataset.from_list(addition_problems())
    demo = DemoArguments(heldout_questions=10)
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        trained, check = prepare(None, None, rows, TEMPLATES, demo, SimpleNamespace(seed=0))
    assert check is None and trained["uid"] == split_heldout(rows, 10, seed=0)[0]["uid"]
    assert any(
        "heldout_questions: 10 questions kept out of training" in r.getMessage()
        and "before_after" in r.getMessage()
        for r in caplog.records
    )


def test_the_warm_start_and_the_scores_render_prompts_with_the_recipes_chat_template_kwargs(tiny_model_dir):
    """Training renders its prompts with ``chat_template_kwargs``; the warm start trains on those prompts and
    the before/after table scores them, not the prompts without the keywords."""
    from types import SimpleNamespace

    import datasets
    from transformers import AutoTokenizer

    from prompt_aug.templates import CHATML_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = CHATML_TEMPLATE + "{% if mode is defined %}[{{ mode }}]{% endif %}"
    templates, kwargs = TEMPLATES[:2], {"mode": "terse"}
    rows = addition_problems()[:4]
    expected = {
        tuple(tokenizer(t.render(r["question"], tokenizer, **kwargs)).input_ids)
        for r in rows
        for t in templates
    }
    assert all("[terse]" in tokenizer.decode(ids) for ids in expected)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    seen: dict[bool, list[list[int]]] = {True: [], False: []}  # training (warm start) or not (scoring)

    def record(module, args, kw):
        seen[module.training] += kw["input_ids"].tolist()

    model.register_forward_pre_hook(record, with_kwargs=True)
    demo = DemoArguments(warmstart_steps=2, warmstart_batch_size=2, heldout_questions=1, before_after=True)
    args = SimpleNamespace(seed=0, max_completion_length=1, temperature=1.0, chat_template_kwargs=kwargs)
    _, check = prepare(model, tokenizer, datasets.Dataset.from_list(rows), templates, demo, args)
    pad = tokenizer.pad_token_id
    trained = seen[True]  # 2 steps of 2 examples, each a prompt and its target
    assert len(trained) == 4 and all(any(tuple(ids[: len(p)]) == p for p in expected) for ids in trained)
    scored = {tuple(ids[next(i for i, t in enumerate(ids) if t != pad) :]) for ids in seen[False]}
    assert expected <= scored and set(check.scores["before"]) == {"trained", "held-out"}
