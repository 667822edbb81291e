"""Teardown under DeepSpeed ZeRO-2/3 and FSDP2, on CPU (gloo): a run that ends, or is preempted, exits
without an abort and leaves no process behind.

Per config, 2 processes through ``accelerate launch`` and the engine harness (tests/engines/harness.py,
which switches accelerate's CPU fallback to FSDP for ``fsdp.yaml``):

* a 2-step run (also under plain DDP) exits 0, nothing printed "terminate called", and no process of the
  run is left. When each rank begins to exit (after `prompt_aug.train.close_process_group`) it should have
  no gloo thread left (``ENGINE_THREADS_AT_EXIT``); with DeepSpeed installed it has some (an expected
  failure, see the test);
* a run sent SIGTERM through its launcher after step 1 is logged (torch elastic passes SIGTERM on to the
  workers) saves checkpoint-2 on both ranks under the engine, writes ``preempted.json`` and leaves no
  process; the launcher exits non-zero (any worker status but 0 is its failure).

About 1 minute per config (the first DeepSpeed launch compiles an op first).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from engine_tools import HARNESS, REPO, accelerate_launch, engine_env, require, run

from prompt_aug import faults

SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
CONFIGS = ("zero2", "zero3", "fsdp")
CEILING_S = 600


def _command(config: str, out: Path, *extra: str) -> list[str]:
    return [*accelerate_launch(config, 2), str(HARNESS), "--config", SMOKE,
            "--output_dir", str(out), "--per_device_train_batch_size", "3", "--learning_rate", "1e-3",
            "--reward_funcs", "correctness", "engine_rewards:char_length", *extra]  # fmt: skip


def _left_behind(out: Path) -> list[str]:
    """Processes whose command line names the run's output folder."""
    deadline, left = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        left = []
        for entry in Path("/proc").iterdir():
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError):
                continue
            if str(out) in command and state != "Z":
                left.append(f"{entry.name}: {command[:200]}")
        if not left:
            break
        time.sleep(0.5)
    return left


@pytest.fixture(scope="module", params=[*CONFIGS, "ddp"])
def finished(request, engines_tmp):
    config = request.param
    if config.startswith("zero"):
        require("deepspeed")
    out = engines_tmp / "teardown" / config
    threads = out.parent / f"{config}-threads"
    text = run(
        _command(config, out, "--max_steps", "2"),
        out.parent / f"{config}.log",
        timeout=CEILING_S,
        ENGINE_THREADS_AT_EXIT=str(threads),
    )  # fmt: skip  (run fails the test on a non-zero exit)
    names = {rank: (threads / f"threads_rank{rank}.txt").read_text().split() for rank in (0, 1)}
    return {"config": config, "out": out, "text": text, "threads": names}


def test_a_finished_run_exits_0_without_an_abort_and_leaves_no_process(finished):
    assert "terminate called" not in finished["text"]
    assert _left_behind(finished["out"]) == []
    assert json.loads((finished["out"] / "trainer_state.json").read_text())["global_step"] == 2


@pytest.mark.xfail(
    reason="with DeepSpeed installed, gloo threads outlive close_process_group in every config (one group's "
    "under DDP and FSDP2, two groups' under ZeRO), DDP included; without DeepSpeed the same DDP launch ends "
    "them (docs/benchmarks.md, 'Faults'). Idle threads cannot abort the exit; a worker still releasing a "
    "tensor could.",
    strict=False,
)
def test_no_gloo_thread_outlives_the_process_group(finished):
    for rank, names in finished["threads"].items():
        assert not [n for n in names if "gloo" in n], (finished["config"], rank, names)


@pytest.mark.parametrize("config", CONFIGS)
def test_sigterm_to_the_launcher_saves_every_rank_and_leaves_nothing(config, engines_tmp):
    if config.startswith("zero"):
        require("deepspeed")
    out = engines_tmp / "preempted" / config
    log = out.parent / f"{config}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as sink:
        proc = subprocess.Popen(
            _command(config, out, "--max_steps", "6", "--save_steps", "100"), cwd=REPO, env=engine_env(),
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + CEILING_S
        while "| step 1/6 |" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"step 1 not logged:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # the launcher passes it on to both workers
        try:
            code = proc.wait(timeout=CEILING_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("no exit after SIGTERM")
    text = log.read_text(errors="replace")
    assert code != 0, text[-3000:]
    # The signal lands after step 1's line; on a loaded box a step (0.1 s here) may end before it reaches the
    # workers, so the run stops at the end of step 2 or a later one, never before and never at the last.
    found = re.search(
        r"Preempted by SIGTERM \(exit status 75, preempted.json written\) at step (\d)/6\.", text
    )
    assert found and 2 <= int(found.group(1)) < 6, text[-3000:]
    step = int(found.group(1))
    assert "terminate called" not in text
    assert _left_behind(out) == []
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{step}"]
    saved = out / f"checkpoint-{step}"
    assert faults.checkpoint_problem(saved) is None, sorted(os.listdir(saved))
    assert json.loads((out / faults.PREEMPTED_FILE).read_text())["step"] == step
    if config.startswith("zero"):  # each rank wrote its own optimizer shard
        shards = sorted(p.name for p in (saved / f"global_step{step}").iterdir())
        assert sum("optim_states" in name for name in shards) == 2, shards
