"""It learns: the learning demo (recipes/smoke/learn_cpu.yaml) against the shuffled-reward control.

Each run is the recipe as a user launches it (warm start, then GRPO, then the before/after table).
The thresholds are the ones issue 10 fixed before any run of this test, and are not to be tuned to
make a failing run pass:

* training log: the mean of ``rewards/correctness_reward/mean`` over the last 10 logged steps exceeds
  that over the first 10 by at least 0.1;
* held-out questions (never trained on): the format score on the templates with format markers rises
  by at least 0.3 from before GRPO to after;
* the control (both rewards shuffled inside each round) rises by neither.

The correctness test was marked xfail while the recipe's hidden-64 model did not learn correctness;
it passes, with the same threshold, since the recipe uses the hidden-128 model and a warm start that
boxes the right answer half the time (docs/benchmarks.md, "Learning demo"). To be sure the rise is
learnt and not a rebound from an early dip, the before/after table must agree: trained-question
correctness after GRPO exceeds that before by the same 0.1.

Slow: four runs of the recipe (two seeds, recipe and control), about 2 minutes each on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prompt_aug import train

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "recipes/smoke/learn_cpu.yaml")
CONTROL = ["--reward_funcs", "rewards.controls:shuffled_correctness_reward", "rewards.controls:shuffled_format_reward"]
CORRECTNESS_RISE, FORMAT_RISE = 0.1, 0.3

pytestmark = pytest.mark.slow
_RUNS: dict[tuple[int, str], dict] = {}


def _run(tmp_path_factory, seed: int, kind: str) -> dict:
    """Train once per (seed, recipe or control) in this session; the rises and the logged keys."""
    if (seed, kind) not in _RUNS:
        out = tmp_path_factory.mktemp(f"{kind}-seed{seed}")
        train.main(["--config", RECIPE, "--output_dir", str(out), "--seed", str(seed), *(CONTROL if kind == "control" else [])])
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        key = next(k for k in history[0] if k.startswith("rewards/") and "correctness" in k and k.endswith("/mean"))
        values = [h[key] for h in history if key in h]
        assert len(values) >= 20, f"{len(values)} logged steps"
        summary = json.loads((out / "before_after.json").read_text())["summary"]
        _RUNS[(seed, kind)] = {
            "log_correctness_rise": sum(values[-10:]) / 10 - sum(values[:10]) / 10,
            "heldout_format_rise": summary["after/held-out/format/marker_templates"]
            - summary["before/held-out/format/marker_templates"],
            "table_correctness_rise": summary["after/trained/correctness"] - summary["before/trained/correctness"],
            "keys": {k for h in history for k in h},
        }
    return _RUNS[(seed, kind)]


def _report(learned: dict, control: dict) -> dict:
    return {n: {k: round(v, 3) for k, v in r.items() if k != "keys"} for n, r in (("recipe", learned), ("control", control))}


@pytest.mark.parametrize("seed", [0, 1])
def test_heldout_format_rises_and_not_under_the_shuffled_control(seed, tmp_path_factory):
    learned, control = _run(tmp_path_factory, seed, "recipe"), _run(tmp_path_factory, seed, "control")
    assert learned["heldout_format_rise"] >= FORMAT_RISE, _report(learned, control)
    assert control["heldout_format_rise"] < FORMAT_RISE, _report(learned, control)
    # Per-template metrics follow whatever reward functions the recipe names.
    assert "templates/open-r1/correctness_reward" in learned["keys"]
    assert "templates/open-r1/shuffled_correctness_reward" in control["keys"]


@pytest.mark.parametrize("seed", [0, 1])
def test_logged_correctness_rises_and_not_under_the_shuffled_control(seed, tmp_path_factory):
    learned, control = _run(tmp_path_factory, seed, "recipe"), _run(tmp_path_factory, seed, "control")
    assert control["log_correctness_rise"] < CORRECTNESS_RISE, _report(learned, control)
    assert learned["log_correctness_rise"] >= CORRECTNESS_RISE, _report(learned, control)
    # The same model sampled before and after GRPO agrees (the log alone can rise by rebounding from a dip).
    assert learned["table_correctness_rise"] >= CORRECTNESS_RISE, _report(learned, control)
    assert control["table_correctness_rise"] < CORRECTNESS_RISE, _report(learned, control)
