"""Running a bench script of bench/ as a user would, and reading the losses it prints."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[1]


def run_bench(argv: list[str], timeout: int = 300, code: str | None = None) -> subprocess.CompletedProcess:
    """``python bench/<script> ...`` (or ``python -c code``) from the repository root, one torch thread."""
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def load_bench(script: str) -> ModuleType:
    """``bench/<script>`` imported in this Python under its own name (its functions; its main is not run)."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / "bench" / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_patched_bench(script: str, patch: str, call: str) -> subprocess.CompletedProcess:
    """``bench/<script>`` loaded as the module ``bench`` in a fresh Python (one torch thread), then ``patch``
    run (statements that replace some of its functions, to make a failure happen; ``os``, ``signal``,
    ``sys`` and ``torch`` are imported), then ``call`` (how the bench is started, e.g. ``bench.main()``)."""
    code = (
        "import importlib.util, os, signal, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('bench', 'bench/{script}')\n"
        "bench = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(bench)\n"
        f"{textwrap.dedent(patch)}\n{call}\n"
    )
    return run_bench([], code=code)


def printed_losses(stdout: str) -> dict[str, torch.Tensor]:
    """Each ``<mode> loss per optimizer step: a, b, ... [(...)]`` line, as mode -> the losses."""
    return {
        line.split()[0]: torch.tensor([float(x) for x in line.split(": ")[1].split(" (")[0].split(", ")])
        for line in stdout.splitlines()
        if " loss per optimizer step: " in line
    }
