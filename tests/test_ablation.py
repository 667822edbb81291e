"""`bench/ablation.py` end to end on the built-in tiny model (``--model tiny``): both arms, one seed.

1. ``--rounds 1``: each run trains one round (a checkpoint), the base model and the checkpoint are scored
   under all 13 templates, the report is written.
2. ``--rounds 2``: each run resumes from ``checkpoint-1`` and trains round 2 only: round 1's completions
   and log entry are the ones written in step 1, the relaunch's log says it resumed and shows no step 1;
   finished evaluations are not redone; a checkpoint left half-written is removed first.
3. ``--rounds 2`` again: everything is finished, nothing is launched.

And the held-out questions the runner writes are those the recipe itself writes with ``before_after``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prompt_aug import train

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "ablation.py"
ARMS = ("bank", "one")

pytestmark = pytest.mark.slow

sys.path.insert(0, str(REPO / "bench"))
import ablation


def _run(out: Path, rounds: int) -> str:
    cmd = [sys.executable, str(SCRIPT), "--model", "tiny", "--out", str(out), "--arms", *ARMS, "--seeds", "0"]
    cmd += ["--rounds", str(rounds), "--eval_every", "0", "--jobs", "2"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _launches(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "launches.jsonl").read_text().splitlines()]


def _log(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "train" / "logs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ablation_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablation")
    first = _run(out, 1)
    runs = {arm: out / f"{arm}-s0" for arm in ARMS}
    after_first = {
        arm: {
            "launches": _launches(run),
            "step1": [e for e in _log(run) if e["step"] == 1 and "entropy" in e],
            "parquet": (run / "train" / "completions" / "completions_00001.parquet").stat().st_mtime_ns,
            "checkpoint": (run / "train" / "checkpoint-1" / "trainer_state.json").stat().st_mtime_ns,
            "scores": (run / "eval" / "round-1" / "scores.json").stat().st_mtime_ns,
        }
        for arm, run in runs.items()
    }
    base_scores = (out / "base-s0" / "eval" / "scores.json").stat().st_mtime_ns
    # A save stopped halfway: a checkpoint folder without trainer_state.json.
    (runs["bank"] / "train" / "checkpoint-7").mkdir()
    second = _run(out, 2)
    third = _run(out, 2)
    return {
        "out": out, "runs": runs, "first": first, "second": second, "third": third,
        "after_first": after_first, "base_scores": base_scores,
    }  # fmt: skip


def test_first_call_trains_one_round_and_scores_base_and_checkpoint(ablation_runs):
    for arm, before in ablation_runs["after_first"].items():
        assert [(x["from_step"], x["to_step"], x["exit"]) for x in before["launches"]] == [(0, 1, 0)], arm
        assert len(before["step1"]) == 1
    assert "finished 1 rounds" in ablation_runs["first"]
    base = json.loads((ablation_runs["out"] / "base-s0" / "eval" / "scores.json").read_text())
    assert len(base["templates"]) == 13
    assert set(base["templates"]["abel"]) == {"strict", "lenient", "format"}


def test_second_call_resumes_from_the_checkpoint_and_trains_only_round_2(ablation_runs):
    for arm, run in ablation_runs["runs"].items():
        before = ablation_runs["after_first"][arm]
        launches = _launches(run)
        assert [(x["from_step"], x["to_step"], x["exit"]) for x in launches] == [(0, 1, 0), (1, 2, 0)], arm
        relaunch = (run / "logs" / "train-2.log").read_text()
        assert "--resume_from_checkpoint true" in relaunch
        assert "resuming from" in relaunch and "checkpoint-1 (step 1)" in relaunch
        assert "step 2/2" in relaunch and "step 1/2" not in relaunch  # round 1 is not trained again
        state = json.loads((run / "train" / "checkpoint-2" / "trainer_state.json").read_text())
        assert state["global_step"] == 2
        # Round 1's records are those of the first call: not regenerated, not rewritten.
        assert (run / "train" / "completions" / "completions_00001.parquet").stat().st_mtime_ns == before[
            "parquet"
        ]
        assert (run / "train" / "checkpoint-1" / "trainer_state.json").stat().st_mtime_ns == before[
            "checkpoint"
        ]
        log = [e for e in _log(run) if "entropy" in e]
        assert [e["step"] for e in log] == [1, 2]
        assert log[0] == before["step1"][0]
        # Finished evaluations are kept; the new round is scored.
        assert (run / "eval" / "round-1" / "scores.json").stat().st_mtime_ns == before["scores"]
        assert (run / "eval" / "round-2" / "scores.json").is_file()
        assert json.loads((run / "done.json").read_text())["rounds"] == 2
    assert (ablation_runs["out"] / "base-s0" / "eval" / "scores.json").stat().st_mtime_ns == ablation_runs[
        "base_scores"
    ]
    assert not (ablation_runs["runs"]["bank"] / "train" / "checkpoint-7").exists()
    assert "removing incomplete" in (ablation_runs["runs"]["bank"] / "logs" / "train-2.log").read_text()


def test_third_call_skips_finished_runs(ablation_runs):
    for arm, run in ablation_runs["runs"].items():
        assert f"{arm}-s0: finished earlier (2 rounds), skipped" in ablation_runs["third"]
        assert len(_launches(run)) == 2
        assert not (run / "logs" / "train-3.log").exists()
    assert "training to round" not in ablation_runs["third"]


def test_report_has_both_arms_every_round_and_the_figure(ablation_runs):
    out = ablation_runs["out"]
    report = json.loads((out / "ablation.json").read_text())
    assert set(report["arms"]) == set(ARMS)
    for run in report["runs"]:
        assert run["rounds"] == 2 and run["finished"]
        assert set(run["curves"]["entropy"]) == {"1", "2"}
        assert run["first_round_entropy_below_floor"] is None  # the tiny random model: about 6 nats
        assert run["first_round_entropy_5_round_mean_below_floor"] is None
        assert set(run["eval"]) == {"0", "1", "2"}
        summary = run["eval"]["2"]["summary"]
        assert set(summary) >= {"lenient", "strict", "format", "format_marker_templates", "worst_lenient"}
        assert set(summary["lenient"]) == {"mean", "spread", "std"}
    text = (out / "ablation.md").read_text()
    assert "| **bank** (mean ± sd, seeds 0) |" in text and "| one s0 | 2 |" in text
    assert (out / "ablation.png").stat().st_size > 10_000


def test_heldout_questions_are_the_ones_the_recipe_writes(ablation_runs, tmp_path):
    """The recipe with ``before_after: true`` writes its held-out questions; the runner's are the same."""
    out = tmp_path / "recipe"
    argv = ["--config", str(ablation.ARMS["bank"]), "--output_dir", str(out), "--seed", "0"]
    argv += [*ablation.TINY_OVERRIDES, "--max_steps", "1", "--before_after", "true", "--save_strategy", "no"]
    train.main(argv)
    runner = (ablation_runs["runs"]["bank"] / "heldout.jsonl").read_text()
    assert (out / "heldout.jsonl").read_text() == runner
    assert len(runner.splitlines()) == 4
    assert (ablation_runs["out"] / "base-s0" / "heldout.jsonl").read_text() == runner
    assert (ablation_runs["runs"]["one"] / "heldout.jsonl").read_text() == runner
