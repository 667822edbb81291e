"""``prompt-aug-eval`` on several processes: each generates a share, the main process writes what one process
would have written, in the same order; leftover shard files resume; docs/reproduce.md's checkpoint commands.

The launches run the hf backend on CPU (gloo), with the smoke model's weights redrawn larger so that greedy
text varies from question to question and, in bf16, a prompt's batch mates change a few of its completions:
a launch that batched the questions otherwise than one process would not match.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from launch import torchrun

from prompt_aug.evaluate import (
    EvalError,
    Processes,
    deal,
    fold_shards,
    join_processes,
    main,
    parse_args,
    protocol_differences,
    read_records,
    shard_path,
)

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [
    ("Compute $12 + 30$.", "42"),
    ("What is $7 \\times 6$?", "42"),
    ("Evaluate $2^{5}$.", "32"),
    ("What is $1 + 1$?", "2"),
    ("Solve for $x$: $2x + 1 = 7$.", "3"),
    ("What is the remainder when $10$ is divided by $4$?", "2"),
    ("Compute $100 - 58$.", "42"),
]
# 7 questions x 2 templates x 2 runs = 28 prompts in batches of 3: 10 batches, dealt 5 and 5.
SETTINGS = ["--backend", "hf", "--max_tokens", "8", "--template", "qwen-math,abel", "--runs", "2",
            "--batch_size", "3", "--no_progress"]  # fmt: skip


@pytest.fixture(scope="module")
def varied_model(tiny_model_dir, tmp_path_factory) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path_factory.mktemp("varied") / "model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("questions") / "sums.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return path


def _run_evaluation(processes: int, model: Path, questions: Path, out: Path, *extra: str):
    launcher = torchrun(processes) if processes > 1 else [sys.executable]
    cmd = [*launcher, "-m", "prompt_aug.evaluate", "--model",
           str(model), "--benchmarks", str(questions), "--output", str(out), *SETTINGS, *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_two_processes_write_what_one_process_writes(varied_model, questions, tmp_path):
    one = _run_evaluation(1, varied_model, questions, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _run_evaluation(2, varied_model, questions, tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "(on 2 processes)" in two.stderr
    assert "merged 28 new completions of 2 processes (15 + 13) into completions.jsonl" in two.stderr

    alone, shared = (read_records(tmp_path / name / "completions.jsonl") for name in ("one", "two"))
    assert len(alone) == 28 and len({r["completion"] for r in alone}) > 10  # the text varies
    key = ("benchmark", "template", "run", "index", "sample", "completion", "extracted", "correct")
    assert [[r[k] for k in key] for r in alone] == [[r[k] for k in key] for r in shared]  # in order
    for name in ("completions.jsonl", "results.md", "settings.json"):  # byte for byte
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    results = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two")]
    for r in results:
        r.pop("seconds")
    assert results[0] == results[1]
    files = {"completions.jsonl", "results.json", "results.md", "settings.json"}
    assert {p.name for p in (tmp_path / "two").iterdir()} == files  # the shard files are gone


@pytest.mark.slow
def test_every_process_stops_with_the_main_processs_verdict_on_the_folder(varied_model, questions, tmp_path):
    # Completions made with other settings: only the main process reads the folder; none may wait for it.
    out = tmp_path / "eval"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"model": "model", "stop": "eos"}))
    (out / "completions.jsonl").write_text("")
    run = _run_evaluation(2, varied_model, questions, out)
    assert run.returncode != 0
    assert run.stderr.count("holds completions made with other settings") == 2, run.stderr[-3000:]


def test_a_shard_left_by_an_interrupted_launch_is_kept_on_resume(tiny_model_dir, questions, tmp_path):
    out = tmp_path / "eval"
    args = ["--model", str(tiny_model_dir), "--benchmarks", str(questions), "--backend", "hf",
            "--max_tokens", "2", "--limit", "3", "--output", str(out), "--no_progress"]  # fmt: skip
    main(args)
    records_path = out / "completions.jsonl"
    records = read_records(records_path)
    assert len(records) == 3
    # As if a 2-process launch had died: one record only in process 1's shard, the last line torn.
    records_path.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    shard_path(records_path, 1).write_text(json.dumps(records[2]) + "\n" + '{"benchmark": ')
    main(args)
    results = json.loads((out / "results.json").read_text())
    assert results["new_completions"] == 0  # nothing generated again
    assert read_records(records_path) == records and not shard_path(records_path, 1).exists()


def test_a_shards_record_replaces_the_files_record_of_the_same_completion(tmp_path):
    """A shard is left by the latest run, an interrupted launch: where it holds a completion the file also
    holds (that question asked again, say after an edit), the shard's replaces the file's; the rest is
    appended and the shard deleted."""
    records_path = tmp_path / "completions.jsonl"
    key = {"benchmark": "sums", "template": "qwen-math", "run": 0, "sample": 0}
    old, other = {**key, "index": 0, "prompt": "OLD"}, {**key, "index": 1, "prompt": "KEPT"}
    records_path.write_text(json.dumps(old) + "\n" + json.dumps(other) + "\n")
    new, more = {**key, "index": 0, "prompt": "NEW"}, {**key, "index": 2, "prompt": "ADDED"}
    shard_path(records_path, 1).write_text(json.dumps(new) + "\n" + json.dumps(more) + "\n")
    assert fold_shards(records_path) == 1
    assert [r["prompt"] for r in read_records(records_path)] == ["NEW", "KEPT", "ADDED"]
    assert not shard_path(records_path, 1).exists()


def test_the_batches_are_dealt_whole_for_hf_and_question_by_question_for_vllm():
    order = [4, 0, 6, 2, 1, 5, 3]
    for whole in (True, False):
        shares = [deal(order, 2, share, 3, whole) for share in range(3)]
        dealt = [i for share in shares for batch in share for i in batch]
        assert sorted(dealt) == sorted(order)  # every item once
    assert [deal(order, 2, s, 3, True) for s in range(3)] == [[[4, 0], [3]], [[6, 2]], [[1, 5]]]
    assert [deal(order, 2, s, 3, False) for s in range(3)] == [[[4, 2], [3]], [[0, 1]], [[6, 5]]]
    assert deal(order, 2, 0, 1, True) == deal(order, 2, 0, 1, False) == [[4, 0], [6, 2], [1, 5], [3]]


def test_processes_come_from_the_launchers_environment(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert join_processes() == Processes()
    alone = Processes()
    assert alone.main and alone.gather("x") == ["x"] and alone.broadcast("y") == "y"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(EvalError, match="RANK is not set"):
        join_processes()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(EvalError, match="--tensor_parallel_size must divide"):
        join_processes(engine=True, ranks_per_engine=3)
    # vLLM engines of 2 processes each (tensor parallel): processes 2 and 3 take share 1; 3 keeps no records.
    engine = Processes(rank=3, size=4, ranks_per_engine=2)
    assert (engine.share, engine.shares, engine.keeps_records) == (1, 2, False)


def test_vllm_runs_inside_each_process_when_launched_as_several(tiny_model_dir, monkeypatch):
    """A stand-in vLLM: several processes build their engines as TRL's colocate mode does."""
    import types

    from prompt_aug.evaluate import VLLMBackend

    seen: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)
            config = types.SimpleNamespace(max_model_len=kwargs["max_model_len"])
            self.llm_engine = types.SimpleNamespace(model_config=config)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    VLLMBackend(str(tiny_model_dir), max_model_len=64)
    assert "distributed_executor_backend" not in seen
    VLLMBackend(str(tiny_model_dir), max_model_len=64, tensor_parallel_size=2, external_launcher=True)
    assert seen["distributed_executor_backend"] == "external_launcher" and seen["tensor_parallel_size"] == 2


def _checkpoint_section() -> str:
    text = (REPO / "docs/reproduce.md").read_text()
    return text.split("\n### Checkpoints: ", 1)[1].split("\n## ", 1)[0]


def _commands(text: str, module: str) -> list[list[str]]:
    """The commands of ``text``'s bash blocks that run ``-m module``, continuation lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if f"-m {module}" in line:
                commands.append(shlex.split(line, comments=True))
    return commands


def test_reproduce_md_evaluates_kept_checkpoints_with_a_command_the_code_takes():
    from torch.distributed.run import get_args_parser

    section = _checkpoint_section()
    evaluate_page = (
        (REPO / "docs/reproduce.md").read_text().split("\n## 7. Evaluate\n", 1)[1].split("\n### ")[0]
    )
    commands = _commands(section, "prompt_aug.evaluate") + _commands(evaluate_page, "prompt_aug.evaluate")
    assert len(commands) == 2
    for command in commands:
        assert command[0] == "torchrun"
        launcher = get_args_parser().parse_args(command[1:])
        assert launcher.module and launcher.training_script == "prompt_aug.evaluate"
        assert launcher.nproc_per_node == "8" and launcher.standalone
        args = parse_args(
            [a.replace("$ckpt", "outputs/kept/checkpoint-80") for a in launcher.training_script_args]
        )
        assert protocol_differences(vars(args)) == [], command  # the paper's protocol


def test_reproduce_md_keeps_the_weights_of_complete_checkpoints(tmp_path):
    block = re.search(r"\nkeep_weights\(\) \{.*?\n\}\n", _checkpoint_section(), re.DOTALL).group(0)

    def checkpoint(step: int, complete: bool = True) -> None:
        folder = tmp_path / f"checkpoint-{step}"
        (folder / f"global_step{step}").mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "optimizer.pt", "rng_state_0.pth",
                     f"global_step{step}/optim_states.pt"):  # fmt: skip
            (folder / name).write_text(name)
        if complete:
            (folder / "trainer_state.json").write_text("{}")

    def keep(every: int) -> list[str]:
        script = (
            f"OUT={shlex.quote(str(tmp_path))}; EVERY={every}; mkdir -p $OUT/kept\n{block}\nkeep_weights\n"
        )
        subprocess.run(["bash", "-euc", script], check=True, timeout=60)
        return sorted(p.name for p in (tmp_path / "kept").iterdir())

    checkpoint(80)
    checkpoint(160)
    checkpoint(240, complete=False)  # still being written
    assert keep(every=2) == ["checkpoint-160"]
    assert keep(every=1) == ["checkpoint-160", "checkpoint-80"]
    kept = tmp_path / "kept" / "checkpoint-80"
    assert sorted(p.name for p in kept.iterdir()) == [
        "config.json",
        "model.safetensors",
        "trainer_state.json",
    ]
    (tmp_path / "checkpoint-240" / "trainer_state.json").write_text("{}")
    assert keep(every=1) == ["checkpoint-160", "checkpoint-240", "checkpoint-80"]
