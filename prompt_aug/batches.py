"""A recipe's batch arithmetic: how its batch keys combine into generation rounds and optimizer steps, as
``--dry_run`` prints it (no model, no data)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .records import generation_round, micro_steps_per_round, optimizer_steps_per_round
from .sources import builtin


@dataclass
class BatchArithmetic:
    """How a recipe's batch keys combine into generation rounds and optimizer steps."""

    processes: int
    questions_per_round: int
    completions_per_round: int
    completions_per_optimizer_step: int
    optimizer_steps_per_round: float
    rounds_per_epoch: int | None
    total_rounds: int | None

    def table(self) -> str:
        rows = [
            ("processes", self.processes),
            ("questions per round", self.questions_per_round),
            ("completions per round", self.completions_per_round),
            ("completions per optimizer step", self.completions_per_optimizer_step),
            ("optimizer steps per round", _fmt(self.optimizer_steps_per_round)),
            (
                "rounds per epoch",
                self.rounds_per_epoch if self.rounds_per_epoch is not None else "? (set dataset_num_rows)",
            ),
            ("total rounds", self.total_rounds if self.total_rounds is not None else "?"),
        ]
        return "\n".join(f"{name:<32}{value}" for name, value in rows)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def planned_steps(args: Any, per_epoch: int) -> int:
    """The optimizer steps a run trains: ``max_steps`` if set, else as transformers' Trainer counts them from
    ``num_train_epochs`` and the ``per_epoch`` micro-steps of an epoch (0 for an empty epoch).

    >>> from types import SimpleNamespace as NS
    >>> planned_steps(NS(max_steps=-1, num_train_epochs=1.5, gradient_accumulation_steps=2), per_epoch=9)
    8
    """
    if args.max_steps >= 0:  # the Trainer counts epochs only for a negative max_steps
        return args.max_steps
    if not per_epoch:
        return 0
    # ceil(epochs × steps per epoch), an epoch ending on a short step; a partly trained last round counts.
    return math.ceil(args.num_train_epochs * math.ceil(per_epoch / args.gradient_accumulation_steps))


def batch_arithmetic(
    args: Any,
    script_args: Any = None,
    num_processes: int | None = None,
    rows: int | None = None,
    held_out: int = 0,
) -> BatchArithmetic:
    """The effective batch arithmetic of a parsed recipe (no model, no data; ``rows``, the questions a
    loaded dataset trains on, where known; ``held_out``, the learning demo's ``heldout_questions``, which a
    built-in set's size then loses, as training sets them aside).

    Mirrors TRL 1.16: a round generates ``generation_batch_size`` completions (``per_device_train_batch_size
    × processes × steps_per_generation`` unless set), its questions are ``/ num_generations``, and the
    `RepeatSampler` drops the last incomplete round of an epoch; total rounds count a partly trained last
    round (`planned_steps`). Rounds per epoch need the dataset's row count (``script_args.dataset_num_rows``,
    or a built-in set's size from `prompt_aug.sources.BUILTINS`).
    """
    processes = num_processes or (script_args.num_processes if script_args else None)
    processes = processes or int(os.environ.get("WORLD_SIZE", "1"))
    per_step = args.per_device_train_batch_size * processes
    steps_per_generation = args.steps_per_generation or args.gradient_accumulation_steps
    # GRPOConfig fills generation_batch_size from its own process count; recompute for `processes`.
    completions = per_step * steps_per_generation
    questions = completions // args.num_generations
    optimizer_steps = optimizer_steps_per_round(args)
    if rows is None:
        rows = script_args.dataset_num_rows if script_args else None
    source = builtin(script_args.dataset_name, "dataset") if script_args is not None else None
    if rows is None and source is not None:
        rows = max((source.rows or script_args.num_synthetic) - held_out, 0)
    rounds_per_epoch = rows // questions if rows is not None and questions else None
    total = None
    if rounds_per_epoch is not None:
        per_epoch = rounds_per_epoch * micro_steps_per_round(args)
        total = generation_round(planned_steps(args, per_epoch), args, per_epoch)
    return BatchArithmetic(
        processes=processes,
        questions_per_round=questions,
        completions_per_round=completions,
        completions_per_optimizer_step=per_step * args.gradient_accumulation_steps,
        optimizer_steps_per_round=optimizer_steps,
        rounds_per_epoch=rounds_per_epoch,
        total_rounds=total,
    )
