"""The one place outside `PromptAugGRPOTrainer`'s own overrides that touches private members of TRL's
`GRPOTrainer`: the generation tuple, the reward call, the metric and completion-record buffers, the
micro-step counter and the pending completion-record columns.

Written against TRL 1.16 (`SUPPORTED_TRL`): importing this module with another TRL minor version fails with
one line saying so. When TRL changes, what to port is `PRIVATE_TRL_NAMES` (here) and the trainer's overrides;
``tests/test_trl_seam.py`` checks that no other module names a private TRL member.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
import trl

SUPPORTED_TRL = "1.16"

# Every private member of TRL's GRPOTrainer used here (the trainer's overrides are listed in its docstring).
PRIVATE_TRL_NAMES = (
    "_step",
    "_generate",
    "_calculate_rewards",
    "_metrics",
    "_logs",
    "_pending_extra_logs",
    "_log_completion_extra",
)


class TRLVersionError(ImportError):
    """The installed TRL is not the version this seam was written for."""


def check_trl_version(version: str = trl.__version__) -> None:
    """Raise `TRLVersionError` unless ``version`` is `SUPPORTED_TRL` (any patch release).

    >>> check_trl_version("1.16.2")
    >>> check_trl_version("1.17.0")
    Traceback (most recent call last):
    ...
    prompt_aug.trl_seam.TRLVersionError: prompt_aug is written for TRL 1.16 (it reaches into \
GRPOTrainer's private members, listed in prompt_aug.trl_seam.PRIVATE_TRL_NAMES) but TRL 1.17.0 \
is installed; pip install "trl==1.16.*"
    """
    if ".".join(version.split(".")[:2]) != SUPPORTED_TRL:
        raise TRLVersionError(
            f"prompt_aug is written for TRL {SUPPORTED_TRL} "
            "(it reaches into GRPOTrainer's private members, listed "
            f"in prompt_aug.trl_seam.PRIVATE_TRL_NAMES) but TRL {version} is installed; "
            f'pip install "trl=={SUPPORTED_TRL}.*"'
        )


check_trl_version()


class Generation(NamedTuple):
    """What TRL 1.16's ``GRPOTrainer._generate`` returns, by name (it is a positional tuple of 8)."""

    prompt_ids: list
    completion_ids: list
    tool_mask: list | None
    completions: list
    logprobs: list | None
    extra_fields: dict
    images: Any
    tool_images: list


class SamplingTrainer(Protocol):
    """What dynamic sampling uses of `PromptAugGRPOTrainer`: public TRL attributes, our own helpers, and (only
    through the functions of this module) TRL's private ones."""

    args: Any
    accelerator: Any
    train_dataset: Any
    num_generations: int
    reward_funcs: list
    reward_func_names: list[str]
    reward_weights: torch.Tensor
    eos_token_ids: list[int]
    max_completion_length: int
    log_completions: bool
    rollout_func: Any
    tools: Any
    environment_factories: Any

    def _reward_column(self, *funcs: Any) -> int | None: ...
    def _round_number(self) -> int: ...
    def _log_completion_extra(self, column: str, values: list) -> None: ...
    def _append_template_metrics(
        self, names: list[str], rewards: torch.Tensor | None, lengths: torch.Tensor, truncated: torch.Tensor,
        mode: str, kept: torch.Tensor | None = None,
    ) -> None: ...  # fmt: skip


def micro_step(trainer: Any) -> int:
    """TRL's micro-batch counter (``_step``): a round is generated when it is a multiple of the round size."""
    return trainer._step


def set_micro_step(trainer: Any, value: int) -> None:
    """Set TRL's micro-batch counter (``_step``)."""
    trainer._step = value


def generate(trainer: Any, prompts: list) -> Generation:
    """TRL's ``_generate`` for ``prompts`` (through the trainer's override), as a `Generation`."""
    return Generation(*trainer._generate(prompts))


def calculate_rewards(
    trainer: Any, rows: list[dict], prompts: list, completions: list, ids: list
) -> torch.Tensor:
    """TRL's ``_calculate_rewards``: the gathered (all processes' rows × reward functions) reward matrix."""
    return trainer._calculate_rewards(rows, prompts, completions, ids)


def take_pending_columns(trainer: Any) -> dict[str, list]:
    """The completion-record columns logged since the last round (TRL's ``_pending_extra_logs``), emptied."""
    pending = {key: list(values) for key, values in trainer._pending_extra_logs.items()}
    trainer._pending_extra_logs.clear()
    return pending


def log_completion_column(trainer: Any, column: str, values: list) -> None:
    """Add a column to this round's completion records (TRL's ``_log_completion_extra``)."""
    trainer._log_completion_extra(column, values)


def metrics(trainer: Any, mode: str) -> defaultdict[str, list[float]]:
    """TRL's metric buffer for ``mode`` (``train`` / ``eval``): key -> values, averaged at the next log."""
    return trainer._metrics[mode]


def completion_logs(trainer: Any) -> dict[str, Any]:
    """TRL's completion-record buffers (``_logs``): ``prompt``, ``completion``, ``advantages``, ``images``,
    ``rewards`` (name -> values) and ``extra`` (column -> values)."""
    return trainer._logs


def reset_completion_logs(trainer: Any, size: int) -> None:
    """Empty TRL's completion-record buffers, each now holding up to ``size`` records."""
    logs = trainer._logs
    for key in ("images", "prompt", "completion", "advantages"):
        logs[key] = deque(maxlen=size)
    new: Callable[[], deque] = lambda: deque(maxlen=size)
    logs["rewards"] = defaultdict(new)
    logs["extra"] = defaultdict(new)
