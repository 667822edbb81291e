"""Helpers of the engine tier: fail on a missing engine, run an engine subprocess with a hard time limit."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch import free_port

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "harness.py"


def require(module: str) -> None:
    """Fail (not skip) when an engine of the tier cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as err:
        pytest.fail(
            f"engine tier: cannot import {module} in {sys.executable} ({err}); "
            "build the venv with .ci/engine-venv"
        )


def accelerate_launch(config: str, processes: int) -> list[str]:
    """``accelerate launch`` with ``accelerate_configs/<config>.yaml`` on ``processes`` CPU processes, in
    float32, on a free rendezvous port (``accelerate launch`` takes 29500 unless told, and reads no
    ``MASTER_PORT``); the script and its arguments follow."""
    return [str(Path(sys.executable).parent / "accelerate"), "launch", "--config_file",
            str(REPO / "accelerate_configs" / f"{config}.yaml"), "--num_processes", str(processes),
            "--mixed_precision", "no", "--main_process_port", str(free_port())]  # fmt: skip


def engine_env(**extra: str) -> dict[str, str]:
    """The environment of an engine subprocess: this tree first on the path, offline, a small KV cache, and a
    rendezvous port of its own (``MASTER_PORT``: torch's default 29500 is taken by any other run on the
    machine that uses it)."""
    env = dict(os.environ)
    # Importing TRL in the test process sets VLLM_LOGGING_LEVEL=ERROR there; a subprocess must start from the
    # user's environment, not from what an earlier test's import left in this one.
    env.pop("VLLM_LOGGING_LEVEL", None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        HF_HUB_OFFLINE="1",
        WANDB_MODE="disabled",
        VLLM_CPU_KVCACHE_SPACE=env.get(
            "VLLM_CPU_KVCACHE_SPACE", "1"
        ),  # GiB; vLLM's default asks for most of RAM
        TOKENIZERS_PARALLELISM="false",
        MASTER_PORT=env.get("MASTER_PORT") or str(free_port()),
    )
    env.update(extra)
    return env


def run(cmd: list[str], log: Path, timeout: float, expect: int = 0, **extra_env: str) -> str:
    """Run ``cmd`` in the repo root with `engine_env`, output to ``log``; kill its whole process group
    after ``timeout`` seconds. Fails the test on an exit status other than ``expect``, showing the log's
    tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=engine_env(**extra_env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    text = log.read_text(errors="replace")
    print(f"{' '.join(cmd[:6])} ...: {time.monotonic() - started:.0f} s, log {log}")
    if code != expect:
        what = f"timed out after {timeout:.0f} s" if code is None else f"exited {code}, not {expect}"
        pytest.fail(f"{' '.join(cmd)} {what}; last lines of {log}:\n{text[-4000:]}")
    return text


def left_behind(out: Path) -> list[str]:
    """Processes whose command line names the run's output folder ``out``, still there after 30 s."""
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
