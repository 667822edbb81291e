"""Evaluation: tiny benchmark fixtures, the tiny random model, the hf backend, end to end."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from chain_model import build_turn_then_eos_model
from launch import torchrun

from prompt_aug.evaluate import (
    EvalCallback,
    EvalError,
    load_benchmark,
    main,
    normalize_gold,
    parse_args,
    parse_benchmarks,
    read_records,
    render_tables,
    run_evaluation,
    score_completions,
    summarize,
)
from prompt_aug.sources import SourceError

AIME = [
    {"problem": "Compute $12 + 30$.", "answer": "42"},
    {"problem": "What is $7 \\times 6$?", "answer": "42"},
    {"problem": "Evaluate $2^{5}$.", "answer": "32"},
]
AMC = [  # AMC stores answers as floats
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{2}$?", "answer": 1.0},
    {"problem": "Compute $100 - 58$.", "answer": 42.0},
]
MINERVA = [  # list-valued answers: any match counts
    {"problem": "Solve for $x$: $2x + 1 = 7$.", "answer": ["3", "3.0"]},
    {"problem": "What is the remainder when $10$ is divided by $4$?", "answer": ["2"]},
]


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    from datasets import Dataset, DatasetDict

    path = tmp_path_factory.mktemp("suite") / "evaluation_suite"
    DatasetDict(
        {
            "aime": Dataset.from_list(AIME),
            "amc": Dataset.from_list(AMC),
            "minerva": Dataset.from_list(MINERVA),
        }
    ).save_to_disk(str(path))
    return path


def _eval(model: Path, suite: Path, out: Path, *extra: str) -> dict:
    main(
        [
            "--model",
            str(model),
            "--data_dir",
            str(suite),
            "--backend",
            "hf",
            "--max_tokens",
            "16",
            "--output",
            str(out),
            "--no_progress",
            *extra,
        ]
    )
    return json.loads((out / "results.json").read_text())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_end_to_end_results_records_table_and_resume(tiny_model_dir, suite_dir, tmp_path):
    out = tmp_path / "eval"
    results = _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc,minerva")

    records = _lines(out / "completions.jsonl")
    assert len(records) == len(AIME) + len(AMC) + len(MINERVA)
    fields = {
        "prompt",
        "completion",
        "extracted",
        "correct",
        "finish_reason",
        "benchmark",
        "template",
        "run",
        "index",
    }
    for record in records:
        assert fields <= set(record)
        assert record["template"] == "qwen-math" and record["run"] == 0
        assert record["finish_reason"] in ("stop", "length")
        assert "Please reason step by step" in record["prompt"]
    golds = {(r["benchmark"], r["index"]): r["gold"] for r in records}
    assert golds[("amc", 1)] == ["42"] and golds[("minerva", 0)] == ["3", "3.0"]

    row = results["results"]["qwen-math"]
    assert set(row["benchmarks"]) == {"aime24", "amc", "minerva"}
    assert row["benchmarks"]["aime24"]["n"] == 3 and row["benchmarks"]["aime24"]["runs"][0]["n"] == 3
    table = (out / "results.md").read_text()
    assert "| Model | AIME24 | AMC | Minerva | **Macro** | **Micro** |" in table
    assert f"| {tiny_model_dir.name} |" in table

    # Mark some answers right by hand (the random model gets none), then rerun: nothing is generated
    # again, and the summary is recomputed from the records.
    for record in records:
        record["correct"] = (record["benchmark"], record["index"]) in {("aime24", 0), ("amc", 0), ("amc", 1)}
    (out / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    again = _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc,minerva")
    assert again["new_completions"] == 0
    assert len(_lines(out / "completions.jsonl")) == len(records)

    accuracy = {}
    for benchmark in ("aime24", "amc", "minerva"):
        mine = [r["correct"] for r in records if r["benchmark"] == benchmark]
        accuracy[benchmark] = sum(mine) / len(mine)
    assert accuracy == {"aime24": 1 / 3, "amc": 1.0, "minerva": 0.0}
    row = again["results"]["qwen-math"]
    for benchmark, value in accuracy.items():
        assert row["benchmarks"][benchmark]["accuracy"] == pytest.approx(value)
    assert row["macro"] == pytest.approx(sum(accuracy.values()) / 3)
    assert row["micro"] == pytest.approx(3 / 7)
    assert "**44.4** | **42.9** |" in (out / "results.md").read_text()


def test_the_model_cards_index_carries_the_evaluation_of_its_own_weights_and_no_other(
    tiny_model_dir, suite_dir, tmp_path, monkeypatch
):
    """`python -m prompt_aug.model_card RUN` puts RUN/eval's accuracies into the front matter the Hub reads
    (``model-index``), each under the suite's dataset and split; once the weights change, it takes them
    out. A copy of the suite with other question counts is not the suite: no index."""
    import shutil

    from huggingface_hub import ModelCard

    from prompt_aug import model_card
    from prompt_aug.evaluation import benchmarks

    run = tmp_path / "run"
    shutil.copytree(tiny_model_dir, run)
    notes = "# My notes on this run\n"
    (run / "README.md").write_text(notes)
    _eval(run, suite_dir, run / "eval", "--benchmarks", "aime24,amc")  # 3 and 2 questions, not 30 and 83
    with pytest.raises(SystemExit):  # no card a trainer wrote: left as it is
        model_card.main([str(run)])
    assert (run / "README.md").read_text() == notes
    (run / "README.md").write_text(
        "---\nlibrary_name: transformers\nmodel_name: run\n---\n\n# Model Card for run\n"
    )
    model_card.main([str(run)])
    assert ModelCard((run / "README.md").read_text()).data.eval_results is None
    # Below, this test's suite stands for the real one.
    monkeypatch.setitem(benchmarks.SUITE_QUESTIONS, "aime24", 3)
    monkeypatch.setitem(benchmarks.SUITE_QUESTIONS, "amc", 2)
    _eval(run, suite_dir, run / "eval", "--benchmarks", "aime24,amc")
    records = _lines(run / "eval" / "completions.jsonl")
    for record in records:  # the random model gets none right: mark 1 of AIME's 3 and both of AMC's
        record["correct"] = (record["benchmark"], record["index"]) in {("aime24", 2), ("amc", 0), ("amc", 1)}
    (run / "eval" / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _eval(run, suite_dir, run / "eval", "--benchmarks", "aime24,amc")
    model_card.main([str(run)])
    card = ModelCard((run / "README.md").read_text())
    assert card.data.library_name == "transformers" and card.data.model_name == "run"
    index = {
        (r.dataset_type, r.dataset_split, r.dataset_name): (r.task_type, r.metric_type, r.metric_value)
        for r in card.data.eval_results
    }
    assert index == {
        ("lkevinzc/math-eval", "aime", "AIME24"): ("text-generation", "accuracy", 33.3),
        ("lkevinzc/math-eval", "amc", "AMC"): ("text-generation", "accuracy", 100.0),
    }
    assert {r.metric_name for r in card.data.eval_results} == {
        "accuracy (qwen-math template, greedy, at most 16 new tokens)"
    }
    assert "| **66.7** | **60.0** |" in card.text  # the table beside it: macro and micro
    # The first question of each benchmark is not the benchmark's accuracy: no index (a copy of the model
    # evaluated so; into the folder of the whole evaluation, such a run is refused).
    limited = tmp_path / "limited"
    shutil.copytree(run, limited, ignore=shutil.ignore_patterns("eval"))
    _eval(limited, suite_dir, limited / "eval", "--benchmarks", "aime24,amc", "--limit", "1")
    model_card.main([str(limited)])
    assert ModelCard((limited / "README.md").read_text()).data.eval_results is None
    weights = next(run.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[::-1])  # trained further since
    model_card.main([str(run)])
    card = ModelCard((run / "README.md").read_text())
    assert card.data.eval_results is None and "model-index" not in card.content
    assert (card.data.library_name, card.data.model_name) == ("transformers", "run")  # the rest is kept
    assert "holds an evaluation of other weights" in card.text


def test_template_all_writes_robustness_table(tiny_model_dir, suite_dir, tmp_path):
    out = tmp_path / "eval"
    results = _eval(
        tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--template", "all", "--limit", "1"
    )
    assert len(results["templates"]) == 13
    assert len(_lines(out / "completions.jsonl")) == 13 * 2
    assert set(results["spread"]) == set(results["std"]) == {"aime24", "amc", "macro", "micro"}
    table = (out / "results.md").read_text()
    robustness = table.split("Robustness across 13 templates")[1]
    rows = [line for line in robustness.splitlines() if line.startswith("| ")][1:]  # skip the header
    assert [r.split(" | ")[0][2:] for r in rows[:13]] == results["templates"]
    assert rows[13].startswith("| **spread (max − min)** |") and rows[14].startswith("| **std** |")
    assert "template `qwen-math`" in table  # the main table uses the paper's evaluation template


def test_completions_of_other_weights_in_a_folder_of_the_same_name_are_not_resumed(
    tiny_model_dir, suite_dir, tmp_path, caplog
):
    """The output folder holds completions of ``first/model``; ``second/model`` (the same name, other
    weights, as a run trained further or another run's model) is refused, not resumed from them; the same
    weights copied elsewhere resume."""
    import shutil

    from transformers import AutoModelForCausalLM

    first, second, copy = (tmp_path / name / "model" for name in ("first", "second", "copy"))
    for folder in (first, second):
        shutil.copytree(tiny_model_dir, folder)
    model = AutoModelForCausalLM.from_pretrained(second)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    model.save_pretrained(second)
    out = tmp_path / "eval"
    _eval(first, suite_dir, out, "--benchmarks", "amc", "--limit", "1")
    with pytest.raises(SystemExit) as exit_info:
        _eval(second, suite_dir, out, "--benchmarks", "amc", "--limit", "1")
    message = str(exit_info.value.code)
    assert "holds completions made with other settings ({'weights': " in message
    # Other weights cannot be given again: only another folder or discarding them is offered.
    assert message.endswith("; pass another --output, or --overwrite to discard them"), message
    shutil.copytree(first, copy)
    assert _eval(copy, suite_dir, out, "--benchmarks", "amc", "--limit", "1")["new_completions"] == 0
    # A folder written before the weights were recorded resumes, with a warning, and records them from then.
    settings = json.loads((out / "settings.json").read_text())
    del settings["weights"]
    (out / "settings.json").write_text(json.dumps(settings))
    with caplog.at_level("WARNING", logger="prompt_aug.evaluate"):
        assert _eval(copy, suite_dir, out, "--benchmarks", "amc", "--limit", "1")["new_completions"] == 0
    assert "does not record which weights made its completions" in caplog.text
    assert json.loads((out / "settings.json").read_text())["weights"] is not None


def test_an_adapters_completions_are_not_resumed_on_other_base_weights(tiny_model_dir, suite_dir, tmp_path):
    """An adapter's completions are its base's too: the same adapter on a base whose weights changed since
    (re-fetched, trained further) is refused, not resumed from them."""
    import shutil

    from lora_tools import save_lora_adapter
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    folder, out, flags = save_lora_adapter(base, tmp_path / "run"), tmp_path / "eval", ("--benchmarks", "amc")
    _eval(folder, suite_dir, out, *flags, "--limit", "1")
    assert _eval(folder, suite_dir, out, *flags, "--limit", "1")["new_completions"] == 0  # same base: resumed
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    model.save_pretrained(base)
    with pytest.raises(SystemExit, match=r"holds completions made with other settings \(\{'base_weights': "):
        _eval(folder, suite_dir, out, *flags, "--limit", "1")


def test_completions_of_another_commit_of_a_hub_model_are_not_resumed(
    tiny_model_dir, suite_dir, tmp_path, monkeypatch, caplog
):
    """Offline (conftest), a Hub model is read from the Hugging Face cache at the commit its ``main`` names:
    the evaluation records that commit, and completions of another one are refused, not resumed."""
    import shutil

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--nobody-here--tiny"

    def cache(commit: str) -> None:  # what a download of that commit leaves in the cache
        shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)

    first, second = "1" * 40, "2" * 40
    cache(first)
    out = tmp_path / "eval"
    _eval("nobody-here/tiny", suite_dir, out, "--benchmarks", "amc", "--limit", "1")
    assert json.loads((out / "settings.json").read_text())["weights"] == f"revision {first}"
    assert (
        _eval("nobody-here/tiny", suite_dir, out, "--benchmarks", "amc", "--limit", "1")["new_completions"]
        == 0
    )
    cache(second)
    changed = rf"other settings \(\{{'weights': \('revision {first}', 'revision {second}'\)"
    with pytest.raises(SystemExit, match=changed):
        _eval("nobody-here/tiny", suite_dir, out, "--benchmarks", "amc", "--limit", "1")
    # A folder that does not record a Hub model's commit resumes, with a warning.
    settings = json.loads((out / "settings.json").read_text())
    (out / "settings.json").write_text(json.dumps({**settings, "weights": None}))
    with caplog.at_level("WARNING", logger="prompt_aug.evaluate"):
        assert (
            _eval("nobody-here/tiny", suite_dir, out, "--benchmarks", "amc", "--limit", "1")[
                "new_completions"
            ]
            == 0
        )
    assert "does not record which weights made its completions" in caplog.text


def test_a_smaller_evaluation_does_not_replace_a_larger_ones_tables_and_a_bad_record_is_one_line(
    tiny_model_dir, suite_dir, tmp_path
):
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc")
    table = (out / "results.md").read_text()
    for extra, lost in (
        (["--benchmarks", "aime24"], "benchmarks ['amc']"),
        (["--benchmarks", "aime24,amc", "--limit", "1"], "3 questions of a benchmark"),
    ):
        with pytest.raises(
            SystemExit,
            match=rf"holds the tables of an evaluation this one does not cover \({re.escape(lost)}\)",
        ):
            _eval(tiny_model_dir, suite_dir, out, *extra)
    assert (out / "results.md").read_text() == table  # a quick check goes to another --output
    # A limit that cuts no benchmark short is the same evaluation.
    assert _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--limit", "3")["limit"] == 3
    assert _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--runs", "2")["runs"] == 2
    with pytest.raises(SystemExit, match=r"does not cover \(runs 2\)"):
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc")
    # A line of the records cut short in the middle of the file (not the last, which a resume cuts off).
    records = out / "completions.jsonl"
    lines = records.read_text().splitlines()
    records.write_text("\n".join([lines[0], lines[1][:20], *lines[2:]]) + "\n")
    with pytest.raises(SystemExit, match=r"completions.jsonl, line 2: not JSON .*delete that line"):
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--runs", "2")


def test_tables_whose_completions_are_gone_are_not_replaced_by_a_smaller_evaluation_with_other_settings(
    tiny_model_dir, suite_dir, tmp_path
):
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc")
    (out / "completions.jsonl").unlink()
    tables = {name: (out / name).read_text() for name in ("results.json", "results.md")}
    with pytest.raises(SystemExit, match=r"does not cover \(benchmarks \['amc'\]\)"):
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24", "--max_tokens", "8")
    assert {name: (out / name).read_text() for name in tables} == tables


def test_decoding_values_a_model_file_and_a_json_file_of_columns_are_refused_in_one_line(
    tiny_model_dir, suite_dir, tmp_path, capsys
):
    for flag, value, expected in (
        ("--temperature", "-1", "--temperature must be at least 0"),
        ("--top_p", "1.5", "--top_p must be in (0, 1]"),
    ):
        with pytest.raises(SystemExit):
            _eval(tiny_model_dir, suite_dir, tmp_path / "a", flag, value)
        assert expected in capsys.readouterr().err
    with pytest.raises(
        SystemExit, match=r"--model .*config.json: a file; give the folder the model was saved in"
    ):
        _eval(tiny_model_dir / "config.json", suite_dir, tmp_path / "a")
    columns = tmp_path / "columns.json"  # one row whose cells are the whole columns
    columns.write_text(json.dumps({"question": ["What is 1 + 1?", "What is 2 + 2?"], "answer": ["2", "4"]}))
    with pytest.raises(
        SystemExit, match=r"columns.json: one JSON object \(keys question, answer\) that .*lines=True"
    ):
        _eval(tiny_model_dir, suite_dir, tmp_path / "a", "--benchmarks", str(columns))


def test_unknown_benchmark_missing_split_and_changed_settings(tiny_model_dir, suite_dir, tmp_path):
    with pytest.raises(SystemExit, match=r"unknown benchmark\(s\) \['gsm8k'\].*aime24, amc, math500"):
        main(["--model", str(tiny_model_dir), "--benchmarks", "aime24,gsm8k", "--data_dir", str(suite_dir)])
    with pytest.raises(SystemExit, match=r"no split 'math'"):
        _eval(tiny_model_dir, suite_dir, tmp_path / "a", "--benchmarks", "math500")
    with pytest.raises(SystemExit, match=r"unknown template"):
        _eval(tiny_model_dir, suite_dir, tmp_path / "a", "--template", "no-such-template")
    with pytest.raises(
        SystemExit, match=r"^prompt-aug-eval: error: --model: no such folder './no-such-model'"
    ):
        _eval("./no-such-model", suite_dir, tmp_path / "a")
    with pytest.raises(  # offline (conftest), a Hub id with no copy in the cache: before any load
        SystemExit,
        match=r"^prompt-aug-eval: error: --model nobody-here/no-such-model: not in the Hugging Face",
    ):
        _eval("nobody-here/no-such-model", suite_dir, tmp_path / "a")
    _eval(tiny_model_dir, suite_dir, tmp_path / "b", "--benchmarks", "amc", "--limit", "1")
    with pytest.raises(
        SystemExit,
        match=r"other settings \(\{'max_tokens': \(16, 8\)\}, as \(before, now\)\); rerun with the earlier "
        r"values to resume them, pass another --output, or --overwrite to discard them$",
    ):
        _eval(tiny_model_dir, suite_dir, tmp_path / "b", "--benchmarks", "amc", "--max_tokens", "8")
    with pytest.raises(  # an evaluation's folder given as the model: one line, and nothing written in it
        SystemExit,
        match=rf"^prompt-aug-eval: error: --model {tmp_path / 'b'}: a folder with no config.json or "
        "adapter_config.json, so no model saved there",
    ):
        main(["--model", str(tmp_path / "b"), "--data_dir", str(suite_dir), "--backend", "hf"])
    assert not (tmp_path / "b" / "eval").exists()


def score_completion(completion, gold, template):
    return score_completions([completion], [gold], [template])[0]


def test_grading_is_strict_and_accepts_any_listed_gold():
    assert score_completion("So the sum is \\boxed{42}.", ["42"], "qwen-math")["correct"]
    assert not score_completion("So the sum is 42.", ["42"], "qwen-math")["correct"]  # no box: wrong
    assert score_completion("\\boxed{0.5}", normalize_gold(["1/3", "\\frac{1}{2}"]), "qwen-math")["correct"]
    assert score_completion("\\boxed{142}", normalize_gold(142.0), "qwen-math")["correct"]
    assert score_completion("\\boxed{1} then \\boxed{7}", ["7"], "qwen-math")["extracted"] == "7"
    tagged = "<think>\nx\n</think>\n<answer>\n\\boxed{7}\n</answer>"
    assert score_completion(tagged, ["7"], "open-r1")["correct"]
    outside = "<think>\n\\boxed{7}\n</think>\n<answer>\n7\n</answer>"
    assert not score_completion(outside, ["7"], "open-r1")["correct"]


def test_summary_macro_micro_and_spread():
    records = [
        {"template": t, "benchmark": b, "run": r, "index": i, "correct": c}
        for t, b, r, i, c in [
            ("a", "aime24", 0, 0, True),
            ("a", "aime24", 1, 0, False),
            ("a", "amc", 0, 0, True),
            ("a", "amc", 0, 1, True),
            ("a", "amc", 1, 0, True),
            ("a", "amc", 1, 1, True),
            ("b", "aime24", 0, 0, False),
            ("b", "aime24", 1, 0, False),
            ("b", "amc", 0, 0, True),
            ("b", "amc", 0, 1, False),
            ("b", "amc", 1, 0, True),
            ("b", "amc", 1, 1, False),
        ]
    ]
    summary = summarize(records, ["aime24", "amc"], ["a", "b"])
    a = summary["results"]["a"]
    assert [r["accuracy"] for r in a["benchmarks"]["aime24"]["runs"]] == [1.0, 0.0]
    assert a["benchmarks"]["aime24"]["std_over_runs"] == pytest.approx(0.5)
    assert (a["macro"], a["micro"]) == (pytest.approx(0.75), pytest.approx(5 / 6))
    assert summary["spread"]["macro"] == pytest.approx(0.75 - 0.25)
    assert summary["std"]["amc"] == pytest.approx(0.25)
    settings = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 10, "n": 1, "runs": 2}
    table = render_tables(summary, ["aime24", "amc"], "m", settings)
    assert "| m | 50.0 | 100.0 | **75.0** | **83.3** |" in table
    assert "| **spread (max − min)** | 50.0 | 50.0 | 50.0 | 50.0 |" in table


def test_pass_at_n_has_its_own_table_in_results_md():
    # one run, 2 samples per question: aime24 q0 any-correct, q1 none; amc q0 any-correct
    records = [
        {"template": "t", "benchmark": b, "run": 0, "index": i, "correct": c}
        for b, i, c in [
            ("aime24", 0, False),
            ("aime24", 0, True),
            ("aime24", 1, False),
            ("aime24", 1, False),
            ("amc", 0, True),
            ("amc", 0, True),
        ]
    ]
    summary = summarize(records, ["aime24", "amc"], ["t"])
    settings = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 10, "n": 2, "runs": 1}
    table = render_tables(summary, ["aime24", "amc"], "m", settings)
    assert "| m | 25.0 | 100.0 | **62.5** | **50.0** |" in table  # accuracy over every sample
    assert "pass@2 (%)" in table
    assert "| t | 50.0 | 100.0 | **75.0** |" in table
    single = render_tables(summary, ["aime24", "amc"], "m", {**settings, "n": 1})
    assert "pass@" not in single


def test_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "completions.jsonl"
    first, second = ({"benchmark": "amc", "template": "qwen-math", "run": 0, "index": i} for i in (0, 1))
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + '\n{"benchmark": ')
    assert read_records(path) == [first, second]
    assert path.read_text().endswith("}\n")


def test_a_torn_last_line_is_cut_in_place_even_when_the_disk_takes_no_more(tmp_path):
    """Cutting the torn line writes nothing: with no room to write (a full disk), every whole record stays."""
    import resource

    path = tmp_path / "completions.jsonl"
    records = [{"benchmark": "amc", "template": "qwen-math", "run": 0, "index": i, "completion": "x" * 1000}
               for i in range(100)]  # fmt: skip
    whole = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(whole + '{"benchmark": "am')
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, limit[1]))  # writes past 50 KB fail, as on a full disk
    try:
        assert read_records(path) == records
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_text() == whole


def test_a_line_torn_inside_a_character_is_cut_and_an_earlier_undecodable_line_is_named(tmp_path):
    path = tmp_path / "completions.jsonl"
    record = {
        "benchmark": "amc",
        "template": "qwen-math",
        "run": 0,
        "index": 0,
        "completion": "x = π/2\u2028",
    }
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
    torn = line[: line.index("π".encode()) + 1]  # the write stopped between the two bytes of π
    path.write_bytes(line + torn)
    assert read_records(path) == [record]
    assert path.read_bytes() == line
    path.write_bytes(torn + b"\n" + line)
    with pytest.raises(
        EvalError, match=rf"^{re.escape(str(path))}, line 1: not UTF-8 text .*delete that line"
    ):
        read_records(path)


def test_callback_logs_eval_metrics(tiny_model_dir, tokenizer, suite_dir):
    from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.train()
    callback = EvalCallback("aime24,amc", every_n_steps=2, data_dir=suite_dir, max_tokens=4)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 1
    callback.on_step_end(None, state, control, model=model, processing_class=tokenizer)
    assert not control.should_log  # not an evaluation step

    state.global_step = 2
    callback.on_step_end(None, state, control, model=model, processing_class=tokenizer)
    assert control.should_log and model.training  # training mode restored
    state.log_history.append({"loss": 0.0, "step": 2})
    logs = {"loss": 0.0}
    callback.on_log(None, state, control, logs=logs)
    keys = {"eval/aime24/accuracy", "eval/amc/accuracy", "eval/macro", "eval/micro"}
    assert keys <= set(logs) and keys <= set(state.log_history[-1])
    assert 0.0 <= logs["eval/macro"] <= 1.0


def test_hf_decoding_takes_no_sampling_setting_from_the_models_generation_config(tiny_model_dir, tmp_path):
    """Qwen2.5 Instruct models ship sampling settings (a repetition penalty, top_k, top_p, temperature) in
    their generation_config.json. vLLM, given its SamplingParams, applies none of them; nor does the hf
    backend, in greedy decoding or in sampling."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from prompt_aug.evaluate import HFBackend

    plain, shipped = tmp_path / "plain", tmp_path / "shipped"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():  # larger weights: the greedy text varies, so that a penalty can change it
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for folder in (plain, shipped):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    config = GenerationConfig.from_pretrained(plain)
    config.update(do_sample=True, repetition_penalty=1.05, temperature=0.7, top_k=20, top_p=0.8)
    config.save_pretrained(shipped)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Compute $2 + 3$."}], tokenize=False, add_generation_prompt=True
    )

    def outputs(folder: Path) -> list:
        backend = HFBackend.load(str(folder), "float32", device="cpu")
        greedy = backend.generate([prompt], [0], max_tokens=24, temperature=0.0, top_p=1.0, n=1)
        sampled = backend.generate([prompt], [3], max_tokens=24, temperature=1.0, top_p=1.0, n=2)
        return [greedy, sampled]

    assert outputs(shipped) == outputs(plain)
    # transformers' own greedy decoding applies the shipped penalty, and it changes the text.
    ids = tokenizer([prompt], return_tensors="pt")
    own = [
        AutoModelForCausalLM.from_pretrained(folder).generate(**ids, max_new_tokens=24, do_sample=False)
        for folder in (plain, shipped)
    ]
    assert not torch.equal(*own)


def test_vllm_backend_builds_requests_with_a_stand_in_vllm(tiny_model_dir, monkeypatch):
    """A stand-in module checks the requests our backend builds (the real engine: tests/engines)."""
    import sys
    import types

    from prompt_aug.evaluate import EvalError, VLLMBackend

    seen: dict = {}

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class LLM:
        def __init__(self, **kwargs):
            seen["engine"] = kwargs
            config = types.SimpleNamespace(max_model_len=kwargs["max_model_len"])
            self.llm_engine = types.SimpleNamespace(model_config=config)

        def generate(self, prompts, params, use_tqdm=True):
            seen["params"] = params
            done = types.SimpleNamespace(text="\\boxed{1}", finish_reason="stop")
            return [types.SimpleNamespace(outputs=[done] * p.n) for p in params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    backend = VLLMBackend(str(tiny_model_dir), max_model_len=64, seed=3)
    assert seen["engine"]["max_model_len"] == 64 and seen["engine"]["seed"] == 3
    out = backend.generate(
        ["short", "a bit longer prompt"], [1, 2], max_tokens=100, temperature=0.0, top_p=0.9, n=1
    )
    assert out == [[("\\boxed{1}", "stop")], [("\\boxed{1}", "stop")]]
    first, second = seen["params"]
    assert first.temperature == 0.0 and first.top_p == 1.0 and first.seed is None
    assert first.max_tokens < 64 and second.max_tokens < first.max_tokens  # cut to fit the context
    assert set(backend.stop_ids) >= {
        backend.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    }
    backend.generate(["x"], [5], max_tokens=10, temperature=0.7, top_p=0.9, n=4)
    assert (seen["params"][0].seed, seen["params"][0].n, seen["params"][0].max_tokens) == (5, 4, 10)
    with pytest.raises(EvalError, match="max_model_len"):
        backend.generate(["word " * 200], [0], max_tokens=10, temperature=0.0, top_p=1.0, n=1)


def test_help_gives_each_options_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line an option: argparse would wrap at a hyphen
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for shown in ("(the paper: 5). (default: 1)", "per completion. (default: 3000)", "(default: bfloat16)",
                  "mass kept. (default: 1.0)", "(default: qwen-math)"):  # fmt: skip
        assert shown in text, shown
    assert "(default: None)" not in text and "(default: False)" not in text
    # What the help promises is there: both backends' batch size, resuming, the column flags it points to.
    assert "(default: 16 for hf, 1024 for vllm)" in text and "(see below)" not in text
    assert "gold column (--question_column, --answer_column)" in text
    assert "A rerun into the same folder resumes where it stopped." in text


def test_a_resume_with_another_batch_size_keeps_every_completion_once(tiny_model_dir, suite_dir, tmp_path):
    """An evaluation stopped part way and resumed with another --batch_size (a smaller one after running out
    of memory, say) generates only what is missing, and ends with each question answered once, as an
    uninterrupted one."""
    flags = ("--benchmarks", "aime24,amc,minerva", "--runs", "2")
    whole = _eval(tiny_model_dir, suite_dir, tmp_path / "whole", *flags, "--batch_size", "4")
    out = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole", out)
    records = (out / "completions.jsonl").read_text().splitlines(keepends=True)
    (out / "completions.jsonl").write_text("".join(records[:5]))  # stopped after 5 of 14
    (out / "results.json").unlink()
    (out / "results.md").unlink()
    resumed = _eval(tiny_model_dir, suite_dir, out, *flags, "--batch_size", "3")
    assert resumed["new_completions"] == 14 - 5
    keys = [(r["benchmark"], r["run"], r["index"]) for r in _lines(out / "completions.jsonl")]
    assert len(keys) == len(set(keys)) == 14
    assert sorted(keys) == sorted(
        (r["benchmark"], r["run"], r["index"]) for r in _lines(tmp_path / "whole" / "completions.jsonl")
    )
    row, again = whole["results"]["qwen-math"], resumed["results"]["qwen-math"]
    assert {b: e["n"] for b, e in again["benchmarks"].items()} == {"aime24": 6, "amc": 4, "minerva": 4}
    assert again["n"] == row["n"] == 14


class SmallMemory:
    """An hf backend whose memory holds ``fits`` prompts at a time, as a GPU holds so many sequences."""

    name, default_batch_size = "hf", 16

    def __init__(self, fits: int) -> None:
        self.fits, self.asked = fits, []

    def generate(self, prompts, seeds, *, max_tokens, temperature, top_p, n):
        if len(prompts) > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.asked += prompts
        return [[("so \\boxed{42}", "stop")] * n for _ in prompts]


def test_running_out_of_memory_keeps_the_completions_and_names_the_batch_size_to_lower(tokenizer, tmp_path):
    """A batch that does not fit in the accelerator's memory stops the evaluation in one line that names
    --batch_size; what earlier batches made is kept, and a rerun with a smaller batch size resumes from it."""
    from prompt_aug.evaluation.benchmarks import Problem, parse_templates
    from prompt_aug.evaluation.runner import generate_and_grade

    problems = [Problem("sums", k, f"Compute {k} + {42 - k}." + " Think." * k, ["42"]) for k in range(5)]
    templates = parse_templates("qwen-math")
    path = tmp_path / "completions.jsonl"

    def run(backend: SmallMemory, batch_size: int) -> list[dict]:
        return generate_and_grade(
            backend, tokenizer, problems, templates, path, batch_size=batch_size, progress=False
        )

    first = SmallMemory(fits=5)
    run(first, batch_size=2)  # 3 batches of at most 2: they fit
    assert len(read_records(path)) == 5
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:2]))  # as if stopped after a batch
    with pytest.raises(EvalError) as error:
        run(SmallMemory(fits=1), batch_size=2)
    assert str(error.value) == (
        f"out of memory generating 2 prompts x 1 sample(s) of up to 3000 new tokens; the completions made so "
        f"far are kept in {path}: rerun the same command with a smaller --batch_size (this one: 2), which "
        "resumes from them"
    )
    assert len(read_records(path)) == 2
    smaller = SmallMemory(fits=1)
    records = run(smaller, batch_size=1)
    assert len(smaller.asked) == 3 and len(records) == 5 and all(r["correct"] for r in records)
    assert sorted(r["index"] for r in read_records(path)) == [0, 1, 2, 3, 4]


def test_dtype_defaults_to_bfloat16_and_results_state_the_protocol(tiny_model_dir, suite_dir, tmp_path):
    from prompt_aug.evaluate import parse_args

    assert parse_args(["--model", "m"]).dtype == "bfloat16"
    out = tmp_path / "eval"
    results = _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc")
    table = (out / "results.md").read_text()
    protocol = next(line for line in table.splitlines() if line.startswith("Protocol:"))
    parts = ("backend hf", "dtype bfloat16", "template `qwen-math`", "max_tokens 16", "runs 1")
    for part in (*parts, "every question"):
        assert part in protocol, part
    # A 1-run hf table must say it is not the paper's protocol, and why.
    assert "**Not the paper's protocol**" in protocol and "runs 1 (paper: 5)" in protocol
    assert "backend hf (paper: vllm)" in protocol and results["paper_protocol"] is False
    assert results["settings"]["dtype"] == "bfloat16" and results["settings"]["backend"] == "hf"


def test_a_limited_run_says_so_in_the_table(tiny_model_dir, suite_dir, tmp_path):
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--limit", "1")
    table = (out / "results.md").read_text()
    assert f"| {tiny_model_dir.name} (first 1 questions per benchmark) |" in table
    assert "**--limit 1: only the first 1 questions per benchmark**" in table
    assert "limit 1 (paper: every question)" in table


def test_a_second_evaluation_into_a_folder_in_use_is_refused(tiny_model_dir, suite_dir, tmp_path):
    """While an evaluation holds its folder (here: a lock taken as one takes it), another into the same
    folder stops in one line and writes nothing; once the folder is free, the same command runs."""
    import fcntl

    out = tmp_path / "eval"
    out.mkdir()
    folder = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(SystemExit, match="another evaluation is writing there"):
            _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24", "--limit", "1")
        assert list(out.iterdir()) == []
    finally:
        os.close(folder)
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24", "--limit", "1")
    assert (out / "results.json").is_file()


def test_the_paper_protocol_is_recognised_and_any_departure_named():
    from prompt_aug.evaluate import PAPER_PROTOCOL, protocol_line

    paper = protocol_line(dict(PAPER_PROTOCOL))
    assert paper.endswith(
        "This is the paper's protocol (mean of 5 greedy vLLM runs in bfloat16, stopping at EOS only)."
    )
    assert "stop turn (paper: eos)" in protocol_line({**PAPER_PROTOCOL, "stop": "turn"})
    line = protocol_line({**PAPER_PROTOCOL, "dtype": "auto"})
    assert "**Not the paper's protocol**: dtype auto (paper: bfloat16)." in line
    line = protocol_line({**PAPER_PROTOCOL, "max_model_len": 1024})
    assert "**Not the paper's protocol**: max_model_len 1024 (paper: 4096, or room for" in line
    # Everything the paper's but the benchmarks: one of the five, or a question set of one's own.
    # A question set of one's own by its file name: the table goes into the model card.
    for benchmarks, shown in (("aime24", "aime24"), ("/data/sums.jsonl", "sums.jsonl")):
        line = protocol_line({**PAPER_PROTOCOL, "benchmarks": benchmarks})
        assert f"**Not the paper's protocol**: benchmarks {shown} (paper: aime24,amc," in line


def test_a_copy_of_the_suite_with_other_question_counts_is_not_the_papers_protocol(
    tiny_model_dir, suite_dir, tmp_path
):
    from prompt_aug.evaluate import PAPER_PROTOCOL, protocol_line

    suite = {"aime24": 30, "amc": 83, "math500": 500, "minerva": 272, "olympiadbench": 675}
    line = protocol_line({**PAPER_PROTOCOL, "questions": {**suite, "aime24": 3}})
    assert "**Not the paper's protocol**: questions aime24 3 (paper: 30). Do not" in line
    assert "This is the paper's protocol" in protocol_line({**PAPER_PROTOCOL, "questions": suite})
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc")
    table = (out / "results.md").read_text()
    assert "questions aime24 3 (paper: 30); questions amc 2 (paper: 83)." in table


def test_a_table_of_a_question_set_does_not_pass_for_the_papers(tiny_model_dir, tmp_path):
    """The command's own verdict (``results.json``'s ``paper_protocol``) on a question set of one's own."""
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n")
    results = _eval(
        tiny_model_dir, tmp_path, tmp_path / "out", "--benchmarks", str(questions), "--max_tokens", "2"
    )
    assert results["paper_protocol"] is False
    assert "benchmarks sums.jsonl (paper: aime24," in (tmp_path / "out" / "results.md").read_text()


def test_training_evaluation_refuses_sharded_models_naming_the_keys():
    from prompt_aug.evaluate import sharding_error

    for setup in (("FSDP", False), ("DEEPSPEED", True)):
        message = sharding_error(*setup)
        assert message and "eval_every_steps" in message and "prompt-aug-eval" in message
    assert sharding_error("DEEPSPEED", False) is None and sharding_error("MULTI_GPU", False) is None


def test_callback_evaluates_a_share_of_the_questions_per_process(tiny_model_dir, tokenizer, suite_dir):
    # Outside a distributed run the gather is the identity, so each call sees only its own share.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    callback = EvalCallback("aime24,amc,minerva", every_n_steps=1, data_dir=suite_dir, max_tokens=2)
    shares = [callback.evaluate_model(model, tokenizer, rank, 2)["eval/questions"] for rank in (0, 1)]
    assert shares == [4.0, 3.0]  # 7 questions, every other one
    assert callback.evaluate_model(model, tokenizer)["eval/questions"] == 7.0


@pytest.mark.slow
def test_two_processes_share_the_evaluation_during_training(suite_dir, tmp_path):
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    cmd = [
        *torchrun(2),
        "-m", "prompt_aug.train", "--config", str(repo / "recipes/smoke/tiny_cpu.yaml"),
        "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no", "--max_completion_length", "8",
        "--eval_benchmarks", "aime24", "amc", "minerva", "--eval_every_steps", "2",
        "--eval_data_dir", str(suite_dir), "--eval_max_tokens", "4",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, check=False, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluated 7 questions on 2 processes (4 + 3)" in result.stderr
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    evaluated = [h for h in history if "eval/macro" in h]
    assert [h["step"] for h in evaluated] == [2] and evaluated[0]["eval/questions"] == 7.0


def test_vllm_context_follows_the_models_config(tiny_model_dir):
    from prompt_aug.evaluate import model_context_length, vllm_max_model_len

    context = model_context_length(str(tiny_model_dir))
    assert context == 2048  # the smoke model's max_position_embeddings
    # A context the model lacks is never asked for (vLLM refuses it), however long the run.
    assert vllm_max_model_len(None, 100, 3000, context) == 2048
    assert vllm_max_model_len(None, 100, 500, context) == 600


def test_a_context_that_can_cut_a_completion_short_is_recorded_and_not_the_papers_protocol(
    tiny_model_dir, tmp_path, monkeypatch
):
    """A stand-in vLLM (the real engine: tests/engines) takes the requests; the command records the context
    when it leaves a prompt less room than --max_tokens, and a folder keeps its context as it keeps its other
    settings."""
    import types

    asked: list[int] = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class LLM:
        def __init__(self, **kwargs):
            config = types.SimpleNamespace(max_model_len=kwargs["max_model_len"])
            self.llm_engine = types.SimpleNamespace(model_config=config)

        def generate(self, prompts, params, use_tqdm=True):
            asked.extend(p.max_tokens for p in params)
            done = types.SimpleNamespace(text="\\boxed{2}", finish_reason="stop")
            return [types.SimpleNamespace(outputs=[done] * p.n) for p in params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n")

    def run(out: Path, *extra: str) -> tuple[dict, str]:
        asked.clear()
        results = run_evaluation(
            parse_args(["--model", str(tiny_model_dir), "--benchmarks", str(questions), "--backend", "vllm",
                        "--max_tokens", "1000", "--output", str(out), "--no_progress", *extra])
        )  # fmt: skip
        return results, (out / "results.md").read_text()

    # The model's context (2048) leaves the prompt room for 1000 new tokens: nothing is cut, nothing recorded.
    results, table = run(tmp_path / "whole")
    assert asked == [1000] and results["settings"]["max_model_len"] is None and "max_model_len" not in table
    results, table = run(tmp_path / "cut", "--max_model_len", "512")
    assert len(asked) == 1 and asked[0] < 1000  # the prompt's room in 512 tokens
    assert results["settings"]["max_model_len"] == 512 and results["paper_protocol"] is False
    assert "max_model_len 512 (paper: 4096, or room for max_tokens after every prompt)" in table
    with pytest.raises(EvalError, match=r"other settings \(\{'max_model_len': \(None, 512\)\}"):
        run(tmp_path / "whole", "--max_model_len", "512")
    with pytest.raises(EvalError, match=r"other settings \(\{'max_model_len': \(512, 256\)\}"):
        run(tmp_path / "cut", "--max_model_len", "256")
    # Past the tiny model's 2048 positions, as vLLM runs a context only with this set.
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    run(tmp_path / "whole", "--max_model_len", "4096")  # a larger context cuts nothing either: it resumes
    # The paper's context, 4096 tokens, cuts a completion of 4090 tokens after any prompt, as the paper did.
    results, table = run(tmp_path / "paper", "--max_model_len", "4096", "--max_tokens", "4090")
    assert len(asked) == 1 and asked[0] < 4090 and results["settings"]["max_model_len"] is None
    assert "max_model_len" not in table


def test_a_question_set_of_ones_own_from_jsonl_parquet_csv_or_a_saved_folder(tiny_model_dir, tmp_path):
    import datasets
    import pandas as pd

    rows = [{"question": "Compute $2 + 3$.", "answer": 5}, {"question": "Compute $1 + 1$.", "answer": "2"}]
    pd.DataFrame(rows).to_json(tmp_path / "sums.jsonl", orient="records", lines=True)
    pd.DataFrame(rows).astype(str).to_parquet(tmp_path / "sums.parquet")
    pd.DataFrame(rows).rename(columns={"question": "problem"}).to_csv(tmp_path / "sums.csv", index=False)
    datasets.Dataset.from_pandas(pd.DataFrame(rows).astype(str)).save_to_disk(str(tmp_path / "sums-folder"))
    for name in ("sums.jsonl", "sums.parquet", "sums.csv", "sums-folder"):
        problems = load_benchmark(str(tmp_path / name))
        assert [(p.question, p.gold) for p in problems] == [
            ("Compute $2 + 3$.", ["5"]),
            ("Compute $1 + 1$.", ["2"]),
        ]

    out = tmp_path / "eval"
    results = run_evaluation(
        parse_args(["--model", str(tiny_model_dir), "--benchmarks", str(tmp_path / "sums.jsonl"),
                    "--backend", "hf", "--max_tokens", "4", "--output", str(out), "--no_progress"])
    )  # fmt: skip
    assert results["benchmarks"] == [str(tmp_path / "sums.jsonl")]
    assert "| Model | sums | **Macro** | **Micro** |" in (out / "results.md").read_text()
    assert len(read_records(out / "completions.jsonl")) == 2


def test_question_set_errors_name_the_file_and_column(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"q": "Compute $2 + 3$.", "answer": "5"}\n')
    with pytest.raises(
        EvalError, match=r"bad.jsonl: none of the columns \['question', .*'q'.*--question_column"
    ):
        load_benchmark(str(tmp_path / "bad.jsonl"))
    (tmp_path / "nogold.jsonl").write_text('{"question": "Compute $2 + 3$.", "gold": "5"}\n')
    with pytest.raises(EvalError, match=r"none of the columns \['answer', .*'gold'.*--answer_column"):
        load_benchmark(str(tmp_path / "nogold.jsonl"))
    with pytest.raises(EvalError, match="missing.jsonl: no such file"):
        load_benchmark(str(tmp_path / "missing.jsonl"))
    with pytest.raises(EvalError, match="unknown benchmark"):
        parse_benchmarks("math5000")


def test_a_mistyped_benchmark_or_question_set_names_what_was_meant(suite_dir, tmp_path, monkeypatch):
    """A suite benchmark under another spelling (its split's name, capitals) is named with the one meant; a
    local path that is not there is "no such file or folder" (not a Hub dataset offline), with a near name
    where its folder has one; a file of another kind and a single split as --data_dir say what to give."""
    with pytest.raises(EvalError) as error:
        parse_benchmarks("olympiad_bench,AIME24,gsm8k")
    assert str(error.value).startswith(
        "unknown benchmark(s) ['olympiad_bench', 'AIME24', 'gsm8k'] (did you mean olympiadbench for "
        "olympiad_bench, aime24 for AIME24?); known: aime24, amc, math500, minerva, olympiadbench, or "
    )
    with pytest.raises(EvalError, match=r"^unknown benchmark\(s\) \['gsm8k'\]; known: "):
        parse_benchmarks("gsm8k")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "heldout.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    (tmp_path / "sets" / "saved").mkdir()
    (tmp_path / "notes.txt").write_text("1+1?\n")
    for name in ("./missing", "sets/held/out", "sets/missing"):
        with pytest.raises(EvalError) as error:
            load_benchmark(name)
        where = tmp_path / name.removeprefix("./")
        assert str(error.value) == (
            f"question set {name}: no such file or folder (resolved to {where}); fix the path, or give a Hub "
            "dataset id (owner/name)"
        )
    with pytest.raises(
        EvalError, match=r"^question set sets/savd: no such file or folder .*; did you mean 'sets/saved'\?$"
    ):
        load_benchmark("sets/savd")
    with pytest.raises(
        EvalError,
        match=r"^question set sets/heldot.jsonl: no such file; did you mean 'sets/heldout.jsonl'\?$",
    ):
        load_benchmark("sets/heldot.jsonl")
    with pytest.raises(
        EvalError, match=r"^question set notes.txt: a file of a kind not read; give a .*\.jsonl.* file"
    ):
        load_benchmark("notes.txt")
    with pytest.raises(EvalError) as error:
        load_benchmark("aime24", suite_dir / "aime")
    assert str(error.value) == (
        f"--data_dir {suite_dir / 'aime'} holds a single Dataset (one split); give the folder that holds it, "
        f"{suite_dir}"
    )


def test_one_question_set_given_twice_or_two_sharing_a_column_are_refused(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Counted twice, one set would weigh double in macro and micro; two sets of one stem would be two columns
    of one name."""
    monkeypatch.chdir(tmp_path)
    line = json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n"
    (tmp_path / "other").mkdir()
    for path in ("dup.jsonl", "other/dup.jsonl", "AMC.jsonl"):
        (tmp_path / path).write_text(line)
    cases = {
        "dup.jsonl,./dup.jsonl": "--benchmarks: dup.jsonl and ./dup.jsonl are one question set; give it once",
        f"dup.jsonl,{tmp_path}/dup.jsonl": f"dup.jsonl and {tmp_path}/dup.jsonl are one question set",
        "dup.jsonl,other/dup.jsonl": "dup.jsonl and other/dup.jsonl would share the column 'dup' of the",
        "amc,AMC.jsonl": "amc and AMC.jsonl would share the column 'AMC' of the table; rename a file",
    }
    for benchmarks, expected in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            main(["--model", str(tiny_model_dir), "--benchmarks", benchmarks, "--backend", "hf",
                  "--output", str(tmp_path / "out"), "--no_progress"])  # fmt: skip
        message = str(exit_info.value.code)
        assert message.startswith("prompt-aug-eval: error: ") and "\n" not in message, message
        assert expected in message, message
    assert not (tmp_path / "out").exists()


def _truncate_arrow_files(folder: Path) -> None:
    """Cut every arrow file under ``folder`` to a few bytes, as an interrupted copy leaves them."""
    for arrow in folder.rglob("*.arrow"):
        arrow.write_bytes(b"cut")


def test_a_folder_that_is_no_whole_save_to_disk_copy_is_one_line_naming_it(tiny_model_dir, tmp_path):
    """A question set or a suite folder that datasets cannot load (a folder of other files, a truncated copy)
    is one line naming the folder and datasets' complaint, from the function and from the command."""
    import datasets

    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a dataset")
    cut = tmp_path / "cut"
    datasets.Dataset.from_list([{"question": "1 + 1?", "answer": "2"}]).save_to_disk(str(cut))
    _truncate_arrow_files(cut)
    unreadable = r": not a readable save_to_disk folder \("
    with pytest.raises(SourceError, match=rf"^question set {re.escape(str(cut))}{unreadable}ArrowInvalid: "):
        load_benchmark(str(cut))
    plain = re.escape(str(tmp_path / "plain"))
    with pytest.raises(SourceError, match=rf"^--data_dir {plain}{unreadable}FileNotFoundError: "):
        load_benchmark("aime24", data_dir=tmp_path / "plain")
    with pytest.raises(
        SystemExit,
        match=rf"^prompt-aug-eval: error: question set {re.escape(str(cut))}{unreadable}[^\n]*whole$",
    ):
        main(["--model", str(tiny_model_dir), "--benchmarks", str(cut), "--backend", "hf",
              "--output", str(tmp_path / "out"), "--no_progress"])  # fmt: skip


@pytest.mark.parametrize(
    ("benchmarks", "what"),
    [("aime24", "suite lkevinzc/math-eval"), ("someone/questions", "question set someone/questions")],
)
def test_an_unreachable_hub_fails_the_evaluation_at_once(
    benchmarks, what, tiny_model_dir, tmp_path, unreachable_hub
):
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(tiny_model_dir), "--benchmarks", benchmarks, "--backend", "hf",
              "--output", str(tmp_path / "out"), "--no_progress"])  # fmt: skip
    message = str(exit_info.value.code)
    assert message.startswith(
        f"prompt-aug-eval: error: {what}: cannot reach the Hugging Face Hub (http://127.0.0.1:9)"
    ), message
    assert "HF_HUB_OFFLINE=1" in message
    assert time.monotonic() - started < 30  # not the client's retries


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("templates_file", r"^templates_file: no such file .*nosuch\.yaml"),
        ("malformed", r"^/.*/bad\.jsonl: cannot be read: ArrowInvalid: JSON parse error"),
        ("empty", r"^/.*/empty\.jsonl: holds no rows"),
        ("parquet", r"^/.*/bad\.parquet: cannot be read: ArrowInvalid: "),
        ("model", r"^--model: no such folder 'learnn/'"),
    ],
)
def test_bad_input_to_the_evaluation_is_one_line_naming_it(case, expected, tiny_model_dir, tmp_path, capsys):
    """Files that do not parse or hold nothing, a missing template bank and a mistyped model folder stop
    the command in one line naming the culprit, not a traceback."""
    good = tmp_path / "sums.jsonl"
    good.write_text(json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n")
    files = {
        "malformed": ("bad.jsonl", '{"question": "a", "answer": "1"}\n{bad\n'),
        "empty": ("empty.jsonl", ""),
        "parquet": ("bad.parquet", "not parquet"),
    }
    benchmarks, model, extra = str(good), str(tiny_model_dir), []
    if case in files:
        name, text = files[case]
        (tmp_path / name).write_text(text)
        benchmarks = str(tmp_path / name)
    elif case == "templates_file":
        extra = ["--templates_file", str(tmp_path / "nosuch.yaml")]
    else:
        model = "learnn/"
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", model, "--benchmarks", benchmarks, "--backend", "hf", "--max_tokens", "2",
              "--output", str(tmp_path / "out"), "--no_progress", *extra])  # fmt: skip
    message = str(exit_info.value.code)
    assert message.startswith("prompt-aug-eval: error: ") and "\n" not in message, message
    assert re.search(expected, message.removeprefix("prompt-aug-eval: error: ")), message


def test_a_model_without_a_chat_template_is_one_line_and_chat_template_gives_it_one(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    model = tmp_path / "base"
    shutil.copytree(tiny_model_dir, model)
    (model / "chat_template.jinja").unlink()
    tokenizer = AutoTokenizer.from_pretrained(model)
    assert tokenizer.chat_template is None  # a base model's tokenizer
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n")

    def run(out: Path, *extra: str) -> dict:
        main(["--model", str(model), "--benchmarks", str(questions), "--backend", "hf", "--max_tokens", "2",
              "--output", str(out), "--no_progress", *extra])  # fmt: skip
        return json.loads((out / "results.json").read_text())

    with pytest.raises(SystemExit) as exit_info:
        run(tmp_path / "none")
    assert exit_info.value.code == (
        f"prompt-aug-eval: error: --model {model}: its tokenizer has no chat template (a base model?), and "
        "prompts render through one; pass --chat_template chatml (or a Jinja template, or the path of a "
        ".jinja file)"
    )
    assert not (tmp_path / "none").exists()  # refused before anything is written
    with pytest.raises(SystemExit, match=r"^prompt-aug-eval: error: chat_template: 'nosuch' is neither"):
        run(tmp_path / "none", "--chat_template", "nosuch")
    results = run(tmp_path / "chatml", "--chat_template", "chatml")
    (record,) = read_records(tmp_path / "chatml" / "completions.jsonl")
    assert record["prompt"] == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
        "<|im_end|>\n<|im_start|>user\nWhat is $1 + 1$?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert results["settings"]["chat_template"] == "chatml"
    assert "chat_template chatml (paper: the model's own)" in (tmp_path / "chatml" / "results.md").read_text()
    (tmp_path / "template.jinja").write_text(AutoTokenizer.from_pretrained(tiny_model_dir).chat_template)
    results = run(tmp_path / "file", "--chat_template", str(tmp_path / "template.jinja"))
    assert read_records(tmp_path / "file" / "completions.jsonl")[0]["prompt"] == record["prompt"]


def test_a_model_folder_saved_without_its_tokenizer_is_refused_in_one_line(tiny_model_dir, tmp_path):
    """A folder of weights without tokenizer files loads in transformers as an empty tokenizer (every prompt
    no tokens): the evaluation stops before writing anything, naming the folder, not its chat template."""
    model = tmp_path / "weights-only"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, model / name)
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": "What is $1 + 1$?", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(model), "--benchmarks", str(questions), "--backend", "hf", "--max_tokens", "2",
              "--output", str(tmp_path / "out"), "--no_progress", "--chat_template", "chatml"])  # fmt: skip
    assert exit_info.value.code == (
        f"prompt-aug-eval: error: --model {model}: its tokenizer turns text into no tokens (no tokenizer "
        "files beside the weights?); save the tokenizer into that folder (tokenizer.save_pretrained) or "
        "point at a folder that has one"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--dtype", "bf16"], "argument --dtype: invalid choice: 'bf16'"),
        (["--max_tokens", "0"], "--max_tokens must be at least 1 (got 0)"),
        (["--limit", "-1"], "--limit must be at least 1 (got -1)"),
        (["--output", "FILE"], "is a file; give a folder"),
        (["--output", "FILE/sub"], "FILE/sub lies under the file "),
        (
            ["--chat_template_kwargs", '{"enable_thinking": false, "tokenize": true}'],
            "argument --chat_template_kwargs: 'tokenize' is set by the prompt rendering itself",
        ),
        (["--chat_template_kwargs", '{"add_generation_prompt": false}'], "'add_generation_prompt' is set by"),
    ],
)
def test_flags_out_of_range_are_refused_before_anything_loads(flags, expected, tmp_path, capsys):
    (tmp_path / "FILE").write_text("a file\n")
    flags = [str(tmp_path / f) if f.startswith("FILE") else f for f in flags]
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", "some/model", *flags])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err


def test_a_file_where_the_default_output_goes_is_refused_before_anything_loads(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "eval").write_text("my own notes\n")  # where --output goes by default: <model>/eval
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", str(model)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert f"--output (by default, from --model {model}) {model / 'eval'} is a file; give a folder" in err
    assert (model / "eval").read_text() == "my own notes\n"


def test_a_question_set_is_read_as_training_reads_it(tmp_path, caplog):
    """A conversation column gives its user turn; a row with no gold answer (an empty CSV cell) or no
    question is left out and counted in the log, not asked or graded against "None"; the rows kept keep
    their row numbers."""
    conversations = tmp_path / "chats.jsonl"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute $1 + 2$."}]
    conversations.write_text(json.dumps({"prompt": chat, "answer": "3"}) + "\n")
    (problem,) = load_benchmark(str(conversations), question_column="prompt")
    assert problem.question == "Compute $1 + 2$." and problem.gold == ["3"]
    gaps = tmp_path / "gaps.csv"
    gaps.write_text("question,answer\nCompute $1 + 1$.,2\nCompute $2 + 2$.,\n,5\nCompute $3 + 3$.,6\n")
    with caplog.at_level("WARNING", logger="prompt_aug.evaluate"):
        problems = load_benchmark(str(gaps))
    assert [(p.index, p.question, p.gold) for p in problems] == [
        (0, "Compute $1 + 1$.", ["2"]), (3, "Compute $3 + 3$.", ["6"])
    ]  # fmt: skip
    assert "2 of 4 rows have no question or no gold answer and are left out" in caplog.text
    # --limit counts the questions kept, not the rows read
    assert [p.index for p in load_benchmark(str(gaps), limit=2)] == [0, 3]
    assert [p.index for p in load_benchmark(str(gaps), limit=1)] == [0]
    gaps.write_text("question,answer\nCompute $2 + 2$.,\n")
    with pytest.raises(EvalError, match="no row has both a question and a gold answer"):
        load_benchmark(str(gaps))
    words = tmp_path / "words.csv"  # words pandas takes for missing by default are answers here
    words.write_text("question,answer\nWhich option holds?,None\nIs the limit defined?,NA\n")
    assert [p.gold for p in load_benchmark(str(words))] == [["None"], ["NA"]]
    named = tmp_path / "named.csv"  # a gold column named by the flag is read as written, as a guessed one is
    named.write_text("q,gold\nHow big?,123456789012345678\nWhich code?,007\n")
    assert [p.gold for p in load_benchmark(str(named), question_column="q", answer_column="gold")] == [
        ["123456789012345678"],
        ["007"],
    ]


def test_a_question_set_with_other_column_names_is_evaluated_through_the_mapping(tiny_model_dir, tmp_path):
    rows = [
        {"statement": "Compute $2 + 3$.", "final": 5, "worked": "So $2 + 3 = \\boxed{5}$."},
        {"statement": "Compute $1 + 1$.", "final": 2, "worked": "Hence \\boxed{2}."},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(
        EvalError, match=r"none of the columns \['question', .*'statement'.*--question_column"
    ):
        load_benchmark(str(path))
    problems = load_benchmark(str(path), question_column="statement", answer_column="final")
    assert [(p.question, p.gold) for p in problems] == [
        ("Compute $2 + 3$.", ["5"]),
        ("Compute $1 + 1$.", ["2"]),
    ]
    (tmp_path / "math.jsonl").write_text(
        "".join(json.dumps({"problem": r["statement"], "solution": r["worked"]}) + "\n" for r in rows)
    )
    problems = load_benchmark(str(tmp_path / "math.jsonl"), answer_column="solution")  # the boxed answer
    assert [p.gold for p in problems] == [["5"], ["2"]]

    out = tmp_path / "eval"
    main([
        "--model", str(tiny_model_dir), "--benchmarks", str(path), "--question_column", "statement",
        "--answer_column", "final", "--backend", "hf", "--max_tokens", "4", "--output", str(out),
        "--no_progress",
    ])  # fmt: skip
    records = read_records(out / "completions.jsonl")
    assert sorted(r["index"] for r in records) == [0, 1]
    assert "| Model | mine | **Macro** | **Micro** |" in (out / "results.md").read_text()


def test_a_question_set_is_read_with_the_column_names_training_guesses(tmp_path):
    from prompt_aug.data import load_math_dataset

    path = tmp_path / "qa.jsonl"
    rows = [
        {"query": "Compute $2 + 3$.", "ground_truth": "5"},
        {"query": "Compute $1 + 1$.", "ground_truth": "2"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    problems = load_benchmark(str(path))
    assert [(p.question, p.gold) for p in problems] == [
        ("Compute $2 + 3$.", ["5"]),
        ("Compute $1 + 1$.", ["2"]),
    ]
    rows, _ = load_math_dataset(str(path))  # training reads the same file to the same questions and golds
    assert [(r["question"], r["answer"]) for r in rows] == [
        ("Compute $2 + 3$.", "5"),
        ("Compute $1 + 1$.", "2"),
    ]


def test_callback_evaluates_a_question_set(tiny_model_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "sums.jsonl"
    path.write_text('{"question": "Compute $2 + 3$.", "answer": "5"}\n')
    metrics = EvalCallback(str(path), every_n_steps=1, max_tokens=4).evaluate_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer
    )
    # The key holds the file's stem, not its path: the same on every machine, and nothing for W&B to nest.
    assert set(metrics) == {"eval/sums/accuracy", "eval/macro", "eval/micro", "eval/questions"}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "sums.jsonl").write_text(path.read_text())
    with pytest.raises(EvalError, match=r"would log under one name; rename a file"):
        EvalCallback([str(path), str(tmp_path / "other" / "sums.jsonl")])
    for key, value in (
        ("batch_size", 0),
        ("batch_size", -1),
        ("max_tokens", 0),
    ):  # else at the first evaluation
        with pytest.raises(EvalError, match=rf"^{key}: {value} is not a whole number of at least 1$"):
            EvalCallback(str(path), **{key: value})


def test_stop_eos_grades_what_the_model_writes_after_ending_its_turn_as_the_papers_evaluator(tmp_path):
    model = build_turn_then_eos_model(tmp_path / "turn-then-eos")
    questions = tmp_path / "nine.jsonl"
    questions.write_text(json.dumps({"question": "What is $4 + 5$?", "answer": "9"}) + "\n")

    def run(*extra: str) -> tuple[dict, dict, str]:
        out = tmp_path / ("eval" + "".join(extra))
        results = _eval(model, tmp_path, out, "--benchmarks", str(questions), "--dtype", "float32", *extra)
        (record,) = _lines(out / "completions.jsonl")
        return results, record, (out / "results.md").read_text()

    # Ours (the default): the completion ends at <|im_end|>; "7" has no box, so strict grading finds none.
    results, record, table = run()
    assert (record["completion"], record["finish_reason"], record["correct"]) == ("7", "stop", False)
    assert results["settings"]["stop"] == "turn" and "stop turn (paper: eos)" in table
    # The paper's rule: generation runs on to <|endoftext|>; the box written after the turn's end is graded.
    results, record, table = run("--stop", "eos")
    assert (record["completion"], record["finish_reason"]) == ("7\\boxed{9}", "stop")
    assert record["extracted"] == "9" and record["correct"] is True
    assert results["settings"]["stop"] == "eos" and "stop eos" in table and "(paper: eos)" not in table


def test_a_resume_grades_again_against_a_corrected_gold_and_asks_an_edited_question_again(tmp_path):
    """Completions stored for a question set that has changed since: a corrected gold answer grades the
    stored completion again (no new generation); an edited question is asked again, its old completion no
    longer counted."""
    model = build_turn_then_eos_model(tmp_path / "turn-then-eos")  # answers \boxed{9} to anything
    questions, out = tmp_path / "sums.jsonl", tmp_path / "eval"

    def run(rows: list[dict]) -> tuple[dict, list[dict]]:
        questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
        results = _eval(model, tmp_path, out, "--benchmarks", str(questions), "--dtype", "float32",
                        "--stop", "eos")  # fmt: skip
        return results, _lines(out / "completions.jsonl")

    rows = [{"question": "What is $4 + 5$?", "answer": "8"}, {"question": "What is $3 + 3$?", "answer": "6"}]
    results, records = run(rows)
    assert results["new_completions"] == 2 and [r["correct"] for r in records] == [False, False]
    assert results["results"]["qwen-math"]["micro"] == 0.0
    rows[0]["answer"] = "9"  # the gold corrected
    results, records = run(rows)
    assert results["new_completions"] == 0 and results["results"]["qwen-math"]["micro"] == 0.5
    # The file says so too: the record's gold and verdict are today's.
    assert [(r["gold"], r["correct"]) for r in records] == [(["9"], True), (["6"], False)]
    rows[1]["question"] = "What is $4 + 4$?"  # the question edited
    results, records = run(rows)
    assert results["new_completions"] == 1 and results["results"]["qwen-math"]["n"] == 2
    assert results["results"]["qwen-math"]["micro"] == 0.5
    # The old question's completion is gone from the file, the new one's is there.
    assert len(records) == 2 and "What is $3 + 3$?" not in "".join(r["prompt"] for r in records)
    assert records[-1]["prompt"].count("What is $4 + 4$?") == 1


def test_a_resume_grades_again_what_another_grader_graded_and_keeps_its_own_verdicts(tmp_path):
    """A verdict stored by another grader (an older package or math-verify) is graded again on resume, with
    no new generation; one of today's grader stands as stored."""
    from prompt_aug.evaluation.runner import grader_version

    model = build_turn_then_eos_model(tmp_path / "turn-then-eos")  # answers \boxed{9} to anything
    questions, out = tmp_path / "sums.jsonl", tmp_path / "eval"
    questions.write_text("".join(json.dumps({"question": f"What is $4 + {k}$?", "answer": "9"}) + "\n"
                                 for k in (5, 6)))  # fmt: skip
    flags = ("--benchmarks", str(questions), "--dtype", "float32", "--stop", "eos")
    _eval(model, tmp_path, out, *flags)
    records = _lines(out / "completions.jsonl")
    assert [(r["correct"], r["grader"]) for r in records] == [(True, grader_version())] * 2
    records[0].update(correct=False, grader="math-verify 0.0.1")  # an old grader's verdict
    records[1].update(correct=False)  # today's grader's, as stored
    (out / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    again = _eval(model, tmp_path, out, *flags)
    assert again["new_completions"] == 0 and again["results"]["qwen-math"]["micro"] == 0.5
    assert [(r["correct"], r["grader"]) for r in _lines(out / "completions.jsonl")] == [
        (True, grader_version()),
        (False, grader_version()),
    ]


def test_a_resume_grades_again_under_a_templates_edited_rules_and_asks_again_under_its_edited_wording(
    tmp_path,
):
    """An edited answer rule or set of markers grades the stored completions again (no new generation);
    edited wording is another prompt, asked again."""
    model = build_turn_then_eos_model(tmp_path / "turn-then-eos")  # answers \boxed{9} to anything
    questions, bank, out = tmp_path / "sums.jsonl", tmp_path / "bank.yaml", tmp_path / "eval"
    questions.write_text(json.dumps({"question": "What is $4 + 5$?", "answer": "9"}) + "\n")

    def run(system: str, answer: str, markers: str) -> tuple[dict, dict]:
        bank.write_text(f"- {{name: mine, system: '{system}', user: '{{question}}', answer: {answer}, "
                        f"markers: {markers}}}\n")  # fmt: skip
        results = _eval(model, tmp_path, out, "--benchmarks", str(questions), "--dtype", "float32",
                        "--stop", "eos", "--templates_file", str(bank), "--template", "mine")  # fmt: skip
        (record,) = _lines(out / "completions.jsonl")
        return results, record

    results, record = run("Box it.", "boxed", "[]")
    assert results["new_completions"] == 1 and (record["correct"], record["format_score"]) == (True, 1.0)
    results, record = run("Box it.", "boxed", "['<answer>']")  # a marker the completion lacks
    assert results["new_completions"] == 0 and (record["correct"], record["format_score"]) == (True, 0.0)
    results, record = run("Box it.", "tag", "['<answer>']")  # the box must now be inside <answer>
    assert results["new_completions"] == 0 and record["correct"] is False
    assert results["results"]["mine"]["micro"] == 0.0
    results, _ = run("Box it, please.", "tag", "['<answer>']")
    assert results["new_completions"] == 1


def test_help_names_the_papers_stop_rule_and_a_folder_keeps_its_stop_rule(
    tiny_model_dir, suite_dir, tmp_path, capsys
):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--stop {turn,eos}" in text and "eos: the paper's stop rule" in text
    assert parse_args(["--model", "m"]).stop == "turn"
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc")
    with pytest.raises(SystemExit, match="other settings.*stop"):
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc", "--stop", "eos")


def test_evaluation_during_training_takes_the_eval_template_from_the_recipes_templates_file(tmp_path):
    from prompt_aug.config import PromptAugGRPOConfig
    from prompt_aug.evaluation.callback import evaluator_from_args

    bank = tmp_path / "bank.yaml"
    bank.write_text(
        "- {name: terse, system: 'Answer in \\\\boxed{}.', user: 'Q: {question}', answer: boxed}\n"
    )
    questions = tmp_path / "sums.jsonl"
    questions.write_text('{"question": "Compute $1 + 1$.", "answer": "2"}\n')
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, templates_file=str(bank),
        eval_template="terse", eval_benchmarks=[str(questions)], eval_every_steps=1,
    )  # fmt: skip
    evaluator = evaluator_from_args(args)
    assert evaluator.template.name == "terse" and evaluator.template.user == "Q: {question}"
    args.eval_template = "nowhere"
    with pytest.raises(EvalError, match="eval_template 'nowhere' is not in") as err:
        evaluator_from_args(args)
    # Both banks the name is looked up in are listed: the file's, then the built-in one's.
    assert "'terse', " in str(err.value) and "'qwen-math'" in str(err.value)


# A ChatML template with a thinking switch, as Qwen3's has: rendering without `enable_thinking` is an error,
# so a prompt made without the recipe's chat_template_kwargs cannot pass unnoticed.
THINKING_TEMPLATE = (
    "{% if enable_thinking is not defined %}{{ raise_exception('enable_thinking not passed') }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if not enable_thinking %}{{ '<think>\\n' + 'thinking is off. ' * 20 + '</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


def test_training_and_evaluation_prompts_render_with_the_recipes_chat_template_kwargs(
    tiny_model_dir, tmp_path
):
    """The evaluation during training, the prompt-length filter and the trainer's collator render a question
    alike, with the recipe's chat_template_kwargs."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState

    from prompt_aug.collator import PromptAugmentationCollator
    from prompt_aug.config import PromptAugGRPOConfig
    from prompt_aug.data import filter_long_prompts
    from prompt_aug.evaluation.callback import evaluator_from_args

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = THINKING_TEMPLATE
    question = "Compute $1 + 1$."
    questions = tmp_path / "sums.jsonl"
    questions.write_text(json.dumps({"question": question, "answer": "2"}) + "\n")
    off = {"enable_thinking": False}
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
        eval_benchmarks=[str(questions)], eval_every_steps=1, eval_max_tokens=2, chat_template_kwargs=off,
    )  # fmt: skip
    evaluator = evaluator_from_args(args)
    template = evaluator.template
    collator = PromptAugmentationCollator(
        [template], tokenizer, eval_template=template, chat_template_kwargs=args.chat_template_kwargs
    )
    prompt = collator([{"question": question}], training=False)[0]["prompt"]
    assert "thinking is off." in prompt and evaluator.prompt(question, tokenizer) == prompt
    length = len(tokenizer(prompt).input_ids)
    shorter = template.render(question, tokenizer, enable_thinking=True)
    assert len(tokenizer(shorter).input_ids) < length - 1  # the kwargs change what the limit sees
    rows = Dataset.from_dict({"question": [question], "answer": ["2"], "uid": ["a"]})
    assert filter_long_prompts(rows, [template], tokenizer, length, args.chat_template_kwargs)[1] == 0
    assert filter_long_prompts(rows, [template], tokenizer, length - 1, args.chat_template_kwargs)[1] == 1
    # Generating: the evaluator built from the recipe, and one passed in (the training arguments' kwargs).
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert evaluator.evaluate_model(model, tokenizer)["eval/questions"] == 1.0
    given = EvalCallback(str(questions), every_n_steps=1, max_tokens=2)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 1
    given.on_step_end(args, state, control, model=model, processing_class=tokenizer)
    assert control.should_log


def test_prompt_aug_eval_renders_with_chat_template_kwargs_and_records_them(
    tiny_model_dir, suite_dir, tmp_path, capsys
):
    chat_template = tmp_path / "thinking.jinja"
    chat_template.write_text(THINKING_TEMPLATE)
    out = tmp_path / "eval"
    flags = (
        "--benchmarks",
        "amc",
        "--limit",
        "1",
        "--max_tokens",
        "2",
        "--chat_template",
        str(chat_template),
    )
    results = _eval(
        tiny_model_dir, suite_dir, out, *flags, "--chat_template_kwargs", '{"enable_thinking": false}'
    )
    assert results["settings"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert all("thinking is off." in r["prompt"] for r in _lines(out / "completions.jsonl"))
    assert "chat_template_kwargs {'enable_thinking': False}" in (out / "results.md").read_text()
    with pytest.raises(SystemExit, match="other settings.*chat_template_kwargs"):
        _eval(tiny_model_dir, suite_dir, out, *flags, "--chat_template_kwargs", '{"enable_thinking": true}')
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--chat_template_kwargs", "[1]"])
    assert "--chat_template_kwargs: not a JSON object" in capsys.readouterr().err


def test_evaluation_during_training_stops_where_the_recipes_rollouts_stop(tmp_path):
    """With the paper's stop_tokens (the model's EOS alone) the evaluation generates past <|im_end|>, as the
    rollouts and `prompt-aug-eval --stop eos` do; with the default stop_tokens it ends there."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from prompt_aug.config import PromptAugGRPOConfig
    from prompt_aug.trainer import PromptAugGRPOTrainer
    from rewards import correctness_reward

    model = build_turn_then_eos_model(tmp_path / "turn-then-eos")  # writes 7<|im_end|>\boxed{9}<|endoftext|>
    questions = tmp_path / "nine.jsonl"
    questions.write_text(json.dumps({"question": "What is $4 + 5$?", "answer": "9"}) + "\n")

    def macro(stop_tokens: list[str]) -> float:
        args = PromptAugGRPOConfig(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
            max_completion_length=4, max_steps=1, learning_rate=1e-6, report_to="none", save_strategy="no",
            logging_steps=1, use_cpu=True, bf16=False, stop_tokens=stop_tokens,
            eval_benchmarks=[str(questions)], eval_every_steps=1, eval_max_tokens=16,
        )  # fmt: skip
        trainer = PromptAugGRPOTrainer(
            model=str(model),
            reward_funcs=[correctness_reward],
            args=args,
            train_dataset=Dataset.from_list([{"question": "What is $4 + 5$?", "answer": "9"}] * 2),
            processing_class=AutoTokenizer.from_pretrained(model),
        )
        trainer.train()
        return next(h["eval/macro"] for h in trainer.state.log_history if "eval/macro" in h)

    assert macro(["<|endoftext|>"]) == 1.0  # "7\boxed{9}": the box after the turn's end is graded
    assert macro(["<|im_end|>", "<|endoftext|>"]) == 0.0  # "7"


def test_a_question_set_in_training_layouts_gives_training_golds_and_a_dict_is_no_gold(tmp_path):
    import pandas as pd

    # verl's layout (SimpleRL-Zoo's files): the user turn, and the reward model's ground truth.
    chat = [{"role": "user", "content": "Compute $6 + 7$."}]
    verl = pd.DataFrame({"prompt": [chat], "reward_model": [{"ground_truth": "13", "style": "rule"}]})
    verl.to_parquet(tmp_path / "verl.parquet")
    (problem,) = load_benchmark(str(tmp_path / "verl.parquet"))
    assert (problem.question, problem.gold) == ("Compute $6 + 7$.", ["13"])
    # A column of dicts named as the gold is refused, not graded against its text.
    with pytest.raises(EvalError, match=r"column 'reward_model' holds dict values .*--answer_column"):
        load_benchmark(str(tmp_path / "verl.parquet"), question_column="prompt", answer_column="reward_model")
    # A solution column of plain answers, text or numbers, as training reads it.
    (tmp_path / "plain.csv").write_text("problem,solution\nWhat is 1+1?,2\n")
    (tmp_path / "text.jsonl").write_text(json.dumps({"problem": "Half?", "solution": "\\frac{1}{2}"}) + "\n")
    assert [p.gold for p in load_benchmark(str(tmp_path / "plain.csv"))] == [["2"]]
    assert [p.gold for p in load_benchmark(str(tmp_path / "text.jsonl"))] == [["\\frac{1}{2}"]]
    # A float32 column's 0.1 is the gold 0.1, as training reads it (Arrow hands it over as float64).
    pd.DataFrame({"question": ["Tenth?"], "answer": pd.Series([0.1], dtype="float32")}).to_parquet(
        tmp_path / "f32.parquet"
    )
    assert [p.gold for p in load_benchmark(str(tmp_path / "f32.parquet"))] == [["0.1"]]
    # GSM8K's worked answer gives its final answer, a class label its name, a decimal its digits.
    gsm8k = {"question": "Clips?", "answer": "48 / 2 = <<48/2=24>>24 clips.\n#### 72"}
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps(gsm8k) + "\n")
    assert [p.gold for p in load_benchmark(str(tmp_path / "gsm8k.jsonl"))] == [["72"]]
    from decimal import Decimal

    import datasets

    labels = datasets.Features(
        {"question": datasets.Value("string"), "answer": datasets.ClassLabel(names=["A", "B"])}
    )
    datasets.Dataset.from_dict({"question": ["Which?"], "answer": [1]}, features=labels).save_to_disk(
        tmp_path / "labels"
    )
    assert [p.gold for p in load_benchmark(str(tmp_path / "labels"))] == [["B"]]
    pd.DataFrame({"question": ["Price?"], "answer": [Decimal("142.50")]}).to_parquet(tmp_path / "dec.parquet")
    assert [p.gold for p in load_benchmark(str(tmp_path / "dec.parquet"))] == [["142.5"]]


@pytest.mark.parametrize("overwrite", [False, True])
def test_ctrl_c_keeps_the_completions_and_says_the_same_command_resumes(
    tiny_model_dir, suite_dir, tmp_path, overwrite
):
    """Interrupted while it generates, the evaluation names the command that resumes: with --overwrite,
    that command without it (the same command would discard what this one made)."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "prompt_aug.evaluate", "--model", str(tiny_model_dir), "--data_dir",
           str(suite_dir), "--benchmarks", "aime24,amc,minerva", "--backend", "hf", "--max_tokens", "512",
           "--n", "16", "--temperature", "1", "--batch_size", "1", "--output", str(out),
           "--no_progress", *(["--overwrite"] if overwrite else [])]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    records = out / "completions.jsonl"
    while (
        not (records.is_file() and records.read_text())
        and time.monotonic() < deadline
        and proc.poll() is None
    ):
        time.sleep(0.2)  # 7 questions x 16 samples of up to 512 tokens: interrupted after the first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("prompt-aug-eval: interrupted; the completions written"), last
    again = "the same command without --overwrite resumes" if overwrite else "the same command resumes"
    assert again in last, last
    assert 0 < len(records.read_text().splitlines()) < 7 * 16


def test_a_model_given_as_dot_is_named_by_its_folder_and_resumed_under_its_path(
    tiny_model_dir, suite_dir, tmp_path, monkeypatch
):
    out, flags = tmp_path / "eval", ("--benchmarks", "amc")
    monkeypatch.chdir(tiny_model_dir)
    _eval(Path("."), suite_dir, out, *flags)
    assert json.loads((out / "settings.json").read_text())["model"] == tiny_model_dir.name
    assert f"| {tiny_model_dir.name} |" in (out / "results.md").read_text()
    assert _eval(tiny_model_dir, suite_dir, out, *flags)["new_completions"] == 0


def test_a_question_set_and_a_templates_file_spelled_two_ways_are_one_evaluation(
    tiny_model_dir, suite_dir, tmp_path, monkeypatch
):
    from prompt_aug.templates import DEFAULT_TEMPLATES_FILE

    (tmp_path / "x").mkdir()
    questions = tmp_path / "x" / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": f"Compute {k}+1.", "answer": str(k + 1)}) + "\n"
                                 for k in range(2)))  # fmt: skip
    bank = tmp_path / "bank.yaml"
    shutil.copy(DEFAULT_TEMPLATES_FILE, bank)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    out = tmp_path / "eval"
    relative = ("--benchmarks", "../x/q.jsonl", "--templates_file", "../bank.yaml")
    absolute = ("--benchmarks", str(questions.resolve()), "--templates_file", str(bank.resolve()))
    first = _eval(tiny_model_dir, suite_dir, out, *relative)
    assert first["benchmarks"] == [str(questions.resolve())]
    assert first["settings"]["templates_file"] == str(bank.resolve())
    assert {r["benchmark"] for r in _lines(out / "completions.jsonl")} == {str(questions.resolve())}
    table = (out / "results.md").read_text()  # it goes into the model card: file names, no home folder
    assert "templates_file bank.yaml" in table and "q.jsonl" in table and str(tmp_path) not in table
    assert _eval(tiny_model_dir, suite_dir, out, *absolute)["new_completions"] == 0
    # A folder that kept the relative spellings resumes too, and its records take the absolute path.
    for name in ("completions.jsonl", "settings.json", "results.json"):
        text = (out / name).read_text()
        for path, spelling in ((questions, "../x/q.jsonl"), (bank, "../bank.yaml")):
            text = text.replace(json.dumps(str(path.resolve())), json.dumps(spelling))
        (out / name).write_text(text)
    assert _eval(tiny_model_dir, suite_dir, out, *absolute)["new_completions"] == 0
    assert {r["benchmark"] for r in _lines(out / "completions.jsonl")} == {str(questions.resolve())}


def test_a_prompt_longer_than_max_model_len_fails_before_the_vllm_engine_loads(
    tiny_model_dir, suite_dir, tmp_path
):
    out = tmp_path / "eval"
    with pytest.raises(
        SystemExit,
        match=r"^prompt-aug-eval: error: the longest prompt \(\d+ tokens, amc question \d, template "
        r"qwen-math\) leaves no room for a completion in --max_model_len 8: pass --max_model_len \d+ .*"
        r"or leave amc out of --benchmarks",
    ):  # vLLM is not installed here: the engine is never reached
        _eval(
            tiny_model_dir, suite_dir, out, "--benchmarks", "amc", "--backend", "vllm", "--max_model_len", "8"
        )
    assert not out.exists()
    # Where the prompt and --max_tokens exceed the model's own context, no longer --max_model_len is offered.
    vllm = ("--benchmarks", "amc", "--backend", "vllm", "--max_model_len", "8", "--max_tokens", "100000")
    with pytest.raises(SystemExit, match=r"in --max_model_len 8: leave amc out of --benchmarks$"):
        main(["--model", str(tiny_model_dir), "--data_dir", str(suite_dir), "--output", str(out), *vllm])


def test_a_max_model_len_above_the_models_context_is_refused_before_the_vllm_engine_loads(
    tiny_model_dir, suite_dir, tmp_path
):
    """vLLM refuses a ``max_model_len`` past the config's context (a traceback once the engine loads); a
    model whose config scales its RoPE may run past it, as vLLM lets it."""
    import importlib.util

    out = tmp_path / "eval"
    context = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    vllm = ("--benchmarks", "amc", "--backend", "vllm", "--max_model_len", str(context + 1))
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(tiny_model_dir), "--data_dir", str(suite_dir), "--output", str(out), *vllm])
    assert exit_info.value.code == (
        f"prompt-aug-eval: error: --max_model_len {context + 1} is above the context of --model "
        f"{tiny_model_dir} ({context} tokens, its config's); pass at most that, leave --max_model_len out, "
        "or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to run past it (vLLM warns the outputs may be wrong)"
    )
    assert not out.exists()
    if importlib.util.find_spec("vllm") is not None:  # the scaled model would run: shown where it cannot
        return

    def reaches_the_engine(model: Path) -> bool:  # past the check, to the engine, which is not installed here
        with pytest.raises(SystemExit) as exit_info:
            main(
                [
                    "--model",
                    str(model),
                    "--data_dir",
                    str(suite_dir),
                    "--output",
                    str(out),
                    *vllm,
                    "--limit",
                    "1",
                ]
            )
        return str(exit_info.value.code).startswith(
            "prompt-aug-eval: error: --backend vllm: vLLM is not installed"
        )

    with pytest.MonkeyPatch.context() as patch:  # vLLM's own way past the context
        patch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
        assert reaches_the_engine(tiny_model_dir)
    scaled = tmp_path / "yarn"
    shutil.copytree(tiny_model_dir, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": context}
    (scaled / "config.json").write_text(json.dumps(config))
    assert reaches_the_engine(scaled)


def test_backend_vllm_without_vllm_is_one_line_before_the_folder_is_touched(
    tiny_model_dir, suite_dir, tmp_path
):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here; this checks the refusal where it is not")
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc")
    kept = {path.name: path.read_text() for path in out.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc", "--backend", "vllm", "--overwrite")
    assert exit_info.value.code == (
        "prompt-aug-eval: error: --backend vllm: vLLM is not installed; install the gpu extra "
        '(pip install -e ".[gpu]" -c constraints-gpu.txt) or pass --backend hf'
    )
    assert {path.name: path.read_text() for path in out.iterdir()} == kept


def test_leftover_world_size_without_a_launcher_is_one_line(tiny_model_dir, suite_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(
        SystemExit,
        match=r"^prompt-aug-eval: error: WORLD_SIZE is 2 but MASTER_ADDR and MASTER_PORT not set: launch "
        r"with torchrun or accelerate launch, or unset WORLD_SIZE",
    ):
        _eval(tiny_model_dir, suite_dir, tmp_path / "eval", "--benchmarks", "amc", "--limit", "1")


def test_processes_that_never_come_are_waited_for_a_bounded_time(monkeypatch, caplog):
    import socket
    from datetime import timedelta

    from prompt_aug.evaluation import runner

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runner, "JOIN_WAIT", timedelta(seconds=1))
    caplog.set_level("INFO", logger="prompt_aug.evaluate")
    with pytest.raises(EvalError, match=rf"could not join the others via 127.0.0.1:{port} within 0:00:01"):
        runner.join_processes()
    assert f"joining 2 processes via 127.0.0.1:{port}" in caplog.text


def test_a_damaged_settings_file_or_record_is_one_line_naming_it(tiny_model_dir, suite_dir, tmp_path):
    out, flags = tmp_path / "eval", ("--benchmarks", "amc", "--limit", "1")
    _eval(tiny_model_dir, suite_dir, out, *flags)
    settings = out / "settings.json"
    kept = settings.read_text()
    settings.write_text(kept[:10])
    with pytest.raises(
        SystemExit, match=rf"^prompt-aug-eval: error: {re.escape(str(settings))}: not JSON .*pass --overwrite"
    ):
        _eval(tiny_model_dir, suite_dir, out, *flags)
    settings.write_text(kept)
    records = out / "completions.jsonl"
    records.write_text(records.read_text() + json.dumps({"question": "?"}) + "\n")
    with pytest.raises(
        SystemExit,
        match=rf"^prompt-aug-eval: error: {re.escape(str(records))}, line 2: not a record \(no benchmark, "
        r"template, run, index\); delete that line",
    ):
        _eval(tiny_model_dir, suite_dir, out, *flags)


def test_a_question_with_samples_written_twice_by_torn_attempts_gets_all_its_samples(
    tiny_model_dir, suite_dir, tmp_path
):
    out, flags = tmp_path / "eval", ("--benchmarks", "amc", "--n", "3", "--temperature", "1")
    assert (
        _eval(tiny_model_dir, suite_dir, out, *flags)["results"]["qwen-math"]["benchmarks"]["amc"]["n"] == 6
    )
    records = _lines(out / "completions.jsonl")
    torn = [r for r in records if r["index"] == 0 and r["sample"] < 2]  # two attempts, each cut after 2
    rest = [r for r in records if r["index"] != 0]
    (out / "completions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rest + torn + torn))
    again = _eval(tiny_model_dir, suite_dir, out, *flags)
    assert again["new_completions"] == 3
    amc = again["results"]["qwen-math"]["benchmarks"]["amc"]
    assert amc["n"] == 6 and amc["questions"] == 2


def test_a_folder_whose_settings_lack_newer_keys_keeps_its_tables_covered(
    tiny_model_dir, suite_dir, tmp_path
):
    out = tmp_path / "eval"
    _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc")
    settings = json.loads((out / "settings.json").read_text())
    del settings["stop"], settings["weights"]  # as written before those keys
    (out / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(SystemExit, match=r"does not cover \(3 questions of a benchmark\)"):
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "aime24,amc", "--limit", "1")
    assert (out / "results.md").is_file()


def _without_weights(model: Path, folder: Path) -> Path:
    """A copy of ``model`` whose weights file is gone: its config and tokenizer load, the model does not."""
    shutil.copytree(model, folder)
    (folder / "model.safetensors").unlink()
    return folder


REFUSED = (
    "and this evaluation would write over it; move it, or pass another --output (--overwrite replaces "
    "prompt-aug-eval's own files only)"
)


def test_an_output_folder_that_cannot_be_made_is_one_line_naming_it(tiny_model_dir, suite_dir):
    """An --output where the folder cannot be made (a read-only place, as a shared model folder's default
    <model>/eval may be; here sysfs, which refuses new folders even to root) stops in one line that names it
    and asks for another --output, not a traceback."""
    out = Path("/sys/kernel/prompt-aug-eval-test/eval")
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs here")
    with pytest.raises(SystemExit) as stopped:
        _eval(tiny_model_dir, suite_dir, out, "--benchmarks", "amc")
    message = str(stopped.value)
    head = f"prompt-aug-eval: error: --output {out}: cannot make or open that folder"
    assert message.startswith(head), message
    assert message.endswith("pass an --output this evaluation can write to") and "\n" not in message, message


def test_files_prompt_aug_eval_did_not_write_are_refused_before_the_model_loads_even_with_overwrite(
    tiny_model_dir, suite_dir, tmp_path
):
    """An --output folder holding a results.json, results.md, settings.json or completions.jsonl of one's own
    is refused in one line naming the file, before the model loads (a model with no weights, which would fail
    to load, is never reached), and --overwrite deletes none of them; the folder is left as it was."""
    broken = _without_weights(tiny_model_dir, tmp_path / "no-weights")
    flags = ("--benchmarks", "amc", "--limit", "1")
    own = {  # a file of that name, and why it is not one of prompt-aug-eval's
        "results.json": ('{"accuracy": 0.5}\n', "no benchmarks, templates, runs, results"),
        "results.md": ("# My results\n\nAccuracy 50%.\n", "not a table of prompt-aug-eval"),
        "settings.json": ('{"theme": "dark"}\n', "no model"),
        "completions.jsonl": (
            '{"prompt": "hi", "completion": "hello"}\n',
            "not a record (no benchmark, template, run, index)",
        ),
    }
    for name, (text, why) in own.items():
        out = tmp_path / name.replace(".", "-")
        out.mkdir()
        (out / name).write_text(text)
        for extra in ((), ("--overwrite",)):
            with pytest.raises(SystemExit) as exit_info:
                _eval(broken, suite_dir, out, *flags, *extra)
            assert exit_info.value.code == (
                f"prompt-aug-eval: error: {out / name}: not written by prompt-aug-eval ({why}), {REFUSED}"
            )
            assert {path.name: path.read_text() for path in out.iterdir()} == {name: text}
    # A folder of that name is refused too, and kept with what it holds.
    out = tmp_path / "folder"
    (out / "results.md").mkdir(parents=True)
    (out / "results.md" / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        _eval(tiny_model_dir, suite_dir, out, *flags, "--overwrite")
    assert exit_info.value.code == (
        f"prompt-aug-eval: error: {out / 'results.md'}: not written by prompt-aug-eval (a folder), {REFUSED}"
    )
    assert (out / "results.md" / "notes.txt").read_text() == "mine\n"


def test_overwrite_discards_the_old_results_only_once_the_model_has_loaded(
    tiny_model_dir, suite_dir, tmp_path
):
    """--overwrite with a model that does not load (a mistyped checkpoint folder that holds no weights) stops
    in one line naming it and leaves the earlier evaluation's files as they were; with a model that loads it
    discards them, and a file of one's own beside them stays."""
    out, flags = tmp_path / "eval", ("--benchmarks", "amc", "--limit", "1")
    _eval(tiny_model_dir, suite_dir, out, *flags)
    (out / "notes.txt").write_text("mine\n")
    kept = {path.name: path.read_bytes() for path in out.iterdir()}
    assert set(kept) == {"completions.jsonl", "results.json", "results.md", "settings.json", "notes.txt"}
    broken = _without_weights(tiny_model_dir, tmp_path / "checkpoint-9")
    with pytest.raises(SystemExit) as exit_info:
        _eval(broken, suite_dir, out, *flags, "--max_tokens", "8", "--overwrite")
    assert re.fullmatch(
        rf"prompt-aug-eval: error: --model {re.escape(str(broken))}: the model does not load \(.*\); fix "
        rf"--model \(the completions and tables in {re.escape(str(out))} are kept\)",
        str(exit_info.value.code),
    ), exit_info.value.code
    assert {path.name: path.read_bytes() for path in out.iterdir()} == kept
    cut = tmp_path / "checkpoint-10"  # weights cut short (a copy interrupted): one line too
    shutil.copytree(tiny_model_dir, cut)
    weights = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    with pytest.raises(SystemExit) as exit_info:
        _eval(cut, suite_dir, out, *flags, "--max_tokens", "8", "--overwrite")
    assert "the model does not load (" in str(exit_info.value.code), exit_info.value.code
    assert {path.name: path.read_bytes() for path in out.iterdir()} == kept
    results = _eval(tiny_model_dir, suite_dir, out, *flags, "--max_tokens", "8", "--overwrite")
    assert results["new_completions"] == 1 and results["settings"]["max_tokens"] == 8
    assert (out / "notes.txt").read_text() == "mine\n"
    assert [r["index"] for r in _lines(out / "completions.jsonl")] == [0]


def test_hf_samples_depend_on_the_batch_size_so_a_resume_with_another_is_refused(
    tiny_model_dir, suite_dir, tmp_path, caplog
):
    """hf samples a batch jointly from one seed, so --batch_size changes the samples: settings.json records
    it when hf samples, and a rerun with another batch size is refused as another setting is. Greedy
    decoding records none, and resumes with any batch size."""
    sampled = ("--benchmarks", "amc", "--temperature", "1")
    one, two = tmp_path / "one", tmp_path / "two"
    _eval(tiny_model_dir, suite_dir, one, *sampled, "--batch_size", "1")
    _eval(tiny_model_dir, suite_dir, two, *sampled, "--batch_size", "2")
    assert [r["completion"] for r in _lines(one / "completions.jsonl")] != [
        r["completion"] for r in _lines(two / "completions.jsonl")
    ]
    assert json.loads((two / "settings.json").read_text())["batch_size"] == 2
    with pytest.raises(SystemExit) as exit_info:
        _eval(tiny_model_dir, suite_dir, two, *sampled, "--batch_size", "1")
    assert exit_info.value.code == (
        f"prompt-aug-eval: error: {two} holds completions made with other settings "
        "({'batch_size': (2, 1)}, as (before, now)); rerun with the earlier values to resume them, pass "
        "another --output, or --overwrite to discard them"
    )
    assert _eval(tiny_model_dir, suite_dir, two, *sampled, "--batch_size", "2")["new_completions"] == 0
    # No --batch_size is hf's default, 16.
    default = tmp_path / "default"
    assert _eval(tiny_model_dir, suite_dir, default, *sampled)["settings"]["batch_size"] == 16
    assert _eval(tiny_model_dir, suite_dir, default, *sampled, "--batch_size", "16")["new_completions"] == 0
    # A folder written before the batch size was recorded resumes, with a warning, and records it from then.
    settings = json.loads((two / "settings.json").read_text())
    del settings["batch_size"]
    (two / "settings.json").write_text(json.dumps(settings))
    with caplog.at_level("WARNING", logger="prompt_aug.evaluate"):
        assert _eval(tiny_model_dir, suite_dir, two, *sampled, "--batch_size", "4")["new_completions"] == 0
    assert "does not record the --batch_size its sampled completions were made in" in caplog.text
    assert json.loads((two / "settings.json").read_text())["batch_size"] == 4
    greedy = tmp_path / "greedy"
    assert _eval(tiny_model_dir, suite_dir, greedy, "--benchmarks", "amc")["settings"]["batch_size"] is None
    assert (
        _eval(tiny_model_dir, suite_dir, greedy, "--benchmarks", "amc", "--batch_size", "1")[
            "new_completions"
        ]
        == 0
    )


def test_running_out_of_memory_while_hf_samples_says_a_smaller_batch_size_does_not_resume(
    tokenizer, tmp_path
):
    """hf samples depend on the batch size: after running out of memory, the message offers another --output
    or --overwrite with a smaller batch size, not a resume."""
    from prompt_aug.evaluation.benchmarks import Problem, parse_templates
    from prompt_aug.evaluation.runner import generate_and_grade

    problems = [Problem("sums", k, f"Compute {k} + {42 - k}.", ["42"]) for k in range(3)]
    path = tmp_path / "completions.jsonl"
    with pytest.raises(EvalError) as error:
        generate_and_grade(
            SmallMemory(fits=1), tokenizer, problems, parse_templates("qwen-math"), path,
            temperature=1.0, batch_size=2, progress=False,
        )  # fmt: skip
    assert str(error.value) == (
        f"out of memory generating 2 prompts x 1 sample(s) of up to 3000 new tokens; the completions made so "
        f"far are kept in {path}: hf samples a batch jointly, so a smaller --batch_size (this one: 2) "
        "samples otherwise and does not resume them: rerun with one and another --output, or with "
        "--overwrite to discard them"
    )
