"""Varlen attention for packed rows (`prompt_aug.varlen`): which attention a packed model gets, the SDPA
fallback, and the wrapper around the kernel, exact to SDPA on the same packed row.

torch's ``varlen_attn`` runs on CUDA only (FlashAttention 2, fp16 / bf16), so on CPU the wrapper is run with
the kernel replaced by a per-sequence reference written here, once with each of the kernel's signatures as
torch's own sources have them (2.10: ``is_causal``, no ``scale``, no ``enable_gqa``; 2.11: ``window_size``
and ``scale``, no ``enable_gqa``; 2.13: all three). What this checks is the wrapper: the sequence offsets it
derives from the position ids, the layouts, grouped-query heads and scaling. The real kernel's values need
a GPU: the last test runs it there and is skipped elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import logging
import sys
import warnings
from typing import Any

import pytest
import torch
from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface
from trl.trainer.utils import add_fused_lm_head

from prompt_aug.packing import (
    fused_head_call,
    pack_rows,
    packed_forward,
    packing_check,
    packing_unsupported_reason,
)
from prompt_aug.padding import PaddingFreePasses
from prompt_aug.varlen import (
    VARLEN_ATTENTION,
    block_causal_mask,
    dense_mask_reason,
    make_varlen_attention,
    packed_attention,
    register,
    sequences,
    use_varlen_attention,
    varlen_kernel,
)

# Packed position ids: sequences of 5, 3, 1 and 6 tokens (the 1-token one like a pack's rounding tail).
POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0, 1, 2, 3, 4, 5]])
LENGTHS = [5, 3, 1, 6]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Plain softmax attention of one sequence, (Lq, H, D) and (Lk, H, D), K / V already at H heads; causal
    as FlashAttention aligns it, to the last key (query j sees keys 0 .. Lk - Lq + j)."""
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if causal:
        upper = torch.ones(q.size(0), k.size(0), dtype=torch.bool).triu(1 + k.size(0) - q.size(0))
        scores = scores.masked_fill(upper, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


class _Kernel:
    """Records its calls; `_reference` does the work, one sequence at a time."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def _reference(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale, gqa):
        assert query.ndim == key.ndim == value.ndim == 3  # (tokens, heads, head_dim)
        assert cu_seq_q.dtype == cu_seq_k.dtype == torch.int32
        lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
        key_lengths = (cu_seq_k[1:] - cu_seq_k[:-1]).tolist()
        self.calls.append({"lengths": lengths, "max": (max_q, max_k), "kv_heads": key.size(1)})
        assert max_q == max(lengths) and max_k == max(key_lengths) and key.size(0) == cu_seq_k[-1]
        groups = query.size(1) // key.size(1)
        if groups > 1:
            assert gqa, "K / V with fewer heads and no enable_gqa"
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scale = query.size(-1) ** -0.5 if scale is None else scale
        q_bounds, k_bounds = itertools.pairwise(cu_seq_q.tolist()), itertools.pairwise(cu_seq_k.tolist())
        return torch.cat(
            [
                _attend(query[qs:qe], key[ks:ke], value[ks:ke], causal, scale)
                for (qs, qe), (ks, ke) in zip(q_bounds, k_bounds, strict=True)
            ]
        )


class OldKernel(_Kernel):
    """torch 2.10's signature: ``is_causal``, no ``scale``, no ``enable_gqa``."""

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        return self._reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, False)


class Kernel211(_Kernel):
    """torch 2.11's signature (the lent GPU machines' torch): ``window_size`` and ``scale``, no
    ``enable_gqa``."""

    def __call__(
        self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
        window_size=(-1, -1),
    ):  # fmt: skip
        assert tuple(window_size) in ((-1, -1), (-1, 0))
        causal = tuple(window_size) == (-1, 0)
        return self._reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale, False)


class NewKernel(_Kernel):
    """torch 2.13's signature: ``window_size`` (``(-1, 0)`` is causal), ``scale``, ``enable_gqa``."""

    def __call__(
        self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
        window_size=(-1, -1), enable_gqa=False,
    ):  # fmt: skip
        assert tuple(window_size) in ((-1, -1), (-1, 0))
        causal = tuple(window_size) == (-1, 0)
        return self._reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal, scale, enable_gqa)


class _Module(torch.nn.Module):
    """What transformers' attention functions read off the attention module."""

    is_causal = True
    num_key_value_groups = 2


def test_sequences_start_at_position_zero_and_at_each_row():
    found = sequences(POSITIONS)
    assert found.cu_seqlens.tolist() == [0, 5, 8, 9, 15] and found.cu_seqlens.dtype == torch.int32
    assert found.max_length == 6
    assert found.segment.tolist() == [[0] * 5 + [1] * 3 + [2] + [3] * 6]
    assert found.key_index is None  # every sequence starts at 0: no shared prefix
    assert sequences(POSITIONS) is found  # the same tensor again: memoised, no second device-to-host copy
    # Two rows: the second row starts a sequence even where its position is not 0.
    two = sequences(torch.tensor([[0, 1, 2, 0], [5, 6, 0, 1]]))
    assert two.cu_seqlens.tolist() == [0, 3, 4, 6, 8] and two.max_length == 3
    mask = block_causal_mask(torch.tensor([[0, 1, 0, 1]]))[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


@pytest.mark.parametrize("kernel_type", [OldKernel, Kernel211, NewKernel, None])
@pytest.mark.parametrize("scaling", [None, 0.3])
def test_the_wrapper_matches_sdpa_run_on_each_sequence(kernel_type, scaling):
    """The packed row through the wrapper against transformers' SDPA run on each sequence alone: values and
    gradients, with grouped-query heads (4 query heads, 2 K / V heads) and a scaling other than 1/sqrt(D).
    ``None``: no kernel runs (CPU), the wrapper's own SDPA a sequence."""
    generator = torch.Generator().manual_seed(0)
    width = POSITIONS.size(1)
    shapes = {"q": (1, 4, width, 8), "k": (1, 2, width, 8), "v": (1, 2, width, 8)}
    leaves = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
    weights = torch.randn(1, width, 4, 8, generator=generator, dtype=torch.float64)
    results = {}
    for name in ("wrapper", "alone"):
        q, k, v = (leaves[n].clone().requires_grad_() for n in "qkv")
        if name == "wrapper" and kernel_type is None:
            attention = make_varlen_attention(devices=())
            out, weights_out = attention(_Module(), q, k, v, None, scaling=scaling, position_ids=POSITIONS)
            assert weights_out is None
        elif name == "wrapper":
            kernel = kernel_type()
            attention = make_varlen_attention(kernel, devices=("cpu",), dtypes=(torch.float64,))
            out, weights_out = attention(_Module(), q, k, v, None, scaling=scaling, position_ids=POSITIONS)
            assert weights_out is None
            # 2.10 and 2.11 have no enable_gqa: the wrapper repeats K / V to the 4 query heads.
            kv_heads = 2 if kernel_type is NewKernel else 4
            assert kernel.calls == [{"lengths": LENGTHS, "max": (6, 6), "kv_heads": kv_heads}]
        else:
            pieces, start = [], 0
            for length in LENGTHS:
                part = slice(start, start + length)
                piece, _ = sdpa_attention_forward(
                    _Module(), q[:, :, part], k[:, :, part], v[:, :, part], None, scaling=scaling
                )
                pieces.append(piece)
                start += length
            out = torch.cat(pieces, dim=1)
        assert out.shape == (1, width, 4, 8)
        (out * weights).sum().backward()
        results[name] = (out.detach(), q.grad, k.grad, v.grad)
    for got, want in zip(results["wrapper"], results["alone"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_sdpa_a_sequence_matches_the_block_mask_over_rows_with_shared_prefixes():
    """Two packed rows, the second with sequences continuing a shared prefix (positions 3 and 2 after a root
    of 5), through the wrapper's SDPA a sequence (CPU, no kernel) against SDPA over the whole rows with
    `block_causal_mask`: values and gradients, grouped-query heads, scaling 0.3."""
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 3, 4, 2, 3, 4]])
    generator = torch.Generator().manual_seed(1)
    shapes = {"q": (2, 4, 10, 8), "k": (2, 2, 10, 8), "v": (2, 2, 10, 8)}
    leaves = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
    weights = torch.randn(2, 10, 4, 8, generator=generator, dtype=torch.float64)
    results = {}
    for name in ("sequences", "mask"):
        q, k, v = (leaves[n].clone().requires_grad_() for n in "qkv")
        if name == "sequences":
            out, _ = make_varlen_attention(devices=())(
                _Module(), q, k, v, None, scaling=0.3, position_ids=positions.clone()
            )
        else:
            mask = block_causal_mask(positions.clone())
            out, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.3, is_causal=False)
        (out * weights).sum().backward()
        results[name] = (out.detach(), q.grad, k.grad, v.grad)
    for got, want in zip(results["sequences"], results["mask"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def _model(attention: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=97, attn_implementation=attention,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).float()
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    return model


def _shared_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's layout, 5 rows of (prompt, completion) lengths in a 6 + 7 layout; rows 1-3 share a 3-token
    prompt."""
    mask = torch.zeros(5, 13, dtype=torch.long)
    for i, (p, c) in enumerate([(2, 7), (3, 5), (3, 1), (3, 3), (1, 0)]):
        mask[i, 6 - p : 6 + c] = 1
    ids = torch.randint(1, 97, mask.shape, generator=torch.Generator().manual_seed(2))
    ids[2:4, :6] = ids[1, :6]
    return ids * mask, mask


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's layout, 5 rows of (prompt, completion) lengths in a 6 + 7 layout, ids 0 at padding."""
    mask = torch.zeros(5, 13, dtype=torch.long)
    for i, (p, c) in enumerate([(2, 7), (6, 1), (4, 3), (1, 0), (3, 5)]):
        mask[i, 6 - p : 6 + c] = 1
    return torch.randint(1, 97, mask.shape, generator=torch.Generator().manual_seed(1)) * mask, mask


def test_a_model_with_the_wrapper_gives_sdpas_packed_values_and_gradients():
    """A tiny Qwen2 whose attention is the registered wrapper (the 2.13 reference kernel, float32 on CPU):
    a packed row's log-probs, entropies and gradients equal SDPA's on the same packed row, the kernel ran in
    every layer, and padded calls still go to SDPA with their mask."""
    kernel = NewKernel()
    name = register(kernel, name="test_varlen_reference", devices=("cpu",), dtypes=(torch.float32,))
    ids, mask = _rows()
    packed = pack_rows(ids, mask, logits_to_keep=7, pad_to_multiple_of=5)
    results = {}
    for attention in (name, "sdpa"):
        model = _model(attention).train()
        out = model(**packed.inputs(), fused_lm_head=True, use_cache=False)
        (out.log_probs.sum() + 0.1 * out.entropy.sum()).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        with torch.no_grad():
            padded = model(input_ids=ids, attention_mask=mask).logits
        results[attention] = (out.log_probs.detach(), out.entropy.detach(), grads, padded)
    # Rows of 9, 7, 7, 1 and 8 tokens, then the 3 tokens rounding 32 up to 35: one call in each of 2 layers.
    # The padded calls (with their mask) did not reach the kernel.
    assert [c["lengths"] for c in kernel.calls] == [[9, 7, 7, 1, 8, 3]] * 2
    assert packing_unsupported_reason(_model(register())) is None  # the registered name is known
    assert packing_check(_model(name), ids, mask).ok
    logps, entropy, grads, padded = results[name]
    want_logps, want_entropy, want_grads, want_padded = results["sdpa"]
    torch.testing.assert_close(logps, want_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-5)
    for key, grad in want_grads.items():
        torch.testing.assert_close(grads[key], grad, rtol=1e-4, atol=1e-6, msg=key)
    torch.testing.assert_close(padded, want_padded, rtol=0, atol=0)  # padded calls: SDPA, unchanged


@pytest.mark.parametrize("kernel_type", [OldKernel, Kernel211, NewKernel])
def test_shared_prompts_reach_the_kernel_as_gathered_keys_and_match_the_masked_path(kernel_type):
    """A pack whose groups share their prompt (`pack_rows(share_prompts=True)`): the kernel gets each
    sequence's keys gathered (prefix, then itself) with key bounds apart from the query bounds, and the
    log-probs and gradients equal the masked SDPA path's (the tree's mask) on the same pack."""
    ids, mask = _shared_rows()
    packed = pack_rows(ids, mask, logits_to_keep=7, share_prompts=True)
    kernel = kernel_type()
    names = {
        "kernel": register(kernel, name=f"test_shared_{kernel_type.__name__}", devices=("cpu",),
                           dtypes=(torch.float32,)),
        "masked": register(name="test_shared_masked", devices=("cpu",), dtypes=()),
    }  # fmt: skip
    results = {}
    for path, name in names.items():
        model = _model(name).train()
        out = model(**packed.inputs(), fused_lm_head=True, use_cache=False)
        out.log_probs.sum().backward()
        results[path] = (out.log_probs.detach(), model.model.embed_tokens.weight.grad.clone())
    # Row 0; the prompt with row 1; rows 2 and 3 as their prompt's last token and completion; row 4.
    assert [c["lengths"] for c in kernel.calls] == [[9, 8, 2, 4, 1]] * 2  # both layers
    torch.testing.assert_close(results["kernel"][0], results["masked"][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results["kernel"][1], results["masked"][1], rtol=1e-4, atol=1e-6)


def test_under_autocast_the_kernel_gets_the_autocast_dtype_as_sdpa_would():
    """float32 weights under bf16 autocast, as a bf16 recipe trains: the rotary embedding leaves query and key
    in float32, yet the kernel (here the reference, taking bf16 on CPU only) runs in every layer on bf16
    tensors, and the log-probs are SDPA's under the same autocast within bf16 rounding."""
    seen: list[torch.dtype] = []

    class Recording(NewKernel):
        def _reference(self, query, key, value, *args):
            seen.extend({query.dtype, key.dtype, value.dtype})
            return super()._reference(query.float(), key.float(), value.float(), *args).to(query.dtype)

    kernel = Recording()
    name = register(kernel, name="test_varlen_autocast", devices=("cpu",), dtypes=(torch.bfloat16,))
    ids, mask = _rows()
    packed = pack_rows(ids, mask, logits_to_keep=7)
    got = {}
    for attention in (name, "sdpa"):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got[attention] = _model(attention)(
                **packed.inputs(), fused_lm_head=True, use_cache=False
            ).log_probs
    assert len(kernel.calls) == 2 and set(seen) == {torch.bfloat16}  # both layers, bf16 only
    scale = got["sdpa"].float().abs().mean()
    assert (got[name].float() - got["sdpa"].float()).abs().max() <= 2e-2 * scale


def _fallback_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("packed attention:")]


def _why_not_the_kernel() -> str:
    """Why torch's own kernel does not run here (CPU): this torch has none, or it runs on CUDA only."""
    return (
        f"torch {torch.__version__} has no varlen_attn"
        if varlen_kernel() is None
        else "the kernel does not run on cpu"
    )


@pytest.mark.parametrize("share_prompts", [False, True])
def test_on_cpu_a_packed_call_runs_sdpa_on_each_sequence_and_builds_no_mask(
    caplog, monkeypatch, share_prompts
):
    """torch's own kernel on CPU: not run (CUDA only); each sequence of the packed row runs SDPA on its own
    (its shared prefix's keys, then its own), so no T x T mask is built or computed; the log-probs and
    gradients are those of SDPA with the block mask over the whole row, one log line says which path ran,
    and the live packing check passes."""
    name = register(name="test_varlen_torch_kernel")
    ids, mask = _shared_rows() if share_prompts else _rows()
    packed = pack_rows(ids, mask, logits_to_keep=7, share_prompts=share_prompts)
    width = packed.inputs()["input_ids"].size(1)
    masked = register(name="test_varlen_whole_row", sequence_devices=())
    sdpa = torch.nn.functional.scaled_dot_product_attention
    widths: list[tuple[int, bool]] = []  # per SDPA call: queries, and whether it got a mask

    def recorded(query, key, value, attn_mask=None, **kwargs):
        widths.append((query.size(-2), attn_mask is not None))
        return sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    results, calls = {}, {}
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        for attention in (name, masked):
            widths.clear()
            model = _model(attention).train()
            out = model(**packed.inputs(), fused_lm_head=True, use_cache=False)
            out.log_probs.sum().backward()
            results[attention] = (out.log_probs.detach(), model.model.embed_tokens.weight.grad.clone())
            calls[attention] = list(widths)
    assert max(q for q, _ in calls[name]) < width and len(calls[name]) > 2  # each sequence alone, each layer
    assert calls[masked] == [(width, True)] * 2  # the whole row with its mask, a layer each
    torch.testing.assert_close(results[name][0], results[masked][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[name][1], results[masked][1], rtol=1e-4, atol=1e-6)
    assert _fallback_lines(caplog) == [
        f"packed attention: sdpa on each sequence, not varlen: {_why_not_the_kernel()}",
        f"packed attention: sdpa with a block-diagonal mask, not varlen: {_why_not_the_kernel()}",
    ]
    assert packing_check(fused_head_call(_model(name).eval()), ids, mask).ok


def test_where_neither_the_kernel_nor_sdpa_per_sequence_runs_a_packed_call_is_sdpa_with_the_block_mask(
    caplog,
):
    """A device where the kernel cannot run and SDPA is kept on the whole row (a GPU without torch's kernel;
    here CPU, with no sequence devices): the packed row runs SDPA with the block-diagonal mask built from the
    position ids (a plain SDPA call would let the sequences see each other), equal to SDPA's own packed
    call, one log line says so, and the live packing check passes."""
    name = register(name="test_varlen_block_mask", sequence_devices=())
    ids, mask = _rows()
    packed = pack_rows(ids, mask, logits_to_keep=7)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="prompt_aug"):
        got = _model(name)(**packed.inputs(), fused_lm_head=True, use_cache=False).log_probs
        want = _model("sdpa")(**packed.inputs(), fused_lm_head=True, use_cache=False).log_probs
        again = _model(name)(**packed.inputs(), fused_lm_head=True, use_cache=False).log_probs
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    assert _fallback_lines(caplog) == [
        f"packed attention: sdpa with a block-diagonal mask, not varlen: {_why_not_the_kernel()}"
    ]
    # Off CUDA the line is information (a warning only on CUDA, where the dense mask is a large slowdown).
    assert {r.levelno for r in caplog.records if r.getMessage().startswith("packed attention:")} == {
        logging.INFO
    }
    assert packing_check(fused_head_call(_model(name).eval()), ids, mask).ok


def test_packed_attention_picks_varlen_on_cuda_with_the_kernel_and_sdpa_otherwise():
    assert packed_attention("cuda", True, "sdpa")[0] == VARLEN_ATTENTION
    chosen, why = packed_attention("cpu", False, "sdpa")
    assert chosen == VARLEN_ATTENTION and why == "sdpa on each sequence on cpu"
    chosen, why = packed_attention("mps", True, "sdpa")
    assert chosen == "sdpa" and "needs CUDA or CPU" in why
    assert packed_attention("cuda", False, "sdpa") == (
        "sdpa",
        f"torch {torch.__version__} has no varlen_attn",
    )
    # A model on another attention keeps it (eager for exactness, flex or flash by the user's choice).
    assert packed_attention("cuda", True, "eager")[0] == "eager"
    assert packed_attention("cuda", True, "flash_attention_2")[0] == "flash_attention_2"
    assert packed_attention("cuda", True, VARLEN_ATTENTION)[0] == VARLEN_ATTENTION


def test_varlen_is_chosen_only_for_a_gpu_and_heads_the_kernel_takes():
    """torch's kernel (FlashAttention 2) raises on a GPU older than Ampere and on heads over 256 wide: there a
    packed model keeps SDPA, with the reason, and ``auto`` finds a packed call would compute a dense mask."""
    old_gpu = "the kernel needs a GPU of compute capability 8.0 or later (this one: 7.5)"
    wide = "the kernel takes heads up to 256 wide (these: 512)"
    assert packed_attention("cuda", True, "sdpa", capability=(7, 5), head_dim=128) == ("sdpa", old_gpu)
    assert packed_attention("cuda", True, "sdpa", capability=(9, 0), head_dim=512) == ("sdpa", wide)
    assert packed_attention("cuda", True, "sdpa", capability=(8, 0), head_dim=256)[0] == VARLEN_ATTENTION
    bf16 = torch.bfloat16
    assert dense_mask_reason("cuda", bf16, 0.0, True, VARLEN_ATTENTION, capability=(7, 5)) == old_gpu
    assert dense_mask_reason("cuda", bf16, 0.0, True, VARLEN_ATTENTION, head_dim=512) == wide
    assert (
        dense_mask_reason("cuda", bf16, 0.0, True, VARLEN_ATTENTION, capability=(8, 6), head_dim=64) is None
    )


def _ampere_only(*args: Any, window_size: tuple[int, int] = (-1, -1), **kwargs: Any) -> torch.Tensor:
    """A varlen kernel that raises as torch's does on a GPU it cannot run on."""
    raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.\nException raised from ...")


def test_a_packed_call_with_heads_wider_than_the_kernel_takes_runs_sdpa_instead():
    generator = torch.Generator().manual_seed(0)
    attention = make_varlen_attention(_ampere_only, devices=("cpu",), dtypes=(torch.float32,))
    sdpa_alone = make_varlen_attention(devices=())  # SDPA on each sequence
    q, k, v = torch.randn(3, 1, 2, POSITIONS.size(1), 272, generator=generator)
    out, _ = attention(_Module(), q, k, v, None, position_ids=POSITIONS)
    torch.testing.assert_close(out, sdpa_alone(_Module(), q, k, v, None, position_ids=POSITIONS)[0])
    with pytest.raises(RuntimeError, match="Ampere"):  # heads it takes: the kernel runs
        attention(_Module(), q[..., :64], k[..., :64], v[..., :64], None, position_ids=POSITIONS)


def test_on_cpu_a_packed_model_gets_sdpa_on_each_sequence_and_the_choice_is_logged_once(caplog):
    model = _model("sdpa")
    assert use_varlen_attention(model, torch.device("cpu"))[0] == VARLEN_ATTENTION
    assert model.config._attn_implementation == VARLEN_ATTENTION
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        passes = PaddingFreePasses("packed")
        assert passes.choose(_model("sdpa")) == "packed"
        auto = PaddingFreePasses("auto")
        assert auto.choose(_model("sdpa")) == "packed"
        assert PaddingFreePasses("auto", device="mps").choose(_model("sdpa")) == "trim"  # not measured there
    lines = [r.getMessage() for r in caplog.records if "padding-free passes" in r.getMessage()]
    attention = f"attention {VARLEN_ATTENTION}: sdpa on each sequence on cpu"
    assert lines == [
        f"padding-free passes: packed ({attention})",
        f"padding-free passes: packed (auto on cpu; {attention})",
        "padding-free passes: trim (auto on mps)",
    ]
    assert passes.attention == VARLEN_ATTENTION
    # A model on another attention keeps it.
    eager = _model("eager")
    assert use_varlen_attention(eager, torch.device("cpu"))[0] == "eager"
    assert eager.config._attn_implementation == "eager"
    # The device the trainer passes decides auto, not where the weights are at the time.
    assert PaddingFreePasses("auto", device="cuda").choose(_model("eager")) == "packed"


def _leaky_kernel(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *offsets: Any,
    window_size=(-1, -1),
    **options: Any,
) -> torch.Tensor:
    """A varlen kernel that ignores the sequence offsets: every token sees every earlier token of the pack."""
    out = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), is_causal=True,
        scale=options.get("scale"), enable_gqa=options.get("enable_gqa", False),
    )  # fmt: skip
    return out.transpose(0, 1)


@contextlib.contextmanager
def _as_varlen(kernel: Any, dtype: torch.dtype = torch.float32):
    """``kernel`` registered as `VARLEN_ATTENTION` (run on CPU in ``dtype``) for the block, then the
    registration as it was, for the other tests."""
    registries = (AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping)
    previous = [registry.get(VARLEN_ATTENTION) for registry in registries]
    try:
        register(kernel, devices=("cpu",), dtypes=(dtype,))
        yield
    finally:
        for registry, function in zip(registries, previous, strict=True):
            if function is None:
                registry.pop(VARLEN_ATTENTION, None)
            else:
                registry[VARLEN_ATTENTION] = function


def _unused(*args):
    raise AssertionError("the packed path runs the model itself")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _back_to_sdpa(model: str, why: str = "packed rows do NOT match") -> str:
    """The start of the warning where ``model``'s (the policy, the reference model) varlen attention fails
    its live check."""
    return f"padding-free passes: the {model}'s varlen attention failed the live check, back to sdpa: {why}"


def test_each_model_is_checked_live_so_a_policy_whose_varlen_fails_goes_back_to_sdpa(caplog):
    """With beta > 0 TRL may score the reference model (built on SDPA) before the policy: the reference gets
    the policy's varlen attention, here a kernel that lets the sequences see each other; each model gets its
    own live check, fails it, goes back to SDPA (checked in turn), and the packed values are right."""
    with _as_varlen(_leaky_kernel):
        policy, reference = _model(VARLEN_ATTENTION), _model("sdpa")
        passes = PaddingFreePasses("packed", device="cpu")
        assert passes.choose(policy) == "packed" and passes.attention == VARLEN_ATTENTION
        ids, mask = _rows()
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            passes.forward(_unused, reference, ids, mask, 7, None, False)
            logps, _ = passes.forward(_unused, policy, ids, mask, 7, None, False)
    warned = _warnings(caplog)
    assert len(warned) == 2
    assert warned[0].startswith(_back_to_sdpa("reference model")) and warned[1].startswith(
        _back_to_sdpa("policy")
    )
    assert passes.mode == "packed" and passes.attention == "sdpa"
    assert policy.config._attn_implementation == reference.config._attn_implementation == "sdpa"
    with torch.no_grad():
        want = packed_forward(fused_head_call(reference), ids, mask, 7).log_probs  # SDPA, the same weights
    torch.testing.assert_close(logps, want, rtol=0, atol=1e-5)


def test_a_kernel_that_raises_fails_the_live_check_and_the_policy_goes_back_to_sdpa(caplog):
    """A kernel that cannot run where it is (torch's on a GPU before Ampere) raises at the first packed call:
    the live check counts that a failure, in one warning naming the model and the error, and SDPA runs."""
    with _as_varlen(_ampere_only):
        policy = _model(VARLEN_ATTENTION)
        passes = PaddingFreePasses("packed", device="cpu")
        passes.choose(policy)
        ids, mask = _rows()
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            logps, _ = passes.forward(_unused, policy, ids, mask, 7, None, False)
    raised = "the packed call raised RuntimeError: FlashAttention only supports Ampere GPUs or newer."
    assert _warnings(caplog) == [_back_to_sdpa("policy", raised)]
    assert passes.mode == "packed" and policy.config._attn_implementation == "sdpa"
    with torch.no_grad():
        want = packed_forward(fused_head_call(_model("sdpa")), ids, mask, 7).log_probs
    torch.testing.assert_close(logps, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "fault",
    [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
     torch.AcceleratorError("CUDA error: an illegal memory access was encountered")],
)  # fmt: skip
def test_a_device_fault_in_the_kernel_stops_the_run_instead_of_failing_the_live_check(fault):
    """Only the kernel's refusal of a call is the live check's to judge: running out of memory, or a device
    left unusable, is raised as it is, not taken for a path that does not fit and retried on SDPA."""

    def faulty(*args: Any, window_size: tuple[int, int] = (-1, -1), **kwargs: Any) -> torch.Tensor:
        raise fault

    with _as_varlen(faulty):
        policy = _model(VARLEN_ATTENTION)
        passes = PaddingFreePasses("packed", device="cpu")
        passes.choose(policy)
        ids, mask = _rows()
        with pytest.raises(type(fault), match=str(fault).split(".")[0]):
            passes.forward(_unused, policy, ids, mask, 7, None, False)


def _leaky_for_wide_heads(query, key, value, *offsets, window_size=(-1, -1), **options):
    """The exact kernel for heads of 16, `_leaky_kernel` for wider ones (a reference of other shapes)."""
    if query.size(-1) > 16:
        return _leaky_kernel(query, key, value, *offsets, window_size=window_size, **options)
    return NewKernel()(query, key, value, *offsets, window_size=window_size, **options)


def test_a_reference_whose_varlen_fails_goes_back_to_sdpa_alone_and_the_policy_keeps_varlen(caplog):
    """Where the policy passed its live check on varlen and the reference model fails it, the reference goes
    back to SDPA and the policy keeps varlen: the path's attention (logged, and what shared prompts need)
    stays the policy's."""
    with _as_varlen(_leaky_for_wide_heads):
        policy = _model(VARLEN_ATTENTION)
        torch.manual_seed(0)
        wide = Qwen2Config(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=97, attn_implementation="sdpa",
        )  # fmt: skip
        reference = Qwen2ForCausalLM(wide).float()
        add_fused_lm_head(reference, temperature=0.7, outputs=("log_probs", "entropy"))
        passes = PaddingFreePasses("packed", device="cpu", share_prompts=True)
        passes.choose(policy)
        ids, mask = _rows()
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            passes.forward(_unused, policy, ids, mask, 7, None, False)
            passes.forward(_unused, reference, ids, mask, 7, None, False)
    warned = _warnings(caplog)
    assert len(warned) == 1 and warned[0].startswith(_back_to_sdpa("reference model"))
    assert passes.mode == "packed" and passes.attention == VARLEN_ATTENTION and passes.share_prompts
    assert policy.config._attn_implementation == VARLEN_ATTENTION
    assert reference.config._attn_implementation == "sdpa"


class _NonCausal(NewKernel):
    """A varlen kernel that keeps each sequence to itself but lets each query see its sequence's later keys:
    packed rows then agree with the rows run alone through the same kernel, not with SDPA."""

    def __call__(
        self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
        window_size=(-1, -1), enable_gqa=False,
    ):  # fmt: skip
        return self._reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, False, scale, enable_gqa)


def test_the_live_check_compares_varlen_with_sdpa_so_a_kernel_that_drops_causality_goes_back_to_sdpa(caplog):
    ids, mask = _rows()
    with _as_varlen(_NonCausal()):
        assert not packing_check(_model(VARLEN_ATTENTION), ids, mask)
        policy = _model(VARLEN_ATTENTION)
        passes = PaddingFreePasses("packed", device="cpu")
        passes.choose(policy)
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            logps, _ = passes.forward(_unused, policy, ids, mask, 7, None, False)
    warned = _warnings(caplog)
    assert len(warned) == 1 and warned[0].startswith(_back_to_sdpa("policy"))
    assert passes.mode == "packed" and passes.attention == "sdpa"
    assert policy.config._attn_implementation == "sdpa"
    with torch.no_grad():
        want = packed_forward(fused_head_call(_model("sdpa")), ids, mask, 7).log_probs
    torch.testing.assert_close(logps, want, rtol=0, atol=1e-5)
    # A right kernel passes the same check and stays (the CPU fallback's is in the tests above).
    caplog.clear()
    with _as_varlen(NewKernel()):
        assert packing_check(_model(VARLEN_ATTENTION), ids, mask)
        policy = _model(VARLEN_ATTENTION)
        passes = PaddingFreePasses("packed", device="cpu")
        passes.choose(policy)
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            passes.forward(_unused, policy, ids, mask, 7, None, False)
    assert not _warnings(caplog) and policy.config._attn_implementation == VARLEN_ATTENTION


def test_a_reference_model_on_sdpa_gets_the_policys_varlen_attention_at_its_first_call(caplog):
    """TRL builds the reference model on SDPA: at its first call it gets the policy's varlen attention (on
    CPU, SDPA on each sequence), passes its own live check, and its packed values are SDPA's."""
    policy, reference = _model("sdpa"), _model("sdpa")
    passes = PaddingFreePasses("packed", device="cpu")
    passes.choose(policy)
    ids, mask = _rows()
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        logps, _ = passes.forward(_unused, reference, ids, mask, 7, None, False)
    assert reference.config._attn_implementation == VARLEN_ATTENTION
    assert not _warnings(caplog) and passes.mode == "packed"
    with torch.no_grad():
        want = packed_forward(fused_head_call(_model("sdpa")), ids, mask, 7).log_probs
    torch.testing.assert_close(logps, want, rtol=0, atol=1e-5)
    # A reference on another attention keeps it.
    eager = _model("eager")
    passes.forward(_unused, eager, ids, mask, 7, None, False)
    assert eager.config._attn_implementation == "eager"


def test_a_packed_call_with_an_attention_argument_the_kernel_ignores_is_refused():
    """gpt-oss passes its sinks as ``s_aux``: a packed call refuses them (and any other argument that
    changes the attention) instead of running plain causal attention; the arguments transformers passes a
    Qwen2 or Llama layer (``position_ids``, ``use_cache``, ``sliding_window=None``) go through."""
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, POSITIONS.size(1), 8, generator=generator)
    k, v = torch.randn(2, 1, 2, POSITIONS.size(1), 8, generator=generator)
    attention = make_varlen_attention(devices=())
    common = {"position_ids": POSITIONS, "use_cache": False, "sliding_window": None}
    out, _ = attention(_Module(), q, k, v, None, **common)
    assert out.shape == (1, POSITIONS.size(1), 4, 8)
    for extra in ({"s_aux": torch.zeros(4)}, {"position_bias": torch.zeros(1, 4, 15, 15)}, {"softcap": 30.0}):
        name = next(iter(extra))
        with pytest.raises(ValueError, match=f"packed calls take full causal attention only, .*{name}"):
            attention(_Module(), q, k, v, None, **common, **extra)


# A model whose modeling code has an attention layer of its own, outside transformers' AttentionInterface:
# transformers then keeps its attention when asked to set another (with a warning).
OWN_ATTENTION_MODEL = """
from torch import nn
from transformers import Qwen2ForCausalLM
from transformers.masking_utils import create_causal_mask  # what packing_unsupported_reason looks for


class OwnAttention(nn.Module):
    pass


class OwnAttentionForCausalLM(Qwen2ForCausalLM):
    _can_set_attn_implementation_cached_value = None  # transformers caches its verdict per class
"""


def test_where_transformers_keeps_the_models_attention_the_attention_that_runs_is_logged(tmp_path, caplog):
    path = tmp_path / "own_attention_model.py"
    path.write_text(OWN_ATTENTION_MODEL)
    spec = importlib.util.spec_from_file_location("own_attention_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where transformers reads the class's source
    try:
        spec.loader.exec_module(module)
        config = _model("sdpa").config
        chosen, why = use_varlen_attention(module.OwnAttentionForCausalLM(config), torch.device("cpu"))
        assert chosen == "sdpa" and why.startswith("transformers kept 'sdpa' for OwnAttentionForCausalLM")
        model = module.OwnAttentionForCausalLM(config)
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            passes = PaddingFreePasses("packed", device="cpu", share_prompts=True)
            assert passes.choose(model) == "packed"
    finally:
        del sys.modules[spec.name]
    assert model.config._attn_implementation == "sdpa" and passes.attention == "sdpa"
    assert not passes.share_prompts  # only varlen attention reads shared prompts
    lines = [r.getMessage() for r in caplog.records if "padding-free passes" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "padding-free passes: packed (attention sdpa: transformers kept"
    )


def test_dense_mask_reason_names_what_makes_a_packed_call_build_a_dense_mask():
    bf16, fp32 = torch.bfloat16, torch.float32
    # The kernel runs: CUDA, torch has it, a half dtype, no dropout; so do flash and flex attention.
    assert dense_mask_reason("cuda", bf16, 0.0, True, VARLEN_ATTENTION) is None
    assert dense_mask_reason("cuda", torch.float16, 0.0, True, VARLEN_ATTENTION) is None
    assert dense_mask_reason("cuda", fp32, 0.1, False, "flash_attention_2") is None
    assert dense_mask_reason("cuda", fp32, 0.0, True, "flex_attention") is None
    # On CPU the varlen attention runs SDPA on each sequence, whatever the dtype.
    assert dense_mask_reason("cpu", fp32, 0.1, False, VARLEN_ATTENTION) is None
    assert (
        dense_mask_reason("cuda", fp32, 0.0, True, VARLEN_ATTENTION)
        == "the kernel does not take torch.float32"
    )
    assert dense_mask_reason("cuda", bf16, 0.1, True, VARLEN_ATTENTION) == "attention dropout is on"
    assert (
        dense_mask_reason("cuda", bf16, 0.0, False, VARLEN_ATTENTION)
        == f"torch {torch.__version__} has no varlen_attn"
    )
    assert (
        dense_mask_reason("cuda", bf16, 0.0, False, "sdpa") == f"torch {torch.__version__} has no varlen_attn"
    )
    assert dense_mask_reason("cuda", bf16, 0.0, True, "sdpa") == (
        f"the model is on transformers' sdpa, not {VARLEN_ATTENTION}"
    )
    assert (
        dense_mask_reason("cuda", bf16, 0.0, True, "eager")
        == "attention 'eager' masks packed rows with a dense mask"
    )


def _padded_call(model, ids, mask, keep, rows, compute_entropy):
    """A stand-in for TRL's padded log-prob call (the trim path's): zeros of its shape."""
    return torch.zeros(ids.size(0), keep), None, None


@pytest.mark.parametrize(
    ("dtype", "dropout", "why"),
    [
        (torch.float32, 0.0, "the kernel does not take torch.float32"),
        (torch.bfloat16, 0.1, "attention dropout is on"),
    ],
)
def test_auto_on_cuda_trims_at_the_first_call_where_packed_attention_would_build_a_dense_mask(
    caplog, dtype, dropout, why
):
    """``auto`` on CUDA with torch's kernel (the device the trainer passes; the tensors here are on the CPU):
    a model that runs in float32, or with attention dropout, would get a dense T x T mask in every packed
    call, so the first call turns ``auto`` to ``trim``, in one log line, and SDPA is put back."""
    model = _model("sdpa").to(dtype)
    model.config.attention_dropout = dropout
    passes = PaddingFreePasses("auto", device="cuda")
    assert passes.choose(model) == "packed"
    ids, mask = _rows()
    caplog.clear()  # choose's own line, caught where an earlier test left the logger at INFO
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        passes.forward(_padded_call, model, ids, mask, 7, None, False)
    lines = [r.getMessage() for r in caplog.records if "padding-free passes" in r.getMessage()]
    reason = why if varlen_kernel() is not None else f"torch {torch.__version__} has no varlen_attn"
    dense = "a packed call would compute a dense mask"
    assert lines == [f"padding-free passes: trim, not packed (auto on cuda: {dense}: {reason})"]
    assert passes.mode == "trim" and model.config._attn_implementation == "sdpa"
    # Asked for by name, packed stays packed.
    model = _model("sdpa").to(dtype)
    passes = PaddingFreePasses("packed", device="cuda")
    passes.choose(model)
    passes.forward(_unused, model, ids, mask, 7, None, False)
    assert passes.mode == "packed"


@pytest.mark.skipif(
    varlen_kernel() is None, reason="auto keeps packed on CUDA only where torch has the kernel"
)
@pytest.mark.parametrize("failing", ["policy", "reference model"])
def test_auto_on_cuda_trims_where_a_models_varlen_fails_its_live_check(caplog, failing):
    """``auto`` on CUDA (the device the trainer passes; the tensors here are on the CPU, in bf16) keeps
    packed at the first call, where the kernel runs; when the policy's or the reference's varlen attention
    then fails its live check, SDPA would compute a dense mask, so the path becomes ``trim``, not packed on
    SDPA."""
    kernel = _leaky_kernel if failing == "policy" else _leaky_for_wide_heads
    with _as_varlen(kernel, torch.bfloat16):
        policy = _model(VARLEN_ATTENTION).to(torch.bfloat16)
        torch.manual_seed(0)
        wide = Qwen2Config(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=97, attn_implementation="sdpa",
        )  # fmt: skip
        reference = Qwen2ForCausalLM(wide).to(torch.bfloat16)
        add_fused_lm_head(reference, temperature=0.7, outputs=("log_probs", "entropy"))
        passes = PaddingFreePasses("auto", device="cuda")
        assert passes.choose(policy) == "packed"
        ids, mask = _rows()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="prompt_aug"):
            passes.forward(_padded_call, policy, ids, mask, 7, None, False)
            passes.forward(_padded_call, reference, ids, mask, 7, None, False)
    warned = _warnings(caplog)
    assert len(warned) == 1 and warned[0].startswith(_back_to_sdpa(failing))
    sdpa = f"the model is on transformers' sdpa, not {VARLEN_ATTENTION}"
    dense = f"a packed call would compute a dense mask: {sdpa}"
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("padding-free passes: trim")]
    assert lines == [f"padding-free passes: trim, not packed (auto on cuda: {dense})"]
    assert passes.mode == "trim"
    assert policy.config._attn_implementation == reference.config._attn_implementation == "sdpa"


def test_a_model_left_on_varlen_attention_runs_under_inference_mode_and_saves_a_portable_config(tmp_path):
    """After training the policy keeps the varlen attention: an unpadded call with no mask (a pipeline,
    ``generate``) under ``torch.inference_mode`` gives SDPA's values, and its saved config names no
    attention of ours, so the folder loads where this package is not imported."""
    model, want = _model("sdpa"), _model("sdpa")
    assert use_varlen_attention(model, torch.device("cpu"))[0] == VARLEN_ATTENTION
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, want(ids).logits)
        greedy = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(model.generate(ids, **greedy), want.generate(ids, **greedy))
    model.save_pretrained(tmp_path)
    assert VARLEN_ATTENTION not in (tmp_path / "config.json").read_text()


GPU = pytest.mark.skipif(
    not torch.cuda.is_available() or varlen_kernel() is None, reason="needs CUDA and varlen_attn"
)


@GPU
@pytest.mark.parametrize("share_prompts", [False, True])
def test_the_real_kernel_matches_sdpa_on_a_packed_row_in_bf16(share_prompts):
    """On a GPU only: torch's varlen_attn through the wrapper against SDPA on the same packed row (bf16
    autocast over float32 weights), log-probs and gradients, within bf16 rounding. With shared prompts the
    SDPA side is the wrapper's masked fallback (plain SDPA cannot read that layout), which checks the kernel's
    causal alignment for more keys than queries."""
    ids, mask = (t.cuda() for t in (_shared_rows() if share_prompts else _rows()))
    packed = pack_rows(ids, mask, logits_to_keep=7, share_prompts=share_prompts)
    reference = register(name="test_real_kernel_masked", dtypes=()) if share_prompts else "sdpa"
    calls = []

    @functools.wraps(varlen_kernel())
    def counted(*args, **kwargs):  # torch's kernel, counted: the test fails if the fallback ran instead
        calls.append(args[0].dtype)
        return varlen_kernel()(*args, **kwargs)

    results = {}
    for attention in (register(counted), reference):
        model = _model(attention).cuda().train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**packed.inputs(), fused_lm_head=True, use_cache=False)
        out.log_probs.sum().backward()
        results[attention] = (out.log_probs.detach().float(), model.model.embed_tokens.weight.grad.clone())
    assert calls and set(calls) == {torch.bfloat16}
    (logps, grad), (want_logps, want_grad) = results[VARLEN_ATTENTION], results[reference]
    scale = want_logps.abs().mean()
    assert (logps - want_logps).abs().max() <= 2e-2 * scale
    assert (grad - want_grad).norm() <= 2e-2 * want_grad.norm()


@GPU
def test_on_a_gpu_auto_keeps_the_real_kernel_which_passes_the_live_check_against_sdpa(caplog):
    """On a GPU only: float32 weights under bf16 autocast (the recipes' precision), ``auto``: the first call
    keeps packed (the kernel runs), and the live check, torch's varlen_attn against SDPA, passes."""
    ids, mask = (t.cuda() for t in _rows())
    model = _model("sdpa").cuda()
    passes = PaddingFreePasses(
        "auto", device="cuda", autocast=lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    )
    assert passes.choose(model) == "packed" and passes.attention == VARLEN_ATTENTION
    with caplog.at_level(logging.INFO, logger="prompt_aug"):
        passes.forward(_unused, model, ids, mask, 7, None, False)
    assert not _warnings(caplog), _warnings(caplog)
    assert passes.mode == "packed" and model.config._attn_implementation == VARLEN_ATTENTION


def _device_waits(run) -> int:
    """How many times ``run()`` makes the host wait for the GPU (a stream synchronisation: a copy back, an
    ``item``, a boolean index), as torch's sync debug mode reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@GPU
@pytest.mark.parametrize("share_prompts", [False, True])
def test_on_a_gpu_packing_adds_one_wait_for_the_device_to_the_models_own(share_prompts):
    """On a GPU only: a packed call (forward and backward, varlen attention, bf16 autocast) makes the host
    wait for the device once more than the model call on the same pack does by itself (TRL's fused head and
    transformers' mask code wait there): packing reads the rows' lengths (and prompts) back once, and sends
    its indices and position ids without waiting, and the attention reads the sequences from the host copy.
    Each wait stalls the queue of kernels, so this is a cost per call on a GPU only."""
    ids, mask = (t.cuda() for t in (_shared_rows() if share_prompts else _rows()))
    model = _model(register()).cuda().train()
    call = fused_head_call(model, lambda: torch.autocast("cuda", dtype=torch.bfloat16))

    def model_alone() -> int:  # the pack built first, uncounted
        packed = pack_rows(ids, mask, logits_to_keep=7, share_prompts=share_prompts)
        return _device_waits(lambda: call(packed.inputs())[0].sum().backward())

    def whole() -> int:
        return _device_waits(
            lambda: packed_forward(call, ids, mask, 7, share_prompts=share_prompts).log_probs.sum().backward()
        )

    model_alone(), whole()  # the first calls load kernels
    alone, packed = model_alone(), whole()
    assert packed == alone + 1, f"packed call: {packed} waits; the model call on its pack alone: {alone}"
