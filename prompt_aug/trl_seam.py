"""The one door to TRL's private code: every private member of `GRPOTrainer` the package uses is named here.

`TRLSeam` is `GRPOTrainer` with each private method we change routed to a public hook of the same job
(``score_round``, ``prepare_micro_batch``, ``compute_rewards``, ``generate_round``, ``train_sampler``,
``token_logps_and_entropies``); each hook's default is TRL's own behaviour, reachable as ``trl_<hook>``.
`PromptAugGRPOTrainer` subclasses it and overrides only public names, so when TRL changes, this file is
what to port. The private attributes we read or set (the micro-step counter, the buffered micro-batches,
the metric and completion-record buffers, the text tokenizer, the entropy-bonus flag, the adaptive entropy
controller's last entropy) are properties and functions here. `PRIVATE_TRL_NAMES` lists them all;
``tests/test_trl_seam.py`` fails when any other file of the repository names one, or when TRL no longer has
one.

Written against TRL 1.16 (`TESTED_TRL`). Another version warns once, when a trainer is built; a TRL that
lacks a member listed here fails then, in one line naming the missing members.
"""

from __future__ import annotations

import contextlib
import functools
import json
import warnings
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
import trl
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME
from trl import GRPOTrainer
from trl.extras.profiling import profiling_decorator

from .faults import ENTROPY_FILE

TESTED_TRL = "1.16"

# Every private member of TRL's GRPOTrainer (and of transformers' Trainer beneath it) this package names.
PRIVATE_TRL_NAMES = (
    # methods routed to public hooks by `TRLSeam`
    "_generate_and_score_completions",
    "_prepare_inputs",
    "_calculate_rewards",
    "_generate",
    "_get_train_sampler",
    "_get_per_token_logps_and_entropies",
    "_load_optimizer_and_scheduler",
    # attributes and helpers read or set through this module
    "_step",
    "_buffered_inputs",
    "_metrics",
    "_tokenizer",
    "_entropy_bonus_enabled",
    "_last_world_entropy",
    "_logs",
    "_pending_extra_logs",
    "_log_completion_extra",
)

# Attributes TRL sets in __init__ (not class members): checked on the built trainer.
_INSTANCE_NAMES = (
    "_step", "_buffered_inputs", "_metrics", "_tokenizer", "_entropy_bonus_enabled", "_last_world_entropy",
    "_logs", "_pending_extra_logs",
)  # fmt: skip


class TRLVersionError(ImportError):
    """The installed TRL lacks a private member this package relies on."""


def untested_version_message(version: str) -> str | None:
    """A one-line warning when ``version`` is not the tested TRL minor version, else ``None``.

    >>> untested_version_message("1.16.2") is None
    True
    >>> untested_version_message("1.17.0")[:60]
    'prompt_aug was tested with TRL 1.16 but TRL 1.17.0 is instal'
    """
    if ".".join(version.split(".")[:2]) == TESTED_TRL:
        return None
    return (
        f"prompt_aug was tested with TRL {TESTED_TRL} but TRL {version} is installed; it uses GRPOTrainer's "
        f'private members (prompt_aug.trl_seam.PRIVATE_TRL_NAMES). If training misbehaves: pip install "trl=='
        f'{TESTED_TRL}.*"'
    )


@functools.cache
def _warn_once(message: str) -> None:
    """``message`` as a warning, once a process. Python's own once-per-place rule does not hold here: a
    trainer's construction changes the warning filters (transformers and TRL set some), which makes Python
    forget what it has shown."""
    warnings.warn(message, stacklevel=3)  # the trainer's constructor that built the seam


def missing_private_names(trainer: Any) -> list[str]:
    """The members of `PRIVATE_TRL_NAMES` that a built trainer (or TRL's class) does not have."""
    on_class = [n for n in PRIVATE_TRL_NAMES if n not in _INSTANCE_NAMES]
    missing = [n for n in on_class if not hasattr(GRPOTrainer, n)]
    return missing + [n for n in _INSTANCE_NAMES if not hasattr(trainer, n)]


def _unprofiled(name: str) -> Callable[..., Any]:
    """TRL's method ``name`` without its profiling wrapper (``trl.extras.profiling.profiling_decorator``): the
    seam's routed method carries that wrapper instead, so each of TRL's calls is timed once, under TRL's
    metric name, with the hook's own work in it, however many times a hook calls TRL's method."""
    method = getattr(GRPOTrainer, name)
    return getattr(method, "__wrapped__", method)


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


class TRLSeam(GRPOTrainer):
    """`GRPOTrainer` whose private steps are public hooks; on its own it trains exactly as `GRPOTrainer`.

    At construction it warns once on an untested TRL version, and fails in one line when TRL lacks a private
    member listed in `PRIVATE_TRL_NAMES`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        message = untested_version_message(trl.__version__)
        if message is not None:
            _warn_once(message)
        super().__init__(*args, **kwargs)
        missing = missing_private_names(self)
        if missing:
            raise TRLVersionError(
                f"TRL {trl.__version__}'s GRPOTrainer has no {', '.join(missing)}, which prompt_aug uses; "
                f'pip install "trl=={TESTED_TRL}.*"'
            )

    # -- hooks: override the public name; ``trl_<name>`` is TRL's behaviour -------------------------------

    def score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Generate and score one round of rows (TRL's ``_generate_and_score_completions``)."""
        return self.trl_score_round(inputs)

    def trl_score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return super()._generate_and_score_completions(inputs)

    def prepare_micro_batch(self, generation_batch: Any) -> Any:
        """The micro-batch to train on now, generating a round when one is due (``_prepare_inputs``)."""
        return self.trl_prepare_micro_batch(generation_batch)

    def trl_prepare_micro_batch(self, generation_batch: Any) -> Any:
        return _unprofiled("_prepare_inputs")(self, generation_batch)

    def compute_rewards(self, inputs: list, prompts: list, completions: list, ids: list) -> torch.Tensor:
        """The gathered (all processes' rows x reward functions) reward matrix (``_calculate_rewards``)."""
        return self.trl_compute_rewards(inputs, prompts, completions, ids)

    def trl_compute_rewards(self, inputs: list, prompts: list, completions: list, ids: list) -> torch.Tensor:
        return _unprofiled("_calculate_rewards")(self, inputs, prompts, completions, ids)

    def generate_round(self, prompts: list) -> Generation:
        """Completions of ``prompts`` (``_generate``)."""
        return self.trl_generate_round(prompts)

    def trl_generate_round(self, prompts: list) -> Generation:
        return Generation(*super()._generate(prompts))

    def train_sampler(self, dataset: Any = None) -> Any:
        """The training sampler (``_get_train_sampler``)."""
        return self.trl_train_sampler(dataset)

    def trl_train_sampler(self, dataset: Any = None) -> Any:
        return super()._get_train_sampler(dataset)

    def token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
        """Per-token log-probs, entropies and MoE aux loss of the last ``logits_to_keep`` columns; every
        forward pass of training runs through it (``_get_per_token_logps_and_entropies``)."""
        return self.trl_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
            **kwargs,
        )  # fmt: skip

    def trl_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:  # fmt: skip
        return _unprofiled("_get_per_token_logps_and_entropies")(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
            compute_aux_loss, **kwargs,
        )  # fmt: skip

    # -- the private methods, each routed to its hook ---------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        return self.score_round(inputs)

    @profiling_decorator  # timed as TRL times it, hook and all (`_unprofiled`)
    def _prepare_inputs(self, generation_batch):
        return self.prepare_micro_batch(generation_batch)

    @profiling_decorator
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.compute_rewards(inputs, prompts, completions, completion_ids_list)

    def _generate(self, prompts):
        return tuple(self.generate_round(prompts))

    def _get_train_sampler(self, dataset=None):
        return self.train_sampler(dataset)

    # TRL's parameter names: callers may pass them by keyword (``logits_to_keep=4``).
    @profiling_decorator
    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, *rest, **kw
    ):
        return self.token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *rest, **kw)

    # Why: transformers 5.17 (the GPU stack's) loads the optimizer state of a run with several processes
    # onto ``args.device``; on CPU that is ``cpu:0``, which torch.load rejects, so a multi-process CPU run
    # could not resume. There the optimizer and scheduler states are loaded onto plain "cpu" here, and TRL's
    # own extra state (the adaptive entropy controller) is restored after them, as TRL's override does.
    def _load_optimizer_and_scheduler(self, checkpoint):
        device = self.args.device
        folder = Path(checkpoint) if checkpoint is not None else None
        engine = self.is_deepspeed_enabled or self.is_fsdp_enabled
        indexed_cpu = device.type == "cpu" and device.index is not None
        if folder is None or engine or not indexed_cpu or not (folder / OPTIMIZER_NAME).is_file():
            return super()._load_optimizer_and_scheduler(checkpoint)
        load = {"map_location": "cpu", "weights_only": True}
        self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_NAME, **load))
        self.lr_scheduler.load_state_dict(torch.load(folder / SCHEDULER_NAME, **load))
        self._load_entropy_state(folder)
        return None

    def _load_entropy_state(self, folder: Path) -> None:
        """TRL's adaptive entropy coefficient and last measured entropy from ``folder``'s
        ``entropy_ctrl_state.json``, as TRL's ``_load_optimizer_and_scheduler`` restores them (a missing file
        leaves the initial values, as TRL does)."""
        path = folder / ENTROPY_FILE
        if self.use_adaptive_entropy and path.is_file():
            state = json.loads(path.read_text())
            self.entropy_coef = state["entropy_coef"]
            self._last_world_entropy = state["last_world_entropy"]

    # -- private attributes --------------------------------------------------------------------------------

    @property
    def micro_step(self) -> int:
        """TRL's micro-batch counter (``_step``): a round is generated when it is a multiple of a round."""
        return self._step

    @micro_step.setter
    def micro_step(self, value: int) -> None:
        self._step = value

    @property
    def buffered_micro_batches(self) -> list[dict] | None:
        """The current round's micro-batches as TRL buffered them (``_buffered_inputs``); ``None`` before the
        first round."""
        return self._buffered_inputs

    @buffered_micro_batches.setter
    def buffered_micro_batches(self, value: list[dict]) -> None:
        self._buffered_inputs = value

    @property
    def text_tokenizer(self) -> Any:
        """The tokenizer of the processing class (TRL's ``_tokenizer``)."""
        return self._tokenizer

    @property
    def entropy_bonus_enabled(self) -> bool:
        """Whether TRL adds an entropy bonus to the loss (computed per micro-batch)."""
        return bool(getattr(self, "_entropy_bonus_enabled", False))

    def metric_buffer(self, mode: str) -> defaultdict[str, list[float]]:
        """TRL's metric buffer for ``mode`` (``train`` / ``eval``): key -> values, averaged when logged."""
        return self._metrics[mode]

    def save_model_unpushed(self, output_dir: str | None = None) -> None:
        """`save_model`, without the push transformers makes from it when ``push_to_hub`` is on (its
        ``_internal_call`` says a save is part of something larger): a run's end saves the model, writes its
        card and files, then pushes once."""
        self.save_model(output_dir, _internal_call=True)

    def log_completion_column(self, column: str, values: list) -> None:
        """Add a column to this round's completion records (TRL's ``_log_completion_extra``)."""
        self._log_completion_extra(column, values)


class SamplingTrainer(Protocol):
    """What dynamic sampling uses of `PromptAugGRPOTrainer`: public TRL attributes, `TRLSeam`'s hooks and our
    own helpers (TRL's private buffers only through the functions of this module)."""

    args: Any
    accelerator: Any
    train_dataset: Any
    num_generations: int
    reward_funcs: list
    reward_func_names: list[str]
    reward_weights: torch.Tensor
    eos_token_ids: list[int]
    text_tokenizer: Any
    max_completion_length: int
    log_completions: bool
    rollout_func: Any
    tools: Any
    environment_factories: Any
    micro_step: int
    template_metrics: Any  # `prompt_aug.metrics.TemplateMetrics`

    def generate_round(self, prompts: list) -> Generation: ...
    def compute_rewards(self, inputs: list, prompts: list, completions: list, ids: list) -> torch.Tensor: ...
    def log_completion_column(self, column: str, values: list) -> None: ...
    def metric_buffer(self, mode: str) -> defaultdict[str, list[float]]: ...
    def round_number(self) -> int: ...


def take_pending_columns(trainer: Any) -> dict[str, list]:
    """The completion-record columns logged since the last round (TRL's ``_pending_extra_logs``), emptied."""
    pending = {key: list(values) for key, values in trainer._pending_extra_logs.items()}
    trainer._pending_extra_logs.clear()
    return pending


def completion_logs(trainer: Any) -> dict[str, Any]:
    """TRL's completion-record buffers (``_logs``): ``prompt``, ``completion``, ``advantages``, ``images``,
    ``rewards`` (name -> values) and ``extra`` (column -> values)."""
    return trainer._logs


def reset_completion_logs(trainer: Any, size: int | None) -> None:
    """Empty TRL's completion-record buffers, each now holding up to ``size`` records (``None``: all)."""
    logs = trainer._logs
    for key in ("images", "prompt", "completion", "advantages"):
        logs[key] = deque(maxlen=size)
    new: Callable[[], deque] = lambda: deque(maxlen=size)
    logs["rewards"] = defaultdict(new)
    logs["extra"] = defaultdict(new)


@contextlib.contextmanager
def separate_completion_logs(trainer: Any, size: int | None = None) -> Iterator[None]:
    """Inside the block, TRL's completion-record buffers and the columns pending for them are new ones that
    keep ``size`` records (``None``: every one); the earlier ones are back, untouched, after it."""
    saved = trainer._logs, trainer._pending_extra_logs
    trainer._logs, trainer._pending_extra_logs = {}, defaultdict(list)
    reset_completion_logs(trainer, size)
    try:
        yield
    finally:
        trainer._logs, trainer._pending_extra_logs = saved


def hub_push_running(trainer: Any) -> bool:
    """Whether transformers' background Hub upload started at the last save (the Trainer's
    ``push_in_progress``) is still running; False where the trainer pushes nothing."""
    push = getattr(trainer, "push_in_progress", None)
    return push is not None and not push.is_done()
