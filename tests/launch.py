"""Launching the tests' multi-process runs: a free rendezvous port for each, so that tests running side by
side (pytest ``-n``) never share one."""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(processes: int = 2) -> list[str]:
    """The command prefix that runs a script or ``-m module`` on ``processes`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_port", str(free_port())]  # fmt: skip


SMOKE_RECIPE = Path(__file__).resolve().parents[1] / "recipes/smoke/tiny_cpu.yaml"


def train_command(output_dir: str | Path, *flags: str) -> list[str]:
    """``python -m prompt_aug.train`` on the smoke recipe into ``output_dir``, with ``flags`` after."""
    return [sys.executable, "-m", "prompt_aug.train", "--config", str(SMOKE_RECIPE), "--output_dir",
            str(output_dir), *flags]  # fmt: skip
