"""Collapse, watched and handled: the guard's decisions, its checkpoints and clean stop, ProRL's optimizer
reset, RLinf's mini-batch skip and ±5 reward, the ProRL recipe and the plot marks (the README table is
checked in test_docs.py).

The end-to-end runs use the smoke recipe (tiny random model, CPU). A near-greedy temperature (0.05) makes
that model "collapse" for real: its entropy falls to ~0.005 nats and every completion loops on a newline,
which trips the smoke recipe's own guard. The smoke reward (correctness + format) gives this model no spread
within a group, so the tests that need weights to move use `_spread_reward` instead.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
import yaml
from launch import torchrun
from transformers import TrainerState

from prompt_aug import train
from prompt_aug.config import PromptAugGRPOConfig
from prompt_aug.extensions.collapse import (
    ACCURACY_KEYS,
    REPETITION_KEY,
    CollapseGuard,
    SignalSpec,
    guard_from_args,
)
from prompt_aug.extensions.stabilisers import zero_optimizer_state
from prompt_aug.faults import COLLAPSE_STOP_FILE
from prompt_aug.records import generation_round
from rewards import get_reward_funcs

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
PAPER = REPO / "recipes/qwen2.5-math-1.5b"


# ---------------------------------------------------------------------------------------------------------
# The guard's decisions on synthetic metric streams (one log line per round unless said otherwise)


def _guard(*specs: SignalSpec, steps_per_round: float = 1.0) -> CollapseGuard:
    return CollapseGuard(list(specs), steps_per_round=steps_per_round)


def _feed(guard: CollapseGuard, stream: list[dict]) -> dict[int, list[str]]:
    """Step -> signals fired on that log line; also checks each fired line carries collapse/fired/<signal>."""
    fired = {}
    for entry in stream:
        metrics, firings = guard.observe(entry)
        if firings:
            fired[entry["step"]] = [f.signal for f in firings]
            assert all(metrics[f"collapse/fired/{f.signal}"] == 1.0 for f in firings)
        else:
            assert not any(k.startswith("collapse/fired/") for k in metrics)
    return fired


ENTROPY = SignalSpec("entropy", ("entropy",), "below", 0.05, 3, "stop")
ACCURACY = SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.15, 3, "checkpoint")
TRUNCATION = SignalSpec("truncation", ("completions/clipped_ratio",), "above", 0.5, 2, "checkpoint")
REPETITION = SignalSpec("repetition", (REPETITION_KEY,), "above", 0.2, 4, "log")
EVAL = SignalSpec("eval", ("eval/macro",), "drop", 0.05, 2, "checkpoint")


def test_entropy_fires_on_the_third_round_below_the_floor_once_and_again_after_recovering():
    values = [1.0] * 10 + [0.01] * 6 + [0.5] + [0.01] * 3
    fired = _feed(_guard(ENTROPY), [{"step": i + 1, "entropy": v} for i, v in enumerate(values)])
    # Rounds 11-16 are below: fires at round 13, not again while low; recovers at 17, below from 18: fires
    # at 20.
    assert fired == {13: ["entropy"], 20: ["entropy"]}


def test_accuracy_fires_when_the_3_round_mean_falls_more_than_0_15_below_its_best():
    values = [0.3, 0.4, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.2]
    key = "rewards/correctness_reward/mean"
    fired = _feed(_guard(ACCURACY), [{"step": i + 1, key: v, "reward": 9.0} for i, v in enumerate(values)])
    # Round 7: mean(0.5, 0.5, 0.2) = 0.4, 0.1 below the best 0.5 (allowed); round 8: 0.3, 0.2 below: fires.
    assert fired == {8: ["accuracy"]}


def test_accuracy_falls_back_to_total_reward_when_no_correctness_reward_is_logged():
    values = [1.0, 1.2, 1.2, 1.2, 0.2, 0.2, 0.2]
    fired = _feed(_guard(ACCURACY), [{"step": i + 1, "reward": v} for i, v in enumerate(values)])
    assert fired == {5: ["accuracy"]}  # mean(1.2, 1.2, 0.2) = 0.867 is 0.333 below the best 1.2


def test_truncation_and_repetition_fire_after_their_windows_above_the_ceiling():
    trunc = [0.1, 0.6, 0.1, 0.6, 0.7, 0.8]
    rep = [0.0, 0.3, 0.3, 0.3, 0.1, 0.3, 0.3, 0.3, 0.3]
    stream = [
        {
            "step": i + 1,
            **({"completions/clipped_ratio": trunc[i]} if i < len(trunc) else {}),
            REPETITION_KEY: r,
        }
        for i, r in enumerate(rep)
    ]
    fired = _feed(_guard(TRUNCATION, REPETITION), stream)
    # Truncation: one round above at 2 is not enough, 4-5 is; repetition: 2-4 is 3 rounds, 6-9 is 4.
    assert fired == {5: ["truncation"], 9: ["repetition"]}


def test_a_diverged_run_logging_nan_or_inf_counts_as_past_the_threshold_and_the_message_says_so():
    nan, inf = float("nan"), float("inf")

    def fired(spec: SignalSpec, stream: list[dict]) -> dict[int, str]:
        guard = _guard(spec)
        return {e["step"]: f.detail for e in stream for f in guard.observe(e)[1]}

    entropy = fired(ENTROPY, [{"step": i, "entropy": 0.5 if i <= 3 else nan} for i in range(1, 10)])
    assert list(entropy) == [6]  # the third NaN round: a stop
    assert "below the floor 0.05 or not finite" in entropy[6] and "NaN, NaN, NaN" in entropy[6]
    stream = [{"step": i, "completions/clipped_ratio": 0.1 if i <= 2 else inf} for i in range(1, 6)]
    truncation = fired(TRUNCATION, stream)
    assert list(truncation) == [4] and "inf, inf" in truncation[4]
    key = "rewards/correctness_reward/mean"  # read even when NaN, not the finite reward behind it
    accuracy = fired(
        ACCURACY, [{"step": i, key: 0.6 if i <= 5 else nan, "reward": 0.6} for i in range(1, 12)]
    )
    assert list(accuracy) == [6] and "averaged NaN over rounds 4-6: not finite" in accuracy[6]
    values = [
        0.5,
        0.5,
        0.5,
        inf,
        0.5,
        0.5,
        0.5,
        0.5,
        0.5,
        0.5,
        0.1,
        0.1,
        0.1,
    ]  # an infinite best hides no fall
    assert list(fired(ACCURACY, [{"step": i + 1, key: v} for i, v in enumerate(values)])) == [4, 12]


def test_with_truncated_completions_masked_entropy_skips_every_line_trained_only_on_fully_cut_rounds():
    # Two optimizer steps a round; TRL logs a round's clipped_ratio on its first line only. A round cut in
    # full trains on no token, and TRL logs its entropy as 0.
    args = train.parse_args(["--config", SMOKE, "--dry_run", "--mask_truncated_completions", "true"])
    guard = guard_from_args(args.training_args, 2)
    spec = next(s for s in guard.specs if s.name == "entropy")
    assert spec.masked_by == ("completions/clipped_ratio",)
    entropy = SignalSpec("entropy", ("entropy",), "below", 0.05, 1, "log", spec.masked_by)
    cut, kept = {"completions/clipped_ratio": 1.0}, {"completions/clipped_ratio": 0.5}
    stream = [
        {"step": 1, "round": 1, "entropy": 0.0, **cut},
        {"step": 2, "round": 1, "entropy": 0.0},
        {"step": 3, "round": 2, "entropy": 0.01, **kept},  # a low entropy where tokens were trained on
        {"step": 4, "round": 2, "entropy": 0.01},
    ]
    assert _feed(_guard(entropy, steps_per_round=2), stream) == {4: ["entropy"]}
    # Lines of 3 steps: the one at step 6 trains on the end of round 2 (not cut) beside all of round 3 (cut),
    # so it is read; the one at step 9 trains on round 4 and 5, both cut, and is not.
    guard = _guard(entropy, steps_per_round=2)
    guard.logging_steps = 3
    stream = [
        {"step": 3, "round": 2, "entropy": 0.5, "completions/clipped_ratio": 0.5},
        {"step": 6, "round": 3, "entropy": 0.01, **cut},
        {"step": 9, "round": 5, "entropy": 0.0, **cut},
    ]
    assert [e["step"] for e in stream if "collapse/entropy" in guard.observe(e)[0]] == [3, 6]


def test_under_dynamic_sampling_entropy_skips_a_round_whose_trained_rows_were_all_cut():
    """TRL's entropy is the trained rows'; under dynamic sampling both truncation shares TRL and the sampler
    log cover every row generated, dropped flat groups included. A round whose trained rows were all cut
    (entropy logged as 0) is skipped by the share of the rows trained, which the sampler logs."""
    from prompt_aug.records import GENERATED, TRAINED_CLIPPED

    argv = [
        "--config",
        SMOKE,
        "--dry_run",
        "--mask_truncated_completions",
        "true",
        "--dynamic_sampling",
        "true",
    ]
    args = train.parse_args(argv)
    spec = next(s for s in guard_from_args(args.training_args, 1).specs if s.name == "entropy")
    assert spec.masked_by == (TRAINED_CLIPPED,)
    entropy = SignalSpec("entropy", ("entropy",), "below", 0.05, 1, "log", spec.masked_by)
    generated = {GENERATED + "completions/clipped_ratio": 0.75, "completions/clipped_ratio": 0.75}
    stream = [
        {"step": 1, "round": 1, "entropy": 0.0, TRAINED_CLIPPED: 1.0, **generated},  # no token trained
        {"step": 2, "round": 2, "entropy": 0.01, TRAINED_CLIPPED: 0.5, **generated},  # a real low reading
    ]
    assert _feed(_guard(entropy, steps_per_round=1), stream) == {2: ["entropy"]}


def test_eval_fires_on_the_evaluation_whose_2_eval_mean_falls_more_than_0_05():
    evals = [0.30, 0.32, 0.34, 0.36, 0.25, 0.20]
    stream = []
    for step in range(1, 31):
        entry = {"step": step, "entropy": 0.5}
        if step % 5 == 0:
            entry["eval/macro"] = evals[step // 5 - 1]
        stream.append(entry)
    # Means of 2: .31 .33 .35 .305 (0.045 below .35: allowed) .225 (0.125 below): the 6th evaluation, step 30.
    assert _feed(_guard(EVAL), stream) == {30: ["eval"]}


def test_each_evaluation_counts_one_even_when_several_fall_in_one_round():
    # eval_every_steps 2 at 4 optimizer steps a round: two evaluations a round, each one of the window's 2.
    guard = _guard(SignalSpec("eval", ("eval/macro",), "drop", 0.04, 2, "stop"), steps_per_round=4)
    evals = {2: 0.4, 4: 0.4, 6: 0.4, 8: 0.3}
    stream = [
        {"step": s, "entropy": 0.5, **({"eval/macro": evals[s]} if s in evals else {})} for s in range(1, 9)
    ]
    # The last 2 evaluations average 0.35, 0.05 below the best 0.4: it fires at step 8. Averaged by round
    # (0.4, then 0.35) the fall would be 0.025, and it would not.
    assert _feed(guard, stream) == {8: ["eval"]}


def test_the_eval_message_names_the_evaluations_and_their_rounds():
    guard = _guard(SignalSpec("eval", ("eval/macro",), "drop", 0.05, 2, "stop"))
    firings = []
    for r, v in [(5, 0.3), (10, 0.32), (15, 0.36), (20, 0.36), (25, 0.2)]:
        firings += guard.observe({"step": r, "round": r, "eval/macro": v})[1]
    (firing,) = firings
    assert "averaged 0.28 over the last 2 evaluations (rounds 20-25)" in firing.detail, firing.detail


def test_the_logged_run_keeps_counting_past_the_window_and_restarts_after_a_recovery():
    # collapse/entropy is the rounds in a row below the floor: it does not stop at the window's 3.
    guard = _guard(ENTROPY)
    values = [0.01] * 6 + [0.5] + [0.01] * 2
    stream = [{"step": r, "round": r, "entropy": v} for r, v in enumerate(values, 1)]
    logged = [guard.observe(entry)[0]["collapse/entropy"] for entry in stream]
    assert logged == [1, 2, 3, 4, 5, 6, 0, 1, 2]
    # A line standing for several rounds counts for each of them.
    guard = _guard(ENTROPY)
    stream = [{"step": 4 * r, "round": 2 * r, "entropy": 0.01} for r in range(1, 5)]
    assert [guard.observe(e)[0]["collapse/entropy"] for e in stream] == [2, 4, 6, 8]


def test_windows_count_rounds_not_log_lines():
    # 2 optimizer steps per round, a log line per step: rounds are steps (1,2), (3,4), (5,6), ...
    guard = _guard(ENTROPY, steps_per_round=2)
    stream = [{"step": s, "entropy": 1.0 if s <= 2 else 0.01} for s in range(1, 11)]
    assert _feed(guard, stream) == {8: ["entropy"]}  # rounds 2, 3, 4 below: the last line of round 4
    # A `round` key (logged by the trainer) wins over the step; attached, the guard counts rounds as the
    # trainer does (here a round a step).
    guard = _guard(ENTROPY, steps_per_round=2)
    guard.round_of_step = lambda step: step
    stream = [{"step": s, "round": s, "entropy": 1.0 if s <= 2 else 0.01} for s in range(1, 11)]
    assert _feed(guard, stream) == {5: ["entropy"]}


def test_a_round_is_judged_once_on_the_mean_of_all_its_lines():
    # 4 optimizer steps a round, a line a step. Round 3 starts below the floor of 0.2 but its mean (0.38) is
    # not; round 4's mean (0.13) is, though its running mean crosses the floor and back (steps 13-15). Only
    # round 4 fires, once, at its last step.
    floor = SignalSpec("entropy", ("entropy",), "below", 0.2, 1, "checkpoint")
    values = [0.5] * 8 + [0.01, 0.5, 0.5, 0.5] + [0.01, 0.5, 0.01, 0.01]
    stream = [{"step": s, "round": (s + 3) // 4, "entropy": v} for s, v in enumerate(values, 1)]
    assert _feed(_guard(floor, steps_per_round=4), stream) == {16: ["entropy"]}
    # A line every 6 steps: each is its round's last line (the next falls in a later round), judged at once.
    guard = _guard(floor, steps_per_round=4)
    guard.on_train_begin(
        None, SimpleNamespace(logging_steps=6, log_history=[], is_world_process_zero=False), None
    )
    stream = [{"step": s, "round": (s + 3) // 4, "entropy": 0.01} for s in (6, 12, 18)]
    assert _feed(guard, stream) == {6: ["entropy"]}
    # The trainer's round count knows an epoch's short step (2 micro-steps a step, 3 a round, 9 an epoch):
    # round 5 is steps 7-8, whose mean (0.255) is above the floor though its first line is not.
    args = SimpleNamespace(gradient_accumulation_steps=2, steps_per_generation=3, num_iterations=1)
    guard = _guard(floor, steps_per_round=1.5)
    guard.round_of_step = lambda step: generation_round(step, args, 9)
    low = {7: 0.01}
    stream = [{"step": s, "round": guard.round_of_step(s), "entropy": low.get(s, 0.5)} for s in range(1, 16)]
    assert _feed(guard, stream) == {}
    # A line that closes an earlier round below the floor and judges its own, above it, fires for neither.
    guard = _guard(floor, steps_per_round=4)
    stream = [{"step": 6, "round": 2, "entropy": 0.01}, {"step": 12, "round": 3, "entropy": 0.9}]
    assert _feed(guard, stream) == {}
    # TRL logs a round's rewards on its first line only: the round's last line, without them, judges them.
    drop = SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.1, 1, "checkpoint")
    rewards = {1: 0.5, 3: 0.5, 5: 0.2}  # rounds of 2 steps
    stream = [{"step": s, "round": (s + 1) // 2, **({"reward": rewards[s]} if s in rewards else {})}
              for s in range(1, 7)]  # fmt: skip
    assert _feed(_guard(drop, steps_per_round=2), stream) == {6: ["accuracy"]}


def test_a_firing_on_the_end_of_training_line_is_logged_and_asks_for_no_save_or_stop():
    from transformers import TrainerControl

    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.2, 1, "stop"), steps_per_round=4)
    state = SimpleNamespace(is_world_process_zero=True, global_step=6, max_steps=6, log_history=[])
    args = SimpleNamespace(save_total_limit=2, output_dir="unused")
    control = TrainerControl()
    guard.on_log(args, state, control, logs={"step": 4, "round": 1, "entropy": 0.5})
    # logging_steps 4 does not divide max_steps 6: steps 5-6 are in the Trainer's last line only.
    final = {"step": 6, "round": 2, "entropy": 0.01, "train_runtime": 12.0}
    guard.on_log(args, state, control, logs=final)
    assert [f.signal for f in guard.fired] == ["entropy"] and final["collapse/fired/entropy"] == 1.0
    assert not control.should_save and not control.should_training_stop and args.save_total_limit == 2
    guard.on_train_end(args, state, control)
    assert guard.stop_message is None and guard.checkpoints == []


def test_a_log_line_spanning_several_rounds_counts_for_each_of_them():
    # TRL's logging_steps of 10 at 4 optimizer steps a round: a log line every 2.5 rounds, its metrics the
    # mean over them. A window of 20 rounds is the 8 lines up to round 20, not 20 lines (round 50).
    below = SignalSpec("entropy", ("entropy",), "below", 0.05, 20, "stop")
    rounds = [int(2.5 * i) for i in range(1, 30)]  # 2, 5, 7, 10, ...
    stream = [{"step": 10 * i, "round": r, "entropy": 0.01} for i, r in enumerate(rounds, 1)]
    fired = _feed(_guard(below), stream)
    assert fired == {80: ["entropy"]} and rounds[7] == 20
    # A drop over 4 rounds with a line every 2 rounds: the mean of the last two lines.
    drop = SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.2, 4, "log")
    values = [0.5, 0.5, 0.5, 0.5, 0.2, 0.2]
    stream = [{"step": 2 * i, "round": 2 * i, "reward": v} for i, v in enumerate(values, 1)]
    # Round 10: mean(0.5, 0.2) is 0.15 below the best 0.5 (allowed); round 12: 0.3 below, it fires.
    # Counting lines, the window would be the last four: 0.425, then 0.35 (allowed), never firing.
    assert _feed(_guard(drop), stream) == {12: ["accuracy"]}


def test_a_signal_missing_from_earlier_lines_counts_from_the_previous_line_not_from_round_0():
    # A resumed run whose history never logged the repetition ratio (or a gap in it): the first line that
    # has it stands for one round, the rounds since the previous log line, not for all rounds before it.
    history = [{"step": r, "round": r, "entropy": 1.0} for r in range(1, 501)]
    looping = [{"step": r, "round": r, REPETITION_KEY: 0.9} for r in range(501, 520)]
    guard = _guard(SignalSpec("repetition", (REPETITION_KEY,), "above", 0.5, 10, "log"))
    assert _feed(guard, history + looping) == {510: ["repetition"]}
    gap = [{"step": 1, "round": 1, REPETITION_KEY: 0.1}] + [{"step": r, "round": r} for r in range(2, 11)]
    guard = _guard(SignalSpec("repetition", (REPETITION_KEY,), "above", 0.5, 3, "log"))
    after = [{"step": r, "round": r, REPETITION_KEY: 0.9} for r in range(11, 15)]
    assert _feed(guard, gap + after) == {13: ["repetition"]}  # rounds 11-13, not 2-11 on the first line


def test_a_noisy_but_healthy_run_trips_nothing():
    rng = random.Random(0)
    guard = _guard(
        SignalSpec("entropy", ("entropy",), "below", 0.1, 5, "stop"),
        SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.1, 10, "stop"),
        SignalSpec("truncation", ("completions/clipped_ratio",), "above", 0.3, 5, "stop"),
        SignalSpec("repetition", (REPETITION_KEY,), "above", 0.2, 5, "stop"),
        SignalSpec("eval", ("eval/macro",), "drop", 0.08, 3, "stop"),
        steps_per_round=4,
    )
    stream = []
    for step in range(1, 1201):  # 300 rounds of 4 steps
        entry = {"step": step, "entropy": 0.5 - step / 6000 + rng.gauss(0, 0.08)}  # 0.5 -> 0.3, noisy
        if step % 4 == 1:
            entry["rewards/correctness_reward/mean"] = 0.3 + step / 6000 + rng.gauss(0, 0.05)
            entry["completions/clipped_ratio"] = max(0.0, 0.08 + rng.gauss(0, 0.05))
            entry[REPETITION_KEY] = max(0.0, 0.03 + rng.gauss(0, 0.03))
        if step % 100 == 0:
            entry["eval/macro"] = 0.35 + step / 12000 + rng.gauss(0, 0.02)
        stream.append(entry)
    assert _feed(guard, stream) == {}
    # The same run with a real collapse appended does trip the entropy floor and the accuracy fall.
    tail = [
        {"step": s, "entropy": 0.02, "rewards/correctness_reward/mean": 0.1} for s in range(1201, 1261, 4)
    ]
    fired = _feed(guard, tail)
    assert {s for signals in fired.values() for s in signals} == {"entropy", "accuracy"}


def test_replaying_a_history_continues_where_the_interrupted_guard_was():
    stream = [{"step": i + 1, "entropy": v} for i, v in enumerate([1.0] * 4 + [0.01] * 6)]
    whole = _feed(_guard(ENTROPY), stream)
    resumed = _guard(ENTROPY)

    class State:  # what the Trainer hands to on_train_begin on resume: the restored log history
        log_history = stream[:5]
        is_world_process_zero = False

    resumed.on_train_begin(None, State(), None)
    assert _feed(resumed, stream[5:]) == whole == {7: ["entropy"]}


def test_bad_guard_keys_name_the_key():
    def parse(*extra):
        return train.parse_args(["--config", SMOKE, "--dry_run", *extra]).training_args

    # The config checks its keys when parsed (its __post_init__), one line naming the key and the recipe.
    with pytest.raises(ValueError, match=r"tiny_cpu.yaml: collapse_entropy_action: 'halt' is not one of"):
        parse("--collapse_entropy_action", "halt")
    with pytest.raises(ValueError, match="collapse_truncation_rounds: must be at least 1, got 0"):
        parse("--collapse_truncation_ceiling", "0.5", "--collapse_truncation_rounds", "0")
    with pytest.raises(ValueError, match="collapse_eval_drop is set but evaluation during training is off"):
        parse("--collapse_eval_drop", "0.05")
    # Built in code, the config checks the same keys.
    with pytest.raises(ValueError, match="collapse_entropy_action"):
        PromptAugGRPOConfig(
            output_dir="unused", use_cpu=True, collapse_entropy_floor=0.1, collapse_entropy_action="halt"
        )
    # guard_from_args names the key for an object that skipped those checks.
    args = parse()
    args.collapse_entropy_action = "halt"
    with pytest.raises(ValueError, match="collapse_entropy_action"):
        guard_from_args(args, 2)
    # From the command line: one line, no traceback (prompt-aug-train exits with it).
    with pytest.raises(SystemExit, match="^prompt-aug-train: error: .*reset_optimizer_on_ref_sync"):
        train.main(["--config", SMOKE, "--dry_run", "--reset_optimizer_on_ref_sync", "true"])
    schedule_free = ["--sync_ref_model", "true", "--beta", "0.01", "--optim", "schedule_free_adamw"]
    with pytest.raises(
        SystemExit, match="^prompt-aug-train: error: .*optim schedule_free_adamw keeps an iterate"
    ):
        train.main(["--config", SMOKE, "--dry_run", "--reset_optimizer_on_ref_sync", "true", *schedule_free])
    with pytest.raises(SystemExit, match="^prompt-aug-train: error: .*skip_minibatch_ratio_above"):
        train.main(["--config", SMOKE, "--dry_run", "--skip_minibatch_ratio_above", "0.5"])
    with pytest.raises(SystemExit, match="^prompt-aug-train: error: .*collapse_entropy_action"):
        train.main(["--config", SMOKE, "--dry_run", "--collapse_entropy_action", "halt"])


def test_stabiliser_and_guard_values_that_cannot_work_are_refused_at_parse_or_dry_run():
    def parse(*extra):
        return train.parse_args(["--config", SMOKE, "--dry_run", *extra]).training_args

    # TRL's reference sync divides by its interval at every step, and needs a reference (beta > 0).
    with pytest.raises(ValueError, match="ref_model_sync_steps: must be at least 1 with sync_ref_model"):
        parse("--sync_ref_model", "true", "--beta", "0.001", "--ref_model_sync_steps", "0")
    with pytest.raises(ValueError, match="sync_ref_model: true needs beta > 0"):
        parse("--sync_ref_model", "true", "--beta", "0")
    # A share written as a percentage could never fire; NaN never compares.
    with pytest.raises(ValueError, match="collapse_truncation_ceiling: must be at most 1, got 90"):
        parse("--collapse_truncation_ceiling", "90")
    with pytest.raises(ValueError, match="collapse_entropy_floor: must be at least 0, got -0.1"):
        parse("--collapse_entropy_floor", "-0.1")
    with pytest.raises(ValueError, match="skip_minibatch_ratio_above: is NaN"):
        parse("--skip_minibatch_ratio_above", "nan")
    # The dynamic-sampling signal names a reward function: checked in the dry run, not at the first round.
    with pytest.raises(SystemExit, match="dynamic_sampling_signal: 'corectness' is neither 'total' nor one"):
        train.main(["--config", SMOKE, "--dry_run", "--dynamic_sampling", "true",
                    "--dynamic_sampling_signal", "corectness"])  # fmt: skip


def test_a_guard_threshold_that_can_never_fire_is_refused_naming_the_key(tmp_path):
    def parse(*extra):
        return train.parse_args(["--config", SMOKE, "--dry_run", *extra]).training_args

    pair, pm5, fmt = (get_reward_funcs(names) for names in (["correctness", "format"], ["correctness_pm5"],
                                                            ["format"]))  # fmt: skip
    # A fall of a share written as a percentage: the share right cannot fall by 5, whatever the reward scale.
    for funcs in (pair, pm5):
        with pytest.raises(ValueError, match=r"^collapse_accuracy_drop: 5 can never fire: completions/accur"):
            guard_from_args(parse("--collapse_accuracy_drop", "5"), 1, funcs)
    chosen = parse("--collapse_accuracy_drop", "1", "--collapse_accuracy_metric", "templates/t1/accuracy")
    with pytest.raises(ValueError, match="collapse_accuracy_drop: 1 can never fire: templates/t1/accuracy"):
        guard_from_args(chosen, 1, pair)
    evaluating = ("--eval_benchmarks", "math500", "--eval_every_steps", "2")
    with pytest.raises(ValueError, match=r"^collapse_eval_drop: 10 can never fire: eval/macro is a share"):
        guard_from_args(parse("--collapse_eval_drop", "10", *evaluating), 1, pair)
    # A ceiling of 1 on a share: every completion cut or looping is not above it.
    for signal in ("truncation", "repetition"):
        with pytest.raises(ValueError, match=rf"^collapse_{signal}_ceiling: 1 can never fire: .* below 1"):
            guard_from_args(parse(f"--collapse_{signal}_ceiling", "1"), 1, pair)
        assert guard_from_args(parse(f"--collapse_{signal}_ceiling", "0.99"), 1, pair) is not None
    with pytest.raises(ValueError, match="collapse_entropy_floor: is infinite; give a finite number"):
        parse("--collapse_entropy_floor", "inf")  # refused with the recipe, as every key of ours is
    # Without a correctness reward the signal reads the total reward, whose scale is the recipe's.
    assert guard_from_args(parse("--collapse_accuracy_drop", "2"), 1, fmt) is not None
    assert guard_from_args(parse("--collapse_accuracy_drop", "0.99"), 1, pair) is not None
    # prompt-aug-train refuses it in one line naming where it was set, before anything is read.
    where = f"command line --collapse_accuracy_drop, overriding {SMOKE}"
    with pytest.raises(SystemExit) as refused:
        train.main(
            ["--config", SMOKE, "--output_dir", str(tmp_path / "out"), "--collapse_accuracy_drop", "20"]
        )
    assert str(refused.value).startswith(
        f"prompt-aug-train: error: {where}: collapse_accuracy_drop: 20 can never"
    )
    assert not (tmp_path / "out").exists()
    # ... and so does its dry run.
    with pytest.raises(SystemExit) as refused:
        train.main(["--config", SMOKE, "--dry_run", "--collapse_accuracy_drop", "1.5"])
    assert str(refused.value).startswith(
        f"prompt-aug-train: error: {where}: collapse_accuracy_drop: 1.5 can never"
    )


def test_a_guard_that_saves_or_stops_is_refused_when_no_log_line_would_reach_it():
    def parse(*extra):
        return train.parse_args(["--config", SMOKE, "--dry_run", *extra]).training_args

    # The smoke recipe's entropy signal stops, its accuracy signal saves; the guard reads log lines.
    with pytest.raises(ValueError, match=r"collapse_entropy_action: stop .* logging_strategy is no.* steps"):
        parse("--logging_strategy", "no")
    with pytest.raises(ValueError, match=r"collapse_accuracy_action: checkpoint .* logging_strategy is no"):
        parse("--logging_strategy", "no", "--collapse_entropy_action", "log")
    # Watches whose action is only a log line: kept, with a warning naming each, as they see nothing.
    with pytest.warns(UserWarning) as warned:
        logged_only = parse(
            "--logging_strategy",
            "no",
            "--collapse_entropy_action",
            "log",
            "--collapse_accuracy_action",
            "log",
        )
    blind = [str(w.message).split(":")[0] for w in warned if "logging_strategy is no" in str(w.message)]
    assert set(blind) == {"collapse_entropy_floor", "collapse_accuracy_drop", "collapse_repetition_ceiling"}
    assert guard_from_args(logged_only, 1) is not None
    # Evaluation during training logs a line at each evaluation, with the training metrics since the last.
    with_eval = parse("--logging_strategy", "no", "--eval_benchmarks", "math500", "--eval_every_steps", "2")
    assert with_eval.logging_strategy == "no"


def test_guard_is_off_unless_a_threshold_is_set():
    paper = train.parse_args(["--config", str(PAPER / "prompt_aug.yaml"), "--dry_run"]).training_args
    assert guard_from_args(paper, 4) is None
    smoke = guard_from_args(train.parse_args(["--config", SMOKE, "--dry_run"]).training_args, 2)
    assert {s.name for s in smoke.specs} == {"entropy", "accuracy", "repetition"}


def test_with_dynamic_sampling_the_guard_reads_accuracy_over_everything_generated():
    # Dynamic sampling trains only groups with a spread, so TRL's accuracy over the trained rows stays near
    # a half while the model fails more and more of what it generates: the guard reads the latter.
    def guard(*extra):
        args = train.parse_args(["--config", SMOKE, "--dry_run", *extra]).training_args
        return guard_from_args(args, 1)

    generated = "dynamic_sampling/generated/rewards/correctness_reward/mean"
    stream = [
        {"step": r, "round": r, "rewards/correctness_reward/mean": 0.5, generated: 0.6 if r < 4 else 0.0}
        for r in range(1, 8)
    ]
    assert _feed(guard("--dynamic_sampling", "true"), stream) == {5: ["accuracy"]}
    assert _feed(guard(), stream) == {}  # without dynamic sampling the trained rows are everything generated
    trained = "rewards/correctness_reward/mean"
    chosen = guard("--dynamic_sampling", "true", "--collapse_accuracy_metric", trained)
    assert next(s for s in chosen.specs if s.name == "accuracy").keys == (trained,)


def test_with_dynamic_sampling_a_chosen_share_right_reads_the_one_logged_over_everything_generated():
    # Under dynamic sampling the share right is logged only under dynamic_sampling/generated/: naming its
    # plain key (the documented default) must not leave the accuracy signal reading nothing.
    args = train.parse_args(
        ["--config", SMOKE, "--dry_run", "--dynamic_sampling", "true"]
        + ["--collapse_accuracy_metric", "completions/accuracy"]
    ).training_args
    stream = [
        {"step": r, "round": r, "dynamic_sampling/generated/completions/accuracy": 0.6 if r < 4 else 0.0}
        for r in range(1, 8)
    ]
    assert _feed(guard_from_args(args, 1), stream) == {5: ["accuracy"]}


# ---------------------------------------------------------------------------------------------------------
# End to end: a collapsing CPU run trips the guard, keeps named checkpoints through rotation, stops cleanly


def _history(run: Path) -> list[dict]:
    return json.loads((run / "trainer_state.json").read_text())["log_history"]


SLOW_SECOND_RANK = """
import sys, time
from transformers import Trainer
from prompt_aug import train

save = Trainer._save_rng_state
def slow(self, output_dir):  # the second process writes its part of the checkpoint last
    if self.args.process_index == 1:
        time.sleep(3)
    return save(self, output_dir)
Trainer._save_rng_state = slow
train.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_on_two_processes_the_collapse_checkpoint_holds_every_processs_part(tmp_path):
    """Each process writes its random state into the checkpoint; the guard renames the folder only once all
    have, so the collapse checkpoint holds both and no stray checkpoint-1 holds the late one."""
    script = tmp_path / "slow_second_rank.py"
    script.write_text(SLOW_SECOND_RANK)
    out = tmp_path / "run"
    flags = ["--temperature", "0.05", "--collapse_repetition_rounds", "1", "--collapse_repetition_action",
             "checkpoint", "--max_steps", "2", "--save_strategy", "no"]  # fmt: skip
    command = [*torchrun(2), str(script), "--config", SMOKE, "--output_dir", str(out), *flags]
    result = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = out / "_collapse-repetition-round1"  # judged at step 2, the end of round 1
    assert sorted(p.name for p in saved.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
    assert not list(out.glob("checkpoint-*"))
    # The process count a resume checks was written before the rename.
    assert json.loads((saved / "launch.json").read_text())["processes"] == 2


def _save_as_the_trainer_does(
    guard: CollapseGuard, args, step: int, scheduled: bool, signal_in_save: bool = False, best: bool = False
) -> TrainerState:
    """The guard fires on a log line at ``step``; the Trainer writes checkpoint-<step> (with its state, which
    names it the best model when an evaluation at ``step`` was a new ``best``), rotates with transformers'
    own function, then calls ``on_save`` (after the preemption callback, which stops the run there when
    ``signal_in_save``). Returns the Trainer's state."""
    from transformers import TrainerControl
    from transformers.trainer_utils import rotate_checkpoints

    state = TrainerState(global_step=step, max_steps=100)
    control = TrainerControl(should_save=scheduled)
    guard.on_log(args, state, control, logs={"step": step, "entropy": 0.0})
    assert control.should_save
    folder = Path(args.output_dir) / f"checkpoint-{step}"
    folder.mkdir()
    if best:
        state.best_model_checkpoint, state.best_global_step = str(folder), step
        state.save_to_json(str(folder / "trainer_state.json"))
    rotate_checkpoints(
        args.output_dir,
        save_total_limit=args.save_total_limit,
        best_model_checkpoint=state.best_model_checkpoint,
        use_mtime=False,
    )
    control.should_training_stop = signal_in_save
    guard.on_save(args, state, control)
    return state


@pytest.mark.parametrize("limit", [1, 2, None])
def test_a_collapse_save_never_costs_a_regular_checkpoint_and_a_scheduled_one_is_kept_too(tmp_path, limit):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=limit, report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    regular = ["checkpoint-2", "checkpoint-4"][-(limit or 2) :]  # what the rotation has left so far
    for name in regular:
        (tmp_path / name).mkdir()

    _save_as_the_trainer_does(guard, args, 5, scheduled=False)  # renamed away, nothing rotated out for it
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == regular
    assert args.save_total_limit == limit
    assert (tmp_path / "_collapse-entropy-round5").is_dir()

    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))  # fires again
    _save_as_the_trainer_does(guard, args, 6, scheduled=True)  # kept as checkpoint-6 and copied
    kept = (regular + ["checkpoint-6"])[-(limit or 3) :]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == kept
    assert (tmp_path / "_collapse-entropy-round6").is_dir()


def test_a_collapse_checkpoint_that_is_the_best_model_stays_the_trainers_best_model(tmp_path):
    """An evaluation at the firing step was a new best: the Trainer named checkpoint-<step> its best model
    before ``on_save``. Renamed away, it must be found there still: at the end the Trainer loads it
    (``load_best_model_at_end``), and with save_total_limit 1 checks every checkpoint against it
    (``os.path.samefile``); a resume from it reads the best model's path from its saved state."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=1, report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    state = _save_as_the_trainer_does(guard, args, 5, scheduled=False, best=True)
    renamed = tmp_path / "_collapse-entropy-round5"
    assert not (tmp_path / "checkpoint-5").exists()
    assert os.path.samefile(state.best_model_checkpoint, renamed)
    saved = TrainerState.load_from_json(str(renamed / "trainer_state.json"))
    assert os.path.samefile(saved.best_model_checkpoint, renamed)
    # A scheduled checkpoint is kept (and copied): the best model stays where the Trainer saved it.
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    state = _save_as_the_trainer_does(guard, args, 6, scheduled=True, best=True)
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-6")
    assert (tmp_path / "checkpoint-6").is_dir() and (tmp_path / "_collapse-entropy-round6").is_dir()


def test_a_collapse_checkpoint_is_left_out_of_hub_pushes_and_goes_with_the_run_on_overwrite(tmp_path):
    import inspect

    import transformers.trainer
    from huggingface_hub.utils import filter_repo_objects
    from transformers import TrainingArguments

    from prompt_aug.cli import UsageError, check_output_dir

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    _save_as_the_trainer_does(guard, args, 5, scheduled=False)
    assert guard.checkpoints == [tmp_path / "_collapse-entropy-round5"]
    # Each push of the output folder by transformers' Trainer (at the end, and of each save) leaves out `_*`
    # and `checkpoint-*`.
    patterns = re.findall(r"ignore_patterns=(\[.*?\])", inspect.getsource(transformers.trainer))
    assert len(patterns) >= 2 and set(patterns) == {'["_*", f"{PREFIX_CHECKPOINT_DIR}-*"]'}
    files = [f"{guard.checkpoints[0].name}/{name}" for name in ("optimizer.pt", "model.safetensors")]
    kept = filter_repo_objects([*files, "model.safetensors"], ignore_patterns=["_*", "checkpoint-*"])
    assert list(kept) == ["model.safetensors"]
    # A folder holding only a collapse checkpoint holds a run; an overwrite deletes it.
    with pytest.raises(UsageError, match="already holds a run \\(_collapse-entropy-round5\\)"):
        check_output_dir(tmp_path, resume=False, overwrite=False)
    assert tmp_path / "_collapse-entropy-round5" in check_output_dir(tmp_path, resume=False, overwrite=True)


@pytest.mark.parametrize("strategy", ["checkpoint", "all_checkpoints", "every_save"])
def test_a_checkpoint_the_hub_upload_is_still_reading_is_copied_not_moved(tmp_path, strategy):
    """transformers uploads checkpoint-<step> in a background job before ``on_save`` (hub_strategy checkpoint
    or all_checkpoints; every_save uploads the output folder, without checkpoint-*). Pushing needs the Hub,
    so the job here is a thread that reads the folder as the upload does, held on the Trainer as
    transformers holds it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.utils.hub import PushInProgress

    args = TrainingArguments(output_dir=str(tmp_path), push_to_hub=True, hub_strategy=strategy, report_to=[])
    trainer = SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[]), push_in_progress=None)
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint")).attach(trainer)
    state, control = TrainerState(global_step=5, max_steps=100), TrainerControl()
    guard.on_log(args, state, control, logs={"step": 5, "entropy": 0.0})
    source = tmp_path / "checkpoint-5"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    reading = threading.Event()

    def upload(folder: Path) -> dict[str, bytes]:
        reading.wait(10)
        return {p.name: p.read_bytes() for p in folder.iterdir()}

    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(upload, source)
        trainer.push_in_progress = PushInProgress([job])
        guard.on_save(args, state, control)
        reading.set()
        if strategy == "every_save":  # nothing reads the checkpoint folder: moved as usual
            assert not source.exists()
            return
        assert job.result() == {"model.safetensors": b"weights"}
    assert (tmp_path / "_collapse-entropy-round5" / "model.safetensors").read_bytes() == b"weights"
    # Once the upload is done, a later collapse checkpoint is moved as usual.
    guard.on_log(args, TrainerState(global_step=8), TrainerControl(), logs={"step": 8, "entropy": 0.9})
    state, control = TrainerState(global_step=9, max_steps=100), TrainerControl()
    guard.on_log(args, state, control, logs={"step": 9, "entropy": 0.0})
    (tmp_path / "checkpoint-9").mkdir()
    guard.on_save(args, state, control)
    assert (tmp_path / "_collapse-entropy-round9").is_dir() and not (tmp_path / "checkpoint-9").exists()


def test_a_collapse_save_that_a_preemption_signal_stops_at_keeps_the_checkpoint_a_resume_takes(tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=None, report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    _save_as_the_trainer_does(guard, args, 5, scheduled=False, signal_in_save=True)
    # preempted.json names checkpoint-5, and --resume_from_checkpoint true takes it: copied, not renamed
    assert (tmp_path / "checkpoint-5").is_dir() and (tmp_path / "_collapse-entropy-round5").is_dir()


def test_the_preemption_callback_runs_before_the_guard_which_counts_rounds_as_the_trainer_does(
    tiny_model_dir, tmp_path
):
    from prompt_aug.faults import PreemptionCallback
    from prompt_aug.trainer import PromptAugGRPOTrainer

    # 3 micro-steps a round, 2 a step: a round an epoch of 3 questions ends on a short step.
    args = PromptAugGRPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=4, collapse_entropy_floor=0.5, gradient_accumulation_steps=2,
        steps_per_generation=3,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict(
        {"question": ["What is 1 + 1?", "What is 2 + 2?", "What is 3 + 3?"], "answer": ["2", "4", "6"]}
    )
    trainer = PromptAugGRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=dataset,
    )  # fmt: skip
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert kinds.index(PreemptionCallback) < kinds.index(CollapseGuard)  # its on_save runs first
    # The guard counts rounds as the trainer's `round` key does: steps 2k-1 and 2k are round k (by 1.5
    # optimizer steps a round alone, step 2 would be round 2).
    assert [trainer.features.guard.round_of_step(s) for s in range(1, 7)] == [1, 1, 2, 2, 3, 3]


def test_the_room_made_for_a_collapse_save_is_made_once_and_given_back_if_the_save_never_comes(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=2, report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"),
                   SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.1, 1, "checkpoint"))  # fmt: skip
    state = TrainerState(global_step=1)
    guard.on_log(args, state, TrainerControl(), logs={"step": 1, "entropy": 0.0, "reward": 0.9})
    assert args.save_total_limit == 3
    state.global_step = 2  # the save did not come (save_strategy "best" skips it); the next firing
    guard.on_log(args, state, TrainerControl(), logs={"step": 2, "entropy": 1.0, "reward": 0.1})
    assert args.save_total_limit == 3  # not 4
    guard.on_train_begin(args, TrainerState(), TrainerControl())  # train() again after a failed save
    assert args.save_total_limit == 2


def test_a_collapse_save_that_never_came_leaves_the_next_regular_checkpoint_alone(tmp_path, caplog):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_total_limit=None, report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "checkpoint"))
    guard.on_log(args, TrainerState(global_step=1, max_steps=100), TrainerControl(), logs={"entropy": 0.0})
    # The Trainer skipped the save the guard asked for (save_strategy "best": no new best at step 1). At
    # step 4 a regular save comes; entropy is still low, so nothing fires again.
    state, control = TrainerState(global_step=4, max_steps=100), TrainerControl(should_save=True)
    guard.on_log(args, state, control, logs={"entropy": 0.0})
    (tmp_path / "checkpoint-4").mkdir()
    guard.on_save(args, state, control)
    assert (tmp_path / "checkpoint-4").is_dir() and not list(tmp_path.glob("_collapse-*"))
    assert guard.checkpoints == []
    # A stop whose save never came still ends the run with a message naming the signal.
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "stop"))
    state = TrainerState(global_step=7, max_steps=100)
    control = TrainerControl()
    guard.on_log(args, state, control, logs={"entropy": 0.0})
    assert control.should_training_stop
    with caplog.at_level("WARNING", logger="prompt_aug.collapse"):
        guard.on_train_end(args, state, control)
    assert guard.stop_message and "stopped training at step 7 (round 7): entropy" in guard.stop_message
    assert "no checkpoint" in guard.stop_message and guard.stop_message in caplog.text


def test_a_guard_stop_is_recorded_in_the_output_folder_until_a_run_starts_there_again(tmp_path):
    from transformers import TrainerControl, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    guard = _guard(SignalSpec("entropy", ("entropy",), "below", 0.5, 1, "stop"))
    state = _save_as_the_trainer_does(guard, args, 5, scheduled=False)
    guard.on_train_end(args, state, TrainerControl(should_training_stop=True))
    record = json.loads((tmp_path / "collapse_stop.json").read_text())
    assert record.pop("detail").startswith("entropy (entropy) below the floor 0.5 for 5 rounds in a row")
    assert record == {
        "stopped_by": "collapse guard", "signals": ["entropy"], "step": 5, "round": 5,
        "checkpoint": str(tmp_path / "_collapse-entropy-round5"), "exit_status": 0,
    }  # fmt: skip

    # train() again on the same trainer, resumed from that checkpoint: the run is no longer the stopped one,
    # and what the guard says after it (the model card reads stop_reason) is this run's only.
    resumed = TrainerState(global_step=5, max_steps=8, log_history=[{"step": 5, "entropy": 0.0}])
    guard.on_train_begin(args, resumed, TrainerControl())
    assert not (tmp_path / COLLAPSE_STOP_FILE).exists()
    assert guard.stop_reason is guard.stop_message is None and guard.fired == guard.checkpoints == []
    for step in (6, 7, 8):
        resumed.global_step = step
        guard.on_log(args, resumed, TrainerControl(), logs={"step": step, "entropy": 0.9})
    guard.on_train_end(args, resumed, TrainerControl())
    assert guard.stop_reason is None and not (tmp_path / COLLAPSE_STOP_FILE).exists()


@pytest.mark.slow
def test_collapsing_run_saves_named_checkpoints_stops_cleanly_and_resumes(tmp_path):
    out = tmp_path / "run"
    flags = [
        "--temperature", "0.05",  # near-greedy: entropy ~0.005, every completion loops on "\n"
        "--collapse_repetition_rounds", "1", "--collapse_repetition_action", "checkpoint",
        "--save_steps", "3", "--save_total_limit", "1",
    ]  # fmt: skip
    cmd = [
        sys.executable,
        "-m",
        "prompt_aug.train",
        "--config",
        SMOKE,
        "--output_dir",
        str(out),
        "--max_steps",
        "8",
    ]
    result = subprocess.run(cmd + flags, check=False, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    # 2 optimizer steps a round; each round is judged at its last step. Repetition fired at round 1 (step
    # 2): checkpoint; entropy below 1.0 for 2 rounds at round 2 (step 4): stop.
    message = re.search(r"collapse guard stopped training at step 4 \(round 2\): entropy .*", result.stderr)
    assert message, result.stderr[-3000:]
    assert "below the floor 1 for 2 rounds" in message.group(0)
    assert str(out / "_collapse-entropy-round2") in message.group(0)
    history = _history(out)
    assert max(e["step"] for e in history) == 4
    fired = {(e["step"], k) for e in history for k in e if k.startswith("collapse/fired/")}
    assert fired == {(2, "collapse/fired/repetition"), (4, "collapse/fired/entropy")}

    # Both named checkpoints are full checkpoints; the one from step 2 survived the rotation at step 3, and
    # the unscheduled save at step 4 did not count against save_total_limit 1: the scheduled checkpoint-3
    # is still there.
    for name, step in (("_collapse-repetition-round1", 2), ("_collapse-entropy-round2", 4)):
        folder = out / name
        assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step
        assert (folder / "optimizer.pt").is_file() and (folder / "model.safetensors").is_file()
        # The arguments saved with it are the run's, not the room made for the unscheduled save.
        assert torch.load(folder / "training_args.bin", weights_only=False).save_total_limit == 1
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-3"]
    # The final model's card says where the guard fired and why training stopped early.
    card = (out / "README.md").read_text()
    assert "- Collapse guard fired: repetition at step 2 (round 1), entropy at step 4 (round 2)" in card
    assert "- Stopped early: collapse guard stopped training at step 4 (round 2): entropy" in card
    # Exit status 0 (no failure to retry), and a record that tells the stop from a run trained to its end.
    stopped = json.loads((out / COLLAPSE_STOP_FILE).read_text())
    assert stopped["step"] == 4 and stopped["checkpoint"] == str(out / "_collapse-entropy-round2")
    assert f"This stop is recorded in {out / COLLAPSE_STOP_FILE}" in result.stderr
    # ... and said again after the final save, card and push, as the run's last word
    said = [line for line in result.stderr.splitlines() if "collapse guard stopped training" in line]
    assert said[-1].endswith(f"; exit status 0, recorded in {out / COLLAPSE_STOP_FILE}"), said

    # Resume from the named checkpoint with the same flags: the replayed history keeps the guard's state
    # (entropy already 2 rounds below, already fired), so it neither re-stops nor forgets.
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "6", *flags,
                "--resume_from_checkpoint", str(out / "_collapse-entropy-round2")])  # fmt: skip
    history = _history(out)
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6
    step6 = [e for e in history if e["step"] == 6 and "collapse/entropy" in e]
    assert step6 and step6[0]["collapse/entropy"] == 3.0  # round 3 is the third below the floor
    assert not any(k.startswith("collapse/fired/") for e in history if e["step"] > 4 for k in e)
    assert not (out / COLLAPSE_STOP_FILE).exists()  # the resumed run trained to its end


@pytest.mark.slow
def test_guard_sees_evaluation_during_training(tmp_path):
    import datasets

    suite = tmp_path / "suite"
    datasets.DatasetDict(
        {"math": datasets.Dataset.from_dict({"problem": ["What is $2+2$?"], "answer": ["4"]})}
    ).save_to_disk(str(suite))
    out = tmp_path / "run"
    train.main([
        "--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
        "--eval_benchmarks", "math500", "--eval_every_steps", "1", "--eval_data_dir", str(suite),
        "--eval_max_tokens", "4", "--collapse_eval_drop", "0.0", "--collapse_eval_evaluations", "1",
    ])  # fmt: skip
    evaluated = [e for e in _history(out) if "eval/macro" in e]
    assert [e["step"] for e in evaluated] == [1, 2]
    assert all("collapse/eval" in e for e in evaluated)  # the guard runs after the evaluation callback


@pytest.mark.slow
def test_a_diverged_run_whose_entropy_trl_logs_as_none_trips_the_guard(tmp_path, monkeypatch):
    # The fault: every per-token entropy of the loss pass is NaN. TRL leaves NaN values out of a logged mean
    # and logs None when none is left.
    from prompt_aug.trainer import PromptAugGRPOTrainer

    forward = PromptAugGRPOTrainer.token_logps_and_entropies

    def diverged(self, *args, **kwargs):
        logps, entropies, aux = forward(self, *args, **kwargs)
        if entropies is not None:
            entropies = torch.full_like(entropies, float("nan"))
            self._loss_forward = (logps.detach(), entropies)
        return logps, entropies, aux

    monkeypatch.setattr(PromptAugGRPOTrainer, "token_logps_and_entropies", diverged)
    out = tmp_path / "run"
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "4", "--save_strategy", "no",
                "--collapse_entropy_action", "log"])  # fmt: skip
    history = _history(out)
    assert [e["entropy"] for e in history if "entropy" in e] == [None] * 4
    # The smoke recipe's entropy window is 2 rounds of 2 steps: the second round ends at step 4.
    assert [e["step"] for e in history if "collapse/fired/entropy" in e] == [4]


@pytest.mark.slow
def test_with_augmentation_off_the_guard_reads_repetition_and_the_share_right_not_the_pm5_total(tmp_path):
    out = tmp_path / "run"
    train.main([
        "--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
        "--prompt_augmentation", "false", "--temperature", "0.05",  # near-greedy: completions loop
        "--reward_funcs", "correctness_pm5", "format", "--collapse_repetition_rounds", "1",
    ])  # fmt: skip
    history = _history(out)
    first = next(e for e in history if e["step"] == 1)
    assert first[REPETITION_KEY] > 0.5  # the smoke recipe's ceiling
    assert [e["step"] for e in history if "collapse/fired/repetition" in e] == [2]
    # The share graded right, not the +5 / -5 reward the accuracy watch would otherwise fall back to.
    pm5 = first["rewards/correctness_pm5_reward/mean"]
    assert first["completions/accuracy"] == pytest.approx((pm5 + 5) / 10)
    args = train.parse_args(["--config", SMOKE, "--dry_run", "--reward_funcs", "correctness_pm5", "format"])
    spec = next(s for s in guard_from_args(args.training_args, 2).specs if s.name == "accuracy")
    assert next(k for k in spec.keys if k in first) == "completions/accuracy"
    assert not any(k.startswith("templates/") for e in history for k in e)  # no templates: no breakdown


@pytest.mark.slow
def test_entropy_takes_no_reading_where_every_completion_was_masked_and_truncation_fires(tmp_path):
    out = tmp_path / "run"
    train.main([
        "--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
        "--temperature", "0.05", "--mask_truncated_completions", "true",  # every completion cut and masked
        "--collapse_entropy_rounds", "1", "--collapse_entropy_action", "log",
        "--collapse_truncation_ceiling", "0.5", "--collapse_truncation_rounds", "1",
        "--collapse_truncation_action", "log",
    ])  # fmt: skip
    history = _history(out)
    first = next(e for e in history if e["step"] == 1)
    assert first["completions/clipped_ratio"] == 1.0
    assert [e["entropy"] for e in history if "entropy" in e] == [0.0, 0.0]  # no token: TRL's 0 / 1
    fired = [(e["step"], k) for e in history for k in e if k.startswith("collapse/fired/")]
    assert fired == [(2, "collapse/fired/truncation")]  # the smoke recipe's repetition window is 2 rounds


# ---------------------------------------------------------------------------------------------------------
# ProRL's optimizer reset and RLinf's mini-batch skip, on real training with a reward that has spread


def _spread_reward(completions, **kwargs):
    """Test-only reward with spread within a group: the completion's length in characters / 100."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 100 for c in completions]


@pytest.fixture
def spread(monkeypatch):
    from rewards import registry

    monkeypatch.setitem(registry.REGISTRY, "spread", _spread_reward)
    return ["--reward_funcs", "spread"]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _adam_state(checkpoint: Path) -> tuple[float, float]:
    """(step count, sum of |exp_avg|) over the optimizer state saved in a checkpoint."""
    state = torch.load(checkpoint / "optimizer.pt", weights_only=False)["state"]
    steps = {float(s["step"]) for s in state.values()}
    assert len(steps) == 1
    return steps.pop(), sum(float(s["exp_avg"].abs().sum()) for s in state.values())


def test_zero_optimizer_state_zeroes_adamw_through_a_wrapper():
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(3)
    opt.step()

    class Wrapper:  # accelerate and DeepSpeed expose the wrapped optimizer as `.optimizer`
        optimizer = opt

    assert zero_optimizer_state(Wrapper()) == 3  # step, exp_avg, exp_avg_sq
    state = opt.state[param]
    assert float(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()


def test_an_8bit_optimizer_zeroed_trains_on_as_a_fresh_one():
    """bitsandbytes' 8-bit AdamW keeps its quantization maps (``qmap1``, ``qmap2``) in each parameter's state,
    and every moment decodes through them: zeroed in place, the optimizer must train on exactly as a new one
    would. Needs bitsandbytes, which no extra of this package installs."""
    bnb = pytest.importorskip(
        "bitsandbytes", reason="bitsandbytes is not installed (pip install bitsandbytes, as for QLoRA)"
    )

    def weights_after(reset: str) -> torch.Tensor:
        torch.manual_seed(0)
        layer, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
        opt = bnb.optim.AdamW8bit(layer.parameters(), lr=1e-3, min_8bit_size=0)
        for step in range(12):
            if step == 4:
                if reset == "zeroed":
                    zero_optimizer_state(opt)
                else:
                    opt = bnb.optim.AdamW8bit(layer.parameters(), lr=1e-3, min_8bit_size=0)
            opt.zero_grad()
            (layer(x) - 1).pow(2).mean().backward()
            opt.step()
        return layer.weight.detach().clone()

    torch.testing.assert_close(weights_after("zeroed"), weights_after("new"), rtol=0, atol=0)


@pytest.mark.slow
def test_reference_sync_zeroes_the_optimizer_state_at_the_sync_step_and_only_then(tmp_path, spread):
    out = tmp_path / "run"
    train.main([
        "--config", SMOKE, "--output_dir", str(out), "--max_steps", "3", "--save_steps", "1", *spread,
        "--beta", "0.01", "--sync_ref_model", "true", "--ref_model_sync_steps", "2",
        "--reset_optimizer_on_ref_sync", "true",
    ])  # fmt: skip
    step1, moment1 = _adam_state(out / "checkpoint-1")
    step2, moment2 = _adam_state(out / "checkpoint-2")
    step3, moment3 = _adam_state(out / "checkpoint-3")
    assert (step1, step2, step3) == (1.0, 0.0, 1.0)  # without the reset: 1, 2, 3
    assert moment1 > 0 and moment2 == 0 and moment3 > 0
    assert not any("collapse/fired/" in k for e in _history(out) for k in e)  # a healthy run: no firing
    assert not any("minibatch" in k for e in _history(out) for k in e)  # no mini-batch skip set: none logged


@pytest.mark.slow
@pytest.mark.parametrize("threshold", ["1.0", "1e9"])
def test_minibatch_skip_at_ratio_1_keeps_every_weight_and_above_the_drift_they_move(
    tmp_path, spread, threshold
):
    """The smoke recipe trains 2 optimizer steps on each generation (steps_per_generation 2, accumulation 1):
    TRL computes the old log-probs, and step 2 trains on completions of the policy before step 1."""
    out = tmp_path / "run"
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
                *spread, "--skip_minibatch_ratio_above", threshold])  # fmt: skip
    before, after = _weights(out / "tiny-random-qwen2"), _weights(out)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    history = _history(out)
    assert all(
        e["frac_reward_zero_std"] < 1 for e in history if "frac_reward_zero_std" in e
    )  # spread in groups
    skipped = [e["stability/skipped_minibatches"] for e in history if "loss" in e]
    ratios = [e["stability/minibatch_ratio"] for e in history if "loss" in e]
    if threshold == "1.0":
        assert changed == []
        assert skipped == [1.0, 2.0] and all(r >= 1.0 for r in ratios)
    else:  # nothing skipped: step 1 moved the policy, so step 2's ratio is measured off 1
        assert len(changed) > len(before) // 2
        assert skipped == [0.0, 0.0]
        assert ratios[1] > 1.0 and ratios[1] > ratios[0], ratios


@pytest.mark.parametrize(
    ("batch", "warned"),
    [
        ([], False),  # the smoke recipe: accumulation 1, 2 steps a generation: old log-probs computed
        (["--num_iterations", "2"], False),
        (["--gradient_accumulation_steps", "3"], False),  # generations straddle optimizer steps
        (["--steps_per_generation", "1"], True),  # TRL computes no old log-probs: r is exactly 1
        (["--gradient_accumulation_steps", "2"], True),
        (["--gradient_accumulation_steps", "4", "--num_iterations", "2"], True),
    ],
)
def test_a_minibatch_skip_warns_where_trl_holds_the_ratio_at_1(batch, warned):
    """TRL computes the old log-probs only when gradient_accumulation_steps is no multiple of
    steps_per_generation x num_iterations; otherwise the ratio is exactly 1 and a threshold above 1 never
    trips (1.0 still skips every mini-batch)."""

    def warnings_with(*extra: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train.parse_args(["--config", SMOKE, "--dry_run", *batch, *extra])
        return [str(w.message) for w in caught if str(w.message).startswith("skip_minibatch_ratio_above")]

    lines = warnings_with("--skip_minibatch_ratio_above", "1.5")
    assert len(lines) == warned
    assert all("no effect" in line and "the ratio is 1" in line for line in lines)
    assert warnings_with("--skip_minibatch_ratio_above", "1.0") == warnings_with() == []


def test_minibatch_skip_is_refused_under_fp16_whose_gradient_scaler_cannot_skip_a_step(tmp_path):
    # Dropped gradients leave fp16's GradScaler no inf check to record: it would assert at the optimizer step.
    # Refused with the config, before a model loads.
    with pytest.raises(ValueError, match=r"^skip_minibatch_ratio_above is not supported with fp16 .*bf16"):
        PromptAugGRPOConfig(
            output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, fp16=True,
            num_generations=2, per_device_train_batch_size=2, max_completion_length=4,
            skip_minibatch_ratio_above=2.0,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# Per-template entropy and repetition


@pytest.mark.slow
def test_per_template_entropy_and_repetition_are_logged_and_agree_with_the_totals(tmp_path):
    out = tmp_path / "run"
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_strategy", "no",
                "--temperature", "0.05"])  # fmt: skip
    # One round, two optimizer steps: the generation metrics are logged at step 1, and each step's loss
    # forward logs the entropy of the templates among its half of the round's (shuffled) completions.
    first, second = (next(e for e in _history(out) if e["step"] == s) for s in (1, 2))
    names = [k.split("/")[1] for k in first if k.startswith("templates/") and k.endswith("/count")]
    assert names
    for name in names:
        entropies = [
            e[f"templates/{name}/entropy"] for e in (first, second) if f"templates/{name}/entropy" in e
        ]
        assert entropies and all(0 <= h < 0.1 for h in entropies), name  # near-greedy sampling
        assert first[f"templates/{name}/repetition"] == 1.0  # every completion loops on "\n"
    counts = {n: first[f"templates/{n}/count"] for n in names}
    overall = sum(first[f"templates/{n}/repetition"] * c for n, c in counts.items()) / sum(counts.values())
    assert first[REPETITION_KEY] == pytest.approx(overall)
    for entry in (first, second):  # each step's total is a token-weighted mean of its parts
        parts = [v for k, v in entry.items() if k.startswith("templates/") and k.endswith("/entropy")]
        assert min(parts) - 1e-6 <= entry["entropy"] <= max(parts) + 1e-6


def test_loops_cut_at_the_length_limit_count_when_truncated_completions_are_masked(tmp_path):
    # mask_truncated_completions zeroes a truncated completion's mask; the loop it ends in is still there.
    out = tmp_path / "run"
    train.main(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "1", "--save_strategy", "no",
                "--temperature", "0.05", "--mask_truncated_completions", "true"])  # fmt: skip
    first = next(e for e in _history(out) if e["step"] == 1)
    clipped = first["completions/clipped_ratio"]
    assert clipped > 0.5 and first[REPETITION_KEY] >= clipped


# ---------------------------------------------------------------------------------------------------------
# RLinf's reward, the ProRL recipe, the plot


def test_correctness_pm5_maps_correct_wrong_and_unparseable_and_passes_every_argument_through():
    from rewards import get_reward_funcs

    (reward,) = get_reward_funcs(["correctness_pm5"])
    seen = {}
    scores = reward(
        ["so \\boxed{4}", "so \\boxed{5}", "so \\boxed{4}"],
        answer=["4", "4", ""],  # an empty gold cannot be parsed
        template=["abel"] * 3,
        log_metric=lambda name, value: seen.__setitem__(name, value),
        some_new_column=[1, 2, 3],
    )
    assert scores == [5.0, -5.0, None]
    assert seen["rewards/unparseable_gold"] == 1.0  # log_metric reached the wrapped correctness reward
    assert reward.__name__ == "correctness_pm5_reward"


PRORL_KEYS = {
    "beta": 1e-4, "epsilon": 0.2, "epsilon_high": 0.4, "temperature": 1.2, "num_generations": 16,
    "sync_ref_model": True, "ref_model_mixup_alpha": 1.0, "ref_model_sync_steps": 400,
    "reset_optimizer_on_ref_sync": True, "num_train_epochs": 30,
    # ProRL runs on verl: its KL is the k3 estimator without the importance ratio TRL weighs it by by default
    "use_bias_correction_kl": False,
    # ProRL takes DAPO's dynamic sampling with its decoupled clip; DAPO filters on accuracy
    "dynamic_sampling": True, "dynamic_sampling_signal": "correctness", "dynamic_sampling_max_passes": 4,
    "dynamic_sampling_std_tol": 1e-6,  # ours: float noise only, below TRL's 1e-4 in the advantage
}  # fmt: skip
# The paper recipe's fidelity settings, which the ProRL recipe keeps.
MIRRORED = {
    "vllm_importance_sampling_correction": False, "delta": 3.0, "save_total_limit": 3,
    "wandb_completions_rows": 16,
}  # fmt: skip


def test_prorl_recipe_is_the_paper_run_plus_prorl_stabilisers_only():
    paper = yaml.safe_load((PAPER / "prompt_aug.yaml").read_text())
    prorl = yaml.safe_load((PAPER / "prompt_aug_prorl.yaml").read_text())
    assert {k: prorl.get(k) for k in PRORL_KEYS} == PRORL_KEYS
    assert {k: prorl.get(k) for k in MIRRORED} == MIRRORED
    differ = {k for k in set(paper) | set(prorl) if paper.get(k) != prorl.get(k)}
    # epsilon 0.2 is the paper's lower clip too; everything else is the paper's run, key for key.
    assert differ - set(MIRRORED) == set(PRORL_KEYS) - {"epsilon"} | {"output_dir", "run_name"}
    assert not any(k.startswith("collapse_") for k in prorl)  # the guard stays off: thresholds unmeasured


def test_prorl_recipe_dry_run_keeps_1024_completions_per_round_and_sets_up_the_reset(capsys):
    recipe = str(PAPER / "prompt_aug_prorl.yaml")
    train.main(["--config", recipe, "--dry_run", "--num_processes", "8"])
    assert re.search(r"completions per round\s+1024", capsys.readouterr().out)
    args = train.parse_args(["--config", recipe, "--dry_run"]).training_args
    assert args.sync_ref_model and args.beta == 1e-4 and args.epsilon_high == 0.4
    assert args.reset_optimizer_on_ref_sync


def test_plot_marks_where_the_guard_fired(tmp_path):
    import matplotlib.pyplot as plt

    from prompt_aug.plot import build_figure, collapse_events, plot_runs

    history = [{"step": s, "entropy": 0.5 - 0.01 * s, "reward": 0.5} for s in range(1, 21)]
    history[11]["collapse/fired/entropy"] = 1.0
    history[15].update({"collapse/fired/accuracy": 1.0, "collapse/fired/repetition": 1.0})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trainer_state.json").write_text(
        json.dumps({"global_step": 20, "log_history": history})
    )
    assert collapse_events(history) == [(12, "entropy"), (16, "accuracy"), (16, "repetition")]
    fig = build_figure([tmp_path / "run"])
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"Entropy", "Total reward"}
    for title, key in (("Entropy", "entropy"), ("Total reward", "reward")):
        ax = panels[title]
        curves = [line for line in ax.get_lines() if line.get_linestyle() != ":"]
        assert len(curves) == 1 and list(curves[0].get_xdata()) == list(range(1, 21))
        assert list(curves[0].get_ydata()) == pytest.approx([e[key] for e in history])
        # One dotted vertical line per firing, at its step: one at 12, two at 16.
        marks = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert sorted(line.get_xdata()[0] for line in marks) == [12, 16, 16]
        assert all(line.get_xdata()[0] == line.get_xdata()[1] for line in marks)
    # The signal names are written once, on the first panel.
    labels = [(text.get_text(), text.xy[0]) for ax in fig.axes for text in ax.texts]
    assert sorted(labels) == [("accuracy", 16), ("entropy", 12), ("repetition", 16)]
    assert panels["Entropy"].texts and not panels["Total reward"].texts
    plt.close(fig)
    out = plot_runs([tmp_path / "run"], tmp_path / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_registered_correctness_reward_is_read_as_accuracy():
    # A recipe that swaps `correctness` for another 0/1 correctness reward keeps its accuracy signal and
    # its accuracy column in the console line.
    from types import SimpleNamespace

    from prompt_aug.extensions.collapse import ACCURACY_KEYS
    from prompt_aug.logging_utils import compact_line
    from rewards import REGISTRY

    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1)
    for name in ("correctness", "strict_correctness", "correctness_joined_boxes"):
        key = f"rewards/{REGISTRY[name].__name__}/mean"
        assert ACCURACY_KEYS.index(key) < ACCURACY_KEYS.index("reward"), name
        assert "accuracy 0.500" in compact_line({key: 0.5, "reward": 1.25}, 1, 2, args), name


def test_the_shuffled_controls_round_means_are_read_as_accuracy_and_format():
    # The control's logged means are the round's true accuracy and format score (a shuffle keeps the
    # values), so the console line shows them and the guard watches its accuracy, not the total reward.
    from types import SimpleNamespace

    from prompt_aug.logging_utils import compact_line

    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1)
    logs = {"rewards/shuffled_correctness_reward/mean": 0.25, "rewards/shuffled_format_reward/mean": 0.75}
    logs["reward"] = 1.0
    line = compact_line(logs, 1, 2, args)
    assert "accuracy 0.250" in line and "format 0.750" in line, line
    values = [0.3, 0.4, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.2]
    key = "rewards/shuffled_correctness_reward/mean"
    fired = _feed(_guard(ACCURACY), [{"step": i + 1, key: v, "reward": 9.0} for i, v in enumerate(values)])
    assert fired == {8: ["accuracy"]}  # the flat total reward alone would never fire


def test_a_watch_reads_one_key_so_a_resumed_run_logged_before_the_accuracy_share_keeps_its_scale():
    """A correctness_pm5 run logged before ``completions/accuracy`` existed: its accuracy watch read
    ``reward`` (the +5 / -5 total); resumed, its new lines carry the share too. Read on, the share (0.7)
    beside a best total of 2.35 would look like a collapse: the watch keeps the key it first read."""
    drop = SignalSpec("accuracy", ACCURACY_KEYS, "drop", 0.2, 2, "checkpoint")
    old = [{"step": s, "round": s, "reward": 2.3 + 0.01 * s} for s in range(1, 5)]
    new = [{"step": s, "round": s, "reward": 2.35, "completions/accuracy": 0.7} for s in range(5, 9)]
    assert _feed(_guard(drop), old + new) == {}
    # A run that logs the share from its start reads it, and a fall in the share fires.
    fall = [
        {"step": s, "round": s, "reward": 2.3, "completions/accuracy": 0.7 if s < 5 else 0.4}
        for s in range(1, 9)
    ]
    assert _feed(_guard(drop), fall) == {6: ["accuracy"]}
