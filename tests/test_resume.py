"""Resume: an interrupted smoke run, resumed from a checkpoint, trains on the same questions under the same
templates as the uninterrupted run.

Runs (smoke recipe: 2 optimizer steps per generation round, save_steps 2):

* A: 4 steps, uninterrupted.
* B: 2 steps (checkpoint-1 and checkpoint-2), then resumed from ``B/checkpoint-2`` to step 4 (by path).
* C: a copy of B's 2-step run without checkpoint-2, resumed with ``resume_from_checkpoint true``; the last
  checkpoint is then checkpoint-1, in the middle of a generation round.

The completion records (``completions/completions_0000N.parquet``: step, uid, template) of steps 3-4 must
match A's row for row.

Epoch 2 (`epoch_runs`): 12 questions, 3 rounds of 4 per epoch (6 optimizer steps). D trains 10 steps
uninterrupted, saving every step; E resumes from a copy of checkpoint-8 (round 4 of 5, inside the second
epoch). E's steps 9-10 must be D's, and D's epoch 2 must not replay epoch 1's order. F resumes from a copy of
checkpoint-7 (the middle of round 4) with ``ignore_data_skip``: it starts the second epoch over.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import fault_harness
import pandas as pd
import pytest
from launch import torchrun

from prompt_aug import faults, train

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
COLUMNS = ["step", "uid", "template"]

pytestmark = pytest.mark.slow


def _train(out: Path, *extra: str) -> None:
    train.main(["--config", SMOKE, "--output_dir", str(out), *extra])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    a, b, c = root / "A", root / "B", root / "C"
    _train(a)
    _train(b, "--max_steps", "2", "--save_steps", "1")
    shutil.copytree(b, c)
    shutil.rmtree(c / "checkpoint-2")
    _train(b, "--max_steps", "4", "--resume_from_checkpoint", str(b / "checkpoint-2"))
    assert faults.resolve_resume("true", str(c)) == str(c / "checkpoint-1")
    _train(c, "--max_steps", "4", "--resume_from_checkpoint", "true")
    return {"A": a, "B": b, "C": c}


def _records(run: Path, step: int) -> pd.DataFrame:
    return pd.read_parquet(run / "completions" / f"completions_{step:05d}.parquet")[COLUMNS]


def _global_step(run: Path) -> int:
    return json.loads((run / "trainer_state.json").read_text())["global_step"]


def test_all_runs_reach_step_4(runs):
    assert [_global_step(runs[k]) for k in "ABC"] == [4, 4, 4]
    assert (runs["B"] / "checkpoint-4").is_dir() and (runs["C"] / "checkpoint-4").is_dir()


@pytest.mark.parametrize("step", [3, 4])
def test_resume_by_path_at_a_round_boundary_replays_the_same_uids_and_templates(runs, step):
    expected, got = _records(runs["A"], step), _records(runs["B"], step)
    assert len(expected) == 16
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


@pytest.mark.parametrize("step", [2, 3, 4])
def test_resume_true_from_the_middle_of_a_round_replays_the_same_uids_and_templates(runs, step):
    # Step 2 finishes the round checkpoint-1 interrupted (regenerated for the same questions and
    # templates); steps 3-4 are the next round, as in the uninterrupted run.
    expected, got = _records(runs["A"], step), _records(runs["C"], step)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


def test_the_two_rounds_differ(runs):
    # Guards the comparisons above against a trivially constant record.
    assert set(_records(runs["A"], 1)["uid"]).isdisjoint(_records(runs["A"], 3)["uid"])


EPOCH_RUN = ("--num_synthetic", "12", "--max_completion_length", "8", "--save_steps", "1")


@pytest.fixture(scope="module")
def epoch_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_epoch")
    d, e = root / "D", root / "E"
    _train(d, *EPOCH_RUN, "--max_steps", "10")
    e.mkdir()
    shutil.copytree(d / "checkpoint-8", e / "checkpoint-8")
    _train(e, *EPOCH_RUN, "--max_steps", "10", "--resume_from_checkpoint", "true")
    return d, e


def _all_records(run: Path) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in sorted((run / "completions").glob("completions_*.parquet"))]
    return pd.concat(frames)[[*COLUMNS, "round"]].reset_index(drop=True)


def test_resume_in_the_second_epoch_sees_the_uninterrupted_sequence(epoch_runs):
    d, e = epoch_runs
    assert _global_step(e) == 10 and json.loads((e / "trainer_state.json").read_text())["epoch"] > 1
    expected = _all_records(d).query("step > 8").reset_index(drop=True)
    got = _all_records(e).reset_index(drop=True)
    assert list(got["step"].unique()) == [9, 10] and len(got) == 2 * 16
    pd.testing.assert_frame_equal(got, expected)


def test_the_second_epoch_is_a_new_shuffle_of_every_question(epoch_runs):
    # Guards the test above: under TRL's RepeatSampler the resumed epoch replayed epoch 1's order, which a
    # fresh shuffle must differ from, while still covering all 12 questions once.
    records = _all_records(epoch_runs[0])
    first = records.query("step <= 6").drop_duplicates("uid")["uid"].tolist()
    second = records.query("step > 6 and step <= 10").drop_duplicates("uid")["uid"].tolist()
    assert len(first) == 12 and len(set(second)) == 8 and set(second) <= set(first)
    assert second != first[:8]
    assert records.groupby("step")["round"].first().to_dict() == {s: (s + 1) // 2 for s in range(1, 11)}


def test_a_resume_that_ignores_the_data_skip_starts_its_epoch_over_in_whole_rounds(epoch_runs, tmp_path):
    # The Trainer then restarts the resumed epoch's dataloader at its first batch, so F's steps 8-10 train on
    # D's steps 7-9: round 4 whole, then round 5, each generated from one round of the dataloader.
    d, f = epoch_runs[0], tmp_path / "F"
    f.mkdir()
    shutil.copytree(d / "checkpoint-7", f / "checkpoint-7")
    _train(
        f, *EPOCH_RUN, "--max_steps", "10", "--resume_from_checkpoint", "true", "--ignore_data_skip", "true"
    )
    got = _all_records(f)
    assert got.groupby("step")["round"].first().to_dict() == {8: 4, 9: 4, 10: 5}
    expected = _all_records(d).query("7 <= step <= 9").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected.assign(step=expected["step"] + 1))


def test_every_log_entry_carries_its_generation_round(epoch_runs):
    # 2 optimizer steps per round: steps 1-2 are round 1, ..., steps 9-10 round 5, in the resumed run too.
    for run in epoch_runs:
        history = json.loads((run / "trainer_state.json").read_text())["log_history"]
        assert history and all(h["round"] == (h["step"] + 1) // 2 for h in history), history


def _torchrun(out: Path, *extra: str) -> None:
    cmd = [
        *torchrun(2),
        "-m", "prompt_aug.train", "--config", SMOKE, "--output_dir", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_process_resume_in_the_second_epoch_sees_the_uninterrupted_sequence(tmp_path):
    # On 2 processes the resumed epoch's sampler sits behind SkipBatchSampler -> BatchSamplerShard, which the
    # Trainer's set_epoch does not reach; the sampler reads the epoch itself. 8 questions per round, 3 rounds
    # per epoch: checkpoint-8 is inside epoch 2. On several CPU processes the optimizer state is loaded by
    # the seam, not by TRL, which also restores its adaptive entropy controller there: the entropy lies below
    # the target throughout, so the coefficient grows by 0.1 a step, resumed as uninterrupted.
    d, e = tmp_path / "D", tmp_path / "E"
    run = (
        "--num_synthetic", "24", "--max_completion_length", "8", "--save_steps", "8", "--max_steps", "10",
        "--use_adaptive_entropy", "true", "--entropy_target", "100", "--entropy_coef_delta", "0.1",
    )  # fmt: skip
    _torchrun(d, *run)
    e.mkdir()
    shutil.copytree(d / "checkpoint-8", e / "checkpoint-8")
    assert json.loads((e / "checkpoint-8" / "launch.json").read_text()) == {
        "processes": 2,
        "seed": 42,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "num_generations": 4,
        "steps_per_generation": 2,
        "generation_batch_size": 32,  # 8 questions x 4 rollouts on 2 processes
        "num_iterations": 1,
    }
    # On one process the round would be half as large: refused before the model loads, in one line.
    with pytest.raises(
        SystemExit, match=r"checkpoint-8 was trained on 2 process\(es\), and this launch has 1;"
    ):
        _train(e, *run, "--resume_from_checkpoint", "true")
    _torchrun(e, *run, "--resume_from_checkpoint", "true")
    expected = _all_records(d).query("step > 8").reset_index(drop=True)
    got = _all_records(e).reset_index(drop=True)
    assert len(got) == 2 * 32
    pd.testing.assert_frame_equal(got, expected)
    assert _logged(d, "entropy_coef")[9] == pytest.approx(0.9)
    assert _logged(e, "entropy_coef")[9] == pytest.approx(0.9)  # 0.1 when restarted at 0


def _logged(run: Path, key: str) -> dict[int, float]:
    history = json.loads((run / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h[key] for h in history if key in h}


def test_a_bad_line_in_the_log_file_stops_a_resume_before_the_model_loads(runs, tmp_path, monkeypatch):
    run = tmp_path / "B"
    shutil.copytree(runs["B"], run)
    log = run / "logs.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    loads = []
    monkeypatch.setattr(train, "load_model", lambda *a, **k: loads.append(a))  # a probe: never to be called
    expected = rf"^prompt-aug-train: error: {re.escape(str(log))}, line 2: not JSON"
    with pytest.raises(SystemExit, match=expected):
        _train(run, "--max_steps", "6", "--resume_from_checkpoint", "true")
    assert loads == []


def test_a_resume_under_another_seed_or_batch_size_stops_before_the_model_loads(runs, tmp_path, monkeypatch):
    # Resumed with another seed, the questions come in another order under other templates; with another
    # per_device_train_batch_size, each round holds 8 questions instead of 4. Each stops in one line.
    run = tmp_path / "B"
    shutil.copytree(runs["B"], run)
    saved = run / "checkpoint-4"
    assert json.loads((saved / "launch.json").read_text()) == fault_harness.SMOKE_LAUNCH
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    loads = []
    monkeypatch.setattr(train, "load_model", lambda *a, **k: loads.append(a))  # a probe: never to be called
    why = "; the question order and templates follow the seed, and the rounds the batch keys"
    for changed, named in (
        (("--seed", "7"), "seed 42 (this launch: 7)"),
        (
            ("--per_device_train_batch_size", "16"),
            "per_device_train_batch_size 8 (this launch: 16), generation_batch_size 16 (this launch: 32)",
        ),
    ):
        refused = re.escape(f"resume_from_checkpoint: {saved} was trained with {named}{why}")
        way_out = re.escape("Relaunch with the saved values, or start a new run (another output_dir)")
        with pytest.raises(SystemExit, match=rf"^prompt-aug-train: error: {refused}, .* {way_out}$"):
            _train(run, "--max_steps", "8", "--resume_from_checkpoint", "true", *changed)
    assert loads == []
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_resume_true_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(
        SystemExit, match="^prompt-aug-train: error: resume_from_checkpoint: true, but there is no checkpoint"
    ):
        train.main(["--config", SMOKE, "--output_dir", str(tmp_path), "--resume_from_checkpoint", "true"])
    with pytest.raises(SystemExit, match="resume_from_checkpoint: no such checkpoint folder"):
        train.main(
            [
                "--config",
                SMOKE,
                "--output_dir",
                str(tmp_path),
                "--resume_from_checkpoint",
                str(tmp_path / "x"),
            ]
        )


def _tiny_run(run: Path, *steps: int) -> None:
    from fault_harness import tiny_checkpoint

    for step in steps:
        tiny_checkpoint(run / f"checkpoint-{step}", step)


def test_a_resume_from_an_earlier_checkpoint_is_refused_while_later_ones_are_there(tmp_path):
    # Training on from checkpoint-2 beside checkpoint-4 and -6: the next --resume_from_checkpoint true (every
    # Slurm requeue) would take checkpoint-6, the abandoned line. Nothing is deleted.
    run = tmp_path / "run"
    _tiny_run(run, 2, 4, 6)
    shutil.copytree(run / "checkpoint-2", run / "_collapse-entropy-round1")
    before = sorted(p.name for p in run.iterdir())
    for resume in (run / "checkpoint-2", run / "_collapse-entropy-round1"):
        with pytest.raises(
            SystemExit,
            match=rf"error: resume_from_checkpoint: {re.escape(str(resume))} is at step 2, but "
            rf"{re.escape(str(run))} holds later checkpoints \(checkpoint-4, checkpoint-6\), which the next "
            r"--resume_from_checkpoint true would resume instead; move them out of output_dir",
        ):
            _train(run, "--max_steps", "8", "--resume_from_checkpoint", str(resume))
    assert sorted(p.name for p in run.iterdir()) == before


def test_only_complete_later_checkpoints_hold_a_resume_back(tmp_path):
    from types import SimpleNamespace

    from prompt_aug.faults import ResumeError, check_resume

    run = tmp_path / "run"
    _tiny_run(run, 2, 4, 6)
    args = SimpleNamespace(output_dir=str(run), save_only_model=False)
    (run / "checkpoint-6" / "trainer_state.json").unlink()  # a kill during its save: a resume skips it
    assert check_resume(str(run / "checkpoint-4"), args, processes=1) == str(run / "checkpoint-4")
    with pytest.raises(ResumeError, match=r"holds later checkpoints \(checkpoint-4\)"):
        check_resume(str(run / "checkpoint-2"), args, processes=1)  # as a script's own train() checks it


def test_a_warm_start_into_a_folder_that_holds_a_run_is_refused(tmp_path):
    # Another run's checkpoint into a used folder would mix the runs, and save_total_limit would rotate the
    # folder's own checkpoints away.
    run, other = tmp_path / "run", tmp_path / "other"
    _tiny_run(run, 2)
    _tiny_run(other, 2)
    (run / "logs.jsonl").write_text('{"step": 2}\n')
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(
        SystemExit,
        match=rf"output_dir {re.escape(str(run))} already holds a run \(checkpoint-2, logs.jsonl\), "
        r"and resume_from_checkpoint .*other/checkpoint-2 lies outside it",
    ):
        _train(run, "--max_steps", "4", "--resume_from_checkpoint", str(other / "checkpoint-2"))
    assert sorted(p.name for p in run.iterdir()) == before
