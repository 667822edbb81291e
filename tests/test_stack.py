"""The software stack under the package: the Python floor it shares with TRL, and the one-line refusals of a
missing part (vLLM, DeepSpeed, liger-kernel) or of a CUDA build the driver cannot run."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _floor(specifiers: str) -> Version:
    """The lowest version a ``requires-python`` admits (its ``>=``, ``~=`` and ``==`` bounds)."""
    bounds = [
        Version(s.version.rstrip(".*")) for s in SpecifierSet(specifiers) if s.operator in (">=", "~=", "==")
    ]
    assert bounds, f"{specifiers!r} sets no lower bound"
    return max(bounds)


def test_requires_python_is_trls_floor():
    ours = PYPROJECT["project"]["requires-python"]
    trls = importlib.metadata.metadata("trl")["Requires-Python"]
    assert _floor(ours) >= _floor(trls), (
        f"pyproject's requires-python {ours} admits Pythons TRL ({trls}) refuses"
    )
    assert _floor(ours) == _floor(trls), f"pyproject's requires-python {ours} is above TRL's {trls}"
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{_floor(ours).major}{_floor(ours).minor}"
