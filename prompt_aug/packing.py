"""Packed (padding-free) forward passes for GRPO's per-token log-probs, exact to float rounding.

TRL 1.16 runs every forward of a round at the round's longest prompt plus longest completion, prompts padded
on the left and completions on the right. Here the real tokens of a micro-batch's rows are laid end to end in
ONE row instead, with ``position_ids`` that restart at 0 for each sequence, no ``attention_mask`` and no
cache. transformers 5 then finds the sequences from the position ids
(``masking_utils.find_packed_sequence_indices``) and masks attention block-diagonally: each sequence sees
only its own earlier tokens, at its own positions, as it would alone. Nothing is computed for padding.

* `plan_packs`: consecutive rows cut into packs of at most a token budget (a row longer than the budget is
  a pack of its own).
* `pack_rows`: one pack's tensors (``input_ids``, ``position_ids``, ``labels`` of shape (1, T)) and the
  indices that put the per-token results back at TRL's (rows, logits_to_keep) layout.
* `packed_forward`: a (rows, width) call as packs, the results scattered back, with gradients.
* `fused_head_call`: the ``call`` a trainer passes to `packed_forward`, running ``model(...)`` itself (so
  DDP, FSDP, DeepSpeed and PEFT wrappers stay in the path) with TRL's fused log-prob head.
* `packing_unsupported_reason` (static) and `packing_check` (live, on the model) say
  whether packing serves a model.

The fused head (``trl.trainer.utils.add_fused_lm_head``) takes ``labels`` that are NOT shifted: the label at
position t is token t, scored from the hidden state at t - 1, and it returns ``log_probs`` (and ``entropy``,
when added with ``outputs=(..., "entropy")``) of shape (1, T - 1), where entry j scores token j + 1 and is 0
where that label is -100. Temperature (and any logit scaling) is applied inside the head, as in TRL's padded
call; packing does not touch it. In a packed row, the first token of every sequence is labelled -100, so no
token is scored from the previous sequence's last state.

Pure torch and transformers, no TRL: `prompt_aug.trainer` and `bench/gpu_round.py` (which runs where TRL is
not installed) share it.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .balance import shared_prefix
from .varlen import VARLEN_ATTENTION, host_to_device, remember_positions, sdpa_reference

IGNORE_INDEX = -100

# Attention implementations whose transformers 5 code path honours packed position ids with no attention
# mask: sdpa, eager and flex_attention build their mask in `masking_utils.create_causal_mask`, which detects
# the packed sequences (`find_packed_sequence_indices`) and makes it block-diagonal; the flash attention paths
# get no mask and find the sequence boundaries from the position ids themselves (`_is_packed_sequence`,
# `prepare_fa_kwargs_from_position_ids`). Any other one (``paged|eager``, a kernel from the hub, a custom
# registered function) may ignore them, and then sequences would attend to each other. `VARLEN_ATTENTION`
# (`prompt_aug.varlen`) reads them itself.
PACKING_ATTENTION = frozenset(
    {"sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4",
     VARLEN_ATTENTION}
)  # fmt: skip

# A call runs one pack: it gets {"input_ids", "position_ids", "labels"} (each (1, T)) and returns the
# per-token log-probs and entropies (None when not computed), each (1, T - 1) or (1, T), entry j scoring
# token j + 1.
PackCall = Callable[[dict], tuple[torch.Tensor, torch.Tensor | None]]


class PackedRows(NamedTuple):
    """One pack of rows: the model's inputs and where its results go.

    ``input_ids``, ``position_ids``, ``labels``: (1, T) on the rows' device. ``labels`` is -100 everywhere
    but at the rows' real completion tokens (and -100 at the first token of each sequence), unshifted, as the
    fused head takes it. ``source``: indices into the call's per-token output (entry j scores token j + 1);
    ``target``: the matching flat indices into a (rows, logits_to_keep) result. ``real_tokens`` counts the
    real tokens run (a shared prompt's once); ``T - real_tokens`` is the rounding of `pack_rows`'
    ``pad_to_multiple_of``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    real_tokens: int

    def inputs(self) -> dict:
        """The keyword arguments of the model call (besides ``fused_lm_head`` and ``use_cache``)."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "labels": self.labels}

    def scatter(self, values: torch.Tensor, rows: int, logits_to_keep: int) -> torch.Tensor:
        """A call's (1, T - 1) or (1, T) per-token output as (rows, logits_to_keep), 0 where nothing is
        scored. Differentiable in ``values``."""
        flat = values.reshape(-1)[self.source]
        out = flat.new_zeros(rows * logits_to_keep).index_copy(0, self.target, flat)
        return out.view(rows, logits_to_keep)


class PackedOutput(NamedTuple):
    """`packed_forward`'s result: (rows, logits_to_keep) log-probs and entropies (None unless asked for) in
    TRL's layout, the number of model calls, and the real and processed (packed, rounding included) tokens."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    calls: int
    real_tokens: int
    processed_tokens: int


def plan_packs(lengths: Sequence[int] | torch.Tensor, max_tokens: int) -> list[int]:
    """Rows per pack, in order: consecutive rows, as many as fit in ``max_tokens`` tokens (greedy, so the
    fewest packs); a row longer than ``max_tokens`` is a pack alone. Rows of length 0 join the current pack.
    No rows give no packs."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    sizes: list[int] = []
    tokens = 0
    for length in lengths:
        if sizes and tokens + length <= max_tokens:
            sizes[-1] += 1
            tokens += length
        else:
            sizes.append(1)
            tokens = length
    return sizes


class HostRows(NamedTuple):
    """What packing reads of a call's rows on the CPU, fetched in one device-to-host copy (`host_rows`):
    real prompt and completion tokens per row and, where prompts may be shared, the rows' (left-padded)
    prompt ids."""

    prompt_lengths: torch.Tensor
    completion_lengths: torch.Tensor
    prompt_ids: torch.Tensor | None = None

    def take(self, rows: slice) -> HostRows:
        """The same for a slice of the rows."""
        ids = None if self.prompt_ids is None else self.prompt_ids[rows]
        return HostRows(self.prompt_lengths[rows], self.completion_lengths[rows], ids)


def host_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, share_prompts: bool = False
) -> HostRows:
    """The `HostRows` of a TRL-style call (``cat(prompt, completion)``, the last ``logits_to_keep`` columns
    the completion), with the prompt ids when ``share_prompts``: one device-to-host copy, the only place a
    packed call waits for the device."""
    prompt_width = attention_mask.size(1) - logits_to_keep
    rows = attention_mask.size(0)
    lengths = torch.stack(
        [attention_mask[:, :prompt_width].sum(dim=1), attention_mask[:, prompt_width:].sum(dim=1)]
    ).long()
    if share_prompts:
        flat = torch.cat([lengths.reshape(-1), input_ids[:, :prompt_width].reshape(-1).long()]).cpu()
        prompt, completion = flat[: 2 * rows].view(2, rows).unbind(0)
        return HostRows(prompt, completion, flat[2 * rows :].view(rows, prompt_width))
    prompt, completion = lengths.cpu().unbind(0)
    return HostRows(prompt, completion)


def prompt_groups(prompt_ids: torch.Tensor, prompt_lengths: torch.Tensor) -> list[list[int]] | None:
    """Rows grouped by prompt (``prompt_lengths`` and the left-padded ``prompt_ids``, on the CPU), groups in
    order of their first row, rows in order within a group; None when no two rows share one."""
    if prompt_ids.size(0) < 2:
        return None
    keys = torch.cat([prompt_lengths[:, None], prompt_ids], dim=1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}
    for row, key in enumerate(inverse.tolist()):
        groups.setdefault(key, []).append(row)
    return list(groups.values()) if len(groups) < prompt_ids.size(0) else None


def _shared_layout(
    groups: list[list[int]], prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, prompt_width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per packed token, its row, column in the padded row and position, where each group of rows sharing a
    prompt of P > 1 tokens runs the prompt's first P - 1 tokens once (positions 0 .. P - 2), then each row as
    its own sequence of the prompt's last token and its completion (positions P - 1 onwards), which
    `prompt_aug.varlen` lets see that prefix. A row alone in its group is a plain sequence."""
    row: list[torch.Tensor] = []
    column: list[torch.Tensor] = []
    position: list[torch.Tensor] = []

    def add(r: int, first_column: int, first_position: int, count: int) -> None:
        row.append(torch.full((count,), r))
        column.append(torch.arange(first_column, first_column + count))
        position.append(torch.arange(first_position, first_position + count))

    for group in groups:
        prompt = int(prompt_lengths[group[0]])
        shared = len(group) > 1 and shared_prefix(prompt) > 0
        if shared:
            add(group[0], prompt_width - prompt, 0, shared_prefix(prompt))
        for r in group:
            completion = int(completion_lengths[r])
            if shared:
                add(r, prompt_width - 1, prompt - 1, 1 + completion)
            else:
                add(r, prompt_width - prompt, 0, prompt + completion)
    return torch.cat(row), torch.cat(column), torch.cat(position)


def _pack(
    input_ids: torch.Tensor,
    rows_on_host: HostRows,
    logits_to_keep: int,
    pad_to_multiple_of: int | None,
    pad_token_id: int,
    share_prompts: bool = False,
) -> PackedRows:
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    device = input_ids.device
    prompt_lengths, completion_lengths, prompt_ids = rows_on_host
    groups = prompt_groups(prompt_ids, prompt_lengths) if share_prompts and prompt_ids is not None else None
    if groups is None:
        lengths = prompt_lengths + completion_lengths
        real = int(lengths.sum())
        # Per packed token (built on the CPU from the lengths, then moved once): its row, its position in its
        # sequence, and its column in the padded row (prompts end at prompt_width, completions start there).
        row = torch.repeat_interleave(torch.arange(rows), lengths)
        starts = torch.cumsum(lengths, 0) - lengths
        position = torch.arange(real) - starts[row]
        column = prompt_width - prompt_lengths[row] + position
    else:
        row, column, position = _shared_layout(groups, prompt_lengths, completion_lengths, prompt_width)
        real = row.numel()
    scored = (column >= prompt_width) & (position > 0)
    source = torch.nonzero(scored).view(-1) - 1
    target = row[scored] * logits_to_keep + (column[scored] - prompt_width)
    extra = (-real) % pad_to_multiple_of if pad_to_multiple_of else 0
    # Rounding tokens go last, as a sequence of their own: causal attention keeps them from every real token.
    position = torch.cat([position, torch.arange(extra)])
    # Every index goes to the device in one copy that does not wait there (`varlen.host_to_device`).
    moved = host_to_device(torch.cat([row * width + column, scored.long(), position, source, target]), device)
    index, scored_dev, position_dev, source_dev, target_dev = moved.split(
        [real, real, real + extra, source.numel(), target.numel()]
    )
    ids = input_ids.reshape(-1)[index]
    labels = torch.where(scored_dev.bool(), ids, torch.full_like(ids, IGNORE_INDEX))
    if extra:
        ids = torch.cat([ids, ids.new_full((extra,), pad_token_id)])
        labels = torch.cat([labels, labels.new_full((extra,), IGNORE_INDEX)])
    position_dev = position_dev[None]
    remember_positions(position_dev, position[None])
    return PackedRows(
        input_ids=ids[None],
        position_ids=position_dev,
        labels=labels[None],
        source=source_dev,
        target=target_dev,
        real_tokens=real,
    )


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    pad_to_multiple_of: int | None = None,
    pad_token_id: int = 0,
    share_prompts: bool = False,
) -> PackedRows:
    """The real tokens of every row of a TRL-style call, end to end in one row.

    ``input_ids`` and ``attention_mask`` are (rows, width) = cat(prompt, completion), prompts left-padded and
    completions right-padded, the last ``logits_to_keep`` columns the completion; each row's real tokens must
    be contiguous (as in TRL's layout). Rows keep their order. With ``pad_to_multiple_of``, T is rounded up
    with ``pad_token_id`` tokens forming a last sequence of their own, never labelled. With
    ``share_prompts``, rows with the same prompt (a GRPO group's completions) run its
    first P - 1 tokens once (`_shared_layout`), wherever they stand in the pack (results still go back to
    each row); only `prompt_aug.varlen`'s attention reads that layout.
    """
    on_host = host_rows(input_ids, attention_mask, logits_to_keep, share_prompts)
    return _pack(input_ids, on_host, logits_to_keep, pad_to_multiple_of, pad_token_id, share_prompts)


def packed_forward(
    call: PackCall,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    max_tokens: int | None = None,
    compute_entropy: bool = False,
    pad_to_multiple_of: int | None = None,
    pad_token_id: int = 0,
    share_prompts: bool = False,
    rows_on_host: HostRows | None = None,
) -> PackedOutput:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, run as packed rows.

    The rows are cut into consecutive packs of at most ``max_tokens`` real tokens (`plan_packs`; by default
    rows x width, the tokens of TRL's padded call, so that all rows are one call), each packed by `pack_rows`
    and run by ``call`` (see `PackCall`, `fused_head_call`). Results come back as TRL's padded call gives
    them: (rows, logits_to_keep), rows in their original order, 0 where the completion mask is 0; gradients
    flow back through ``call``'s outputs. ``calls``, ``real_tokens`` and ``processed_tokens`` count the work.
    ``share_prompts``: see `pack_rows` (a shared prompt's tokens are counted once). ``rows_on_host``: the
    rows' `host_rows`, where the caller has them (else read here, the call's one wait for the device).
    """
    rows, width = input_ids.shape
    if rows_on_host is None:
        rows_on_host = host_rows(input_ids, attention_mask, logits_to_keep, share_prompts)
    elif rows_on_host.prompt_lengths.numel() != rows:
        raise ValueError(
            f"rows_on_host holds {rows_on_host.prompt_lengths.numel()} rows; the call has {rows}"
        )
    elif share_prompts and rows_on_host.prompt_ids is None:
        raise ValueError(
            "share_prompts needs rows_on_host with the prompt ids: host_rows(..., share_prompts=True)"
        )
    prompt_lengths, completion_lengths, _ = rows_on_host
    budget = rows * width if max_tokens is None else max_tokens
    log_probs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] | None = [] if compute_entropy else None
    calls = real = processed = 0
    start = 0
    for size in plan_packs(prompt_lengths + completion_lengths, budget):
        part = slice(start, start + size)
        start += size
        packed = _pack(
            input_ids[part], rows_on_host.take(part), logits_to_keep, pad_to_multiple_of, pad_token_id,
            share_prompts,
        )  # fmt: skip
        if packed.input_ids.size(1) == 0:  # rows without a real token: nothing to run
            zeros = input_ids.new_zeros((size, logits_to_keep), dtype=torch.float32)
            log_probs.append(zeros)
            if entropies is not None:
                entropies.append(zeros)
            continue
        logps, entropy = call(packed.inputs())
        calls += 1
        real += packed.real_tokens
        processed += packed.input_ids.size(1)
        log_probs.append(packed.scatter(logps, size, logits_to_keep))
        if entropies is not None:
            if entropy is None:
                raise ValueError(
                    "compute_entropy=True, but the pack call returned no entropy: a PackCall returns "
                    "(log_probs, entropy), entropy not None when it is asked for (see fused_head_call)"
                )
            entropies.append(packed.scatter(entropy, size, logits_to_keep))
    if not log_probs:
        empty = input_ids.new_zeros((0, logits_to_keep), dtype=torch.float32)
        return PackedOutput(empty, empty if compute_entropy else None, 0, 0, 0)
    return PackedOutput(
        torch.cat(log_probs), None if entropies is None else torch.cat(entropies), calls, real, processed
    )


def fused_head_call(
    model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager] | None = None
) -> PackCall:
    """The ``call`` for `packed_forward` of a model with TRL's fused head (``add_fused_lm_head``): runs
    ``model(input_ids=, position_ids=, labels=, fused_lm_head=True, use_cache=False)`` under ``autocast()``
    (e.g. ``accelerator.autocast``) and returns the head's ``log_probs`` and ``entropy``. ``model`` is called
    itself, so it may be wrapped (DDP, FSDP, DeepSpeed, PEFT). No attention mask is passed: that is what makes
    transformers read the packed sequences off the position ids."""

    def call(inputs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast() if autocast is not None else contextlib.nullcontext():
            outputs = model(**inputs, fused_lm_head=True, use_cache=False)
        return outputs.log_probs, outputs.entropy

    return call


def unwrap_model(model: torch.nn.Module) -> tuple[torch.nn.Module, str | None]:
    """The transformers model inside DDP / DeepSpeed / FSDP1 (``.module``) and PEFT wrappers, and a reason
    when a PEFT wrapper adds virtual tokens."""
    for _ in range(8):
        peft_config = getattr(model, "active_peft_config", None)
        if peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
            return model, f"PEFT prompt learning ({peft_config.peft_type}) adds virtual tokens to every row"
        if hasattr(model, "get_base_model") and model.get_base_model() is not model:
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):  # torch.compile
            model = model._orig_mod
        else:
            break
    return model, None


def _configured(model: torch.nn.Module) -> tuple[torch.nn.Module, Any, str] | None:
    """``model`` unwrapped, its transformers config and its name for a message (``Qwen2ForCausalLM
    (qwen2)``); None for a model without a transformers config."""
    model, _ = unwrap_model(model)
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None
    return model, config, f"{type(model).__name__} ({getattr(config, 'model_type', '?')})"


# RoPE kinds whose frequencies follow the length of the call (its largest position), not a token's own place.
LENGTH_ROPE = frozenset({"dynamic", "longrope"})


def context_limit(model: torch.nn.Module) -> tuple[int, str] | None:
    """For a model whose RoPE follows the call's length (``dynamic``, ``longrope``: transformers changes its
    frequencies once the largest position passes the original context), that context in tokens and why;
    None for any other model. A call no wider than it gives every row the values of a call of any other
    such width, TRL's padded one included; a wider one does not.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> small = dict(num_hidden_layers=1, hidden_size=8, intermediate_size=8, num_attention_heads=2)
    >>> dynamic = {"rope_type": "dynamic", "factor": 2.0}
    >>> config = LlamaConfig(**small, vocab_size=50, max_position_embeddings=64, rope_scaling=dynamic)
    >>> context_limit(LlamaForCausalLM(config))
    (64, 'LlamaForCausalLM (llama) uses dynamic RoPE, whose frequencies change past 64 positions')
    """
    found = _configured(model)
    if found is None:
        return None
    model, config, name = found
    text = config.get_text_config()
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    scopes = [rope, *(v for v in rope.values() if isinstance(v, dict))]
    kinds = sorted({scope.get("rope_type") for scope in scopes} & LENGTH_ROPE)
    if not kinds:
        return None
    limits = [scope.get("original_max_position_embeddings") for scope in scopes]
    limit = min(
        [int(n) for n in limits if n]
        or [int(getattr(text, "original_max_position_embeddings", None) or text.max_position_embeddings)]
    )
    return limit, f"{name} uses {' and '.join(kinds)} RoPE, whose frequencies change past {limit} positions"


# Tables of absolute positions that their model indexes by positions counted from the attention mask, so that
# left padding moves none (measured: tests/test_packing.py). Others (BioGPT's takes the mask, yet its model
# passes positions counted from the call's first column) are taken to count the padding.
_MASK_COUNTED_POSITIONS = frozenset({"OPTLearnedPositionalEmbedding"})


def position_dependence(model: torch.nn.Module) -> str | None:
    """Why ``model``'s values for a row would change with the columns of padding before it, or None.

    TRL's padded call passes no position ids, so a model counts positions from the call's first column, left
    padding included. Rotary attention sees only distances and gives the same values however much padding
    there is (RoPE that follows the call's length too, within its original context: `context_limit`); a
    learned table of absolute positions (GPT-2's ``wpe``) does not, and a row's values are then TRL's only at
    the round's prompt width.

    >>> from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    >>> position_dependence(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50)))
    'GPT2LMHeadModel (gpt2) learns a table of absolute positions (transformer.wpe)'
    >>> small = dict(num_hidden_layers=1, hidden_size=8, intermediate_size=8, num_attention_heads=2)
    >>> position_dependence(LlamaForCausalLM(LlamaConfig(**small, vocab_size=50))) is None
    True
    """
    found = _configured(model)
    if found is None:
        return None
    model, config, name = found
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    tokens = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for module_name, module in model.named_modules():
        if module is tokens or type(module).__name__ in _MASK_COUNTED_POSITIONS:
            continue
        learned = isinstance(module, torch.nn.Embedding) and (
            module.num_embeddings - getattr(module, "offset", 0) == positions  # BART's, OPT's: offset 2
        )
        if learned:
            return f"{name} learns a table of absolute positions ({module_name})"
        if type(module).__name__.endswith("SinusoidalPositionalEmbedding"):  # XGLM's: fixed, absolute
            return f"{name} adds sinusoidal absolute positions ({module_name})"
    return None


def packing_unsupported_reason(model: torch.nn.Module) -> str | None:
    """One line saying why packed rows would not give ``model`` its per-row values, or None when nothing in
    its configuration stands in the way. Static: `packing_check` runs the model to make sure."""
    model, reason = unwrap_model(model)
    if reason:
        return reason
    found = _configured(model)
    if found is None:
        return f"{type(model).__name__} has no transformers config"
    model, config, name = found
    if config.get_text_config() is not config or getattr(config, "vision_config", None) is not None:
        return f"{name} is multimodal: its image inputs and position ids are not packed"
    forward = inspect.signature(type(model).forward).parameters
    for key in ("token_type_ids", "mm_token_type_ids", "pixel_values"):
        if key in forward:
            return f"{name} takes {key}, which packing does not carry"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKING_ATTENTION:
        return (
            f"{name} uses attention implementation {attention!r}, which transformers does not mask by packed "
            f"position ids (supported: {', '.join(sorted(PACKING_ATTENTION))})"
        )
    # Models with ``layer_types`` use a sliding window only in their "sliding_attention" layers (Qwen2 keeps
    # its window off below ``max_window_layers``); others (Mistral) use ``sliding_window`` in every layer.
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if "sliding_attention" in other or (not layer_types and getattr(config, "sliding_window", None)):
        window = getattr(config, "sliding_window", None)
        return (
            f"{name} uses sliding window attention ({window} tokens; packing is checked for full attention)"
        )
    if other:
        return f"{name} has {', '.join(other)} layers (packing is checked for full attention only)"
    if getattr(config, "attention_chunk_size", None) is not None:
        return f"{name} uses chunked attention ({config.attention_chunk_size} tokens)"
    if not getattr(config, "is_causal", True):
        return f"{name} is not causal"
    positions = position_dependence(model)
    if positions is not None:  # a packed row's positions are its own, TRL's count the padding before it
        return positions
    module = sys.modules.get(type(model).__module__)
    if not attention.startswith("flash_attention") and not hasattr(module, "create_causal_mask"):
        return (
            f"{name}'s modeling code does not build its mask with transformers' create_causal_mask, which is "
            "what detects packed sequences"
        )
    return None


@dataclass
class PackingCheck:
    """`packing_check`'s finding: ``error`` is the mean absolute difference of a row's log-probs packed
    after another row from the row alone, ``leak`` the same for the two rows run as ONE sequence (what a model
    that ignores the packing computes). ``ok`` when ``error <= atol`` or ``error <= rtol * leak``."""

    ok: bool
    error: float
    leak: float
    tokens: int
    layout: str = "packed rows"  # what was checked
    wrong: str = "as one unpacked sequence"  # what ``leak`` ran

    @classmethod
    def judge(
        cls, error: float, leak: float, tokens: int, atol: float, rtol: float, **what: str
    ) -> PackingCheck:
        """The finding for ``error`` and ``leak`` (``what``: ``layout``, ``wrong``): ok within ``atol``, or
        within ``rtol`` of the leak (bf16 rounding)."""
        return cls(error <= atol or error <= rtol * leak, error, leak, tokens, **what)

    def __bool__(self) -> bool:
        return self.ok

    def describe(self) -> str:
        verdict = f"{self.layout} match" if self.ok else f"{self.layout} do NOT match"
        return (
            f"{verdict} the rows alone: mean |difference| {self.error:.3g} over {self.tokens} tokens "
            f"({self.wrong}: {self.leak:.3g})"
        )


def _real_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, row: int, limit: int) -> torch.Tensor:
    tokens = input_ids[row][attention_mask[row].bool()]
    return tokens[-limit:]


def _filler(input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` tokens for a check whose batch has no row long enough (one-token prompts, completions masked as
    truncated): the batch's real tokens in order, repeated as needed. What the tokens say does not matter to
    whether packing is exact, and the check still makes its calls, as every process must make the same."""
    tokens = input_ids[attention_mask.bool()]
    tokens = tokens if tokens.numel() else input_ids.reshape(-1)
    return tokens.repeat(-(-n // tokens.numel()))[:n]


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode for the block (dropout would make packed and unpacked rows differ for another
    reason), then back in the mode it was in."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def packing_check(
    call_or_model: PackCall | torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_row_tokens: int = 64,
    atol: float = 1e-4,
    rtol: float = 0.1,
    runs: torch.nn.Module | None = None,
) -> PackingCheck:
    """Run the model on two rows of a live batch (the last ``max_row_tokens`` real tokens of its first two
    rows with at least two; the same row twice if there is one; two of the batch's tokens if there is none):
    the second row alone, the two packed, and the two as one sequence (positions running on). Each of the
    second row's tokens after its first is scored.

    ``call_or_model`` is a `PackCall` (such as `fused_head_call`'s, which the trainer uses) or a model with
    TRL's fused head (then called under no autocast, in eval mode for the check). ``runs``: the transformers
    model the call runs (default: ``call_or_model``'s, when it is a model); where it is on an attention of
    `prompt_aug.varlen`, the row alone and the rows as one sequence run on SDPA (`sdpa_reference`), so that
    the packed call is checked against SDPA, not against the same attention. Runs without gradients.
    ``atol`` is for float32 (packing is exact to rounding there); under bf16 rounding, ``rtol`` asks the error
    to be a small part of what running the rows together costs.
    """
    model = call_or_model if isinstance(call_or_model, torch.nn.Module) else None
    call = fused_head_call(model) if model is not None else call_or_model
    if runs is None and model is not None:
        runs = unwrap_model(model)[0]
    lengths = attention_mask.sum(dim=1).tolist()
    usable = [i for i, n in enumerate(lengths) if n >= 2]
    if usable:
        first, second = (usable + usable)[:2]
        a = _real_tokens(input_ids, attention_mask, first, max_row_tokens)
        b = _real_tokens(input_ids, attention_mask, second, max_row_tokens)
    else:
        a = b = _filler(input_ids, attention_mask, 2)
    device = input_ids.device
    positions_b = torch.arange(len(b), device=device)
    labels_b = b.clone()
    labels_b[0] = IGNORE_INDEX
    ids = torch.cat([a, b])[None]
    labels = torch.cat([torch.full_like(a, IGNORE_INDEX), labels_b])[None]
    packed_positions = torch.cat([torch.arange(len(a), device=device), positions_b])[None]
    one_sequence = torch.arange(len(a) + len(b), device=device)[None]
    with eval_mode(model) if model is not None else contextlib.nullcontext(), torch.no_grad():
        with sdpa_reference(runs):  # the references on SDPA
            alone = call({"input_ids": b[None], "position_ids": positions_b[None], "labels": labels_b[None]})
            leaked = call({"input_ids": ids, "position_ids": one_sequence, "labels": labels})
        packed = call({"input_ids": ids, "position_ids": packed_positions, "labels": labels})[0]
    # Entry j scores token j + 1; the second row's tokens 1.. are the last len(b) - 1 scored entries.
    n = len(b) - 1
    alone = alone[0].reshape(-1)[: len(b) - 1].float()
    end = len(a) + len(b) - 1
    packed = packed.reshape(-1)[end - n : end].float()
    leaked = leaked[0].reshape(-1)[end - n : end].float()
    error = float((packed - alone).abs().mean())
    leak = float((leaked - alone).abs().mean())
    return PackingCheck.judge(error, leak, n, atol, rtol)


def shared_prompts_check(
    call: PackCall,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    max_row_tokens: int = 64,
    atol: float = 1e-4,
    rtol: float = 0.1,
) -> PackingCheck:
    """Run one row of a live batch (the first with a prompt of at least 2 tokens and a completion; at most
    ``max_row_tokens`` of each) twice in one pack that shares its prompt (`pack_rows`' ``share_prompts``), and
    compare the second copy's log-probs with the row alone, and with its completion run without the prompt it
    should see (what an attention that does not read the shared layout computes); with no such row, a prompt
    of two of the batch's tokens and a completion of one. ``atol`` and ``rtol`` as `packing_check`. Runs
    without gradients."""
    prompt_lengths, completion_lengths, _ = host_rows(input_ids, attention_mask, logits_to_keep)
    usable = [i for i in range(input_ids.size(0)) if prompt_lengths[i] >= 2 and completion_lengths[i] >= 1]
    if usable:
        i, prompt_width = usable[0], input_ids.size(1) - logits_to_keep
        prompt = input_ids[i, prompt_width - int(prompt_lengths[i]) : prompt_width][-max_row_tokens:]
        completion = input_ids[i, prompt_width : prompt_width + int(completion_lengths[i])][:max_row_tokens]
    else:
        prompt, completion = _filler(input_ids, attention_mask, 3).split([2, 1])
    p, c = len(prompt), len(completion)
    row = torch.cat([prompt, completion])[None]
    both, ones = row.expand(2, -1), torch.ones(2, p + c, dtype=torch.long, device=row.device)
    segment = torch.cat([prompt[-1:], completion])[None]
    labels = segment.clone()
    labels[0, 0] = IGNORE_INDEX
    positions = torch.arange(p - 1, p + c, device=row.device)[None]
    with torch.no_grad():
        shared = packed_forward(call, both, ones, c, share_prompts=True).log_probs[1].float()
        alone = packed_forward(call, both[:1], ones[:1], c).log_probs[0].float()
        unseen = call({"input_ids": segment, "position_ids": positions, "labels": labels})[0]
    unseen = unseen.reshape(-1)[:c].float()
    error, leak = float((shared - alone).abs().mean()), float((unseen - alone).abs().mean())
    return PackingCheck.judge(
        error, leak, c, atol, rtol, layout="rows sharing a prompt", wrong="without the prompt"
    )
