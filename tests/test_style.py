"""Code style: the repository is as `ruff format` writes it, and `ruff check` (pyproject's `[tool.ruff]`,
line length 110 enforced by E501) finds nothing.

Ruff comes with the ``test`` extra (its version pinned by constraints.txt); without it both tests skip.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (pip install -e '.[test]' -c constraints.txt)",
)


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ruff_format_leaves_every_file_as_it_is():
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, (
        f"`ruff format --check .` failed (run `ruff format .`):\n{result.stdout}{result.stderr}"
    )


def test_ruff_check_is_clean():
    result = _ruff("check", ".")
    assert result.returncode == 0, f"`ruff check .` failed:\n{result.stdout}{result.stderr}"
