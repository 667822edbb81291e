"""Packed forward passes: a tiny float32 Qwen2 with TRL's fused log-prob head gives, for rows packed end to
end in one row, the log-probs and entropies (and gradients) of TRL's padded call and of each row alone.

References come from the model itself run another way: each row alone from its plain logits (temperature
applied by hand), or TRL's padded call with TRL's labels. The packing checks must be able to fail, so they
also run on a model whose attention ignores the packing.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from bench_tools import load_bench, printed_losses, run_bench, run_patched_bench
from transformers import AttentionInterface, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from trl.trainer.utils import add_fused_lm_head

from prompt_aug.packing import (
    fused_head_call,
    host_rows,
    pack_rows,
    packed_forward,
    packing_check,
    packing_unsupported_reason,
    plan_packs,
    shared_prompts_check,
)
from prompt_aug.varlen import block_causal_mask, register, sequences

REPO = Path(__file__).resolve().parents[1]
VOCAB = 97
TEMPERATURE = 0.7
# (prompt, completion) real lengths of the rows, in a (5, 6 + 7) layout; row 3's completion is fully masked.
LENGTHS = [(2, 7), (6, 1), (4, 3), (1, 0), (3, 5)]
PROMPT_WIDTH, KEEP = 6, 7
# An attention function transformers knows nothing about: it gets no mask when the mask is None, so packed
# sequences attend to each other (what a kernel that ignores packed position ids would do).
AttentionInterface.register("unpacked_sdpa", sdpa_attention_forward)


def _config(attention: str = "sdpa", **kwargs) -> Qwen2Config:
    return Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, attn_implementation=attention, **kwargs,
    )  # fmt: skip


def _model(attention: str = "sdpa", temperature: float = TEMPERATURE) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config(attention)).float()
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    return model


def _rows(lengths=LENGTHS, prompt_width=PROMPT_WIDTH, keep=KEEP, seed=1):
    """TRL's layout: input_ids = cat(prompt, completion), prompts left-padded, completions right-padded
    (padding ids 0)."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(lengths)
    mask = torch.zeros(rows, prompt_width + keep, dtype=torch.long)
    for i, (p, c) in enumerate(lengths):
        mask[i, prompt_width - p : prompt_width + c] = 1
    ids = torch.randint(1, VOCAB, mask.shape, generator=generator) * mask
    return ids, mask


class _counting:
    """A pack call that counts its calls."""

    def __init__(self, call):
        self.call, self.calls = call, 0

    def __call__(self, inputs):
        self.calls += 1
        return self.call(inputs)


def _alone(model, ids_row, mask_row, keep=KEEP, temperature=TEMPERATURE):
    """One row's completion log-probs and entropies from the model's plain logits over the row's real
    tokens only (no padding, no packing, no fused head), as (keep,) vectors with 0 past the completion."""
    tokens = ids_row[mask_row.bool()]
    completion = int(mask_row[-keep:].sum())
    logps, entropy = torch.zeros(keep), torch.zeros(keep)
    if completion:
        logits = model(input_ids=tokens[None], use_cache=False, fused_lm_head=False).logits[0, :-1]
        logp = (logits.float() / temperature).log_softmax(-1)
        chosen = logp.gather(-1, tokens[1:, None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        logps = torch.cat([chosen[-completion:], torch.zeros(keep - completion)])
        entropy = torch.cat([ent[-completion:], torch.zeros(keep - completion)])
    return logps, entropy


def _trl_padded_call(model, ids, mask, keep=KEEP):
    """What TRL 1.16's `_get_per_token_logps_and_entropies` runs for one batch (no autocast on CPU)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    outputs = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return outputs.log_probs[:, -keep:], outputs.entropy[:, -keep:]


# -- the pure helpers ----------------------------------------------------------------------------------------


def test_plan_packs_cuts_consecutive_rows_within_the_budget():
    assert plan_packs([], 10) == []
    assert plan_packs([3, 4, 3], 10) == [3]  # exactly the budget: one pack
    assert plan_packs([3, 4, 4], 10) == [2, 1]
    assert plan_packs([12, 2, 3], 10) == [1, 2]  # a row over the budget is a pack alone
    assert plan_packs([2, 12, 3], 10) == [1, 1, 1]
    assert plan_packs([0, 5, 0, 5, 0], 10) == [5]  # empty rows cost nothing
    assert plan_packs(torch.tensor([6, 6, 6]), 11) == [1, 1, 1]
    assert plan_packs([1] * 7, 1) == [1] * 7


def test_pack_rows_lays_real_tokens_end_to_end_with_restarting_positions():
    # Two rows, prompt width 3, completion width 3: row 0 = prompt [11, 12] + completion [13];
    # row 1 = prompt [21, 22, 23] + completion [24, 25, 26].
    ids = torch.tensor([[0, 11, 12, 13, 0, 0], [21, 22, 23, 24, 25, 26]])
    mask = (ids != 0).long()
    packed = pack_rows(ids, mask, logits_to_keep=3)
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24, 25, 26]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert packed.labels.tolist() == [[-100, -100, 13, -100, -100, -100, 24, 25, 26]]
    assert packed.real_tokens == 9
    # The fused head's output entry j scores token j + 1: tokens 13, 24, 25, 26 are entries 1, 5, 6, 7, and
    # they go to (row, completion column) (0, 0), (1, 0), (1, 1), (1, 2).
    scores = torch.arange(8.0)[None]
    assert packed.scatter(scores, 2, 3).tolist() == [[1.0, 0.0, 0.0], [5.0, 6.0, 7.0]]
    rounded = pack_rows(ids, mask, logits_to_keep=3, pad_to_multiple_of=4, pad_token_id=7)
    assert rounded.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24, 25, 26, 7, 7, 7]]
    assert rounded.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2]]
    assert rounded.labels[0, 9:].tolist() == [-100] * 3
    assert rounded.scatter(torch.arange(11.0)[None], 2, 3).tolist() == [[1.0, 0.0, 0.0], [5.0, 6.0, 7.0]]


# -- exactness on a tiny model -------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_give_each_row_its_values_alone(attention):
    model = _model(attention).eval()
    ids, mask = _rows()
    with torch.no_grad():
        out = packed_forward(fused_head_call(model), ids, mask, KEEP, compute_entropy=True)
        for i in range(len(LENGTHS)):
            logps, entropy = _alone(model, ids[i], mask[i])
            torch.testing.assert_close(out.log_probs[i], logps, rtol=0, atol=1e-5)
            torch.testing.assert_close(out.entropy[i], entropy, rtol=0, atol=1e-5)
    assert out.log_probs[3].eq(0).all() and out.entropy[3].eq(0).all()  # the fully masked completion
    assert out.log_probs[~mask[:, -KEEP:].bool()].eq(0).all()
    assert (out.calls, out.real_tokens, out.processed_tokens) == (1, int(mask.sum()), int(mask.sum()))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_forward_matches_trl_padded_call_with_gradients(attention):
    ids, mask = _rows(seed=2)
    weights = torch.randn(ids.size(0), KEEP, generator=torch.Generator().manual_seed(3))
    results = {}
    for name in ("padded", "packed", "split"):
        model = _model(attention).train()
        if name == "padded":
            logps, entropy = _trl_padded_call(model, ids, mask)
        else:
            budget = None if name == "packed" else 8  # rows of 9, 7, 7, 1, 8 tokens: packs 9 | 7 | 7 1 | 8
            out = packed_forward(
                fused_head_call(model), ids, mask, KEEP, max_tokens=budget, compute_entropy=True
            )
            logps, entropy = out.log_probs, out.entropy
            assert out.calls == (1 if name == "packed" else 4)
        ((logps * weights).sum() + 0.1 * entropy.sum()).backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        results[name] = (logps.detach(), entropy.detach(), grads)
    padded_logps, padded_entropy, padded_grads = results["padded"]
    for name in ("packed", "split"):
        logps, entropy, grads = results[name]
        torch.testing.assert_close(logps, padded_logps, rtol=0, atol=1e-5)
        torch.testing.assert_close(entropy, padded_entropy, rtol=0, atol=1e-5)
        for key, grad in padded_grads.items():
            torch.testing.assert_close(grads[key], grad, rtol=1e-4, atol=1e-5, msg=f"{name} {key}")


def _grouped_rows(seed: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's layout of two groups and a lone row, as TRL orders a round: rows 0-2 share a 4-token prompt
    (completions of 5, 0 and 7 tokens), rows 3-4 a 2-token prompt (3 and 6), row 5 has a prompt of its own."""
    ids, mask = _rows([(4, 5), (4, 0), (4, 7), (2, 3), (2, 6), (3, 2)], seed=seed)
    ids[1:3, :PROMPT_WIDTH] = ids[0, :PROMPT_WIDTH]
    ids[4, :PROMPT_WIDTH] = ids[3, :PROMPT_WIDTH]
    return ids, mask


def test_shared_prompts_run_once_with_positions_that_continue_them():
    # Rows 0 and 1 share the prompt [11, 12, 13]: its first two tokens once, then each row as the prompt's
    # last token and its completion, at positions 2, 3, ...; row 2's prompt differs: a plain sequence.
    ids = torch.tensor([[11, 12, 13, 14, 15], [11, 12, 13, 16, 0], [0, 21, 22, 23, 24]])
    mask = (ids != 0).long()
    packed = pack_rows(ids, mask, logits_to_keep=2, share_prompts=True)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15, 13, 16, 21, 22, 23, 24]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2, 3]]
    assert packed.labels.tolist() == [[-100, -100, -100, 14, 15, -100, 16, -100, -100, 23, 24]]
    assert packed.real_tokens == 11  # against 13 unshared
    scores = torch.arange(10.0)[None]  # entry j scores token j + 1
    assert packed.scatter(scores, 3, 2).tolist() == [[2.0, 3.0], [5.0, 0.0], [8.0, 9.0]]
    # What the attention reads off these positions: row 0's tokens continue the prompt's, so prompt and row 0
    # are one sequence, the root; row 1's sequence starts at position 2 and sees the root's first two tokens.
    found = sequences(packed.position_ids)
    assert found.cu_seqlens.tolist() == [0, 5, 7, 11]
    assert found.prefix.tolist() == [0, 2, 0] and found.root.tolist() == [0, 0, 2]
    assert found.key_index.tolist() == [0, 1, 2, 3, 4, 0, 1, 5, 6, 7, 8, 9, 10]
    assert found.cu_seqlens_k.tolist() == [0, 5, 9, 13] and found.max_length_k == 5
    mask_row_1 = block_causal_mask(packed.position_ids)[0, 0, 6].int().tolist()  # token 16 of row 1
    assert mask_row_1 == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    # Rows with one prompt need not be neighbours: rows 0 and 2 share, row 1 runs alone between them in the
    # pack's order of groups, and each result still goes back to its own row.
    apart = pack_rows(ids[[0, 2, 1]], mask[[0, 2, 1]], logits_to_keep=2, share_prompts=True)
    assert apart.input_ids.tolist() == [[11, 12, 13, 14, 15, 13, 16, 21, 22, 23, 24]]
    assert apart.scatter(scores, 3, 2).tolist() == [[2.0, 3.0], [8.0, 9.0], [5.0, 0.0]]
    with pytest.raises(ValueError, match="sequence 1 starts at position 3 but has no root"):
        sequences(torch.tensor([[0, 1, 3, 4]]))
    with pytest.raises(ValueError, match="sequence 1 starts at position 3 but has no root"):
        sequences(torch.tensor([[2, 3, 4, 3, 4]]))  # the row's first sequence starts at 2, not 0


@pytest.mark.parametrize("split", [False, True])
def test_shared_prompts_match_trl_padded_call_with_gradients(split):
    """A pack whose groups run their prompt once, under the varlen attention function (SDPA with the tree's
    mask on CPU): log-probs, entropies and gradients equal TRL's padded call; with a budget the groups are cut
    across packs and still match."""
    name = register(name="test_shared_prompts", devices=("cpu",), dtypes=())  # the masked SDPA runs
    ids, mask = _grouped_rows()
    weights = torch.randn(ids.size(0), KEEP, generator=torch.Generator().manual_seed(5))
    results = {}
    for layout in ("padded", "shared"):
        model = _model(name).train()
        if layout == "padded":
            logps, entropy = _trl_padded_call(model, ids, mask)
        else:
            out = packed_forward(
                fused_head_call(model), ids, mask, KEEP, max_tokens=14 if split else None,
                compute_entropy=True, share_prompts=True,
            )  # fmt: skip
            logps, entropy = out.log_probs, out.entropy
            unshared = int(mask.sum())
            # Each row after the first of its group saves the prompt's first P - 1 tokens (3, or 1); the
            # budget of 14 packs rows 0-1 | 2 | 3-4 | 5, so row 2 runs its whole prompt.
            assert out.real_tokens == (unshared - 3 - 1 if split else unshared - 2 * 3 - 1)
            assert out.calls == (4 if split else 1)
        ((logps * weights).sum() + 0.1 * entropy.sum()).backward()
        results[layout] = (
            logps.detach(),
            entropy.detach(),
            {k: p.grad.clone() for k, p in model.named_parameters()},
        )
    (logps, entropy, grads), (want_logps, want_entropy, want_grads) = results["shared"], results["padded"]
    torch.testing.assert_close(logps, want_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, want_entropy, rtol=0, atol=1e-5)
    for key, grad in want_grads.items():
        torch.testing.assert_close(grads[key], grad, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("share", [False, True])
def test_a_packed_call_reads_nothing_back_from_the_device_once_its_rows_are_on_the_host(share):
    """A packed call waits for the device once, in `host_rows`: the pack's indices and position ids are built
    on the CPU and sent, and the attention reads its sequences from that host copy, so no layer waits for the
    kernels queued before it. The device here is "meta", which holds no values: any copy back raises. What
    the attention reads there is what it reads off the same pack built on the CPU."""
    ids, mask = _grouped_rows()
    read: dict[str, list] = {"meta": [], "cpu": []}

    def call(inputs: dict) -> tuple[torch.Tensor, None]:
        found = sequences(inputs["position_ids"])  # as the varlen attention does in every layer
        device = inputs["input_ids"].device.type
        read[device].append(
            (found.max_length, found.prefix.tolist(), found.root.tolist(), found.max_length_k)
        )
        return torch.zeros(1, inputs["input_ids"].size(1) - 1, device=device), None

    on_host = host_rows(ids, mask, KEEP, share)
    for device in ("meta", "cpu"):
        out = packed_forward(
            call,
            ids.to(device),
            mask.to(device),
            KEEP,
            max_tokens=14,
            share_prompts=share,
            rows_on_host=on_host,
        )
        assert out.log_probs.device.type == device and out.calls == 4
    assert read["meta"] == read["cpu"]
    assert any(prefix > 0 for _, prefixes, _, _ in read["cpu"] for prefix in prefixes) == share
    # Under gradient checkpointing every pack's layers run again in the backward, after all the packs: a
    # pack's sequences are still read from its host copy then (here 6 packs of a row each).
    kept: list[torch.Tensor] = []

    def keep(inputs: dict) -> tuple[torch.Tensor, None]:
        kept.append(inputs["position_ids"])
        return call(inputs)

    meta_ids, meta_mask = ids.to("meta"), mask.to("meta")
    packed_forward(keep, meta_ids, meta_mask, KEEP, max_tokens=1, share_prompts=share, rows_on_host=on_host)
    assert len(kept) == 6 and all(sequences(positions).max_length > 0 for positions in kept)
    with pytest.raises(NotImplementedError, match="meta"):  # what a read-back would do there
        sequences(torch.tensor([[0, 1, 0, 1]], device="meta"))


def test_rows_on_host_that_do_not_fit_the_call_are_refused():
    ids, mask = _grouped_rows()
    call = fused_head_call(_model())
    with pytest.raises(ValueError, match="rows_on_host holds 5 rows; the call has 6"):
        packed_forward(call, ids, mask, KEEP, rows_on_host=host_rows(ids[:5], mask[:5], KEEP))
    with pytest.raises(ValueError, match=r"share_prompts needs rows_on_host with the prompt ids"):
        packed_forward(call, ids, mask, KEEP, share_prompts=True, rows_on_host=host_rows(ids, mask, KEEP))


def test_the_layers_of_a_forward_share_one_mask_until_the_positions_change():
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    mask = block_causal_mask(positions)
    assert block_causal_mask(positions) is mask
    assert mask[0, 0].int().tolist()[3] == [0, 0, 0, 1, 0]
    positions[0, 3:] = torch.tensor([3, 4])  # one sequence now, in place
    assert block_causal_mask(positions)[0, 0].int().tolist()[3] == [1, 1, 1, 1, 0]


def test_the_shared_prompts_check_passes_where_the_layout_is_read_and_fails_where_it_is_not():
    ids, mask = _grouped_rows()
    reads = _model(register(name="test_shared_check", devices=("cpu",), dtypes=())).eval()
    check = shared_prompts_check(fused_head_call(reads), ids, mask, KEEP)
    assert check.ok and check.error < 1e-5 < check.leak, check.describe()
    ignores = shared_prompts_check(fused_head_call(_model("sdpa").eval()), ids, mask, KEEP)
    assert not ignores.ok and ignores.describe().startswith("rows sharing a prompt do NOT match")
    # Rows with no prompt of two tokens and a completion: the check runs on the batch's tokens instead, with
    # as many calls (every process must make the same, or FSDP and ZeRO-3 hang) and tells the two apart.
    short = _rows([(1, 3), (4, 0)])
    counted = _counting(fused_head_call(reads))
    assert shared_prompts_check(counted, *short, KEEP).ok
    calls_short = counted.calls
    shared_prompts_check(counted, ids, mask, KEEP)
    assert counted.calls == 2 * calls_short
    assert not shared_prompts_check(fused_head_call(_model("sdpa").eval()), *short, KEEP).ok


def test_budget_splitting_and_rounding_change_no_value():
    model = _model().eval()
    ids, mask = _rows(seed=4)
    call = fused_head_call(model)
    with torch.no_grad():
        whole = packed_forward(call, ids, mask, KEEP, compute_entropy=True)
        # Rows of 9, 7, 7, 1, 8 tokens: 16 a pack gives 9 7 | 7 1 8.
        split = packed_forward(call, ids, mask, KEEP, max_tokens=16, compute_entropy=True)
        rounded = packed_forward(call, ids, mask, KEEP, max_tokens=16, pad_to_multiple_of=5)
    assert mask.sum(1).tolist() == [9, 7, 7, 1, 8]
    assert (split.calls, split.real_tokens, split.processed_tokens) == (2, 32, 32)
    assert (rounded.calls, rounded.real_tokens, rounded.processed_tokens) == (2, 32, 20 + 20)
    assert rounded.entropy is None
    for out in (split, rounded):
        torch.testing.assert_close(out.log_probs, whole.log_probs, rtol=0, atol=1e-5)
    torch.testing.assert_close(split.entropy, whole.entropy, rtol=0, atol=1e-5)


def test_temperature_is_the_fused_heads():
    """Packing leaves temperature to the head: at 1.0 and 0.7 the packed values follow the head's setting."""
    ids, mask = _rows(seed=5)
    with torch.no_grad():
        for temperature in (1.0, 0.7):
            model = _model(temperature=temperature).eval()
            out = packed_forward(fused_head_call(model), ids, mask, KEEP)
            logps, _ = _alone(model, ids[0], mask[0], temperature=temperature)
            torch.testing.assert_close(out.log_probs[0], logps, rtol=0, atol=1e-5)


# -- whether packing serves a model --------------------------------------------------------------------------


def test_packing_unsupported_reason_names_what_stands_in_the_way():
    assert packing_unsupported_reason(_model("sdpa")) is None
    assert packing_unsupported_reason(_model("eager")) is None
    reason = packing_unsupported_reason(_model("unpacked_sdpa"))
    assert reason is not None and "'unpacked_sdpa'" in reason
    sliding = Qwen2ForCausalLM(_config(use_sliding_window=True, sliding_window=4, max_window_layers=0))
    assert "sliding window" in packing_unsupported_reason(sliding)
    # Qwen2 keeps its window off below max_window_layers: here in no layer, so packing is fine.
    unused = Qwen2ForCausalLM(_config(use_sliding_window=True, sliding_window=4, max_window_layers=2))
    assert packing_unsupported_reason(unused) is None
    mistral = MistralForCausalLM(
        MistralConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=VOCAB, sliding_window=16)
    )  # fmt: skip
    assert "sliding window" in packing_unsupported_reason(mistral)
    # RoPE scaled by the call's length packs: within its original context it is plain RoPE, and a call wider
    # than that runs padded (`PaddingFreePasses`).
    dynamic = Qwen2ForCausalLM(_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    assert packing_unsupported_reason(dynamic) is None


def test_packing_unsupported_reason_sees_through_wrappers_and_prompt_learning():
    from peft import LoraConfig, PromptTuningConfig, get_peft_model

    lora = get_peft_model(_model(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert packing_unsupported_reason(lora) is None
    assert packing_unsupported_reason(get_peft_model(_model("unpacked_sdpa"), LoraConfig(r=2))) is not None
    prompt_tuning = get_peft_model(_model(), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    assert "virtual tokens" in packing_unsupported_reason(prompt_tuning)


def test_packing_check_passes_on_the_model_and_fails_when_packing_is_ignored():
    ids, mask = _rows(seed=6)
    check = packing_check(_model(), ids, mask)
    assert check.ok and check.error < 1e-5 and check.leak > 1e-2, check.describe()
    assert packing_check(fused_head_call(_model("eager").eval()), ids, mask).ok
    # An attention implementation that does not mask by packed position ids: the second row sees the first.
    ignored = packing_check(_model("unpacked_sdpa"), ids, mask)
    assert not ignored.ok and ignored.error > 1e-2, ignored.describe()
    assert "do NOT match" in ignored.describe()
    # A call that passes an attention mask: transformers then takes the row as one sequence.
    model = _model().eval()

    def masked_call(inputs):
        ones = torch.ones_like(inputs["input_ids"])
        out = model(**inputs, attention_mask=ones, fused_lm_head=True, use_cache=False)
        return out.log_probs, out.entropy

    assert not packing_check(masked_call, ids, mask).ok


def test_packing_check_of_rows_of_one_token_runs_on_the_batchs_tokens_with_the_same_calls():
    # One-token prompts whose completions were all masked as truncated: no row has two real tokens.
    short, usable = _rows([(1, 0), (1, 0)], seed=2), _rows(seed=6)
    counted = _counting(fused_head_call(_model().eval()))
    assert packing_check(counted, *short).ok
    assert counted.calls == 3
    packing_check(counted, *usable)
    assert counted.calls == 6
    assert not packing_check(_model("unpacked_sdpa"), *short).ok


def test_packing_check_restores_training_mode():
    model = _model().train()
    ids, mask = _rows()
    assert packing_check(model, ids, mask).ok
    assert model.training


# -- the GPU bench's tiny run --------------------------------------------------------------------------------


def test_gpu_round_bench_runs_tiny_on_cpu_without_trl():
    """bench/gpu_round.py at its tiny shape, with trl, datasets and math_verify made unimportable (the GPU
    machine has none of them): every mode is listed, each mode CPU can run trains on padded's losses (float32
    on CPU; balanced micro-batches included, under dapo), the others are skipped with their reason; then a
    budget too small for any round skips every mode, saying so."""

    def run(*argv: str):
        code = (
            "import runpy, sys\n"
            "for name in ('trl', 'datasets', 'math_verify'):\n"
            "    sys.modules[name] = None\n"
            f"sys.argv = ['gpu_round.py', '--tiny', *{list(argv)!r}]\n"
            "runpy.run_path('bench/gpu_round.py', run_name='__main__')\n"
        )
        result = run_bench([], code=code)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout.splitlines(), result.stdout

    lines, stdout = run()
    losses = printed_losses(stdout)
    # packed-varlen runs on CPU too: SDPA on each sequence.
    ran = ("trim", "packed-sdpa", "packed-balanced", "packed-shared", "packed-varlen")
    assert set(losses) == {"padded", *ran}
    assert len(losses["padded"]) == 20  # 4 optimizer steps in each of 4 rounds and the repeated round
    for mode in ran:
        torch.testing.assert_close(losses[mode], losses["padded"], rtol=1e-4, atol=1e-6, msg=mode)
    assert any(line.startswith("packed-flex: skipped (") for line in lines)
    assert any(line.startswith("packed-flash: skipped (") for line in lines)
    assert any(line.startswith("packed-balanced/padded training-side time: ") for line in lines)
    table = lines.index(next(line for line in lines if line.split()[:3] == ["mode", "new", "s"]))
    assert [line.split()[0] for line in lines[table + 1 : table + 7]] == [
        "padded", "packed-balanced", "packed-shared", "packed-varlen", "packed-sdpa", "trim"
    ]  # fmt: skip
    lines, _ = run("--modes", "padded,trim", "--budget_s", "0.001")
    assert any(line.startswith("padded: skipped (--budget_s 0.001: ") for line in lines)
    assert any(line.startswith("packed-sdpa: skipped (not in --modes)") for line in lines)
    assert lines[-2] == "not run (--budget_s, a stop or a failure): padded: every round; trim: every round"
    assert "padded ran: the model's own attention (no line of prompt_aug's)" in stdout.splitlines()
    # The path each packed mode really ran, from the attention's own log line; on CPU no kernel is expected.
    cpu = "packed attention: sdpa on each sequence, not varlen: the kernel does not run on cpu"
    assert f"packed-balanced ran: {cpu}" in stdout.splitlines()


def test_gpu_round_bench_profiles_every_mode_into_one_file_and_refuses_an_unknown_mode(tmp_path):
    """--profile writes one file, whatever the modes (a device call brings back 8 files at most); a mistyped
    --profile_modes name, or --profile_modes without --profile, is refused in one line, before any model is
    built."""
    result = run_bench(["bench/gpu_round.py", "--tiny", "--modes", "padded,trim", "--rounds", "1",
                        "--profile", str(tmp_path / "profiles")])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in (tmp_path / "profiles").iterdir()] == ["profile.txt"]
    text = (tmp_path / "profiles" / "profile.txt").read_text()
    assert "padded" in text and "trim" in text
    result = run_bench(["bench/gpu_round.py", "--tiny", "--profile_modes", "padded, bogus"])
    assert result.returncode == 2
    assert "--profile_modes: unknown bogus; choose among padded" in result.stderr
    alone = run_bench(["bench/gpu_round.py", "--tiny", "--profile_modes", "padded"])
    assert alone.returncode == 2 and "--profile_modes: names the modes --profile profiles" in alone.stderr


TINY_MODES = "bench.main(['--tiny', '--modes', 'padded,packed-balanced,trim'])"


def _bench_with_a_seventh_round_that(action: str):
    """bench/gpu_round.py --tiny over padded, packed-balanced and trim, run in a subprocess, doing ``action``
    (a Python statement; ``os``, ``signal`` and ``torch`` imported) as its 7th round begins: padded has run
    its 5 rounds, packed-balanced 1."""
    patch = f"""
        rounds, began = bench.train_round, []
        def train_round(*args, **kwargs):
            began.append(1)
            if len(began) == 7:
                {action}
            return rounds(*args, **kwargs)
        bench.train_round = train_round
    """
    return run_patched_bench("gpu_round.py", patch, TINY_MODES)


def test_gpu_round_bench_stopped_by_a_step_limit_still_prints_what_it_ran():
    """``timeout`` (the GPU check's step limit) sends SIGTERM: the bench ends its rounds there and still
    prints the losses, the comparison with padded and the table of what ran, instead of dying with nothing.
    The bench signals itself as its 7th round begins."""
    result = _bench_with_a_seventh_round_that("os.kill(os.getpid(), signal.SIGTERM)")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("stopped by SIGTERM after ") for line in lines), lines
    assert lines[-2] == "not run (--budget_s, a stop or a failure): the rounds after that: stopped by SIGTERM"
    losses = printed_losses(result.stdout)
    assert set(losses) == {"padded", "packed-balanced"}
    assert len(losses["padded"]) == 20 and len(losses["packed-balanced"]) == 4  # 4 steps a round
    assert any(line.startswith("packed-balanced vs padded: losses differ by at most ") for line in lines)
    assert "trim (attention sdpa)" not in lines
    # The ratio table marks the mode stopped after its warm-up round: it has no time of new lengths.
    table = lines.index(next(line for line in lines if line.split()[:3] == ["mode", "new", "s"]))
    rows = {line.split()[0]: line for line in lines[table + 1 : table + 3]}
    assert rows["packed-balanced"].endswith("(warm-up round only)") and "nan" in rows["packed-balanced"]
    assert not rows["padded"].endswith("(warm-up round only)")
    # The mode the stop cut short still says which attention it ran.
    cpu = "packed attention: sdpa on each sequence, not varlen: the kernel does not run on cpu"
    assert f"packed-balanced ran: {cpu}" in lines


def test_gpu_round_bench_mode_that_fails_mid_step_leaves_no_gradient_to_the_next():
    """A mode that fails after a backward, inside an optimizer step, leaves gradients on the model; the next
    mode starts from none, so its losses are padded's to float32 rounding as without the failure."""
    patch = """
        loss, rounds, began = bench.dapo_loss, bench.train_round, []
        def train_round(*args, **kwargs):
            began.append(0)
            return rounds(*args, **kwargs)
        def dapo_loss(*args):
            began[-1] += 1
            if len(began) == 6 and began[-1] == 2:  # packed-balanced's first round, one backward done
                raise torch.OutOfMemoryError('CUDA out of memory')
            return loss(*args)
        bench.train_round, bench.dapo_loss = train_round, dapo_loss
    """
    result = run_patched_bench("gpu_round.py", patch, TINY_MODES)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packed-balanced: failed (OutOfMemoryError: CUDA out of memory)" in result.stdout
    line = next(
        x for x in result.stdout.splitlines() if x.startswith("trim vs padded: losses differ by at most ")
    )
    gap = float(line.split("at most ")[1].split()[0])
    assert gap < 1e-6, line  # about 1e-7 apart; the leftover gradient moved them by about 3e-6


def test_gpu_round_bench_mode_that_fails_before_its_first_round_ends_alone():
    """A mode that fails before any round of its own (here a TypeError as its optimizer is made, as a kernel's
    changed signature would raise) is reported as failed; the next mode runs and the summary prints."""
    patch = """
        made, adamw = [], torch.optim.AdamW
        def failing(*args, **kwargs):
            made.append(1)
            if len(made) == 2:  # packed-balanced's
                raise TypeError("varlen_attn() got an unexpected keyword argument 'window_size'")
            return adamw(*args, **kwargs)
        torch.optim.AdamW = failing
    """
    result = run_patched_bench("gpu_round.py", patch, TINY_MODES)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("packed-balanced: failed (TypeError: varlen_attn() got ") for line in lines)
    assert set(printed_losses(result.stdout)) == {"padded", "trim"}
    assert any(line.startswith("trim/padded training-side time: ") for line in lines)
    skipped = "not run (--budget_s, a stop or a failure): packed-balanced: the rest, after TypeError"
    assert lines[-2] == skipped


def test_gpu_round_bench_mode_that_fails_ends_alone_and_the_others_run():
    """A mode that fails mid-way (here out of memory as its second round begins) ends that mode only: its
    rounds before that are kept, the next mode runs, and the summary still compares what ran."""
    result = _bench_with_a_seventh_round_that(
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    failed = "packed-balanced: failed (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)"
    assert f"{failed}; its rounds before that are kept" in lines
    losses = printed_losses(result.stdout)
    assert set(losses) == {"padded", "packed-balanced", "trim"}
    assert len(losses["packed-balanced"]) == 4 and len(losses["trim"]) == len(losses["padded"]) == 20
    assert any(line.startswith("trim/padded training-side time: ") for line in lines)
    assert (
        lines[-2]
        == "not run (--budget_s, a stop or a failure): packed-balanced: the rest, after OutOfMemoryError"
    )


def _round(seconds: float) -> dict:
    """A round of `bench/gpu_round.py`'s `train_round` as the ratio table reads it: ``seconds`` in all."""
    return {"times": {"old log-probs": 0.0, "forward + backward": seconds, "optimizer": 0.0}, "peak_gib": 1.0}


def test_gpu_round_ratio_to_padded_is_over_the_rounds_both_ran():
    """Rounds of new lengths differ in length, so a mode stopped after its third round (budget, failure) is
    compared with padded's same rounds: here it takes half of padded's time on every round it ran, 0.50."""
    bench = load_bench("gpu_round.py")
    labels = ["seed 0", "seed 1", "seed 2", "seed 3", "seed 3 again"]
    padded = [_round(s) for s in (10.0, 2.0, 4.0, 6.0, 6.0)]
    half = [_round(s) for s in (5.0, 1.0, 2.0)]  # no seed 3, no repeat
    lines = bench.ratio_table({"padded": padded, "packed-sdpa": half}, labels)
    assert lines[0].split()[:4] == ["mode", "new", "s", "again"]
    cells = lines[2].split()
    assert cells[0] == "packed-sdpa"
    assert float(cells[1]) == pytest.approx(1.5)  # its own new rounds' mean seconds
    assert float(cells[3]) == pytest.approx(0.5), lines  # new/padded over seeds 1 and 2
    assert math.isnan(float(cells[4]))  # no repeated round: no again/padded


def _tiny_causal_lms() -> dict[str, torch.nn.Module]:
    """Tiny random causal LMs that give positions in different ways."""
    from transformers import (
        BartConfig,
        BartForCausalLM,
        BioGptConfig,
        BioGptForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        OPTConfig,
        OPTForCausalLM,
        XGLMConfig,
        XGLMForCausalLM,
    )  # fmt: skip

    torch.manual_seed(0)
    return {
        "bart": BartForCausalLM(BartConfig(
            vocab_size=50, d_model=8, decoder_layers=1, encoder_layers=1, decoder_attention_heads=2,
            encoder_attention_heads=2, decoder_ffn_dim=8, encoder_ffn_dim=8, max_position_embeddings=64,
        )),
        "xglm": XGLMForCausalLM(XGLMConfig(
            vocab_size=50, d_model=8, num_layers=1, attention_heads=2, ffn_dim=8, max_position_embeddings=64
        )),
        "opt": OPTForCausalLM(OPTConfig(
            vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, ffn_dim=8,
            max_position_embeddings=64, word_embed_proj_dim=8,
        )),
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=8, n_layer=1, n_head=2, n_positions=64)),
        "biogpt": BioGptForCausalLM(BioGptConfig(
            vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
            max_position_embeddings=64,
        )),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(
            vocab_size=50, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64,
        )),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["bart", "xglm", "opt", "gpt2", "biogpt", "qwen2"])
def test_a_model_is_called_position_dependent_exactly_when_left_padding_changes_its_values(name):
    """Measured, not assumed: a row's logits alone and behind three masked padding columns. BART's table
    (offset by 2), XGLM's sinusoids and BioGPT's table (which takes the mask, but is given positions counted
    from the first column) count the padding; OPT's table counts from the attention mask, and rotary
    attention sees distances only."""
    from prompt_aug.packing import position_dependence

    model = _tiny_causal_lms()[name].eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(ids)], dim=1)
    with torch.no_grad():
        alone = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        behind = model(input_ids=padded, attention_mask=mask).logits[0, 3:]
    moved = (alone - behind).abs().max().item() > 1e-5
    assert (position_dependence(model) is not None) == moved, (name, moved, position_dependence(model))
    assert moved == (name in ("bart", "xglm", "gpt2", "biogpt"))
