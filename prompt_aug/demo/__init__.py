"""The learning demo and the offline stand-ins: keys, and the one hook the training path calls.

What lives here is for the demo and the tests, not for training a real model: the random Qwen2 models and
the generated questions built in code (`prompt_aug.demo.smoke`), and the supervised warm start with its
before/after table (`prompt_aug.demo.warmstart`). The training path reaches them only through the functions
below, by the import paths of `prompt_aug.sources.BUILTINS` (a built-in model or dataset name) and
`prompt_aug.sources.demo_stage` (the `DemoArguments` keys); each imports its module when the recipe asks for
it, so a run on a real model and dataset imports no demo module beyond this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def cache_folder(value: str | None) -> str | None:
    """``warmstart_cache`` as a folder, or None for no cache: unset, empty, ``none`` or ``false``.

    >>> [cache_folder(v) for v in [None, "", "None", "false", "outputs/warmstart"]]
    [None, None, None, None, 'outputs/warmstart']
    """
    return None if value is None or value.strip().lower() in ("", "none", "false") else value


@dataclass
class DemoArguments:
    """Recipe keys of the learning demo (``recipes/smoke/learn_cpu.yaml``): a supervised warm start before
    GRPO and a before/after table. All off by default."""

    warmstart_steps: int = field(
        default=0, metadata={"help": "Supervised steps on the training questions before GRPO (0: none)."}
    )
    warmstart_batch_size: int = field(default=32, metadata={"help": "Examples per warm-start step."})
    warmstart_learning_rate: float = field(
        default=1e-2, metadata={"help": "Warm-start AdamW learning rate (cosine decay to 0)."}
    )
    warmstart_wellformed: float = field(
        default=0.5, metadata={"help": "Share of warm-start targets written in their template's layout."}
    )
    warmstart_answer_correct: float = field(
        default=1.0,
        metadata={
            "help": "Share of warm-start targets whose boxed answer is right (the rest box another answer)."
        },
    )
    warmstart_cache: str | None = field(
        default=None,
        metadata={
            "help": "Folder keeping warm-started weights, a file per model, questions, templates, settings, "
            "seed and stack: a run that finds its own there loads it instead of training it again (the "
            "control run of the same seed, a rerun); one making it meanwhile is waited for. Unset, '' or "
            "none: no cache."
        },
    )
    heldout_questions: int = field(
        default=0,
        metadata={
            "help": "Questions kept out of warm start and GRPO, scored by before_after (without it they are "
            "only kept out, for a scorer of one's own: bench/ablation.py)."
        },
    )
    before_after: bool = field(
        default=False,
        metadata={"help": "Score every template before and after GRPO; print and write before_after.md."},
    )

    def __post_init__(self) -> None:
        """Refuse a count or share out of its range, and a ``warmstart_cache`` that is (or lies under) a file
        (`ValueError`, one line naming the key)."""
        for name, low in (("warmstart_steps", 0), ("warmstart_batch_size", 1), ("heldout_questions", 0)):
            value = getattr(self, name)
            if not value >= low:
                raise ValueError(f"{name}: must be at least {low}, got {value}")
        if not 0 < self.warmstart_learning_rate < math.inf:  # NaN too; inf trains to NaN
            rate = self.warmstart_learning_rate
            raise ValueError(f"warmstart_learning_rate: must be a finite number above 0, got {rate}")
        for name in ("warmstart_wellformed", "warmstart_answer_correct"):
            value = getattr(self, name)
            if not 0 <= value <= 1:  # NaN too
                raise ValueError(
                    f"{name}: a share of the warm-start targets, must be from 0 to 1, got {value}"
                )
        cache = self.cache
        if cache is not None and self.warmstart_steps > 0:  # else it fails only after the model has loaded
            from ..sources import file_in_the_way

            file = file_in_the_way(Path(cache).expanduser())
            if file is not None:
                raise ValueError(
                    f"warmstart_cache: {file} is a file, not a folder; give a folder, or none for no cache"
                )

    @property
    def cache(self) -> str | None:
        """The warm start's cache folder (`cache_folder` of ``warmstart_cache``); None for no cache."""
        return cache_folder(self.warmstart_cache)

    @property
    def enabled(self) -> bool:
        """Whether the recipe asks for any part of the demo's before-GRPO stage."""
        return self.warmstart_steps > 0 or self.before_after or self.heldout_questions > 0


def build_model(name: str, output_dir: str, seed: int) -> str:
    """Build the random model ``name`` (a model of `prompt_aug.sources.BUILTINS`) in ``output_dir``; returns
    its path."""
    from pathlib import Path

    from .smoke import build_tiny_model

    path = Path(output_dir) / name
    build_tiny_model(path, seed=seed, name=name)
    return str(path)


def builtin_rows(name: str, num_synthetic: int, seed: int) -> list[dict[str, str]]:
    """The rows of the built-in dataset ``name`` (a dataset of `prompt_aug.sources.BUILTINS`)."""
    from .smoke import (
        ADDITION_DATASET_NAME,
        DIGIT_SUMS_DATASET_NAME,
        addition_problems,
        digit_sum_problems,
        synthetic_problems,
    )

    if name == ADDITION_DATASET_NAME:
        return addition_problems()
    if name == DIGIT_SUMS_DATASET_NAME:
        return digit_sum_problems()
    return synthetic_problems(num_synthetic, seed=seed)


def builtin_tokenizer() -> Any:
    """The small ChatML tokenizer of the built-in models."""
    from .smoke import build_tiny_tokenizer

    return build_tiny_tokenizer()


def before_grpo(
    demo: DemoArguments, model: Any, tokenizer: Any, dataset: Any, templates: list, args: Any
) -> tuple[Any, Any]:
    """The demo's stage before GRPO (held-out split, warm start, "before" scores) when ``demo`` asks for it.

    Returns the training dataset and the `BeforeAfter` to finish after training (``None`` when off).
    """
    if not demo.enabled:
        return dataset, None
    from .warmstart import prepare

    return prepare(model, tokenizer, dataset, templates, demo, args)
