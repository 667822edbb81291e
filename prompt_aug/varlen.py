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
  transformers' SDPA with the mask transformers built for it. Where the kernel cannot run (`kernel_unfit`:
  no kernel, a device, GPU, head width or dtype it does not take, attention dropout), a packed call runs
  SDPA on each sequence alone on CPU, whose SDPA would compute every entry of a T x T mask, and elsewhere
  SDPA over the whole row with the block-diagonal mask built here; it says so once in the log (on CUDA as a
  warning). A packed call with an argument that changes the attention (a sliding window, a softcap, gpt-oss's
  sinks) is refused.
* `packed_attention` (pure: which attention a packed model gets, and why) and `use_varlen_attention`
  (applies that choice to a model, and reports the attention transformers then gives it) select it for a
  model on SDPA: on CUDA where the kernel can run (an Ampere or later GPU, heads up to 256 wide), and on
  CPU (SDPA a sequence); otherwise the model keeps its attention. `dense_mask_reason` (pure) says where a
  packed call would still compute a dense mask.
* `sdpa_reference`: a model on this attention switched to SDPA for a block, what the live packing check
  compares a packed call with (`prompt_aug.packing.packing_check`).

Packed rows may also share prompts (`prompt_aug.packing`, ``share_prompts``): a group's prompt, less its last
token, runs once, and each completion follows as a sequence whose positions continue the prompt's, so it sees
that prefix (`Sequences`). SDPA over the whole row then gets the mask of that tree (`block_causal_mask`);
the kernel, and SDPA run on each sequence, get each sequence's keys gathered (prefix, then itself), with
``cu_seq_k`` apart from ``cu_seq_q``, and a causal mask aligned to the last key (as FlashAttention aligns it
for more keys than queries), which lets query j of a sequence with a prefix of p tokens see keys 0 .. p + j.

``varlen_attn``'s signature changed: torch 2.10's takes ``is_causal`` and no ``scale``; 2.11's takes
``window_size`` and ``scale``; 2.13's also takes ``enable_gqa``. `make_varlen_attention` reads the signature
at run time: causal masking through whichever the kernel has, and K / V heads repeated for grouped-query
attention where it lacks ``enable_gqa`` (and the query pre-scaled where it lacks ``scale``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

logger = logging.getLogger("prompt_aug")

VARLEN_ATTENTION = "prompt_aug_varlen"
# The dtypes and devices torch's varlen kernel (FlashAttention 2) takes.
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_DEVICES = ("cuda",)
# FlashAttention 2's limits: an Ampere or later GPU, heads up to 256 wide; torch's kernel raises beyond them.
KERNEL_MIN_CAPABILITY = (8, 0)
KERNEL_MAX_HEAD_DIM = 256
# Where a packed call the kernel cannot run is SDPA on each sequence alone (`sequence_kernel`) rather than on
# the whole row with a block-diagonal mask: on CPU, whose SDPA computes every entry of a mask given to it.
SEQUENCE_DEVICES = ("cpu",)
# What transformers passes an attention function besides the tensors, ``dropout`` and ``scaling``, that a
# packed call may carry and still be full causal attention (Qwen2 and Llama, transformers 5.17 and 5.24,
# pass ``position_ids``, ``use_cache`` and ``sliding_window`` as None). Any other key with a value
# (``sliding_window``, ``softcap``, gpt-oss's ``s_aux``, ``position_bias``) changes the attention, which the
# kernel would ignore.
PACKED_CALL_KWARGS = frozenset(
    {"position_ids", "use_cache", "cache_position", "output_attentions", "is_causal", "past_key_values",
     "past_key_value"}
)  # fmt: skip

Kernel = Callable[..., Any]


def varlen_kernel() -> Kernel | None:
    """torch's ``varlen_attn``, or None where this torch has none (before 2.10)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class KernelError(RuntimeError):
    """The attention kernel refused a packed call (a GPU or a shape it does not take): what the live packing
    check counts as a failure, where any other error stops the run."""


# Errors of the device rather than of the kernel's arguments: raised as they are.
DEVICE_FAULTS: tuple[type[BaseException], ...] = (
    torch.OutOfMemoryError, *((torch.AcceleratorError,) if hasattr(torch, "AcceleratorError") else ()),
)  # fmt: skip


def kernel_unfit(
    has_kernel: bool,
    device_type: str,
    dtype: torch.dtype | None = None,
    dropout: float = 0.0,
    capability: tuple[int, int] | None = None,
    head_dim: int | None = None,
    devices: tuple[str, ...] = KERNEL_DEVICES,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
) -> str | None:
    """Why the varlen kernel cannot run a packed call, or None where it can: torch has it (``has_kernel``),
    the device type is in ``devices``, the GPU's compute ``capability`` is at least `KERNEL_MIN_CAPABILITY`,
    heads are at most `KERNEL_MAX_HEAD_DIM` wide, ``dtype`` is in ``dtypes`` and there is no attention
    ``dropout`` (an argument that is None is not judged).

    >>> kernel_unfit(True, "cuda", torch.bfloat16, capability=(7, 5))
    'the kernel needs a GPU of compute capability 8.0 or later (this one: 7.5)'
    """
    if not has_kernel:
        return f"torch {torch.__version__} has no varlen_attn"
    if device_type not in devices:
        return f"the kernel does not run on {device_type}"
    if capability is not None and tuple(capability) < KERNEL_MIN_CAPABILITY:
        need, this = (".".join(map(str, c)) for c in (KERNEL_MIN_CAPABILITY, capability))
        return f"the kernel needs a GPU of compute capability {need} or later (this one: {this})"
    if head_dim is not None and head_dim > KERNEL_MAX_HEAD_DIM:
        return f"the kernel takes heads up to {KERNEL_MAX_HEAD_DIM} wide (these: {head_dim})"
    if dtype is not None and dtype not in dtypes:
        return f"the kernel does not take {dtype}"
    return "attention dropout is on" if dropout else None


@functools.cache  # read at every packed attention call
def capability_of(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA ``device``; None for another device, or where CUDA is unavailable."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def head_dim_of(model: torch.nn.Module) -> int | None:
    """The width of a transformers model's attention heads, as its config gives it (``head_dim``, else the
    hidden size over the heads); None where it gives neither."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_attention_heads", None)
    width = getattr(config, "head_dim", None)
    return width or (getattr(config, "hidden_size", 0) // heads if heads else None) or None


class Sequences(NamedTuple):
    """The sequences of a (rows, T) ``position_ids``, flattened to rows x T tokens.

    A sequence starts at every row's first token and wherever a position is not the one before plus 1. A
    sequence that starts at position 0 is a root; one that starts at position p > 0 continues a shared
    prefix: it also sees the first p tokens of the last root before it in its row (a prompt run once for the
    completions that follow it, `prompt_aug.packing`'s ``share_prompts``).

    ``cu_seqlens`` (int32, on the position ids' device): entries i, i + 1 bound sequence i's queries;
    ``max_length``: the longest sequence; ``segment`` (rows, T, on the CPU): each token's sequence number,
    for the mask; ``prefix`` (CPU): per sequence, how many tokens of its root it sees (0 for roots); ``root``
    (CPU): per sequence, its root's number (itself for a root). Where some sequence has a prefix,
    ``key_index`` (on the device) gathers each sequence's keys (its prefix, then itself) from the flat
    tokens, bounded by ``cu_seqlens_k``, the longest ``max_length_k``; otherwise these three are None."""

    cu_seqlens: torch.Tensor
    max_length: int
    segment: torch.Tensor
    prefix: torch.Tensor
    root: torch.Tensor
    key_index: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    max_length_k: int | None = None


class _Seen:
    """What is known of a packed position-id tensor at one version: its host copy when the packer gave one,
    and what was derived from it, the sequences and, on the SDPA fallback, the mask."""

    __slots__ = ("host", "mask", "sequences", "version")

    def __init__(self, version: int) -> None:
        self.version = version
        self.host: torch.Tensor | None = None
        self.sequences: Sequences | None = None
        self.mask: torch.Tensor | None = None


# The attribute a position-id tensor carries its `_Seen` in.
_SEEN = "_prompt_aug_seen"


def _seen(position_ids: torch.Tensor) -> _Seen:
    """What is known of ``position_ids``, kept on the tensor itself so that it lives exactly as long: every
    layer of a forward (and the recomputation of a checkpointed layer) gets the same tensor, so its sequences
    and mask are made once, and from the packer's host copy where it gave one (`remember_positions`), so that
    no layer waits for the device. A tensor changed in place since is read anew. An inference tensor
    (``torch.inference_mode``) has no version to tell that by, so nothing is kept for it."""
    if position_ids.is_inference():
        return _Seen(-1)
    entry = getattr(position_ids, _SEEN, None)
    if entry is None or entry.version != position_ids._version:
        entry = _Seen(position_ids._version)
        setattr(position_ids, _SEEN, entry)
    return entry


def remember_positions(position_ids: torch.Tensor, host: torch.Tensor) -> None:
    """Note that ``host`` (on the CPU) holds the values of the packed ``position_ids`` (on the device), so
    that `sequences` reads them there instead of copying them back from the device, which would wait for
    every kernel queued before it (`prompt_aug.packing` builds its position ids on the CPU)."""
    entry = _seen(position_ids)
    if entry.sequences is None:
        entry.host = host.reshape(position_ids.shape)


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on ``device`` without waiting for the kernels queued there: torch's host-to-device copy
    synchronises the stream unless ``non_blocking``; on CUDA the tensor is pinned first, so the copy is
    truly asynchronous (torch's host allocator keeps the pinned buffer until the copy has run). Where
    memory cannot be pinned, the copy is the ordinary one, which waits."""
    if device.type != "cuda":  # elsewhere (MPS) a non-blocking copy from pageable memory may read it freed
        return tensor.to(device)
    try:
        pinned = tensor.pin_memory()
    except RuntimeError:  # no page-locked memory to be had (a sandboxed or containerised host): wait instead
        return tensor.to(device)
    return pinned.to(device, non_blocking=True)


def sequences(position_ids: torch.Tensor) -> Sequences:
    """The sequences of packed ``position_ids`` (rows, T), read on the CPU (from the host copy given to
    `remember_positions`, else with one device-to-host copy), with their shared prefixes (see `Sequences`).
    Memoised on the tensor (same object, unchanged).

    Raises:
        ValueError: a sequence starting at position p > 0 has no root before it in its row with at least p
            tokens.
    """
    entry = _seen(position_ids)
    if entry.sequences is not None:
        return entry.sequences
    rows, width = position_ids.shape
    device = position_ids.device
    flat = (entry.host if entry.host is not None else position_ids.detach().cpu()).reshape(-1)
    starts = torch.ones(flat.numel(), dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1] + 1
    if width:
        starts[::width] = True
    offsets = torch.nonzero(starts).view(-1)
    lengths = torch.diff(offsets, append=torch.tensor([flat.numel()]))
    first = flat[offsets]
    # Each sequence's root: the last sequence at or before it that starts at position 0 (or a row).
    is_root = (first == 0) | (offsets % max(width, 1) == 0)
    numbers = torch.arange(offsets.numel())
    root = torch.cummax(torch.where(is_root, numbers, torch.full_like(numbers, -1)), 0).values
    prefix = torch.where(is_root, torch.zeros_like(first), first)
    segment = (torch.cumsum(starts.long(), 0) - 1).view(rows, width)
    cu_seqlens = host_to_device(torch.cat([offsets, torch.tensor([flat.numel()])]).to(torch.int32), device)
    max_length = int(lengths.max()) if offsets.numel() else 0
    found = Sequences(cu_seqlens, max_length, segment, prefix, root)
    if bool((prefix > 0).any()):
        found = _with_prefixes(found, offsets, lengths, first, device)
    entry.sequences, entry.host = found, None
    return found


def _with_prefixes(
    found: Sequences, offsets: torch.Tensor, lengths: torch.Tensor, first: torch.Tensor, device: torch.device
) -> Sequences:
    """``found`` with the key gather of its shared prefixes: sequence i's keys are the first ``prefix[i]``
    tokens of its root, then its own tokens. (A root is the row's first sequence or starts at position 0;
    the sequence's own row holds it, as roots include every row's start.)"""
    pieces, key_lengths = [], []
    for i, (offset, length, prefix, root) in enumerate(
        zip(offsets.tolist(), lengths.tolist(), found.prefix.tolist(), found.root.tolist(), strict=True)
    ):
        if prefix:
            if first[root] != 0 or lengths[root] < prefix:
                raise ValueError(
                    f"packed position ids: sequence {i} starts at position {prefix} but has no root before "
                    f"it in its row with {prefix} tokens to continue"
                )
            start = int(offsets[root])
            pieces.append(torch.arange(start, start + prefix))
        pieces.append(torch.arange(offset, offset + length))
        key_lengths.append(prefix + length)
    key_lengths_t = torch.tensor(key_lengths)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(key_lengths_t, 0)])
    return found._replace(
        key_index=host_to_device(torch.cat(pieces), device),
        cu_seqlens_k=host_to_device(cu_k.to(torch.int32), device),
        max_length_k=int(key_lengths_t.max()),
    )


def block_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The (rows, 1, T, T) boolean mask of packed ``position_ids`` (True where attention is allowed): a token
    sees the earlier tokens of its own sequence and, in a sequence that continues a shared prefix, that
    prefix (`Sequences`), as transformers builds the block-diagonal mask for SDPA when there is none.
    Memoised with the sequences, so the layers of a forward share one mask."""
    found, entry = sequences(position_ids), _seen(position_ids)
    if entry.mask is not None:
        return entry.mask
    device = position_ids.device
    segment = host_to_device(found.segment, device)
    width = segment.size(1)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    same = segment[:, :, None] == segment[:, None, :]
    if found.key_index is None:
        entry.mask = (same & causal)[:, None]
        return entry.mask
    # Key u is in query t's prefix: u lies in t's root and before position prefix[t's sequence].
    root, prefix = host_to_device(found.root, device)[segment], host_to_device(found.prefix, device)[segment]
    in_prefix = (segment[:, None, :] == root[:, :, None]) & (position_ids[:, None, :] < prefix[:, :, None])
    entry.mask = ((same | in_prefix) & causal)[:, None]
    return entry.mask


def make_varlen_attention(
    kernel: Kernel | None = None,
    devices: tuple[str, ...] = KERNEL_DEVICES,
    dtypes: tuple[torch.dtype, ...] = KERNEL_DTYPES,
    sequence_devices: tuple[str, ...] = SEQUENCE_DEVICES,
) -> Callable[..., tuple[torch.Tensor, None]]:
    """An attention function with transformers' signature (``(module, query, key, value, attention_mask,
    dropout, scaling, ...)`` with (batch, heads, T, head_dim) tensors, returning ((batch, T, heads,
    head_dim), None)) that runs ``kernel`` (default: torch's `varlen_kernel`) on packed calls.

    A packed call is one with no attention mask, ``position_ids`` given, as many keys as queries (no cache)
    and a causal module. ``kernel`` runs there where `kernel_unfit` finds nothing against it (the query's
    device type in ``devices``, its dtype in ``dtypes``, a GPU and heads it takes, no dropout); otherwise
    SDPA runs on each sequence alone on a device of ``sequence_devices`` (`sequence_kernel`), and with
    `block_causal_mask` over the whole row elsewhere. Every other call is transformers' SDPA, unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kernel = kernel if kernel is not None else varlen_kernel()
    params = set(inspect.signature(kernel).parameters) if kernel is not None else set()
    if kernel is not None and not {"window_size", "is_causal"} & params:
        raise ValueError(
            f"{kernel!r} takes neither window_size nor is_causal: no way to ask for causal attention"
        )

    logged: set[str] = set()  # each line once per function made, so once per model set up

    def log_once(message: str, level: int = logging.INFO) -> None:
        if message not in logged:
            logged.add(message)
            logger.log(level, message)

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
        other = sorted(k for k, v in kwargs.items() if v is not None and k not in PACKED_CALL_KWARGS)
        if other:
            raise ValueError(
                f"{VARLEN_ATTENTION}: packed calls take full causal attention only, and this one has "
                f"{', '.join(other)}; run this model with trim_padding: trim"
            )
        device_type = query.device.type
        if torch.is_autocast_enabled(device_type):
            # Under autocast the rotary embedding leaves query and key in float32 (its cos / sin follow the
            # float32 residual stream), and SDPA casts them down itself; the kernel needs them cast here, to
            # the autocast dtype, as SDPA would, or it never runs in a bf16 recipe.
            low = torch.get_autocast_dtype(device_type)
            query, key, value = (t.to(low) for t in (query, key, value))
        why = kernel_unfit(
            kernel is not None, device_type, query.dtype, dropout, capability_of(query.device),
            max(query.size(-1), value.size(-1)), devices, dtypes,
        )  # fmt: skip
        if why is not None and device_type in sequence_devices:
            log_once(f"packed attention: sdpa on each sequence, not varlen: {why}")
            out = _run_kernel(
                sequence_kernel, SEQUENCE_KERNEL_PARAMS, query, key, value, position_ids, scaling, dropout
            )
            return out, None
        if why is not None:
            # On a GPU the dense T x T mask is a large slowdown that a run should not miss; elsewhere it is
            # what the device allows.
            level = logging.WARNING if device_type == "cuda" else logging.INFO
            log_once(f"packed attention: sdpa with a block-diagonal mask, not varlen: {why}", level)
            mask = block_causal_mask(_per_row(position_ids, query.size(0)))
            kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
            return sdpa_attention_forward(
                module, query, key, value, mask, dropout, scaling, is_causal=False, **kwargs
            )
        log_once("packed attention: varlen")
        return _run_kernel(kernel, params, query, key, value, position_ids, scaling), None

    attention.__doc__ = f"transformers attention function running {kernel!r} on packed calls."
    return attention


def _per_row(position_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """``position_ids`` with one row per batch row (models may pass them unexpanded); the same tensor when it
    has, so `sequences` finds it memoised."""
    return position_ids if position_ids.size(0) == batch else position_ids.expand(batch, -1)


def sequence_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """torch's ``varlen_attn`` (2.13's signature, plus ``dropout_p``) as SDPA run on each sequence alone:
    (tokens, heads, D) tensors, sequence i's queries between ``cu_seq_q[i]`` and ``cu_seq_q[i + 1]`` and its
    keys between those of ``cu_seq_k`` (offsets read on the host); causal (``window_size`` (-1, 0)) aligned
    to the last key, as the kernel aligns it. No (tokens x tokens) mask is built or computed."""
    causal = tuple(window_size) == (-1, 0)
    out = []
    for (qs, qe), (ks, ke) in zip(
        itertools.pairwise(cu_seq_q.tolist()), itertools.pairwise(cu_seq_k.tolist()), strict=True
    ):
        length, keys = qe - qs, ke - ks
        mask = {"is_causal": causal} if length == keys or not causal else {
            "attn_mask": torch.ones(length, keys, dtype=torch.bool, device=query.device).tril(keys - length)
        }  # fmt: skip
        # (1, heads, L, D): with a batch dimension CPU's SDPA takes its flash kernel; (heads, L, D) gets math.
        out.append(
            torch.nn.functional.scaled_dot_product_attention(
                *(
                    t[start:end].transpose(0, 1)[None]
                    for t, start, end in ((query, qs, qe), (key, ks, ke), (value, ks, ke))
                ),
                dropout_p=dropout_p,
                scale=scale,
                enable_gqa=enable_gqa,
                **mask,
            )[0].transpose(0, 1)
        )
    return torch.cat(out)


SEQUENCE_KERNEL_PARAMS = set(inspect.signature(sequence_kernel).parameters)


def _run_kernel(
    kernel: Kernel,
    params: set[str],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    position_ids: torch.Tensor,
    scaling: float | None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """``kernel`` on the (batch, heads, T, D) tensors flattened to (batch x T, heads, D), the sequences read
    off ``position_ids``; the output as (batch, T, heads, D). ``dropout`` goes to a kernel that takes
    ``dropout_p`` (`sequence_kernel`; torch's runs only without dropout)."""
    batch, heads, width, dim = query.shape
    kv_heads = key.size(1)
    found = sequences(_per_row(position_ids, batch))
    q = query.transpose(1, 2).reshape(batch * width, heads, dim)
    k = key.transpose(1, 2).reshape(batch * width, kv_heads, key.size(-1))
    v = value.transpose(1, 2).reshape(batch * width, kv_heads, value.size(-1))
    cu_q, cu_k, max_k = found.cu_seqlens, found.cu_seqlens, found.max_length
    if found.key_index is not None:  # shared prefixes: each sequence's keys are its prefix, then itself
        k, v = k.index_select(0, found.key_index), v.index_select(0, found.key_index)
        cu_k, max_k = found.cu_seqlens_k, found.max_length_k
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
    if "dropout_p" in params:
        options["dropout_p"] = dropout
    if "scale" in params:
        options["scale"] = scaling
    elif scaling is not None and scaling != dim**-0.5:
        q = q * (scaling * dim**0.5)  # the kernel scales by 1 / sqrt(dim)
    try:
        out = kernel(q, k, v, cu_q, cu_k, found.max_length, max_k, **options)
    except RuntimeError as err:
        if isinstance(err, DEVICE_FAULTS):  # memory, or a device left unusable: not the kernel's refusal
            raise
        raise KernelError(f"{type(err).__name__}: {next(iter(str(err).splitlines()), '')}") from err
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
    sequence_devices: tuple[str, ...] = SEQUENCE_DEVICES,
) -> str:
    """Register `make_varlen_attention` (``kernel``: default torch's; ``devices``, ``dtypes``: where it runs;
    ``sequence_devices``: where SDPA runs each sequence alone instead) and its mask function with
    transformers as ``name``, and return ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    attention = make_varlen_attention(kernel, devices, dtypes, sequence_devices)
    attention.packs_sequences = True  # type: ignore[attr-defined]  # how `sdpa_reference` knows it
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, _varlen_mask)
    return name


def attention_of(model: torch.nn.Module | None) -> str | None:
    """The attention implementation of a transformers model (unwrapped), as its config says."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


@contextlib.contextmanager
def sdpa_reference(model: torch.nn.Module | None) -> Iterator[None]:
    """``model`` (a transformers model, unwrapped) on transformers' SDPA for the block where it is on an
    attention `register` made, then back: what a packed call through that attention is checked against, as
    the same function on both sides of a check agrees with itself however wrong it is."""
    from transformers import AttentionInterface

    attention = attention_of(model)
    ours = getattr(AttentionInterface().get(attention or ""), "packs_sequences", False)
    if model is None or not ours:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(attention)


def packed_attention(
    device_type: str,
    has_kernel: bool,
    attention: str | None,
    *,
    capability: tuple[int, int] | None = None,
    head_dim: int | None = None,
) -> tuple[str, str]:
    """Which attention a packed model on ``device_type`` gets, and why, in one line: `VARLEN_ATTENTION` where
    the model uses SDPA, on CUDA where the kernel can run (`kernel_unfit`: torch has it, ``has_kernel``, the
    GPU's ``capability`` and the model's ``head_dim`` fit) and on a device of `SEQUENCE_DEVICES` (CPU: SDPA
    on each sequence); otherwise its own ``attention``.

    >>> packed_attention("mps", True, "sdpa")
    ('sdpa', 'varlen attention needs CUDA or CPU (device: mps)')
    """
    if attention == VARLEN_ATTENTION:
        return attention, "already set"
    if attention != "sdpa":
        return str(attention), f"the model's attention is {attention!r}, not sdpa"
    if device_type in SEQUENCE_DEVICES:
        return VARLEN_ATTENTION, f"sdpa on each sequence on {device_type}"
    if device_type != "cuda":
        return "sdpa", f"varlen attention needs CUDA or CPU (device: {device_type})"
    why = kernel_unfit(has_kernel, device_type, capability=capability, head_dim=head_dim)
    if why is not None:
        return "sdpa", why
    return VARLEN_ATTENTION, f"CUDA with torch {torch.__version__}'s varlen_attn"


def use_varlen_attention(
    model: torch.nn.Module, device: torch.device, shared_prompts: bool = False
) -> tuple[str, str]:
    """Give ``model`` (the transformers model, unwrapped) varlen attention where `packed_attention` picks it
    for ``device`` and this torch, or, with ``shared_prompts``, wherever the model is on SDPA (only this
    attention reads shared prompts; without the kernel it runs SDPA on each sequence or with their mask);
    returns the attention the model then has and why."""
    attention = attention_of(model)
    chosen, why = packed_attention(
        device.type, varlen_kernel() is not None, attention, capability=capability_of(device),
        head_dim=head_dim_of(model),
    )  # fmt: skip
    if shared_prompts and chosen == "sdpa":
        chosen, why = VARLEN_ATTENTION, f"shared prompts ({why}: sdpa with their mask)"
    if chosen == VARLEN_ATTENTION and attention != VARLEN_ATTENTION:
        register()
        return set_varlen_attention(model, why)
    return chosen, why


def set_varlen_attention(model: torch.nn.Module, why: str) -> tuple[str, str]:
    """Give ``model`` (unwrapped) `VARLEN_ATTENTION` as registered (chosen for ``why``); returns the
    attention it then has, read back from its config, and why: transformers keeps a model's attention, with a
    warning, where its modeling code does not go through ``AttentionInterface``."""
    model.set_attn_implementation(VARLEN_ATTENTION)
    now = attention_of(model)
    if now == VARLEN_ATTENTION:
        return now, why
    return str(now), f"transformers kept {now!r} for {type(model).__name__} (not {VARLEN_ATTENTION}: {why})"


def dense_mask_reason(
    device_type: str,
    dtype: torch.dtype,
    dropout: float,
    has_kernel: bool,
    attention: str | None,
    *,
    capability: tuple[int, int] | None = None,
    head_dim: int | None = None,
) -> str | None:
    """Why a packed call on ``device_type`` would compute a dense (T, T) mask, running in ``dtype`` with
    attention ``dropout`` (training), where torch has the varlen kernel or not (``has_kernel``), on a GPU of
    compute ``capability``, with heads ``head_dim`` wide, on the model's ``attention``; None where it computes
    only each sequence's own attention: `VARLEN_ATTENTION` where the kernel runs (`kernel_unfit`) or on
    `SEQUENCE_DEVICES` (SDPA a sequence), and flash and flex attention, which take no dense mask.
    transformers' SDPA and eager build one.

    >>> dense_mask_reason("cuda", torch.float32, 0.0, True, VARLEN_ATTENTION)
    'the kernel does not take torch.float32'
    """
    if attention is not None and (attention.startswith("flash_attention") or attention == "flex_attention"):
        return None
    if attention not in ("sdpa", VARLEN_ATTENTION):
        return f"attention {attention!r} masks packed rows with a dense mask"
    if attention == VARLEN_ATTENTION and device_type in SEQUENCE_DEVICES:
        return None
    why = kernel_unfit(has_kernel, device_type, dtype, dropout, capability, head_dim)
    if why is None and attention == "sdpa":
        return f"the model is on transformers' sdpa, not {VARLEN_ATTENTION}"
    return why


def restore_sdpa(model: torch.nn.Module) -> None:
    """Put SDPA back on a model `use_varlen_attention` changed (after a failed live check)."""
    if attention_of(model) == VARLEN_ATTENTION:
        model.set_attn_implementation("sdpa")
