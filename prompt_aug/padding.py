"""Padding-free training passes: which path runs (`PaddingFreePasses`: packed, trimmed or TRL's padded), and
the exact regrouping and trimming of a round's micro-batches.

TRL 1.16 pads every row of a generation round to the round's longest prompt (on the left) and longest
completion (on the right), and runs the old-log-prob pass and every training micro-batch at that width.
Each path keeps TRL's calls (one per micro-batch, one per ``batch_size`` rows of a round) and its update:

* ``auto`` (default): ``packed`` on CUDA and CPU (`PACKED_DEVICES`), ``trim`` elsewhere (unmeasured there),
  chosen once by `PaddingFreePasses.choose` and logged; on CUDA, ``trim`` from the first call where a packed
  call would compute a dense T x T mask (no varlen kernel, a GPU, head width or dtype it does not take,
  attention dropout, eager attention, varlen attention that failed its live check), in one more log line.
* ``packed``: each call's real tokens run as one packed row (`prompt_aug.packing`), padding-free; on CUDA
  with torch's ``varlen_attn``, and on CPU with SDPA a sequence, the attention runs only each sequence's own
  triangle (`prompt_aug.varlen`).
* ``trim``: each call is cut to its own longest prompt and completion, rows of a no-grad pass sorted by
  length first (`chunked_forward`); the fallback when packing cannot serve the model.
* ``off``: TRL's padded calls.

With ``packed`` and ``trim``, a new round's micro-batches are trimmed (`trim`), and with ``trim`` also ordered
by length within each optimizer step first (`regroup`), where that leaves the update unchanged. No row moves
to another optimizer step.

Pure torch: `prompt_aug.trainer` and `bench/gpu_round.py` (which runs where TRL is not installed) share it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import gather

from .balance import balanced_groups, shared_prefix
from .packing import (
    context_limit,
    eval_mode,
    fused_head_call,
    host_rows,
    packed_forward,
    packing_check,
    packing_unsupported_reason,
    position_dependence,
    prompt_groups,
    shared_prompts_check,
    unwrap_model,
)
from .records import micro_steps_per_round, optimizer_step_of
from .varlen import (
    VARLEN_ATTENTION,
    KernelError,
    attention_of,
    capability_of,
    dense_mask_reason,
    head_dim_of,
    restore_sdpa,
    set_varlen_attention,
    use_varlen_attention,
    varlen_kernel,
)

logger = logging.getLogger("prompt_aug")

# The paths a forward pass can take (the ``trim_padding`` key); the first is the default.
PADDING_MODES = ("auto", "packed", "trim", "off")
# The device types on which ``auto`` is ``packed`` (measured faster than ``trim`` there: docs/benchmarks.md).
PACKED_DEVICES = ("cuda", "cpu")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "none")


def padding_mode(value: Any) -> str:
    """A ``trim_padding`` value as one of `PADDING_MODES`; the old booleans still work (true: ``packed``, the
    path they meant; false: ``off``, TRL's padded passes).

    >>> padding_mode(True), padding_mode("false"), padding_mode("trim"), padding_mode("AUTO")
    ('packed', 'off', 'trim', 'auto')
    """
    text = str(value).strip().lower()
    if text in PADDING_MODES[:3]:
        return text
    if value is True or text in _TRUE:
        return "packed"
    if value is False or text in _FALSE:
        return "off"
    raise ValueError(f"trim_padding: {value!r} is not one of {', '.join(PADDING_MODES)} (or true / false)")


def max_tokens_refusal(max_tokens: int | None, processes: int, mode: str) -> str | None:
    """Why ``packing_max_tokens`` (``max_tokens``) cannot be used on ``processes`` processes on the
    ``trim_padding`` path ``mode``, or None: a budget splits packed calls, and with several processes every
    process must make as many model calls (DDP, FSDP and ZeRO-3 hang otherwise)."""
    if max_tokens is None or processes <= 1 or padding_mode(mode) not in ("packed", "auto"):
        return None
    return (
        f"packing_max_tokens: splits packed calls, and with {processes} processes every process must make "
        "as many calls; unset packing_max_tokens (the default budget never splits)"
    )


# Left-padded (B, P) tensors.
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Right-padded (B, C) tensors over the completion; `importance_sampling_ratio` may also be (B, 1).
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
# One value per row.
ROW_KEYS = ("advantages", "template_index")
# Keys of a micro-batch that `trim` and `regroup` know how to handle; a batch with any other key (images,
# token type ids) is left as TRL built it.
KNOWN_KEYS = frozenset(PROMPT_KEYS + COMPLETION_KEYS + ROW_KEYS + ("num_items_in_batch",))


def can_trim(batch: dict) -> bool:
    """Whether every key of ``batch`` is one `trim` and `regroup` know (no images, no token type ids)."""
    return "prompt_mask" in batch and "completion_mask" in batch and set(batch) <= KNOWN_KEYS


def row_lengths(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row: prompt plus completion (a completion whose mask TRL zeroed counts 0)."""
    return prompt_mask.sum(dim=1) + completion_mask.sum(dim=1)


def trim(batch: dict, left: bool = True) -> dict:
    """``batch`` cut to its own longest prompt (left; with ``left=False`` prompts keep their width, for a
    model whose values follow the padding before a row: `prompt_aug.packing.position_dependence`) and
    completion (right); other values unchanged.

    Widths are read off ``prompt_mask`` (ones at the right of each row) and ``completion_mask`` (ones at the
    left). A completion keeps at least two columns where it has them: TRL's loss reads a one-column tensor
    as one value per sequence (``importance_sampling_level="sequence"``), and would average its token
    metrics (entropy, clipping) over rows instead of tokens; and ``logits_to_keep`` stays positive.
    """
    prompt_width = batch["prompt_mask"].size(1)
    completion_width = batch["completion_mask"].size(1)
    keep_prompt = int(batch["prompt_mask"].sum(dim=1).max().item()) if prompt_width and left else prompt_width
    keep_completion = max(2, int(batch["completion_mask"].sum(dim=1).max().item()))
    keep_completion = min(keep_completion, completion_width)
    out = dict(batch)
    for key in PROMPT_KEYS:
        if out.get(key) is not None:
            out[key] = out[key][:, prompt_width - keep_prompt :]
    for key in COMPLETION_KEYS:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.ndim == 2 and value.size(1) == completion_width:
            out[key] = value[:, :keep_completion]
    return out


def optimizer_step_segments(
    step: int,
    steps_per_generation: int,
    num_iterations: int,
    gradient_accumulation_steps: int,
    per_epoch: int | None = None,
) -> list[list[int]]:
    """The buffered micro-batches of a round that always share an optimizer step, as runs of indices.

    TRL replays the round's ``steps_per_generation`` micro-batches ``num_iterations`` times from micro-step
    ``step`` on, and the Trainer steps the optimizer every ``gradient_accumulation_steps`` micro-steps,
    starting again at each epoch of ``per_epoch`` micro-steps (`prompt_aug.records.optimizer_step_of`).
    Micro-batches ``i`` and ``j`` share a segment when they fall in the same optimizer step in every pass, so
    rows may move between them without moving to another optimizer step.
    """
    keys = [
        tuple(
            optimizer_step_of(step + it * steps_per_generation + j, gradient_accumulation_steps, per_epoch)
            for it in range(num_iterations)
        )
        for j in range(steps_per_generation)
    ]
    segments: list[list[int]] = []
    for j, key in enumerate(keys):
        if segments and keys[segments[-1][-1]] == key:
            segments[-1].append(j)
        else:
            segments.append([j])
    return segments


def _width(batch: dict) -> int:
    """The columns of a micro-batch's model call: its prompt's and its completion's."""
    prompt, completion = batch.get("prompt_ids"), batch.get("completion_ids")
    return sum(t.size(1) for t in (prompt, completion) if isinstance(t, torch.Tensor))


def _cat(batches: Sequence[dict]) -> dict:
    out = {}
    for key, value in batches[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            out[key] = torch.cat([b[key] for b in batches], dim=0)
        else:
            out[key] = value  # a scalar shared by the round (num_items_in_batch) or None
    return out


def _take(batch: dict, rows: torch.Tensor) -> dict:
    return {k: v[rows] if isinstance(v, torch.Tensor) and v.ndim > 0 else v for k, v in batch.items()}


def _prompt_keys(batch: dict) -> list[tuple[int, int]]:
    """Per row of ``batch``: a number naming its prompt (rows with the same prompt ids and length, at least 2
    tokens, which packing shares, have one) and the prompt's real length, read on the CPU in one copy."""
    on_host = host_rows(batch["prompt_ids"], batch["prompt_mask"], 0, share_prompts=True)
    groups = prompt_groups(on_host.prompt_ids, on_host.prompt_lengths)
    keys = list(range(len(on_host.prompt_lengths)))
    for group in groups or []:
        if shared_prefix(int(on_host.prompt_lengths[group[0]])):
            for row in group:
                keys[row] = group[0]
    return [(key, int(length)) for key, length in zip(keys, on_host.prompt_lengths.tolist(), strict=True)]


def regroup(
    micro_batches: Sequence[dict],
    segments: Sequence[Sequence[int]],
    sort: bool = True,
    balance: bool = False,
    share_prompts: bool = False,
    left: bool = True,
) -> list[dict]:
    """Micro-batches with rows ordered by length (longest first) inside each segment, each then trimmed.

    ``micro_batches`` are TRL's buffered micro-batches of one round (equal sizes, the round's widths);
    ``segments`` cover their indices (see `optimizer_step_segments`). Each micro-batch keeps its size, and
    each row stays in its segment. With ``sort=False`` rows stay where they are and each is only trimmed
    (for a loss that depends on which micro-batch a row is in). With ``balance=True`` (and ``sort``) the rows
    of a segment are dealt out so the micro-batches cost about the same (`prompt_aug.balance`; for packed
    calls) instead of sorted (which suits trimmed calls: rows of like length share a width); with
    ``share_prompts`` too, rows that share a prompt are dealt together where they fit, as a packed call that
    shares prompts runs each once (`prompt_aug.balance.balanced_groups`' ``prompts``). ``left`` is `trim`'s.
    """
    out: list[dict] = list(micro_batches)
    for segment in segments:
        if not sort or len(segment) == 1:
            for j in segment:
                out[j] = trim(micro_batches[j], left)
            continue
        sizes = [len(micro_batches[j]["completion_mask"]) for j in segment]
        joined = _cat([micro_batches[j] for j in segment])
        lengths = row_lengths(joined["prompt_mask"], joined["completion_mask"])
        if balance:
            prompts = _prompt_keys(joined) if share_prompts else None
            groups = balanced_groups(lengths.tolist(), sizes, prompts=prompts)
            order = torch.tensor([i for group in groups for i in group], device=lengths.device)
        else:
            order = torch.sort(lengths, descending=True, stable=True).indices
        start = 0
        for j, size in zip(segment, sizes, strict=True):
            out[j] = trim(_take(joined, order[start : start + size]), left)
            start += size
    return out


# TRL 1.16's loss types whose weight for a row does not depend on the other rows of its micro-batch, given
# micro-batches of as many rows: per-row means averaged over the rows (grpo, sapo, luspo), a constant per row
# (dr_grpo), or the round's token count (dapo, cispo, vespo).
ROW_WEIGHTED_LOSSES = frozenset({"grpo", "sapo", "luspo", "dr_grpo", "dapo", "cispo", "vespo"})


def regrouping_is_exact(trainer: Any) -> bool:
    """Whether moving rows between micro-batches of one optimizer step leaves ``trainer``'s update unchanged.

    True when the loss weighs each row independently of its micro-batch (a loss type of
    `ROW_WEIGHTED_LOSSES`, not bnpo, whose normaliser is the micro-batch's token count, nor one TRL adds
    later until it is read; and no entropy bonus, entropy quantile mask or MoE aux loss, all computed per
    micro-batch), and this optimizer step accumulates the full ``gradient_accumulation_steps`` (not an
    epoch's short last one).
    """
    per_micro_batch = (
        trainer.loss_type not in ROW_WEIGHTED_LOSSES
        or trainer.entropy_bonus_enabled
        or trainer.top_entropy_quantile < 1.0
        or trainer.aux_loss_enabled
    )
    full_step = trainer.current_gradient_accumulation_steps == trainer.args.gradient_accumulation_steps
    return not per_micro_batch and full_step


def chunked_forward(
    score: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor | None, ...]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    rows_per_chunk: int,
    left: bool = True,
) -> tuple[torch.Tensor | None, ...]:
    """Per-token outputs of the last ``logits_to_keep`` columns, as trimmed chunks of ``rows_per_chunk`` rows.

    ``score(ids, mask, keep)`` runs the model on a chunk and returns (rows, keep) tensors (log-probs,
    entropies; ``None`` for one not computed), 0 where the mask is 0 as TRL's fused head gives them.
    ``input_ids`` is ``cat(prompt, completion)``, prompts left-padded and completions right-padded. Rows are
    sorted by length and cut into chunks of ``rows_per_chunk`` (as many calls as TRL makes, so every process
    of a run makes the same number, which DDP, FSDP and ZeRO-3 need); each chunk is trimmed to its own widths,
    and the results are put back in the original row order at full width (0 beyond a chunk's width, where its
    rows are padding). Each row's values are those of the padded call, to float rounding; gradients flow
    back through them. With ``left=False`` a chunk keeps the call's prompt width (`trim`'s ``left``).
    """
    prompt_width = input_ids.size(1) - logits_to_keep
    prompt_mask, completion_mask = attention_mask[:, :prompt_width], attention_mask[:, prompt_width:]
    prompt_lengths, completion_lengths = prompt_mask.sum(dim=1), completion_mask.sum(dim=1)
    order = torch.sort(prompt_lengths + completion_lengths, descending=True, stable=True).indices
    outs: list[torch.Tensor | None] | None = None
    for start in range(0, input_ids.size(0), rows_per_chunk):
        rows = order[start : start + rows_per_chunk]
        keep_prompt = int(prompt_lengths[rows].max()) if left else prompt_width
        keep_completion = min(logits_to_keep, max(1, int(completion_lengths[rows].max())))
        cols = slice(prompt_width - keep_prompt, prompt_width + keep_completion)
        results = score(input_ids[rows, cols], attention_mask[rows, cols], keep_completion)
        if outs is None:
            outs = [None if r is None else r.new_zeros(input_ids.size(0), logits_to_keep) for r in results]
        for out, result in zip(outs, results, strict=True):
            if out is not None:
                out[rows, :keep_completion] = result
    assert outs is not None, "chunked_forward needs at least one row"
    return tuple(outs)


def long_tailed_lengths(rows: int, cap: int, generator: torch.Generator) -> list[int]:
    """Completion lengths like a paper round's, for benchmarks: one row in 16 (at random) at ``cap``, the
    rest exponential with mean ``cap / 5`` (clipped to 1 .. cap - 1), so the mean is about ``cap / 4``."""
    lengths = (torch.empty(rows).exponential_(generator=generator) * cap / 5).long().clamp(1, cap - 1)
    lengths[torch.randperm(rows, generator=generator)[: max(1, rows // 16)]] = cap
    return lengths.tolist()


def _failed_on(processes: list[int]) -> str:
    """Where a check failed, in words: ``it failed on process 1`` (processes 1, 3)."""
    plural = "es" if len(processes) > 1 else ""
    return f"it failed on process{plural} {', '.join(map(str, processes))}"


class PaddingFreePasses:
    """Runs every forward pass of a trainer on the path of `padding_mode` and counts the tokens it runs.

    ``forward(trl_forward, model, ...)`` takes TRL's per-token log-prob call (``trl_forward(model, ids, mask,
    keep, batch_size, compute_entropy)`` returning ``(logps, entropies, aux)``) for the ``trim`` and ``off``
    paths; the ``packed`` path calls ``model`` itself with TRL's fused head (`prompt_aug.packing`). Packing is
    checked twice before it is trusted: on the model's configuration when the model is first seen
    (`packing_unsupported_reason`), and on each live model (the policy, a reference model) at its first call
    (`packing_check`: two rows packed against each alone, on SDPA where the model is on varlen attention).
    Either failure falls back to ``trim`` with one log line saying why; the path chosen is logged once. With
    several processes, each judges its own batch and a failure on any process counts on all
    (`_failed_processes`), so that all take the same path and make as many calls.

    ``auto`` becomes ``packed`` or ``trim`` in `choose`, by the device; on CUDA it becomes ``trim`` at the
    first call where a packed call would compute a dense T x T mask there (`_judge_auto`). On the packed
    path, `choose` also gives the model varlen attention where `prompt_aug.varlen.packed_attention` picks it
    (a model on SDPA, on CUDA with torch's ``varlen_attn`` or on CPU), and a second model on SDPA (TRL's
    reference model) gets it at its first call; if the live check then fails, SDPA is put back and checked
    in turn (under ``auto`` on CUDA, the path becomes ``trim`` instead, as SDPA would compute a dense mask).

    Args:
        mode: ``auto``, ``packed``, ``trim`` or ``off``.
        max_tokens: Real tokens per packed call; default: the tokens of TRL's padded call, so a call is never
            split and never holds more than TRL's. A smaller budget splits a call (a single process only).
        pad_to_multiple_of: Round each packed length up to a multiple of this (default: no rounding).
        autocast: The trainer's autocast context (``accelerator.autocast``), for the packed calls.
        processes: The run's process count; ``max_tokens`` needs one (every process must make as many calls).
        device: The device the passes run on (``accelerator.device``), for ``auto`` and the attention;
            default: the model's first parameter's.
        share_prompts: On the packed path, run a prompt once for the rows of a call that share it
            (`prompt_aug.packing.pack_rows`); needs `prompt_aug.varlen`'s attention, which the model then
            gets on any device (without the kernel, SDPA on each sequence or with the shared prefixes'
            mask). A model on another attention than SDPA keeps it, and its prompts are not shared (logged).
    """

    def __init__(
        self,
        mode: str,
        max_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        autocast: Callable[[], Any] | None = None,
        processes: int = 1,
        device: torch.device | str | None = None,
        share_prompts: bool = False,
    ) -> None:
        refused = max_tokens_refusal(max_tokens, processes, mode)
        if refused is not None:
            raise ValueError(refused)
        self.mode = padding_mode(mode)
        self.max_tokens, self.pad_to_multiple_of, self.autocast = max_tokens, pad_to_multiple_of, autocast
        self.processes = processes
        self.device = torch.device(device) if device is not None else None
        # `auto` chose packed on CUDA: trim wherever a packed call would compute a dense mask (`_judge_auto`),
        # judged at the first call and again where a model's varlen attention fails its live check.
        self._auto_cuda = False
        self._auto_pending = False  # the first call's judgement is still to come
        # The model `choose` was given (unwrapped): the policy, the one model that shares prompts.
        self._policy: torch.nn.Module | None = None
        self.attention: str | None = None  # the packed path's attention, once `choose` has run
        # Whether trimmed calls cut left padding: not for a model whose values follow it (`choose`).
        self.trim_left = True
        # The widest call the padding-free paths run; a wider one is TRL's padded call (`choose`).
        self.width_limit: int | None = None
        self.share_prompts = share_prompts
        self._shared_checked = not share_prompts
        self._stats = {"real": 0, "processed": 0, "calls": 0}
        self._unread: list[torch.Tensor] = []  # padded calls' real-token counts, on the device (`stats`)
        self._checked = self.mode not in ("packed", "auto")  # True: no live check is needed any more
        # The models the live check ran on (unwrapped): each model packed is checked on its first call (the
        # policy with varlen attention and a reference model TRL built on SDPA may come in either order).
        self._live_checked: set[int] = set()

    def choose(self, model: torch.nn.Module) -> str:
        """Resolve ``auto`` by the device (``packed`` on `PACKED_DEVICES`, else ``trim``), fall back from
        ``packed`` to ``trim`` when the model's configuration rules packing out, and on the packed path give
        the model varlen attention where it can run; returns the path and logs it, with the attention, in
        one line. A model whose RoPE follows the call's length gets TRL's padded calls where a call is wider
        than its original context (``width_limit``: `prompt_aug.packing.context_limit`); one whose values
        follow the padding before a row (`prompt_aug.packing.position_dependence`) keeps it in trimmed calls
        (``trim_left`` False)."""
        device = self._device_of(model)
        self._policy = unwrap_model(model)[0]
        limit = context_limit(model) if self.mode != "off" else None
        if limit is not None:  # past it, a trimmed or packed call narrower than the round gets other values
            self.width_limit = limit[0]
            logger.info("padding-free passes: calls wider than %d tokens run padded, as TRL's: %s", *limit)
        positions = position_dependence(model) if self.mode != "off" else None
        if positions is not None:
            self.trim_left = False
            logger.info("padding-free passes: prompts keep the round's left padding: %s", positions)
        how = ""
        if self.mode == "auto":
            self.mode = "packed" if device.type in PACKED_DEVICES else "trim"
            self._checked = self.mode != "packed"
            self._auto_cuda = self._auto_pending = self.mode == "packed" and device.type == "cuda"
            how = f"auto on {device.type}"
        reason = packing_unsupported_reason(model) if self.mode == "packed" else None
        if reason is not None:
            self._auto_pending = False
            self._fall_back(reason if not how else f"{reason} ({how})")
            return self.mode
        if self.mode == "packed":
            self.attention, why = use_varlen_attention(unwrap_model(model)[0], device, self.share_prompts)
            how = f"{how}; " if how else ""
            how += f"attention {self.attention}: {why}"
            if self.share_prompts:
                self.share_prompts = self.attention == VARLEN_ATTENTION
                how += "; prompts shared" if self.share_prompts else "; prompts not shared (needs sdpa)"
        logger.info("padding-free passes: %s%s", self.mode, f" ({how})" if how else "")
        return self.mode

    def _device_of(self, model: torch.nn.Module) -> torch.device:
        return self.device or next((p.device for p in model.parameters()), torch.device("cpu"))

    def _to_trim(self) -> None:
        """The ``trim`` path from here on, without shared prompts, the policy back on SDPA where it was on
        varlen attention."""
        if self._policy is not None:
            restore_sdpa(self._policy)
            self.attention = attention_of(self._policy)
        self.mode, self._checked, self.share_prompts = "trim", True, False

    def _fall_back(self, reason: str) -> None:
        self._to_trim()
        logger.warning("padding-free passes: trim, not packed: %s", reason)

    def _judge_auto(self, model: torch.nn.Module) -> None:
        """``auto`` on CUDA: ``trim`` where a packed call of ``model`` (unwrapped) would compute a dense T x T
        mask (`prompt_aug.varlen.dense_mask_reason`: no varlen kernel, a GPU, head width or dtype it does not
        take, attention dropout, eager attention, or SDPA put back after a failed live check), which grows
        with the square of a call's tokens where a trimmed call's grows with its rows' lengths; one log line
        says why. Judged as the model runs as it trains (DeepSpeed casts it to its dtype only when it wraps
        it)."""
        device = self._device_of(model)
        dropout = float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0)
        reason = dense_mask_reason(
            device.type, self._run_dtype(model, device.type), dropout, varlen_kernel() is not None,
            attention_of(model), capability=capability_of(device), head_dim=head_dim_of(model),
        )  # fmt: skip
        if reason is None:
            return
        self._to_trim()
        note = (
            "padding-free passes: trim, not packed (auto on %s: a packed call would compute a dense mask: %s)"
        )
        logger.info(note, device.type, reason)

    def _run_dtype(self, model: torch.nn.Module, device_type: str) -> torch.dtype:
        """The dtype attention runs in: the autocast dtype where the trainer's autocast turns it on for
        ``device_type``, else the model's (its first floating-point parameter's)."""
        if self.autocast is not None:
            with self.autocast():
                if torch.is_autocast_enabled(device_type):
                    return torch.get_autocast_dtype(device_type)
        return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def forward(
        self,
        trl_forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None, Any]],
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None,
        compute_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log-probs and entropies (``None`` unless ``compute_entropy``) of the last
        ``logits_to_keep`` columns, in TRL's (rows, logits_to_keep) layout and calls."""
        if self.mode == "auto":
            self.choose(model)
        if self._auto_pending:  # the policy's dtype and attention, whichever model comes first
            self._auto_pending = False
            self._judge_auto(self._policy if self._policy is not None else unwrap_model(model)[0])
        rows = batch_size or input_ids.size(0)
        if self.mode != "off":
            # The checks gather from every process: each runs them at its first call, whatever its width.
            if not self._checked:
                self._live_check(model, input_ids, attention_mask)
            if self.mode == "packed" and not self._shared_checked:
                self._shares(
                    model, fused_head_call(model, self.autocast), input_ids, attention_mask, logits_to_keep
                )
        if self.mode == "off" or self._too_wide(input_ids.size(1)):  # one process may be, another not: each
            # makes TRL's calls, one per `rows` rows, as the padding-free paths do
            # Counted on the device: TRL's padded call reads nothing back, and neither does this one.
            self._count(attention_mask.sum(), attention_mask.numel(), -(-input_ids.size(0) // rows))
            logps, entropies, _ = trl_forward(
                model, input_ids, attention_mask, logits_to_keep, rows, compute_entropy
            )
            return logps, entropies
        if self.mode == "packed":
            return self._packed(model, input_ids, attention_mask, logits_to_keep, rows, compute_entropy)

        def score(ids: torch.Tensor, mask: torch.Tensor, keep: int) -> tuple[torch.Tensor | None, ...]:
            self._count(int(mask.sum()), mask.numel(), 1)
            logps, entropies, _ = trl_forward(model, ids, mask, keep, ids.size(0), compute_entropy)
            return logps, entropies

        logps, entropies = chunked_forward(
            score, input_ids, attention_mask, logits_to_keep, rows, left=self.trim_left
        )
        return logps, entropies

    def _live_check(
        self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> None:
        """`packing_check` on ``model`` at its first packed call (each model: the policy, a reference model);
        a packed call that raises (a kernel that cannot run on this GPU) fails it. A model on varlen attention
        that fails goes back to SDPA and is checked again (under ``auto`` on CUDA, where SDPA would compute a
        dense mask, the path becomes ``trim`` instead), and a failure on SDPA falls back to ``trim``, one log
        line each. A second model on SDPA (TRL builds the reference model there) first gets the policy's
        varlen attention, where the policy has it."""
        unwrapped = unwrap_model(model)[0]
        if id(unwrapped) in self._live_checked:
            return
        self._live_checked.add(id(unwrapped))
        if self.attention == VARLEN_ATTENTION and attention_of(unwrapped) == "sdpa":
            attention, why = set_varlen_attention(unwrapped, "the policy's attention")
            logger.info(
                "padding-free passes: a second model (the reference) gets attention %s: %s", attention, why
            )
        policy = self._policy is None or unwrapped is self._policy

        def check() -> tuple[bool, str]:
            try:
                with eval_mode(model):
                    found = packing_check(
                        fused_head_call(model, self.autocast), input_ids, attention_mask, runs=unwrapped
                    )
                ok, why = found.ok, found.describe()
            except KernelError as error:  # any other error is not this path's to judge: it stops the run
                ok, why = False, f"the packed call raised {error}"
            failed = self._failed_processes(ok, input_ids.device)
            if ok and failed:
                return False, f"{_failed_on(failed)} (here: {why})"
            return not failed, why

        ok, why = check()
        if not ok and attention_of(unwrapped) == VARLEN_ATTENTION:
            note = "padding-free passes: the %s's varlen attention failed the live check, back to sdpa: %s"
            logger.warning(note, "policy" if policy else "reference model", why)
            restore_sdpa(unwrapped)
            if policy:  # a reference's failure leaves the policy's attention
                self.attention, self.share_prompts = "sdpa", False  # only varlen reads shared prompts
            if self._auto_cuda:
                self._judge_auto(unwrapped)
                if self.mode == "trim":
                    return
            ok, why = check()
        if not ok:
            self._fall_back(why)

    def _failed_processes(self, ok: bool, device: torch.device) -> list[int]:
        """The processes of the run (by index) on which ``ok`` does not hold: each process checks its own
        batch, and a process that went another way would make another number of model calls, on which DDP,
        FSDP and ZeRO-3 hang. Every process must call it at the same point."""
        if self.processes <= 1:
            return [] if ok else [0]
        flags = gather(torch.tensor([0.0 if ok else 1.0], device=device))
        return torch.nonzero(flags).view(-1).tolist()

    def micro_batch(self, trainer: Any, inputs: dict, step: int, new_round: bool) -> dict:
        """The micro-batch to train on: ``inputs`` (TRL's, prepared at micro-step ``step``) trimmed; on a new
        training round, the round's buffered micro-batches (``trainer.buffered_micro_batches``) are first
        trimmed, their rows moved within each optimizer step where that leaves the update unchanged
        (`regrouping_is_exact`): ordered by length on the ``trim`` path, token-balanced on ``packed``.
        ``trainer`` is a `prompt_aug.trl_seam.TRLSeam`."""
        if self.mode == "off" or self._too_wide(_width(inputs)):
            return inputs
        if not trainer.model.training:
            return trim(inputs, self.trim_left) if can_trim(inputs) else inputs
        buffered = trainer.buffered_micro_batches
        if not (new_round and can_trim(buffered[0])):
            return inputs
        spg, per_round = trainer.args.steps_per_generation, micro_steps_per_round(trainer.args)
        # The round's first micro-step (a resume regenerates a round in its middle; TRL then takes micro-batch
        # `step % spg`, as if the round had started there).
        first = step - step % per_round
        ga = trainer.args.gradient_accumulation_steps
        segments = optimizer_step_segments(
            first, spg, trainer.num_iterations, ga, trainer.micro_steps_per_epoch
        )
        # Rows move only where the update stays the same: sorted by length for trim, balanced for packed.
        exact = regrouping_is_exact(trainer)
        trainer.buffered_micro_batches = regroup(
            buffered,
            segments,
            sort=exact,
            balance=self.mode == "packed",
            share_prompts=self.share_prompts,
            left=self.trim_left,
        )
        return trainer.buffered_micro_batches[step % spg]

    def _packed(
        self, model, input_ids, attention_mask, logits_to_keep, rows, compute_entropy
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
        call = fused_head_call(model, self.autocast)
        share = self._shares(model, call, input_ids, attention_mask, logits_to_keep)
        # The rows' lengths (and prompts, when shared) for all of TRL's calls, in one wait for the device.
        on_host = host_rows(input_ids, attention_mask, logits_to_keep, share)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), rows):  # TRL's calls: one per `rows` rows
            part = slice(start, start + rows)
            out = packed_forward(
                call, input_ids[part], attention_mask[part], logits_to_keep, self.max_tokens, compute_entropy,
                self.pad_to_multiple_of, share_prompts=share, rows_on_host=on_host.take(part),
            )  # fmt: skip
            self._count(out.real_tokens, out.processed_tokens, out.calls)
            logps.append(out.log_probs)
            entropies.append(out.entropy)
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None

    def _shares(self, model, call, input_ids, attention_mask, logits_to_keep) -> bool:
        """Whether this call shares prompts: only the policy (the model `choose` was given) does, on
        `prompt_aug.varlen`'s attention, the one attention that reads that layout, and only once a live check
        on it has passed (else sharing stops, in one log line); a reference model runs unshared."""
        if not self.share_prompts:  # every packed call asks: the common answer before any unwrapping
            return False
        unwrapped = unwrap_model(model)[0]
        if attention_of(unwrapped) != VARLEN_ATTENTION:
            return False
        if self._policy is not None and unwrapped is not self._policy:
            return False
        if not self._shared_checked:
            # Checked against the unshared varlen call, which the live check has compared with SDPA. A failure
            # on any process stops sharing on all, which keeps their pack lengths from the same rules.
            with eval_mode(model):
                check = shared_prompts_check(call, input_ids, attention_mask, logits_to_keep)
            failed = self._failed_processes(check.ok, input_ids.device)
            if failed:
                self.share_prompts = False
                why = check.describe() if not check.ok else _failed_on(failed)
                logger.warning("padding-free passes: prompts not shared: %s", why)
            self._shared_checked = True
        return self.share_prompts

    def _too_wide(self, width: int) -> bool:
        """Whether a call of ``width`` columns must be TRL's padded call (`choose`'s ``width_limit``)."""
        return self.width_limit is not None and width > self.width_limit

    @property
    def stats(self) -> dict[str, int]:
        """Tokens and calls so far: ``real`` tokens, ``processed`` ones (padding included), model ``calls``.
        The real-token counts of padded calls are read back from the device here, when asked for."""
        if self._unread:
            self._stats["real"] += int(torch.stack(self._unread).sum())
            self._unread.clear()
        return self._stats

    def _count(self, real: int | torch.Tensor, processed: int, calls: int) -> None:
        if isinstance(real, torch.Tensor):
            self._unread.append(real.detach())
        else:
            self._stats["real"] += real
        self._stats["processed"] += processed
        self._stats["calls"] += calls
