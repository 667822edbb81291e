"""Wall time per round and share of trained groups with a reward spread, with and without dynamic sampling.

The tiny random model of the smoke recipe never answers a question, so the real correctness reward gives
every group zero spread. This script trains the smoke recipe (`recipes/smoke/tiny_cpu.yaml`, or another recipe
given with ``--config``) with a stand-in for question difficulty, the ``difficulty`` reward below: binary,
like correctness, with a success rate fixed per question by the number at the end of its uid (``q``):

* ``q % 4 == 0``: always 1 (an easy question: all-right groups);
* ``q % 4 == 1``: always 0 (a hard question: all-wrong groups);
* otherwise 1 for about half the completions (a hash of the completion text), so a group of 4 is flat 1 in 8.

Without dynamic sampling about 9/16 of the groups are flat; with it the trained groups have spread (unless the
cap is hit), at the price of extra generation passes. Runs are sequential, in one process, and report the wall
time of `trainer.train()` per round and the process CPU time of the whole run (model load and save included)
per round; on a shared machine the CPU time is the steadier of the two. A first run of one round, with
dynamic sampling on and not timed, warms the process up, so that its one-time costs (modules loaded on first
use, first calls) fall on neither arm:

    python bench/dynamic_sampling.py                   # 8 rounds each way, max_passes 4
    python bench/dynamic_sampling.py --rounds 16 --max_passes 2
    python bench/dynamic_sampling.py --config recipes/smoke/learn_cpu.yaml --rounds 40 \\
        --recipe_rewards --signal correctness
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def difficulty_reward(completions: list[Any], uid: list[str], **kwargs: Any) -> list[float]:
    """1/0 per completion with a per-question success rate of 1, 0 or about 1/2 (see the module docstring)."""
    out = []
    for completion, u in zip(completions, uid, strict=True):
        kind = int(str(u).rsplit("-", 1)[-1]) % 4
        if kind in (0, 1):
            out.append(float(kind == 0))
        else:
            out.append(float(hashlib.blake2b(str(completion).encode(), digest_size=1).digest()[0] < 128))
    return out


# The stand-in reward by import path: this file's folder is on sys.path when it runs as a script.
DIFFICULTY = "dynamic_sampling:difficulty_reward"


def zero_std_not_per_group(training_args: Any) -> str | None:
    """Why TRL's ``frac_reward_zero_std`` under ``training_args`` is not the share of groups without spread
    (one std over the whole batch: ``scale_rewards: batch``, or ``multi_objective_aggregation:
    normalize_then_sum``), or None where it is."""
    scale = getattr(training_args, "scale_rewards", "group")
    aggregation = getattr(training_args, "multi_objective_aggregation", "sum_then_normalize")
    if aggregation != "sum_then_normalize":
        return f"multi_objective_aggregation {aggregation}"
    if scale not in ("group", "none"):
        return f"scale_rewards {scale}"
    return None


def run(
    config: str, rounds: int, dynamic: bool, max_passes: int, out: Path, recipe_rewards: bool, signal: str
) -> dict[str, float]:
    from prompt_aug import train
    from prompt_aug.records import optimizer_steps_per_round

    training_args = train.parse_args(["--config", config]).training_args
    steps_per_round = int(optimizer_steps_per_round(training_args))
    rewards = [] if recipe_rewards else ["--reward_funcs", DIFFICULTY]
    cpu_start = time.process_time()
    train.main([
        "--config", config, "--output_dir", str(out), *rewards,
        "--max_steps", str(rounds * steps_per_round), "--save_strategy", "no", "--log_completions", "false",
        "--logging_steps", "1", "--dynamic_sampling", str(dynamic).lower(),
        "--dynamic_sampling_max_passes", str(max_passes), "--dynamic_sampling_signal", signal,
        "--warmstart_cache", "none",  # each arm's CPU time holds its own warm start, if the recipe has one
    ])  # fmt: skip
    cpu = time.process_time() - cpu_start
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    round_logs = [h for h in history if "frac_reward_zero_std" in h]
    runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
    result = {
        "seconds_per_round": runtime / rounds,
        "cpu_seconds_per_round": cpu / rounds,
        "trained_groups_with_spread": 1
        - sum(h["frac_reward_zero_std"] for h in round_logs) / len(round_logs),
    }
    if dynamic:
        for key in ("generation_passes", "kept_share", "cap_hit"):
            result[key] = sum(h[f"dynamic_sampling/{key}"] for h in round_logs) / len(round_logs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "recipes/smoke/tiny_cpu.yaml"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max_passes", type=int, default=4)
    parser.add_argument(
        "--recipe_rewards", action="store_true",
        help="train on the recipe's own rewards instead of the stand-in "
        "(for a model that learns, e.g. learn_cpu.yaml)",
    )  # fmt: skip
    parser.add_argument("--signal", default="total", help="dynamic_sampling_signal (e.g. correctness)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from prompt_aug import train

    why = zero_std_not_per_group(train.parse_args(["--config", args.config]).training_args)
    if why is not None:  # TRL's zero-std share is then of rows under one batch std, not of groups
        parser.error(
            f"--config {args.config}: {why}: TRL's frac_reward_zero_std is then taken over one std of the "
            "whole batch, so 'trained groups with spread' would not count groups; give a recipe with "
            "scale_rewards group or none and multi_objective_aggregation sum_then_normalize"
        )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # Untimed: the first training in a process pays one-time costs, which would fall on the first arm.
        run(args.config, 1, True, args.max_passes, Path(tmp) / "warm-up", args.recipe_rewards, args.signal)
        for dynamic in (False, True):
            rows.append(
                (
                    dynamic,
                    run(
                        args.config,
                        args.rounds,
                        dynamic,
                        args.max_passes,
                        Path(tmp) / str(dynamic),
                        args.recipe_rewards,
                        args.signal,
                    ),
                )
            )
    print(
        f"\n{Path(args.config).name}, {args.rounds} rounds each, "
        f"dynamic_sampling_max_passes {args.max_passes}, "
        f"rewards: {'the recipe' if args.recipe_rewards else 'difficulty stand-in'}, signal {args.signal}\n"
    )
    print(
        "| dynamic_sampling | wall s / round | CPU s / round | trained groups with spread | passes / round "
        "| kept / generated | cap hit |"
    )
    print("|---|---|---|---|---|---|---|")
    for dynamic, r in rows:
        extra = (
            f"{r['generation_passes']:.2f} | {r['kept_share']:.2f} | {r['cap_hit']:.2f}"
            if dynamic
            else "1 | - | -"
        )
        print(
            f"| {'on' if dynamic else 'off'} | {r['seconds_per_round']:.2f} "
            f"| {r['cpu_seconds_per_round']:.2f} "
            f"| {r['trained_groups_with_spread']:.2f} | {extra} |"
        )


if __name__ == "__main__":
    main()
