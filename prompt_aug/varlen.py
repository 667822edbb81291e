"""Variable-length attention for packed rows: torch's ``varlen_attn`` through transformers' attention API.

A packed row (`prompt_aug.packing`) holds several sequences end to end, with ``position_ids`` restarting at 0
for each. Under SDPA, transformers turns that into a dense (T, T) block-diagonal mask, and the kernel computes
every entry of it. ``torch.nn.attention.varlen.varlen_attn`` (torch 2.10 and later, CUDA only, fp16 / bf16)
takes the sequences as cumulative offsets (``cu_seqlens``) and computes only each sequence's own causal
triangle, forward and backward, with no flash-attn package.

* `VARLEN_ATTENTION`: the name the attention function is registered under (`register`), through
  transformers' public ``AttentionInterface`` and ``AttentionMaskInterface``, so the model's own attention
  modules call it and PEFT, DDP, FSDP and DeepSpeed wrappers stay in the path.
* `make_varlen_attention`: the attention function. A call with no attention mask and no cache (a packed
  call) runs the kernel on the sequences read off ``position_ids``; any other call (padded, decoding) is
  transformers' SDPA with the mask transformers built for it. Where the kernel cannot run (no kernel, a
  device or dtype it does not take, attention dropout), a packed call runs SDPA with the block-diagonal mask
  built here, and says so once in the log.
* `packed_attention` (pure: which attention a packed model gets, and why) and `use_varlen_attention`
  (applies that choice to a model) select it: varlen on CUDA where torch has the kernel and the model uses
  SDPA; otherwise the model keeps its attention.

``varlen_attn``'s signature changed: torch 2.10 and 2.11 take ``is_causal``; 2.12 and later take
``window_size`` and ``enable_gqa``. `make_varlen_attention` reads the signature at run time: causal masking
through whichever the kernel has, and K / V heads repeated for grouped-query attention where it lacks
``enable_gqa`` (and the query pre-scaled where it lacks ``scale``).
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

logger = logging.getLogger("prompt_aug")

VARLEN_ATTENTION = "prompt_aug_varlen"
# The dtypes and devices torch's varlen kernel (FlashAttention 2) takes.
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_DEVICES = ("cuda",)

Kernel = Callable[..., Any]


def varlen_kernel() -> Kernel | None:
    """torch's ``varlen_attn``, or None where this torch has none (before 2.10)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class Sequences(NamedTuple):
    """The sequences of a (rows, T) ``position_ids``, flattened to rows x T tokens: ``cu_seqlens`` (int32,
    on the position ids' device; entries i, i + 1 bound sequence i), ``max_length``, and ``segment`` (rows,
    T), each token's sequence number."""

    cu_seqlens: torch.Tensor
    max_length: int
    segment: torch.Tensor


# The last few position-id tensors seen, with their sequences: every layer of a forward (and the recomputation
# of a checkpointed layer) gets the same tensor, so the one device-to-host copy (max_length) is paid once.
_SEEN: list[tuple[weakref.ref, int, Sequences]] = []


def sequences(position_ids: torch.Tensor) -> Sequences:
    """Sequence boundaries from packed ``position_ids`` (rows, T): a sequence starts where the position is 0
    and at the start of every row. Memoised on the tensor (same object, unchanged)."""
    for ref, version, found in _SEEN:
        if ref() is position_ids and position_ids._version == version:
            return found
    rows, width = position_ids.shape
    starts = position_ids == 0
    starts[:, 0] = True
    flat = starts.reshape(-1)
    offsets = torch.nonzero(flat).view(-1)
    end = torch.tensor([rows * width], device=offsets.device, dtype=offsets.dtype)
    cu_seqlens = torch.cat([offsets, end]).to(torch.int32)
    max_length = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if rows * width else 0
    segment = torch.cumsum(flat.long(), 0).view(rows, width)
    found = Sequences(cu_seqlens, max_length, segment)
    _SEEN.insert(0, (weakref.ref(position_ids), position_ids._version, found))
    del _SEEN[4:]
    return found


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The (rows, 1, T, T) boolean mask of packed ``position_ids``: a token sees the earlier tokens of its own
    sequence only (True where attention is allowed), as transformers builds it for SDPA."""
    segment = sequences(position_ids).segment
    width = segment.size(1)
    causal = torch.ones(width, width, dtype=torch.bool, device=segment.device).tril()
    return ((segment[:, :, None] == segment[:, None, :]) & causal)[:, None]


_LOGGED: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.info(message)


def make_varlen_attention(
    kernel: Kernel | None = None,
    devices: tuple[str, ...] = KERNEL_DEVICES,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
) -> Callable[..., tuple[torch.Tensor, None]]:
    """An attention function with transformers' signature (``(module, query, key, value, attention_mask,
    dropout, scaling, ...)`` with (batch, heads, T, head_dim) tensors, returning ((batch, T, heads,
    head_dim), None)) that runs ``kernel`` (default: torch's `varlen_kernel`) on packed calls.

    A packed call is one with no attention mask, ``position_ids`` given, as many keys as queries (no cache)
    and a causal module. ``kernel`` runs there when the query's device type is in ``devices``, its dtype in
    ``dtypes`` and dropout is 0; otherwise SDPA runs with `block_causal_mask`. Every other call is
    transformers' SDPA, unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kernel = kernel if kernel is not None else varlen_kernel()
    params = set(inspect.signature(kernel).parameters) if kernel is not None else set()
    if kernel is not None and not {"window_size", "is_causal"} & params:
        raise ValueError(
            f"{kernel!r} takes neither window_size nor is_causal: no way to ask for causal attention"
        )

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        position_ids = kwargs.get("position_ids")
        packed = (
            attention_mask is None
            and position_ids is not None
            and query.shape[2] == key.shape[2] > 1
            and getattr(module, "is_causal", True)
            and kwargs.get("is_causal", True) is not False
        )
        if not packed:
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout, scaling, **kwargs
            )
        if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
            raise ValueError(f"{VARLEN_ATTENTION}: packed calls take full causal attention only")
        device_type = query.device.type
        if torch.is_autocast_enabled(device_type):
            # Under autocast the rotary embedding leaves query and key in float32 (its cos / sin follow the
            # float32 residual stream), and SDPA casts them down itself; the kernel needs them cast here, to
            # the autocast dtype, as SDPA would, or it never runs in a bf16 recipe.
            low = torch.get_autocast_dtype(device_type)
            query, key, value = (t.to(low) for t in (query, key, value))
        why = (
            "torch has no varlen_attn" if kernel is None
            else f"the kernel does not run on {query.device.type}" if query.device.type not in devices
            else f"the kernel does not take {query.dtype}" if query.dtype not in dtypes
            else "attention dropout is on" if dropout
            else None
        )  # fmt: skip
        if why is not None:
            _log_once(f"packed attention: sdpa with a block-diagonal mask, not varlen: {why}")
            mask = block_causal_mask(_per_row(position_ids, query.size(0)))
            kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
            return sdpa_attention_forward(
                module, query, key, value, mask, dropout, scaling, is_causal=False, **kwargs
            )
        _log_once("packed attention: varlen")
        return _run_kernel(kernel, params, query, key, value, position_ids, scaling), None

    attention.__doc__ = f"transformers attention function running {kernel!r} on packed calls."
    return attention


def _per_row(position_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """``position_ids`` with one row per batch row (models may pass them unexpanded); the same tensor when it
    has, so `sequences` finds it memoised."""
    return position_ids if position_ids.size(0) == batch else position_ids.expand(batch, -1)


def _run_kernel(
    kernel: Kernel,
    params: set[str],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    position_ids: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """``kernel`` on the (batch, heads, T, D) tensors flattened to (batch x T, heads, D), the sequences read
    off ``position_ids``; the output as (batch, T, heads, D)."""
    batch, heads, width, dim = query.shape
    kv_heads = key.size(1)
    found = sequences(_per_row(position_ids, batch))
    q = query.transpose(1, 2).reshape(batch * width, heads, dim)
    k = key.transpose(1, 2).reshape(batch * width, kv_heads, key.size(-1))
    v = value.transpose(1, 2).reshape(batch * width, kv_heads, value.size(-1))
    options: dict[str, Any] = {}
    if "window_size" in params:
        options["window_size"] = (-1, 0)  # causal
    else:
        options["is_causal"] = True
    if kv_heads != heads:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:  # query head h reads K / V head h // groups, as transformers' repeat_kv lays them out
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
    if "scale" in params:
        options["scale"] = scaling
    elif scaling is not None and scaling != dim**-0.5:
        q = q * (scaling * dim**0.5)  # the kernel scales by 1 / sqrt(dim)
    cu = found.cu_seqlens
    out = kernel(q, k, v, cu, cu, found.max_length, found.max_length, **options)
    return out.view(batch, width, heads, -1)


def _varlen_mask(**kwargs: Any) -> torch.Tensor | None:
    """The mask function registered with the attention: no mask when there is no padding mask (a packed call,
    or one sequence; the attention function reads the sequences off the position ids), else SDPA's."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is None:
        return None
    return sdpa_mask(**kwargs)


def register(
    kernel: Kernel | None = None,
    name: str = VARLEN_ATTENTION,
    devices: tuple[str, ...] = KERNEL_DEVICES,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
) -> str:
    """Register `make_varlen_attention` (``kernel``: default torch's; ``devices``, ``dtypes``: where it runs)
    and its mask function with transformers as ``name``, and return ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, make_varlen_attention(kernel, devices, dtypes))
    AttentionMaskInterface.register(name, _varlen_mask)
    return name


def packed_attention(device_type: str, has_kernel: bool, attention: str | None) -> tuple[str, str]:
    """Which attention a packed model on ``device_type`` gets, and why, in one line: `VARLEN_ATTENTION` on
    CUDA where torch has the kernel (``has_kernel``) and the model uses SDPA; otherwise its own
    ``attention``.

    >>> packed_attention("cpu", True, "sdpa")
    ('sdpa', 'varlen attention needs CUDA (device: cpu)')
    """
    if attention == VARLEN_ATTENTION:
        return attention, "already set"
    if attention != "sdpa":
        return str(attention), f"the model's attention is {attention!r}, not sdpa"
    if device_type != "cuda":
        return "sdpa", f"varlen attention needs CUDA (device: {device_type})"
    if not has_kernel:
        return "sdpa", f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    return VARLEN_ATTENTION, f"CUDA with torch {torch.__version__}'s varlen_attn"


def use_varlen_attention(model: torch.nn.Module, device: torch.device) -> tuple[str, str]:
    """Give ``model`` (the transformers model, unwrapped) varlen attention where `packed_attention` picks it
    for ``device`` and this torch; returns the attention it then has and why."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    chosen, why = packed_attention(device.type, varlen_kernel() is not None, attention)
    if chosen == VARLEN_ATTENTION and attention != VARLEN_ATTENTION:
        register()
        model.set_attn_implementation(VARLEN_ATTENTION)
    return chosen, why


def restore_sdpa(model: torch.nn.Module) -> None:
    """Put SDPA back on a model `use_varlen_attention` changed (after a failed live check)."""
    if getattr(model.config, "_attn_implementation", None) == VARLEN_ATTENTION:
        model.set_attn_implementation("sdpa")
