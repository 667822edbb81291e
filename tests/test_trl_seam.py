"""The seam to TRL's private code: which private members of `GRPOTrainer` we use, and where.

Only `prompt_aug/trainer.py` (the subclass's own overrides) and `prompt_aug/trl_seam.py` may name a private
member of TRL's or transformers' trainer; when TRL is upgraded, `PRIVATE_TRL_NAMES` and the trainer's
overrides are what to port.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import transformers.trainer
import trl.trainer.grpo_trainer
from trl import GRPOTrainer

from prompt_aug import trl_seam

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {"prompt_aug/trainer.py", "prompt_aug/trl_seam.py"}

# What dynamic sampling needs of TRL's private code; a change here is a change of the seam.
EXPECTED_PRIVATE = {
    "_step", "_generate", "_calculate_rewards", "_metrics", "_logs", "_pending_extra_logs",
    "_log_completion_extra",
}  # fmt: skip


def _private_trainer_names() -> set[str]:
    """Private members of TRL's GRPOTrainer and transformers' Trainer: methods and ``self._x`` attributes."""
    names = {n for n in dir(GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    for module in (trl.trainer.grpo_trainer, transformers.trainer):
        names |= set(re.findall(r"\bself\.(_[a-z]\w*)\s*=", inspect.getsource(module)))
    return names


def _attributes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_the_seam_lists_exactly_the_private_names_it_uses_and_trl_has_them():
    assert set(trl_seam.PRIVATE_TRL_NAMES) == EXPECTED_PRIVATE
    private = _private_trainer_names()
    assert EXPECTED_PRIVATE <= private, f"gone from TRL: {EXPECTED_PRIVATE - private}"
    used = {name for name in _attributes(REPO / "prompt_aug/trl_seam.py") if name in private}
    assert used == EXPECTED_PRIVATE


def test_only_the_trainer_and_the_seam_name_private_trl_members():
    private = _private_trainer_names()
    offenders = {}
    for path in sorted([*(REPO / "prompt_aug").rglob("*.py"), *(REPO / "rewards").rglob("*.py")]):
        relative = path.relative_to(REPO).as_posix()
        if relative in ALLOWED:
            continue
        found = _attributes(path) & private
        if found:
            offenders[relative] = sorted(found)
    assert not offenders, f"private TRL members named outside the seam: {offenders}"


def test_a_scan_would_catch_an_offender(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(trainer):\n    return trainer._metrics['train']\n")
    assert _attributes(bad) & _private_trainer_names() == {"_metrics"}


def test_another_trl_version_is_refused_with_one_line():
    trl_seam.check_trl_version("1.16.3")
    with pytest.raises(trl_seam.TRLVersionError, match=r"written for TRL 1\.16 .* TRL 1\.17\.0 is installed"):
        trl_seam.check_trl_version("1.17.0")


def test_the_generation_tuple_has_trls_arity():
    source = inspect.getsource(GRPOTrainer._generate)
    returned = source.rstrip().splitlines()[-1].strip()
    assert returned.startswith("return ") and returned.count(",") + 1 == len(trl_seam.Generation._fields)
