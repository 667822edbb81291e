"""Prompt-augmented GRPO on TRL: a template bank, a group-consistent augmenting collator, and a thin
`GRPOTrainer` subclass with its `GRPOConfig` subclass.

The public API, imported from here::

    from prompt_aug import (
        PromptAugGRPOConfig,
        PromptAugGRPOTrainer,
        PromptAugmentationCollator,
        load_templates,
    )

Names load on first use, so ``import prompt_aug`` (and with it ``import rewards`` or a command's ``--help``)
does not import TRL or torch. Entry points: ``python -m prompt_aug.train``, ``prompt_aug.data``,
``prompt_aug.evaluate``, ``prompt_aug.plot``, ``prompt_aug.model_card``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "PromptAugGRPOTrainer": "prompt_aug.trainer",
    "PromptAugGRPOConfig": "prompt_aug.config",
    "PromptAugmentationCollator": "prompt_aug.collator",
    "Template": "prompt_aug.templates",
    "TemplateError": "prompt_aug.templates",
    "load_templates": "prompt_aug.templates",
    "select_templates": "prompt_aug.templates",
}

__all__ = [
    "PromptAugGRPOConfig",
    "PromptAugGRPOTrainer",
    "PromptAugmentationCollator",
    "Template",
    "TemplateError",
    "__version__",
    "load_templates",
    "select_templates",
]

if TYPE_CHECKING:
    from .collator import PromptAugmentationCollator
    from .config import PromptAugGRPOConfig
    from .templates import Template, TemplateError, load_templates, select_templates
    from .trainer import PromptAugGRPOTrainer


def _check_rewards_is_ours() -> None:
    """``rewards`` must be the package installed beside this one. A ``rewards.py`` (open-r1's name for its
    reward file) or ``rewards/`` in the folder Python runs from comes first on the import path and would
    hide it, and every command would then fail on an import far from the cause."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("rewards")
    ours = Path(__file__).resolve().parent.parent / "rewards" / "__init__.py"
    if spec is not None and spec.origin and Path(spec.origin).resolve() != ours:
        raise ImportError(
            f"{spec.origin} hides prompt-aug-grpo's own `rewards` package ({ours.parent}); rename it (for "
            "example to my_rewards.py) and name its functions my_rewards.function in reward_funcs"
        )


_check_rewards_is_ours()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'prompt_aug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
