"""The seam to TRL's private code: every private member of `GRPOTrainer` the repository uses is named in
`prompt_aug/trl_seam.py` and nowhere else, it is listed there, and TRL still has it.

"Private" means a member of TRL's `GRPOTrainer` or transformers' `Trainer` whose name starts with one
underscore: its methods, and the ``self._x`` attributes their source assigns. A use is an attribute access
(``trainer._metrics``), a method definition that overrides one (``def _prepare_inputs``) or a string given to
``getattr``/``setattr``/``hasattr``/``delattr``.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import warnings
from pathlib import Path

import pytest
import transformers.trainer
import trl
import trl.trainer.grpo_trainer
from trl import GRPOConfig, GRPOTrainer

from prompt_aug import trl_seam

REPO = Path(__file__).resolve().parents[1]
SEAM = "prompt_aug/trl_seam.py"


def _private_trainer_names() -> set[str]:
    """Private members of TRL's GRPOTrainer and transformers' Trainer: methods and ``self._x`` attributes."""
    names = {n for n in dir(GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    for module in (trl.trainer.grpo_trainer, transformers.trainer):
        names |= set(re.findall(r"\bself\.(_[a-z]\w*)\s*=", inspect.getsource(module)))
    return names


def _names_used(path: Path) -> set[str]:
    """Attribute names, method names and string arguments of getattr-like calls in a Python file."""
    tree = ast.parse(path.read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used.add(node.name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            used.add(node.args[1].value)
    return used


def _python_files(root: Path) -> list[Path]:
    """Every Python file of the repository, outside hidden folders (``.git``, venvs) and build output."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "dist", "__pycache__")]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def _offenders(root: Path, private: set[str]) -> dict[str, list[str]]:
    found = {}
    for path in _python_files(root):
        relative = path.relative_to(root).as_posix()
        names = _names_used(path) & private
        if relative != SEAM and names:
            found[relative] = sorted(names)
    return found


def test_no_file_but_the_seam_names_a_private_trl_member():
    offenders = _offenders(REPO, _private_trainer_names())
    assert not offenders, f"private TRL members named outside {SEAM}: {offenders}"


def test_the_seam_lists_exactly_the_private_names_it_uses_and_trl_has_them():
    private = _private_trainer_names()
    used = _names_used(REPO / SEAM) & private
    assert used == set(trl_seam.PRIVATE_TRL_NAMES), (
        f"used, not listed: {used - set(trl_seam.PRIVATE_TRL_NAMES)}; "
        f"listed, not used: {set(trl_seam.PRIVATE_TRL_NAMES) - used}"
    )
    assert set(trl_seam.PRIVATE_TRL_NAMES) <= private, (
        f"gone from TRL: {set(trl_seam.PRIVATE_TRL_NAMES) - private}"
    )


def test_each_routed_private_method_takes_trls_parameter_names():
    """A caller may pass TRL's arguments by keyword (TRL's own tests call the log-prob step with
    ``logits_to_keep=4``), so each override in the seam names its parameters as TRL does, in TRL's order,
    and takes the rest through ``*args`` / ``**kwargs``."""
    for name in trl_seam.PRIVATE_TRL_NAMES:
        ours = vars(trl_seam.TRLSeam).get(name)
        if not callable(ours):
            continue
        theirs = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        params = inspect.signature(ours).parameters.values()
        named = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert named == theirs[: len(named)], f"{name}{inspect.signature(ours)} renames TRL's {theirs}"
        rest = {p.kind for p in params} & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
        assert len(named) == len(theirs) or len(rest) == 2, f"{name} drops TRL's {theirs[len(named) :]}"


@pytest.mark.parametrize(
    "source, name",
    [
        ("def f(trainer):\n    return trainer._metrics['train']\n", "_metrics"),
        (
            "def f(trainer):\n    return getattr(trainer, '_entropy_bonus_enabled', False)\n",
            "_entropy_bonus_enabled",
        ),
        ("class T:\n    def _prepare_inputs(self, batch):\n        return batch\n", "_prepare_inputs"),
    ],
)
def test_the_scan_catches_an_attribute_a_getattr_string_and_an_override(tmp_path, source, name):
    for where in ("bench/bad.py", "tool.py", "docs/examples/snippet.py", ".venv/lib/trl_copy.py"):
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(source)
    found = _offenders(tmp_path, _private_trainer_names())
    assert found == {"bench/bad.py": [name], "docs/examples/snippet.py": [name], "tool.py": [name]}


def test_an_untested_trl_version_builds_the_config_and_the_trainer_warns_once(
    tiny_model_dir, tmp_path, monkeypatch
):
    from prompt_aug import PromptAugGRPOConfig
    from prompt_aug.trainer import PromptAugGRPOTrainer

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=4,
    )  # fmt: skip

    def build() -> None:
        PromptAugGRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args, train_dataset=_dataset(),
        )  # fmt: skip

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own rule: a warning from one place shows once
        build()
        build()
    ours = [w for w in caught if "tested with TRL 1.16 but TRL 1.17.0" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]


def test_a_trl_without_a_listed_member_fails_at_init_in_one_line(tiny_model_dir, tmp_path, monkeypatch):
    class Older(trl_seam.TRLSeam):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

    monkeypatch.delattr(GRPOTrainer, "_log_completion_extra")
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=2, num_generations=2)  # fmt: skip
    with pytest.raises(trl_seam.TRLVersionError) as err:
        Older(model=str(tiny_model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
              args=args, train_dataset=_dataset())  # fmt: skip
    message = str(err.value)
    assert "\n" not in message and "has no _log_completion_extra" in message and "trl==1.16.*" in message


def test_the_generation_tuple_names_what_trl_generates(tiny_model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False,
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=4)  # fmt: skip
    trainer = trl_seam.TRLSeam(
        model=str(tiny_model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=_dataset(),
    )  # fmt: skip
    prompts = ["What is 1 + 1?", "What is 2 + 2?", "Name a prime."]
    generation = trainer.trl_generate_round(prompts)
    assert isinstance(generation, trl_seam.Generation)
    assert len(generation.prompt_ids) == len(generation.completion_ids) == len(generation.completions) == 3
    assert all(isinstance(text, str) for text in generation.completions)
    assert all(1 <= len(ids) <= 4 for ids in generation.completion_ids)
    assert isinstance(generation.extra_fields, dict)


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": ["What is 1 + 1?", "What is 2 + 2?"]})
