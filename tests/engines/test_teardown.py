"""Preemption under DeepSpeed ZeRO-2/3 and FSDP2, on CPU (gloo): a run sent SIGTERM through its launcher
after step 1 is logged (torch elastic passes SIGTERM on to the workers) saves a checkpoint on both ranks
under the engine, writes ``preempted.json``, exits without an abort and leaves no process; the launcher
exits non-zero (any worker status but 0 is its failure).

Per config, 2 processes through ``accelerate launch`` and the engine harness (tests/engines/harness.py,
which switches accelerate's CPU fallback to FSDP for ``fsdp.yaml``). A run that ends is checked the same
way (no abort, no process left, no gloo thread at exit) on the launches of test_launch.py. About 40 s per
config.
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
from engine_tools import HARNESS, REPO, accelerate_launch, engine_env, left_behind, require

from prompt_aug import faults

SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
CONFIGS = ("zero2", "zero3", "fsdp")
CEILING_S = 600


def _command(config: str, out: Path, *extra: str) -> list[str]:
    return [*accelerate_launch(config, 2), str(HARNESS), "--config", SMOKE,
            "--output_dir", str(out), "--per_device_train_batch_size", "3", "--learning_rate", "1e-3",
            "--reward_funcs", "correctness", "engine_rewards:char_length", *extra]  # fmt: skip


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
    assert left_behind(out) == []
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{step}"]
    saved = out / f"checkpoint-{step}"
    assert faults.checkpoint_problem(saved) is None, sorted(os.listdir(saved))
    assert json.loads((out / faults.PREEMPTED_FILE).read_text())["step"] == step
    if config.startswith("zero"):  # each rank wrote its own optimizer shard
        shards = sorted(p.name for p in (saved / f"global_step{step}").iterdir())
        assert sum("optim_states" in name for name in shards) == 2, shards
