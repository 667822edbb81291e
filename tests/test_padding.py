"""Padding-free training passes: each path (packed, trim) against TRL's padded one (off), from the same state
and the same generated round: each optimizer step's loss and the parameters after it agree to float rounding.

The in-process runs use a float64 copy of the tiny model whose end-of-text embedding is scaled up, so that
completions end at many different lengths (a random model otherwise runs every completion to the cap, and
only the prompt side would be trimmed). Each run trains exactly the optimizer steps of one generation round,
so both runs sample from the same weights; the test checks the rounds' completions are identical.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from bench_tools import load_bench, printed_losses, run_bench, run_patched_bench
from datasets import Dataset
from launch import torchrun
from rows import padded_masks
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from prompt_aug.config import PromptAugGRPOConfig, planned_processes
from prompt_aug.padding import (
    PaddingFreePasses,
    chunked_forward,
    optimizer_step_segments,
    regroup,
    regrouping_is_exact,
    trim,
)
from prompt_aug.trainer import PromptAugGRPOTrainer
from prompt_aug.varlen import VARLEN_ATTENTION

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [f"What is {a} + {b}?" for a in range(1, 5) for b in range(1, 4)]


# -- the pure helpers ----------------------------------------------------------------------------------------


def _batch(
    prompt_lengths: list[int], completion_lengths: list[int], width_p: int = 6, width_c: int = 7
) -> dict:
    rows = len(prompt_lengths)
    prompt_mask, completion_mask = padded_masks(prompt_lengths, completion_lengths, width_p, width_c)
    return {
        "prompt_ids": torch.arange(rows * width_p).view(rows, width_p),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.arange(rows * width_c).view(rows, width_c),
        "completion_mask": completion_mask,
        "old_per_token_logps": torch.randn(rows, width_c),
        "importance_sampling_ratio": torch.ones(rows, 1),
        "advantages": torch.arange(rows, dtype=torch.float),
        "num_items_in_batch": torch.tensor(float(sum(completion_lengths))),
    }


def test_rows_are_regrouped_only_under_a_loss_type_known_to_weigh_each_row_alone():
    from types import SimpleNamespace

    def trainer(loss_type: str, accumulated: int = 2, **flags) -> SimpleNamespace:
        values = {"entropy_bonus_enabled": False, "top_entropy_quantile": 1.0, "aux_loss_enabled": False}
        return SimpleNamespace(
            loss_type=loss_type, current_gradient_accumulation_steps=accumulated,
            args=SimpleNamespace(gradient_accumulation_steps=2), **{**values, **flags},
        )  # fmt: skip

    for loss_type in ("grpo", "sapo", "luspo", "dr_grpo", "dapo", "cispo", "vespo"):
        assert regrouping_is_exact(trainer(loss_type)), loss_type
    # bnpo divides by the micro-batch's tokens; a loss type TRL adds later is not known to be exact.
    assert not regrouping_is_exact(trainer("bnpo"))
    assert not regrouping_is_exact(trainer("a_new_loss"))
    assert not regrouping_is_exact(trainer("dapo", accumulated=1))  # an epoch's short last step
    assert not regrouping_is_exact(trainer("dapo", top_entropy_quantile=0.5))


def test_trim_cuts_each_side_to_the_longest_row_and_keeps_every_real_token():
    batch = _batch([2, 4, 1], [3, 5, 0])
    out = trim(batch)
    assert out["prompt_ids"].shape == (3, 4) and out["completion_ids"].shape == (3, 5)
    assert torch.equal(out["prompt_ids"], batch["prompt_ids"][:, 2:])
    assert torch.equal(out["old_per_token_logps"], batch["old_per_token_logps"][:, :5])
    assert out["importance_sampling_ratio"].shape == (3, 1)  # a sequence-level value is not a column
    assert out["prompt_mask"].sum() == batch["prompt_mask"].sum()
    assert out["completion_mask"].sum() == batch["completion_mask"].sum()
    assert out["num_items_in_batch"] is batch["num_items_in_batch"]
    # Completions of at most one real token keep two columns: TRL reads a one-column tensor as one value per
    # sequence. A batch that is one column wide stays so.
    assert trim(_batch([1, 1], [0, 0]))["completion_ids"].shape == (2, 2)
    assert trim(_batch([1, 1], [1, 0]))["completion_mask"].shape == (2, 2)
    assert trim(_batch([1], [1], width_c=1))["completion_ids"].shape == (1, 1)


def test_segments_are_the_micro_batches_of_one_optimizer_step_in_every_pass():
    assert optimizer_step_segments(0, 4, 1, 2) == [[0, 1], [2, 3]]  # steps_per_generation > accumulation
    assert optimizer_step_segments(0, 4, 1, 4) == [[0, 1, 2, 3]]
    assert optimizer_step_segments(0, 2, 1, 4) == [[0, 1]]  # the round is half of one optimizer step
    assert optimizer_step_segments(0, 4, 2, 2) == [[0, 1], [2, 3]]  # num_iterations replays the same cut
    # 3 micro-batches per round, 2 per optimizer step: the second round starts mid-step (micro-step 3).
    assert optimizer_step_segments(0, 3, 1, 2) == [[0, 1], [2]]
    assert optimizer_step_segments(3, 3, 1, 2) == [[0], [1, 2]]
    # The Trainer restarts accumulation each epoch: with epochs of 6 micro-steps the second round is still
    # mid-step; with epochs of 3 (one round) micro-step 3 starts an epoch, and its steps hold 0, 1 | 2.
    assert optimizer_step_segments(3, 3, 1, 2, per_epoch=6) == [[0], [1, 2]]
    assert optimizer_step_segments(3, 3, 1, 2, per_epoch=3) == [[0, 1], [2]]
    # Two passes over 3 micro-batches, 2 per step: steps hold 0,1 | 2,0 | 1,2, so no pair always shares one.
    assert optimizer_step_segments(0, 3, 2, 2) == [[0], [1], [2]]


def test_regroup_sorts_within_a_segment_only_and_keeps_sizes():
    batches = [_batch([1, 1], [1, 6]), _batch([1, 1], [5, 2]), _batch([1, 1], [7, 3]), _batch([1, 1], [4, 0])]
    out = regroup(batches, [[0, 1], [2, 3]])
    assert [len(b["advantages"]) for b in out] == [2, 2, 2, 2]
    assert [b["completion_mask"].sum(1).tolist() for b in out] == [[6, 5], [2, 1], [7, 4], [3, 0]]
    assert [b["completion_ids"].size(1) for b in out] == [6, 2, 7, 3]
    # Rows carry their advantages with them, and stay in their segment.
    assert sorted(out[0]["advantages"].tolist() + out[1]["advantages"].tolist()) == [0.0, 0.0, 1.0, 1.0]
    unsorted = regroup(batches, [[0, 1], [2, 3]], sort=False)
    assert [b["completion_mask"].sum(1).tolist() for b in unsorted] == [[1, 6], [5, 2], [7, 3], [4, 0]]


def test_chunked_forward_matches_the_padded_pass_row_for_row(tiny_model_dir):
    torch.manual_seed(0)
    model = _float64_model(tiny_model_dir)
    batch = _batch([2, 6, 4, 1, 3], [7, 1, 3, 0, 5])
    ids = torch.randint(5, 100, (5, 13))
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    seen = []

    def score(chunk_ids, chunk_mask, keep):
        seen.append(tuple(chunk_ids.shape))
        logits = model(input_ids=chunk_ids, attention_mask=chunk_mask).logits[:, -keep - 1 : -1]
        logps = logits.log_softmax(-1).gather(-1, chunk_ids[:, -keep:, None]).squeeze(-1)
        return logps * chunk_mask[:, -keep:], None

    real = batch["completion_mask"].bool()
    with torch.no_grad():
        padded, _ = score(ids, mask, 7)
        for rows, chunks in ((1, [(1, 9), (1, 8), (1, 7), (1, 7), (1, 2)]), (2, [(2, 10), (2, 9), (1, 2)])):
            seen.clear()
            logps, entropies = chunked_forward(score, ids, mask, 7, rows_per_chunk=rows)
            assert seen == chunks and entropies is None  # rows by length: 0 (9 tokens), 4, 1, 2, 3
            # Not bit-equal: trimming shifts a row's positions, and RoPE's cos/sin are computed in float32.
            torch.testing.assert_close(logps[real], padded[real], rtol=0, atol=1e-7)
            assert (logps[~real] == 0).all()


# -- the trainer, on and off ---------------------------------------------------------------------------------


def _float64_model(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)


def _reward(completions, **kwargs):
    return [float(len(set(c))) + 0.1 * len(c) for c in completions]


class _Recording(PromptAugGRPOTrainer):
    """Ends each sampled completion at its first token id divisible by 5 (so completions have many lengths:
    a random model otherwise runs them all to the cap), and keeps each round's completion ids, to check both
    runs trained on the same samples. The cut is idempotent, so completions replayed by dynamic sampling
    are not cut again."""

    def generate_round(self, prompts):
        generation = super().generate_round(prompts)
        eos = self.processing_class.eos_token_id
        cut = []
        for ids in generation.completion_ids:
            stop = next((i for i, t in enumerate(ids[:-1]) if t % 5 == 0), None)
            cut.append(list(ids) if stop is None else [*ids[:stop], eos])
        texts = self.processing_class.batch_decode(cut, skip_special_tokens=True)
        return generation._replace(completion_ids=cut, completions=texts)

    def score_round(self, inputs):
        output = super().score_round(inputs)
        if self.model.training:
            self.rounds.append(output["completion_ids"].clone())
        return output


def _run(
    path: Path,
    out: Path,
    trim_padding: str,
    dynamic: bool = False,
    questions: int | None = None,
    resume: str | None = None,
    **overrides,
) -> dict:
    values = {
        "output_dir": str(out), "learning_rate": 0.05, "per_device_train_batch_size": 4, "num_generations": 4,
        "max_completion_length": 12, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "use_cpu": True, "bf16": False, "seed": 3, "loss_type": "dapo", "beta": 0.0, "optim": "sgd",
        "gradient_accumulation_steps": 2, "steps_per_generation": 2, "num_iterations": 1,
    }  # fmt: skip
    values.update(overrides)
    # One generation round unless epochs are asked for: both runs then sample from the same weights.
    if "num_train_epochs" not in overrides:
        values["max_steps"] = (
            values["steps_per_generation"] * values["num_iterations"] // values["gradient_accumulation_steps"]
        )
    dynamic_keys = {"dynamic_sampling": True, "dynamic_sampling_max_passes": 2} if dynamic else {}
    args = PromptAugGRPOConfig(
        **values, **dynamic_keys, trim_padding=trim_padding, stop_tokens=[], reward_cut_tokens=[]
    )
    trainer = _Recording(
        model=_float64_model(path),
        reward_funcs=_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": QUESTIONS[:questions]}),
        processing_class=AutoTokenizer.from_pretrained(path),
    )
    trainer.rounds = []
    trainer.train(resume_from_checkpoint=resume)
    return {
        "trainer": trainer,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
        "rounds": trainer.rounds,
        "stats": dict(trainer.padding_free.stats),
        "mode": trainer.padding_free.mode,
        "entropy": [
            {k: v for k, v in h.items() if k.endswith("/entropy")}
            for h in trainer.state.log_history
            if "loss" in h
        ],
    }


def _assert_same_update(
    path: Path, tmp_path: Path, mode: str = "packed", dynamic: bool = False, rounds: int = 1, **overrides
) -> None:
    on = _run(path, tmp_path / "on", mode, dynamic, **overrides)
    off = _run(path, tmp_path / "off", "off", dynamic, **overrides)
    assert on["mode"] == mode and off["mode"] == "off"  # no fallback: the path asked for is the one compared
    assert len(on["rounds"]) == len(off["rounds"]) == rounds
    for a, b in zip(on["rounds"], off["rounds"], strict=True):
        assert torch.equal(a, b), "the two runs sampled different completions"
    lengths = (on["rounds"][0] != 0).sum(1)
    assert lengths.unique().numel() >= 3, lengths  # not vacuous: the round holds short and long completions
    assert len(on["losses"]) == len(off["losses"]) >= 1
    # The Trainer accumulates the logged loss in float32.
    torch.testing.assert_close(torch.tensor(on["losses"]), torch.tensor(off["losses"]), rtol=1e-6, atol=1e-7)
    # Compared as updates, relative to their size: ~1e-6 from float rounding (TRL's fused log-prob head and
    # RoPE's cos/sin work in float32, and trimming shifts positions), ~1e-1 for a row weighted differently.
    start = dict(_float64_model(path).named_parameters())
    # Not vacuous: every parameter moved (with 0 <= 1e-4 * 0, an untrained run would pass the check below).
    still = [name for name, value in off["params"].items() if torch.equal(value, start[name])]
    assert not still, f"parameters the off run left unchanged: {still}"
    for name, value in off["params"].items():
        update = (value - start[name]).norm()
        assert (on["params"][name] - value).norm() <= 1e-4 * update, name
    for a, b in zip(on["entropy"], off["entropy"], strict=True):
        assert a.keys() == b.keys()
        torch.testing.assert_close(
            torch.tensor(list(a.values())), torch.tensor(list(b.values())), rtol=1e-6, atol=0
        )
    share_on = on["stats"]["real"] / on["stats"]["processed"]
    share_off = off["stats"]["real"] / off["stats"]["processed"]
    assert share_on > share_off, (share_on, share_off, lengths.tolist())
    if overrides.get("packing_share_prompts"):  # a group's prompt ran once: fewer tokens than the rows hold
        assert on["stats"]["real"] < off["stats"]["real"], (on["stats"], off["stats"])


def test_trls_profiling_times_each_of_its_calls_once_whatever_the_path(tiny_model_dir, tmp_path, monkeypatch):
    """TRL times each forward pass, micro-batch and reward call (``profiling/Time taken: ...``, on W&B): the
    padding-free paths report the same timings, once per call (not per chunk, and not none)."""
    from trl.extras import profiling

    timed: list[str] = []
    exit_ = profiling.ProfilingContext.__exit__

    def recorded(self, *args):
        timed.append(self.name.rsplit(".", 1)[-1])
        return exit_(self, *args)

    monkeypatch.setattr(profiling.ProfilingContext, "__exit__", recorded)
    counts = {}
    for mode in ("off", "packed", "trim"):
        timed.clear()
        _run(tiny_model_dir, tmp_path / mode, mode)
        counts[mode] = {name: timed.count(name) for name in set(timed) if name.startswith("_")}
    names = {"_get_per_token_logps_and_entropies", "_prepare_inputs", "_calculate_rewards"}
    assert names <= counts["off"].keys() and all(counts["off"][n] > 0 for n in names), counts["off"]
    assert counts["packed"] == counts["off"] and counts["trim"] == counts["off"], counts


@pytest.mark.parametrize("mode", ["packed", "trim"])
def test_an_epoch_that_ends_on_a_short_optimizer_step_keeps_each_row_in_its_step(
    tiny_model_dir, tmp_path, mode
):
    # 3 questions are one round an epoch, of 3 micro-batches, 2 to an optimizer step: each epoch's steps hold
    # micro-batches 0, 1 and then 2 alone, as the Trainer restarts accumulation at every epoch. Rows moved
    # by the global micro-step count instead (1, 2 together in the second epoch) change the update.
    _assert_same_update(
        tiny_model_dir, tmp_path, mode, rounds=2, questions=3, steps_per_generation=3, num_train_epochs=2
    )


class _OneTokenOrTruncated(_Recording):
    """Every other completion ends at once (one real token); the rest run to the cap and are masked as
    truncated, so each micro-batch's real completions are at most one token long."""

    def generate_round(self, prompts):
        generation = PromptAugGRPOTrainer.generate_round(self, prompts)
        eos, pad, cap = self.processing_class.eos_token_id, self.processing_class.pad_token_id, 12
        cut = [
            [eos] if i % 2 == 0 else [t if t not in (eos, pad) else 7 for t in ids] + [7] * (cap - len(ids))
            for i, ids in enumerate(generation.completion_ids)
        ]
        return generation._replace(completion_ids=cut, completions=self.processing_class.batch_decode(cut))


@pytest.mark.parametrize("mode", ["packed", "trim"])
def test_completions_of_one_token_log_the_entropy_padded_calls_log(tiny_model_dir, tmp_path, mode):
    logged = {}
    for path in (mode, "off"):
        args = PromptAugGRPOConfig(
            output_dir=str(tmp_path / path), per_device_train_batch_size=4, num_generations=4,
            max_completion_length=12, report_to="none", save_strategy="no", logging_steps=1, use_cpu=True,
            bf16=False, seed=3, beta=0.0, gradient_accumulation_steps=2, steps_per_generation=2, max_steps=1,
            mask_truncated_completions=True, trim_padding=path, stop_tokens=[], reward_cut_tokens=[],
        )  # fmt: skip
        trainer = _OneTokenOrTruncated(
            model=_float64_model(tiny_model_dir), reward_funcs=_reward, args=args,
            train_dataset=Dataset.from_dict({"prompt": QUESTIONS}),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )  # fmt: skip
        trainer.rounds = []
        trainer.train()
        assert trainer.padding_free.mode == path
        logged[path] = next(h for h in trainer.state.log_history if "loss" in h)
    # The entropy is a mean over real completion tokens (one in two rows here), not over every row.
    assert logged[mode]["entropy"] == pytest.approx(logged["off"]["entropy"], rel=1e-4)
    assert logged[mode]["loss"] == pytest.approx(logged["off"]["loss"], rel=1e-5, abs=1e-7)


def test_a_resume_after_an_epochs_short_step_generates_the_rounds_an_unbroken_run_does(
    tiny_model_dir, tmp_path
):
    keys = {"questions": 3, "steps_per_generation": 3, "num_train_epochs": 2, "trim_padding": "off"}
    whole = _run(tiny_model_dir, tmp_path / "whole", save_strategy="steps", save_steps=2, **keys)
    trainer = whole["trainer"]
    assert trainer.micro_steps_per_epoch == len(trainer.get_train_dataloader()) == 3
    assert [h["round"] for h in trainer.state.log_history if "loss" in h] == [1, 1, 2, 2]
    # checkpoint-2 ends the first epoch (its steps: micro-batches 0, 1 and 2): one round is left to generate.
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", resumed / "checkpoint-2")
    again = _run(tiny_model_dir, resumed, resume=str(resumed / "checkpoint-2"), **keys)
    assert len(whole["rounds"]) == 2 and len(again["rounds"]) == 1
    assert torch.equal(whole["rounds"][1], again["rounds"][0]), "the resumed run generated another round"
    assert again["trainer"].micro_step == trainer.micro_step == 6


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_each_loss_type_gets_the_same_update_packed(tiny_model_dir, tmp_path, loss_type, share_prompts):
    # Packed rows are dealt out token-balanced over each optimizer step's micro-batches (bnpo's keep TRL's
    # micro-batches: its normaliser is per micro-batch), so every loss type gets the same update. With shared
    # prompts, the old-log-prob pass runs each group's prompt once (its calls hold whole groups), and so does
    # a training call holding two rows of one group.
    _assert_same_update(
        tiny_model_dir, tmp_path, loss_type=loss_type, steps_per_generation=4,
        packing_share_prompts=share_prompts,
    )  # fmt: skip


def test_shared_prompts_with_a_reference_model_get_the_same_update(tiny_model_dir, tmp_path):
    # beta > 0: TRL builds a reference model on SDPA, which cannot read shared prompts; its passes run
    # unshared while the policy's share, and the KL term is TRL's.
    _assert_same_update(
        tiny_model_dir, tmp_path, steps_per_generation=4, packing_share_prompts=True, beta=0.04
    )


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A random GPT-2 (a learned table of absolute positions) with the tiny model's tokenizer, no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=32, n_layer=2, n_head=2, vocab_size=len(tokenizer), n_positions=256, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("gpt2") / "tiny-random-gpt2"
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_model_of_absolute_positions_keeps_its_left_padding_and_gets_the_same_update(
    tiny_gpt2_dir, tiny_model_dir, tmp_path
):
    # GPT-2 counts positions from the call's first column: a row's values are TRL's only at the round's prompt
    # width, so trimmed calls cut completions alone (the old-log-prob pass and the loss pass then agree).
    _assert_same_update(tiny_gpt2_dir, tmp_path, "trim", steps_per_generation=4, loss_type="grpo")
    passes = PaddingFreePasses("auto")
    assert (
        passes.choose(_float64_model(tiny_gpt2_dir)) == "trim" and not passes.trim_left
    )  # packing refuses it
    rotary = PaddingFreePasses("trim")  # rotary attention sees only distances: its left padding goes
    assert rotary.choose(_float64_model(tiny_model_dir)) == "trim" and rotary.trim_left


@pytest.mark.parametrize("mode", ["packed", "trim"])
def test_a_model_whose_rope_follows_the_calls_length_runs_padded_past_its_original_context(
    tiny_model_dir, caplog, mode
):
    """Dynamic RoPE scales its frequencies by a call's largest position once it passes the original context:
    a call wider than that runs as TRL's, padded; a narrower one padding-free, with TRL's values."""
    from transformers import AutoConfig
    from trl.trainer.utils import add_fused_lm_head

    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.rope_parameters = {**config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    config.max_position_embeddings = 12  # the original context of dynamic RoPE
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, config=config, dtype=torch.float64).eval()
    add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
    calls = []

    def trl_forward(model, ids, mask, keep, rows, compute_entropy):
        calls.append(tuple(ids.shape))
        labels = ids.masked_fill(mask == 0, -100)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, use_cache=False)
        return out.log_probs[:, -keep:], None, None

    passes = PaddingFreePasses(mode)
    with caplog.at_level("INFO", logger="prompt_aug"):
        assert passes.choose(model) == mode and passes.width_limit == 12
    why = "Qwen2ForCausalLM (qwen2) uses dynamic RoPE, whose frequencies change past 12 positions"
    assert f"padding-free passes: calls wider than 12 tokens run padded, as TRL's: {why}" in caplog.text
    for width, padded_call in ((14, True), (12, False)):  # prompts of 6 columns, completions of 8 or 6
        batch = _batch([2, 4, 3], [width - 6, 1, 2], width_c=width - 6)
        ids = torch.randint(5, 100, (3, width), generator=torch.Generator().manual_seed(width))
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        real = batch["completion_mask"].bool()
        with torch.no_grad():
            calls.clear()
            logps, _ = passes.forward(trl_forward, model, ids, mask, width - 6, 3, False)
            assert (calls == [(3, width)]) == padded_call, calls
            trls, _, _ = trl_forward(model, ids, mask, width - 6, 3, False)
            torch.testing.assert_close(logps[real], trls[real], rtol=0, atol=1e-7)
            # Not vacuous: past the original context, the row alone gets other values than in TRL's call.
            alone, _, _ = trl_forward(model, ids[2:, 3:], mask[2:, 3:], width - 6, 1, False)
            gap = (alone[0][real[2]] - trls[2][real[2]]).abs().max()
            assert (gap > 1e-6) == padded_call, gap


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo"])
def test_the_trim_path_gets_the_same_update(tiny_model_dir, tmp_path, loss_type):
    # dapo's rows are regrouped by length within each optimizer step; bnpo divides by each micro-batch's token
    # count, so its rows keep TRL's micro-batches and are only trimmed.
    _assert_same_update(tiny_model_dir, tmp_path, "trim", loss_type=loss_type, steps_per_generation=4)


def test_several_iterations_and_more_micro_batches_per_round_than_per_step(tiny_model_dir, tmp_path):
    # 4 micro-batches per round, 2 per optimizer step, each round trained twice: 4 optimizer steps, and the
    # old-log-prob pass runs (trimmed) because the round spans several optimizer steps.
    _assert_same_update(tiny_model_dir, tmp_path, num_iterations=2, steps_per_generation=4)


def test_dynamic_sampling_gets_the_same_update(tiny_model_dir, tmp_path):
    _assert_same_update(tiny_model_dir, tmp_path, "packed", dynamic=True, steps_per_generation=4)


def test_two_processes_get_the_same_update(tmp_path):
    """Two ranks (gloo) train one round through the recipe path packed, packed with shared prompts, and off
    (float32, SGD; the random model runs every completion to the cap there, so only prompts are trimmed).
    Packed, each rank balances its own rows, with TRL's row count per micro-batch: both ranks make as many
    calls. The reward is a hash of the completion text, so every group has spread and the weights move (the
    smoke recipe's rewards give this model none)."""
    results = {}
    shared = ["--packing_share_prompts", "true"]
    for flag, mode, keys in (("packed", "packed", []), ("shared", "packed", shared), ("off", "off", [])):
        out = tmp_path / flag
        cmd = [
            *torchrun(2),
            "-m", "prompt_aug.train", "--config", str(REPO / "recipes/smoke/tiny_cpu.yaml"),
            "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2", "--steps_per_generation", "4", "--num_generations", "4",
            "--save_strategy", "no", "--optim", "sgd", "--learning_rate", "0.5", "--trim_padding", mode,
            "--log_completions", "true", "--reward_funcs", "fault_harness:text_hash_reward", *keys,
        ]  # fmt: skip
        # tests/ on the path, so that each rank imports the reward by its import path.
        pythonpath = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
        result = subprocess.run(
            cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
        steps = [
            h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h
        ]
        assert all(h["grad_norm"] > 0 and h["loss"] != 0 for h in steps), (flag, steps)
        results[flag] = ([h["loss"] for h in steps], load_file(out / "model.safetensors"))
    loss_off, params_off = results["off"]
    # The off run trained: every tensor left the model the run built (an untrained pair would match anyway).
    initial = load_file(tmp_path / "off" / "tiny-random-qwen2" / "model.safetensors")
    assert initial.keys() == params_off.keys()
    still = [name for name in initial if torch.equal(initial[name], params_off[name])]
    assert not still, f"tensors the off run left unchanged: {still}"
    for flag in ("packed", "shared"):
        loss_on, params_on = results[flag]
        assert len(loss_on) == 2
        torch.testing.assert_close(torch.tensor(loss_on), torch.tensor(loss_off), rtol=1e-4, atol=1e-6)
        for name, value in params_off.items():
            torch.testing.assert_close(params_on[name], value, rtol=1e-4, atol=1e-6, msg=f"{flag} {name}")


# Run by the test below on 2 processes (gloo): `_run` (completions cut at many lengths) for each loss type,
# packed and off, from the same start; each rank writes its losses, each parameter's update and its distance
# from the off run's, its completion lengths and its model calls to rank<i>.json.
UNEQUAL_LENGTHS_SCRIPT = """
import json
import sys
from pathlib import Path

import torch
from accelerate import PartialState

import test_padding as t

folder, model = Path(sys.argv[1]), Path(sys.argv[2])
rank = PartialState(cpu=True).process_index  # gloo, as the runs' use_cpu makes it
calls = []
load = t._float64_model


def counted(path):
    built = load(path)
    built.register_forward_pre_hook(lambda module, args: calls.append(1))
    return built


t._float64_model = counted
start = dict(load(model).named_parameters())
found = {}
for loss in ("dapo", "grpo", "dr_grpo", "bnpo"):
    runs = {}
    for mode in ("packed", "off"):
        calls.clear()
        run = t._run(model, folder / loss / mode, mode, loss_type=loss)
        runs[mode] = {**run, "calls": len(calls)}
    on, off = runs["packed"], runs["off"]
    found[loss] = {
        "modes": [on["mode"], off["mode"]],
        "losses": [on["losses"], off["losses"]],
        "same_samples": all(torch.equal(a, b) for a, b in zip(on["rounds"], off["rounds"], strict=True)),
        "lengths": (off["rounds"][0] != 0).sum(1).tolist(),
        "calls": [on["calls"], off["calls"]],
        "update": {n: float((v - start[n]).norm()) for n, v in off["params"].items()},
        "apart": {n: float((on["params"][n] - v).norm()) for n, v in off["params"].items()},
    }
Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
torch.distributed.destroy_process_group()
"""


def test_two_processes_with_completions_of_unequal_lengths_get_the_same_update(tiny_model_dir, tmp_path):
    """Two ranks whose completions end at many lengths, unequal across the ranks: packed, each rank regroups
    its own rows, and the loss is normalised over both ranks' tokens (dapo) or per row (grpo, dr_grpo,
    bnpo). The update equals the padded one under each loss type, and both ranks make as many model calls,
    which ZeRO-3 and FSDP need to not hang."""
    script = tmp_path / "unequal.py"
    script.write_text(UNEQUAL_LENGTHS_SCRIPT)
    pythonpath = os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": pythonpath}
    result = subprocess.run(
        [*torchrun(2), str(script), str(tmp_path), str(tiny_model_dir)], check=False, cwd=REPO, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for loss in ("dapo", "grpo", "dr_grpo", "bnpo"):
        first, second = ranks[0][loss], ranks[1][loss]
        # Not vacuous: each rank's completions have many lengths, and the ranks' differ.
        assert all(len(set(r["lengths"])) >= 3 for r in (first, second)), (loss, first["lengths"])
        assert sum(first["lengths"]) != sum(second["lengths"]), (loss, first["lengths"], second["lengths"])
        assert first["calls"][0] == second["calls"][0] > 0, (loss, first["calls"], second["calls"])
        for found in (first, second):
            assert found["modes"] == ["packed", "off"] and found["same_samples"], (loss, found["modes"])
            on, off = found["losses"]
            assert len(on) == len(off) >= 1
            torch.testing.assert_close(torch.tensor(on), torch.tensor(off), rtol=1e-6, atol=1e-7)
            still = [name for name, size in found["update"].items() if size == 0]
            assert not still, (loss, still)
            for name, size in found["update"].items():
                assert found["apart"][name] <= 1e-4 * size, (loss, name, found["apart"][name], size)


# Run by the test below on 2 processes (gloo): rank 1's varlen attention drops causality, so its live check
# fails where rank 0's passes. Each rank writes its path, attention and model calls to rank<i>.json in the
# folder it is given.
LIVE_CHECK_SCRIPT = """
import json
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl.trainer.utils import add_fused_lm_head

from prompt_aug.padding import PaddingFreePasses
from prompt_aug.varlen import VARLEN_ATTENTION, register, sequence_kernel


def non_causal(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    return sequence_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, enable_gqa=enable_gqa)


state = PartialState(cpu=True)
if state.process_index == 1:
    register(non_causal, devices=("cpu",), dtypes=(torch.float32,))
else:
    register()
torch.manual_seed(0)
config = Qwen2Config(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
    vocab_size=97, attn_implementation=VARLEN_ATTENTION,
)
model = Qwen2ForCausalLM(config)
add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
calls = []
model.register_forward_pre_hook(lambda module, args: calls.append(1))
mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
ids = torch.randint(1, 97, mask.shape, generator=torch.Generator().manual_seed(state.process_index)) * mask
passes = PaddingFreePasses("packed", device="cpu", processes=state.num_processes)
passes.choose(model)
passes.forward(None, model, ids, mask, 3, None, False)
found = {"mode": passes.mode, "attention": passes.attention, "calls": len(calls)}
Path(sys.argv[1], f"rank{state.process_index}.json").write_text(json.dumps(found))
torch.distributed.destroy_process_group()
"""


def _on_two_processes(script: Path, folder: Path) -> tuple[list[dict], str]:
    """Run ``script`` on 2 processes (gloo) with ``folder``; each rank's rank<i>.json, and the output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = subprocess.run(
        [*torchrun(2), str(script), str(folder)], check=False, cwd=REPO, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [
        json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)
    ], result.stderr + result.stdout


def test_processes_whose_live_checks_differ_all_take_the_path_of_the_one_that_failed(tmp_path):
    """Each process checks its own batch: where one fails (rank 1's kernel drops causality), every process
    goes back to SDPA, so all make as many model calls (DDP, FSDP and ZeRO-3 would hang otherwise)."""
    script = tmp_path / "live_check.py"
    script.write_text(LIVE_CHECK_SCRIPT)
    found, output = _on_two_processes(script, tmp_path)
    # Each rank: the check's 3 calls on varlen, 3 again on SDPA, then the packed call.
    assert found == [{"mode": "packed", "attention": "sdpa", "calls": 7}] * 2
    # Rank 0's warning names the process that failed.
    assert (
        "the policy's varlen attention failed the live check, back to sdpa: it failed on process 1 ("
        in output
    )


# Rank 1's kernel reads separate query and key offsets as if they were one (it drops a shared prompt), so
# its check of shared prompts fails where rank 0's passes; unshared calls stay exact on both.
NO_SHARED_KERNEL = """
def no_shared(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
    if not torch.equal(cu_q, cu_k):  # keep each sequence's own last keys only: its prompt is not seen
        ends, sizes = cu_k[1:].tolist(), (cu_q[1:] - cu_q[:-1]).tolist()
        keep = torch.cat([torch.arange(end - size, end) for end, size in zip(ends, sizes)])
        k, v, cu_k, max_k = k[keep], v[keep], cu_q, max_q
    return sequence_kernel(
        q, k, v, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size, enable_gqa=enable_gqa
    )
"""


def test_processes_whose_shared_prompt_checks_differ_all_stop_sharing(tmp_path):
    """Where one process's check of shared prompts fails, no process shares them: every process packs its
    rows by the same rules."""
    script = tmp_path / "shared_check.py"
    script.write_text(
        LIVE_CHECK_SCRIPT.replace(
            "state = PartialState(cpu=True)", NO_SHARED_KERNEL + "\nstate = PartialState(cpu=True)"
        )
        .replace("register(non_causal,", "register(no_shared,")
        .replace("processes=state.num_processes)", "processes=state.num_processes, share_prompts=True)")
        .replace('"calls": len(calls)}', '"calls": len(calls), "shares": passes.share_prompts}')
    )
    found, output = _on_two_processes(script, tmp_path)
    assert [(f["mode"], f["attention"], f["shares"]) for f in found] == [
        ("packed", VARLEN_ATTENTION, False)
    ] * 2
    assert "prompts not shared: it failed on process 1" in output


TRL_FORWARD = """
def trl_forward(model, ids, mask, keep, rows, compute_entropy):
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True, use_cache=False)
    return out.log_probs[:, -keep:], None, None

"""


def test_processes_of_which_one_runs_a_call_past_the_rope_context_padded_make_as_many_calls(tmp_path):
    """Dynamic RoPE over 5 positions: rank 0's call (6 columns) runs padded, rank 1's (5) packed with shared
    prompts. The live checks, which gather from every process, run on both all the same, so neither waits
    for the other, and both make as many model calls."""
    script = tmp_path / "wide_call.py"
    script.write_text(
        LIVE_CHECK_SCRIPT.replace(
            "state = PartialState(cpu=True)", TRL_FORWARD + "state = PartialState(cpu=True)"
        )
        .replace(
            "if state.process_index == 1:\n    register(non_causal,", "if False:\n    register(non_causal,"
        )
        .replace(
            "vocab_size=97, attn_implementation=VARLEN_ATTENTION,",
            "vocab_size=97, attn_implementation=VARLEN_ATTENTION, max_position_embeddings=5,\n"
            "    rope_scaling={'rope_type': 'dynamic', 'factor': 2.0},",
        )
        .replace(
            "ids = torch.randint(",
            "mask = mask if state.process_index == 0 else torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])\n"
            "ids = torch.randint(",
        )
        .replace("processes=state.num_processes)", "processes=state.num_processes, share_prompts=True)")
        .replace("passes.forward(None,", "passes.forward(trl_forward,")
        .replace('"calls": len(calls)}', '"calls": len(calls), "wide": passes._too_wide(ids.size(1))}')
    )
    found, _ = _on_two_processes(script, tmp_path)
    assert [(f["mode"], f["wide"]) for f in found] == [("packed", True), ("packed", False)]
    assert found[0]["calls"] == found[1]["calls"]


def test_a_model_packing_cannot_serve_falls_back_to_trim_with_one_log_line(tiny_model_dir, tmp_path, caplog):
    model = _float64_model(tiny_model_dir)
    layers = model.config.num_hidden_layers
    model.config.sliding_window, model.config.layer_types = 4, ["sliding_attention"] * layers
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
        report_to="none", use_cpu=True, bf16=False, trim_padding="packed",
    )  # fmt: skip
    with caplog.at_level("INFO", logger="prompt_aug"):
        trainer = PromptAugGRPOTrainer(
            model=model, reward_funcs=_reward, args=args,
            train_dataset=Dataset.from_dict({"prompt": QUESTIONS}),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if "padding-free passes" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("padding-free passes: trim, not packed:") and "sliding window" in lines[0]
    assert trainer.padding_free.mode == "trim"
    assert args.trim_padding == "packed"  # the recipe's value is kept; the trainer chose the path


def test_a_packing_token_budget_with_several_processes_is_refused_by_the_config_while_packing_is_on(tmp_path):
    """A budget splits packed calls, so processes would make different numbers of calls: the config refuses
    it before the model loads, only where packing is on; on the trim path the key is only inert."""
    common = {"output_dir": str(tmp_path), "use_cpu": True, "bf16": False, "packing_max_tokens": 4096}
    with planned_processes(2):
        for mode in ("auto", "packed"):
            with pytest.raises(
                ValueError, match="^packing_max_tokens: splits packed calls, and with 2 processes"
            ):
                PromptAugGRPOConfig(**common, trim_padding=mode)
        with pytest.warns(UserWarning, match="packing_max_tokens: no effect"):
            PromptAugGRPOConfig(**common, trim_padding="trim")
    assert PromptAugGRPOConfig(**common).packing_max_tokens == 4096  # one process
    assert PaddingFreePasses("trim", max_tokens=4096, processes=2).mode == "trim"


@pytest.mark.parametrize(
    ("value", "mode"),
    [(True, "packed"), ("false", "off"), ("trim", "trim"), ("packed", "packed"), ("auto", "auto")],
)
def test_the_old_booleans_still_choose_a_path(tmp_path, value, mode):
    if (
        isinstance(value, bool) or value == "false"
    ):  # the old booleans work, with a warning naming the new value
        with pytest.warns(FutureWarning, match=f"trim_padding: {value} is deprecated; write {mode} instead"):
            args = PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, trim_padding=value)
    else:
        args = PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, trim_padding=value)
    assert args.trim_padding == mode
    with pytest.raises(ValueError, match="trim_padding: 'squash' is not one of auto, packed, trim, off"):
        PromptAugGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, trim_padding="squash")


def test_the_default_is_auto_and_resolves_to_packed_on_cpu_in_one_log_line(tiny_model_dir, tmp_path, caplog):
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=4,
        report_to="none", use_cpu=True, bf16=False,
    )  # fmt: skip
    assert args.trim_padding == "auto"
    with caplog.at_level("INFO", logger="prompt_aug"):
        trainer = PromptAugGRPOTrainer(
            model=_float64_model(tiny_model_dir), reward_funcs=_reward, args=args,
            train_dataset=Dataset.from_dict({"prompt": QUESTIONS}),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if "padding-free passes" in r.getMessage()]
    assert lines == [
        "padding-free passes: packed (auto on cpu; attention prompt_aug_varlen: sdpa on each sequence on cpu)"
    ]
    assert trainer.padding_free.mode == "packed"


# -- the trainer-level bench ---------------------------------------------------------------------------------


def test_padding_bench_trains_each_path_on_the_same_losses_over_two_rounds():
    """bench/padding.py at a tiny shape, two rounds: each path trains through the trainer on the same rounds
    (the bench checks), its losses match padded's (float32), and the ratio lines come last, in --paths
    order; shared prompts run fewer tokens than packed."""
    command = ["bench/padding.py", "--cap", "32", "--hidden", "64", "--layers", "1"]
    result = run_bench([*command, "--rounds", "2", "--paths", "padded,trim,packed,packed-shared"])
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "the last of 2 rounds:" in lines
    losses = printed_losses(result.stdout)
    assert set(losses) == {"padded", "trim", "packed", "packed-shared"}
    assert len(losses["padded"]) == 8  # 4 optimizer steps a round
    for path in ("trim", "packed", "packed-shared"):
        torch.testing.assert_close(losses[path], losses["padded"], rtol=1e-4, atol=1e-6, msg=path)
    assert [line.split("/")[0] for line in lines[-3:]] == ["trim", "packed", "packed-shared"]
    assert all("/padded training-side time: " in line for line in lines[-3:])
    tokens_run = {  # the table's training-side rows: the last column
        line.split()[0]: int(line.split()[-1]) for line in lines if "training side" in line
    }
    assert tokens_run["packed-shared"] < tokens_run["packed"], tokens_run
    # Each path's seconds as it ends, before the table (a step limit may stop the bench before that).
    done = [line.split()[0] for line in lines if " done (" in line]
    assert done == ["padded", "trim", "packed", "packed-shared"]
    # The trainer's own lines reach the log: each path, and the attention its packed calls ran.
    assert "padding-free passes: packed (attention prompt_aug_varlen: sdpa on each sequence on cpu)" in (
        result.stderr.splitlines()
    )
    shared = next(line for line in lines if line.startswith("packed-shared done ("))
    assert "; prompts shared): " in shared and "attention prompt_aug_varlen (sdpa on each sequence" in shared
    assert not any(line.startswith("!!!") for line in lines)  # nothing is marked on CPU
    assert lines.index(next(line for line in lines if " done (" in line)) < lines.index(
        "the last of 2 rounds:"
    )
    refused = run_bench([*command, "--paths", "trim,packed"], timeout=60)
    assert refused.returncode == 2
    assert "--paths: include padded" in refused.stderr


def test_padding_bench_marks_a_packed_path_on_a_gpu_that_timed_a_fallback():
    """Each path's "done" line says which path the trainer took, the attention its calls ran and whether
    prompts were shared; on a GPU, a packed path that did not run the varlen kernel alone, took the trim
    path, or (packed-shared) did not share prompts also gets the reason for a line starting with !!!;
    padded and trim, and any path on CPU, get none."""
    bench = load_bench("padding.py")
    dense = "packed attention: sdpa with a block-diagonal mask, not varlen: the kernel does not take float32"
    kernel = {"path": "packed", "attention": VARLEN_ATTENTION, "ran": [bench.KERNEL_LINE], "shared": True}
    assert bench.how_it_ran("packed-shared", kernel, gpu=True) == (
        f"packed path; attention {VARLEN_ATTENTION} (varlen); prompts shared",
        None,
    )
    how, fallback = bench.how_it_ran("packed", {**kernel, "ran": [dense]}, gpu=True)
    assert how.endswith("not varlen: the kernel does not take float32); prompts per row"), how
    assert fallback.startswith(f"attention {VARLEN_ATTENTION} (sdpa with a block-diagonal mask"), fallback
    assert bench.how_it_ran("packed", {**kernel, "ran": [dense]}, gpu=False)[1] is None
    _, fallback = bench.how_it_ran("packed-shared", {**kernel, "shared": False}, gpu=True)
    assert fallback == "prompts not shared"
    trimmed = {"path": "trim", "attention": "sdpa", "ran": [], "shared": False}
    _, fallback = bench.how_it_ran("packed-shared", trimmed, gpu=True)
    assert fallback == (
        "the trim path, not packed; attention sdpa, not the varlen kernel alone; prompts not shared"
    )
    padded = {"path": "off", "attention": "sdpa", "ran": [], "shared": False}
    assert bench.how_it_ran("padded", padded, gpu=True) == ("off path; attention sdpa; prompts per row", None)
    assert bench.how_it_ran("trim", {**padded, "path": "trim"}, gpu=True)[1] is None


def test_padding_bench_path_that_fails_is_reported_and_the_others_compared():
    """A path that fails (here trim, out of memory) is reported with its error; the next path runs and is
    compared with padded as usual."""
    patch = """
        run = bench.run
        def failing(model_path, out, trim_padding, *args):
            if trim_padding == 'trim':
                raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
            return run(model_path, out, trim_padding, *args)
        bench.run = failing
        sys.argv = ['padding.py', '--cap', '32', '--hidden', '64', '--layers', '1',
                    '--paths', 'padded,trim,packed']
    """
    result = run_patched_bench("padding.py", patch, "bench.main()")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    failed = "trim: failed (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)"
    assert f"{failed}; the other paths run" in lines
    assert set(printed_losses(result.stdout)) == {"padded", "packed"}
    assert lines[-1].startswith("packed/padded training-side time: ")


def test_padding_bench_runs_a_saved_model_of_another_architecture(tmp_path):
    """``--model`` runs the bench on a saved model's folder (here a tiny Llama, SmolLM2's architecture)
    instead of the random Qwen2: packed gives padded's losses, and the header names the folder; a folder
    without a config is refused in one line."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from prompt_aug.demo.smoke import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    result = run_bench(
        ["bench/padding.py", "--model", str(folder), "--cap", "16", "--paths", "padded,packed"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    header = next(line for line in result.stdout.splitlines() if line.startswith("device: "))
    assert "tiny-llama, 64 wide, 1 layers" in header, header
    losses = printed_losses(result.stdout)
    torch.testing.assert_close(losses["packed"], losses["padded"], rtol=1e-4, atol=1e-6)
    refused = run_bench(["bench/padding.py", "--model", str(tmp_path), "--paths", "padded"], timeout=60)
    assert refused.returncode == 2
    assert f"--model {tmp_path}: no config.json there" in refused.stderr
