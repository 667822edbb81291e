"""It learns: the learning demo (recipes/smoke/learn_cpu.yaml) against the shuffled-reward control.

Each run is the recipe as a user launches it (``python -m prompt_aug.train``: warm start, 200 GRPO steps,
the before/after table), each in a process of its own, all of a test's runs at once; the runs of a seed
share its warm start through ``warmstart_cache`` (one trains it, the others load the same floats). Two
tiers:

* by default, seed 0 and the control (both rewards shuffled inside each round; seed 0), about 13 minutes
  of one core: seed 0's format score on the held-out questions, over the templates with format markers,
  rises by at least 0.3, and the control's does not, nor does its correctness, either in the log (the mean
  of ``rewards/correctness_reward/mean`` over the last 10 logged steps against the first 10) or in the
  before/after table (trained questions, the same model sampled before and after GRPO);
* with ``PROMPT_AUG_LEARNING=1``, what README.md promises: the format rise for each of seeds 0, 1 and 2,
  correctness rising by at least 0.1 on average over the three seeds, in the log and in the table, and the
  control as above. Seeds 0-2 and the control, about 26 minutes of one core.

The thresholds were fixed before any run, never tuned to a run. Why correctness only on average, in the
tier of its own: sampling amplifies float noise, so another CPU type follows another trajectory from the
same seed, and one seed in three may learn correctness late (seed 2 on the box of docs/benchmarks.md's
table: log +0.09 in 200 steps; seed 0 on a slower box: log +0.13, table +0.04, while its control's log
rose +0.05). bench/learn_robustness.py runs seeds x perturbations of the float path; docs/benchmarks.md
("Learning demo on any machine") has the table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "recipes/smoke/learn_cpu.yaml")
CONTROL = [
    "--reward_funcs",
    "rewards.controls:shuffled_correctness_reward",
    "rewards.controls:shuffled_format_reward",
]
CORRECTNESS_RISE, FORMAT_RISE = 0.1, 0.3
LEARNING_TIER = os.environ.get("PROMPT_AUG_LEARNING") == "1"

pytestmark = pytest.mark.slow


def _train(root: Path, runs: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """Launch every ``(kind, seed)`` of ``runs`` at once, ``kind`` being "recipe" or "control"; the rises
    and the logged keys of each."""
    procs, logs = {}, []
    try:
        for kind, seed in runs:
            out, log = root / f"{kind}-seed{seed}", root / f"{kind}-seed{seed}.log"
            cmd = [sys.executable, "-m", "prompt_aug.train", "--config", RECIPE, "--output_dir", str(out),
                   "--seed", str(seed), "--warmstart_cache", str(root / "warmstart")]  # fmt: skip
            cmd += CONTROL * (kind == "control")
            logs.append(log.open("w"))
            procs[kind, seed] = (
                out,
                log,
                subprocess.Popen(cmd, cwd=REPO, stdout=logs[-1], stderr=subprocess.STDOUT),
            )
        for (kind, seed), (out, log, proc) in procs.items():
            code = proc.wait(timeout=3600)
            assert code == 0, f"{kind} seed {seed} exited {code}:\n{log.read_text()[-3000:]}"
        # Runs of one seed share its warm start: one trains it, the others wait for it and load it.
        for seed in {seed for _, seed in runs}:
            loaded = [
                kind for kind, s in runs if s == seed and "(loaded from" in procs[kind, s][1].read_text()
            ]
            assert len(loaded) == sum(s == seed for _, s in runs) - 1, (seed, loaded)
    finally:
        for _, _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        for sink in logs:
            sink.close()
    return {run: _rises(out) for run, (out, _, _) in procs.items()}


def _rises(out: Path) -> dict:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    key = next(
        k for k in history[0] if k.startswith("rewards/") and "correctness" in k and k.endswith("/mean")
    )
    values = [h[key] for h in history if key in h]
    assert len(values) >= 20, f"{len(values)} logged steps"
    summary = json.loads((out / "before_after.json").read_text())["summary"]
    return {
        "log_correctness_rise": sum(values[-10:]) / 10 - sum(values[:10]) / 10,
        "heldout_format_rise": summary["after/held-out/format/marker_templates"]
        - summary["before/held-out/format/marker_templates"],
        "table_correctness_rise": summary["after/trained/correctness"]
        - summary["before/trained/correctness"],
        "keys": sorted({k for h in history for k in h}),
    }


def _report(runs: dict) -> dict:
    return {f"{k}-{s}": {m: round(v, 3) for m, v in r.items() if m != "keys"} for (k, s), r in runs.items()}


def _check_format_and_control(runs: dict, seeds: tuple[int, ...]) -> None:
    for seed in seeds:
        learned = runs["recipe", seed]
        assert learned["heldout_format_rise"] >= FORMAT_RISE, (seed, _report(runs))
        # Per-template metrics follow whatever reward functions the recipe names.
        assert "templates/open-r1/rewards/correctness_reward" in learned["keys"]
    control = runs["control", 0]
    assert control["log_correctness_rise"] < CORRECTNESS_RISE, _report(runs)
    assert control["table_correctness_rise"] < CORRECTNESS_RISE, _report(runs)
    assert control["heldout_format_rise"] < FORMAT_RISE, _report(runs)
    assert "templates/open-r1/rewards/shuffled_correctness_reward" in control["keys"]


@pytest.mark.skipif(LEARNING_TIER, reason="PROMPT_AUG_LEARNING=1: the test of seeds 0-2 checks this too")
def test_seed_0_learns_the_format_and_the_shuffled_control_learns_nothing(tmp_path):
    runs = _train(tmp_path, [("recipe", 0), ("control", 0)])
    _check_format_and_control(runs, seeds=(0,))


@pytest.mark.skipif(
    not LEARNING_TIER,
    reason="the learning tier (seeds 0-2 and the control, about 26 minutes of one core): "
    "set PROMPT_AUG_LEARNING=1 (README, 'Tests')",
)
def test_every_seed_learns_the_format_and_correctness_rises_on_average(tmp_path):
    seeds = (0, 1, 2)
    runs = _train(tmp_path, [("recipe", s) for s in seeds] + [("control", 0)])
    _check_format_and_control(runs, seeds)
    for source in ("log", "table"):
        mean = sum(runs["recipe", s][f"{source}_correctness_rise"] for s in seeds) / len(seeds)
        assert mean >= CORRECTNESS_RISE, (source, _report(runs))
