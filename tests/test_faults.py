"""Faults: a run killed any way resumes exactly and leaves nothing running; bad data, a broken reward
function, a full disk and a failed Hub push are named in one line.

Runs of the smoke recipe (CPU, tiny random model). Where the weights must move, the reward is
``fault_harness:text_hash_reward`` (the smoke rewards give this model no spread, so nothing would train).

* Preemption: a SIGTERM from outside after step 1 is logged stops the run at the end of step 2 (the end of
  round 1), saved, with exit status 75; the resumed run's completion records and final weights equal an
  uninterrupted run's. A SIGTERM during a checkpoint save stops the run right after that save. On 2
  processes a SIGTERM to rank 1 alone stops both ranks at the same step, both saved.
* A checkpoint a kill left incomplete is skipped on resume, with one line naming it and why.
* Bad rows are dropped and named; above ``max_bad_row_share`` the run stops in one line.
* A reward function that raises, returns NaN or too few rewards stops the run in one line naming it, the
  row's uid and template.
* A full disk at a save and a failed Hub push end the run in one line naming the output folder.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import fault_harness
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from launch import torchrun
from transformers import TrainerCallback

from prompt_aug import faults, train
from prompt_aug.data import DataError, load_math_dataset, to_rows
from prompt_aug.templates import load_templates

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes/smoke/tiny_cpu.yaml")
HARNESS = str(REPO / "tests" / "fault_harness.py")
SPREAD = ("--reward_funcs", "fault_harness:text_hash_reward")
COLUMNS = ["step", "uid", "template"]
# Only keeps a hung run from hanging the suite; the tests wait on events (a busy box is slower, not failing).
SAFETY_CEILING_S = 15 * 60


def _train(out: Path, *extra: str) -> None:
    train.main(["--config", SMOKE, "--output_dir", str(out), *extra])


def _error(argv: list[str]) -> str:
    """The one-line error `prompt-aug-train` exits with."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    message = str(exit_info.value.code)
    assert message.startswith("prompt-aug-train: error: ") and "\n" not in message, message
    return message


def _records(run: Path, step: int) -> pd.DataFrame:
    frame = pd.read_parquet(run / "completions" / f"completions_{step:05d}.parquet")
    return frame[COLUMNS].reset_index(drop=True)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every live process: pid -> (parent, session, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[3]), command)
    return found


def _family(root: int) -> set[int]:
    """``root`` and every process beneath it (torchrun starts its workers in sessions of their own)."""
    table, family = _processes(), {root}
    while grown := {pid for pid, (parent, _, _) in table.items() if parent in family} - family:
        family |= grown
    return family


class Launch:
    """A training subprocess in its own session, its output read as it comes."""

    def __init__(self, cmd: list[str], **extra_env: str) -> None:
        env = {
            **os.environ,
            **extra_env,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.seen: set[int] = set()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str) -> None:
        ceiling = time.monotonic() + SAFETY_CEILING_S
        while text not in self.output:
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended before {text!r}:\n{self.output[-3000:]}")
            if time.monotonic() > ceiling:
                self.kill()
                pytest.fail(f"{text!r} not seen within the {SAFETY_CEILING_S} s safety ceiling")
            time.sleep(0.05)

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=SAFETY_CEILING_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"no exit within the {SAFETY_CEILING_S} s safety ceiling:\n{self.output[-3000:]}")
        self.reader.join()
        return code

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def family(self) -> set[int]:
        """The run's processes now (taken while it runs, for `left_running`)."""
        self.seen = _family(self.proc.pid)
        return self.seen

    def left_running(self, out: Path) -> list[str]:
        """Processes the run left: in its session, of its family as last seen, or naming its output folder."""
        deadline = time.monotonic() + 30  # a process that is exiting gets a moment
        while True:
            left = [
                f"{pid}: {command[:200]}"
                for pid, (_, session, command) in _processes().items()
                if session == self.proc.pid or pid in self.seen or str(out) in command
            ]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# Preemption


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path):
    run = ("--max_steps", "4", "--save_steps", "100", *SPREAD)  # no scheduled save before the end
    uninterrupted, preempted = tmp_path / "A", tmp_path / "B"
    _train(uninterrupted, *run)

    # Step 1's line is printed after its step end, so the signal lands in step 2, which ends round 1; the
    # harness holds step 2's end until the signal is there (a step can take 0.0 s on an idle machine).
    launch = Launch(
        [sys.executable, HARNESS, "--config", SMOKE, "--output_dir", str(preempted), *run],
        FAULT_HARNESS_HOLD_STEP="2",
    )
    launch.wait_for("| step 1/4 |")
    launch.family()
    launch.proc.send_signal(signal.SIGTERM)
    code = launch.wait()
    assert code == faults.EXIT_PREEMPTED, launch.output[-3000:]
    assert "Traceback" not in launch.output
    assert "SIGTERM received: stopping at step 2, checkpoint saving" in launch.output
    assert "Preempted by SIGTERM (exit status 75, preempted.json written) at step 2/4." in launch.output
    assert (
        f"--output_dir {preempted} --max_steps 4" in launch.output
        and "--resume_from_checkpoint true" in launch.output
    )
    assert launch.left_running(preempted) == []
    assert sorted(p.name for p in preempted.glob("checkpoint-*")) == ["checkpoint-2"]
    assert faults.checkpoint_problem(preempted / "checkpoint-2") is None
    marker = json.loads((preempted / faults.PREEMPTED_FILE).read_text())
    assert (marker["signal"], marker["step"], marker["exit_status"]) == ("SIGTERM", 2, 75)
    assert not (preempted / "model.safetensors").exists()  # not finished: no final model

    _train(preempted, *run, "--resume_from_checkpoint", "true")
    assert not (preempted / faults.PREEMPTED_FILE).exists()
    for step in (3, 4):
        pd.testing.assert_frame_equal(_records(preempted, step), _records(uninterrupted, step))
    assert len(_records(preempted, 3)) == 16
    expected, got = _weights(uninterrupted), _weights(preempted)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    first = _weights(preempted / "checkpoint-2")
    assert any(not torch.equal(first[name], got[name]) for name in got)  # steps 3-4 trained


@pytest.mark.slow
def test_a_signal_during_a_checkpoint_save_stops_the_run_right_after_that_save(tmp_path, monkeypatch):
    out = tmp_path / "run"
    original, sent = torch.save, []

    def save(obj, f, *args, **kwargs):  # the optimizer state of checkpoint-2, after its weights
        if not sent and "checkpoint-2" in Path(str(f)).parts:
            sent.append(f)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        _train(out, "--max_steps", "4", "--save_steps", "2")
    assert exit_info.value.code == faults.EXIT_PREEMPTED and sent
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert faults.checkpoint_problem(out / "checkpoint-2") is None
    assert json.loads((out / faults.PREEMPTED_FILE).read_text())["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is handler  # restored after training


@pytest.mark.slow
def test_the_printed_resume_command_resumes_a_recipe_that_sets_overwrite_output_dir(
    tmp_path, monkeypatch, capsys
):
    # A recipe may set overwrite_output_dir: true; the command printed at preemption must still resume the
    # run (with both flags on, the output folder check refuses the launch).
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(SMOKE).read_text() + "\noverwrite_output_dir: true\n")
    out = tmp_path / "run"
    original, sent = torch.save, []

    def save(obj, f, *args, **kwargs):  # SIGTERM while checkpoint-2 is written
        if not sent and "checkpoint-2" in Path(str(f)).parts:
            sent.append(f)
            os.kill(os.getpid(), signal.SIGTERM)
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(SystemExit) as exit_info:
        train.main(
            ["--config", str(recipe), "--output_dir", str(out), "--max_steps", "4", "--save_steps", "2"]
        )
    assert exit_info.value.code == faults.EXIT_PREEMPTED and sent
    monkeypatch.setattr(torch, "save", original)
    printed = capsys.readouterr().err
    command = next(line for line in printed.splitlines() if " -m prompt_aug.train " in line)
    train.main(shlex.split(command.split(" -m prompt_aug.train ", 1)[1]))  # what the message says to run
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step_saved(tmp_path):
    out = tmp_path / "run"
    launch = Launch(
        [*torchrun(2), HARNESS, "--config", SMOKE, "--output_dir", str(out), "--max_steps", "4",
         "--save_steps", "100", *SPREAD],
        FAULT_HARNESS_HOLD_STEP="2", FAULT_HARNESS_HOLD_RANK="1",  # rank 1 ends step 2 once signalled
    )  # fmt: skip
    launch.wait_for("| step 1/4 |")
    ranks = {}
    for pid in launch.family() - {launch.proc.pid}:  # torchrun's workers, each with its RANK
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"RANK=")]
        if rank:
            ranks[rank[0]] = pid
    os.kill(ranks["1"], signal.SIGTERM)  # rank 0 gets no signal: it learns of it at the step end
    launch.wait()  # torchrun turns a worker's non-zero status into 1: requeue scripts read preempted.json
    # torchrun's failure summary: a rank that exits 75 first makes torchrun SIGTERM the other, which may
    # still be leaving (its checkpoint part is written: the ranks pass a barrier after the save).
    exited = dict(re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s+exitcode\s*: (-?\d+)", launch.output))
    assert sorted(exited.values()) in (["75", "75"], ["-15", "75"]), launch.output[-3000:]
    assert "Preempted by SIGTERM (exit status 75, preempted.json written) at step 2/4." in launch.output
    assert launch.left_running(out) == []
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    checkpoint = out / "checkpoint-2"
    assert faults.checkpoint_problem(checkpoint) is None
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 2
    assert json.loads((out / faults.PREEMPTED_FILE).read_text())["step"] == 2


def _built(
    model_dir: Path, out: Path, eval_dataset: Any = None, callbacks: list | None = None, **keys: Any
) -> Any:
    """A trainer built in code, as a script of one's own builds it, on two questions."""
    from prompt_aug import PromptAugGRPOConfig
    from prompt_aug.trainer import PromptAugGRPOTrainer

    args = PromptAugGRPOConfig(
        output_dir=str(out), report_to="none", use_cpu=True, bf16=False,
        per_device_train_batch_size=2, num_generations=2, max_completion_length=4, **keys,
    )  # fmt: skip
    dataset = datasets.Dataset.from_dict(
        {"question": ["What is 1 + 1?", "What is 2 + 2?"], "answer": ["2", "4"]}
    )
    return PromptAugGRPOTrainer(
        model=str(model_dir),
        reward_funcs=fault_harness.text_hash_reward,
        args=args,
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        callbacks=callbacks,
    )


def test_preemption_is_a_config_key_the_trainer_applies(tiny_model_dir, tmp_path):
    def build(**keys):
        return _built(tiny_model_dir, tmp_path, **keys)

    on, off = build(), build(save_on_preemption=False)
    assert isinstance(on.preemption, faults.PreemptionCallback) and on.preempted is None
    assert on.preemption in on.callback_handler.callbacks
    assert off.preemption is None and not any(
        isinstance(c, faults.PreemptionCallback) for c in off.callback_handler.callbacks
    )


class _StepCount(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


class _SignalInStep(TrainerCallback):
    """SIGTERM to this process as step ``step`` begins; counts the Trainer's evaluations."""

    def __init__(self, step: int) -> None:
        self.step, self.evaluations = step, 0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluations += 1


@pytest.mark.slow
def test_a_signal_saves_before_an_evaluation_due_at_the_same_step(tiny_model_dir, tmp_path):
    # A cluster kills the job a grace period after its signal: an evaluation run first could outlast it and
    # lose the checkpoint. Neither ours (eval_every_steps) nor the Trainer's (eval_strategy) runs first.
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    out, held_out = (
        tmp_path / "run",
        datasets.Dataset.from_dict({"question": ["What is 3 + 3?"], "answer": ["6"]}),
    )
    trainer = _built(
        tiny_model_dir, out, eval_dataset=held_out,
        max_steps=4, save_strategy="no", logging_steps=1, eval_strategy="steps", eval_steps=2,
        per_device_eval_batch_size=2, eval_benchmarks=[str(questions)], eval_every_steps=2, eval_max_tokens=4,
    )  # fmt: skip
    watch = _SignalInStep(2)
    trainer.add_callback(watch)
    with pytest.raises(faults.Preempted) as stopped:
        trainer.train()
    assert stopped.value.step == 2 and faults.checkpoint_problem(out / "checkpoint-2") is None
    assert watch.evaluations == 0
    assert not any(k.startswith("eval") for entry in trainer.state.log_history for k in entry)


def test_a_signal_during_a_benchmark_evaluation_stops_the_run_at_that_step_saved(tiny_model_dir, tmp_path):
    """A signal that comes while the in-training benchmark evaluation runs (minutes on a real suite) stops
    the run at that step, saved, not after another generation round."""
    from prompt_aug.evaluation.callback import EvalCallback

    class SignalledWhileEvaluating(EvalCallback):
        def evaluate_model(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return super().evaluate_model(*args, **kwargs)

    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    out = tmp_path / "run"
    evaluator = SignalledWhileEvaluating([str(questions)], 2, max_tokens=4)
    trainer = _built(
        tiny_model_dir, out, callbacks=[evaluator], max_steps=4, save_strategy="no", logging_steps=1
    )
    with pytest.raises(faults.Preempted) as stopped:
        trainer.train()
    assert stopped.value.step == 2 and faults.checkpoint_problem(out / "checkpoint-2") is None
    assert not (out / "checkpoint-3").exists()


def test_a_signal_during_the_last_step_lets_the_run_finish(tiny_model_dir, tmp_path):
    """A signal in the last step is not a preemption: the run ends trained (train() returns), with no
    preempted.json, so that a requeue script does not requeue a finished run."""
    out = tmp_path / "run"
    trainer = _built(tiny_model_dir, out, max_steps=2, save_strategy="no")
    trainer.add_callback(_SignalInStep(2))
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.preempted is None
    assert not (out / faults.PREEMPTED_FILE).exists()


class _SignalInEvaluation(TrainerCallback):
    """SIGTERM to this process during the Trainer's first evaluation (its first prediction step)."""

    def __init__(self) -> None:
        self.sent_at: int | None = None

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.sent_at is None:
            self.sent_at = state.global_step
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_during_the_trainers_evaluation_stops_the_run_at_that_step_saved(tiny_model_dir, tmp_path):
    """The Trainer's own evaluation (eval_strategy) runs after every step-end callback, so the step-end
    agreements cannot see a signal that comes during it (GRPO's evaluation generates: minutes on a real set).
    The run stops right after that evaluation, saved at its step, not another step (a generation round)
    later, past a cluster's grace period."""
    out = tmp_path / "run"
    held_out = datasets.Dataset.from_dict({"question": ["What is 3 + 3?"], "answer": ["6"]})
    trainer = _built(
        tiny_model_dir, out, eval_dataset=held_out, max_steps=6, save_strategy="no", logging_steps=1,
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2,
    )  # fmt: skip
    watch = _SignalInEvaluation()
    trainer.add_callback(watch)
    with pytest.raises(faults.Preempted) as stopped:
        trainer.train()
    assert watch.sent_at == 2 and stopped.value.step == 2
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert faults.checkpoint_problem(out / "checkpoint-2") is None
    assert json.loads((out / faults.PREEMPTED_FILE).read_text())["step"] == 2


class _SavesCounted(_SignalInStep):
    """`_SignalInStep`, counting the checkpoint saves too."""

    def __init__(self, step: int) -> None:
        super().__init__(step)
        self.saves = 0

    def on_save(self, args, state, control, **kwargs):
        self.saves += 1


@pytest.mark.slow
def test_a_signal_under_epoch_strategies_neither_evaluates_nor_saves_again_as_the_epoch_ends(
    tiny_model_dir, tmp_path
):
    # The Trainer ends the stopped epoch too, and its flow callback asks for the epoch's evaluation and save:
    # the evaluation would run inside the grace period and the checkpoint would be written twice.
    out = tmp_path / "run"
    held_out = datasets.Dataset.from_dict({"question": ["What is 3 + 3?"], "answer": ["6"]})
    trainer = _built(
        tiny_model_dir, out, eval_dataset=held_out,
        max_steps=4, save_strategy="epoch", eval_strategy="epoch", per_device_eval_batch_size=2,
    )  # fmt: skip
    watch = _SavesCounted(1)
    trainer.add_callback(watch)
    with pytest.raises(faults.Preempted) as stopped:
        trainer.train()
    assert stopped.value.step == 1 and faults.checkpoint_problem(out / "checkpoint-1") is None
    assert (watch.evaluations, watch.saves) == (0, 1)


@pytest.mark.slow
def test_train_true_in_code_resumes_from_the_last_complete_checkpoint(tiny_model_dir, tmp_path, caplog):
    # transformers' own `True` takes the newest folder, complete or not; a script of one's own gets the
    # checks `prompt-aug-train` makes.
    keys = {"save_steps": 1, "logging_steps": 1}
    with pytest.raises(faults.ResumeError, match="no checkpoint-\\* folder in") as refused:
        _built(tiny_model_dir, tmp_path, max_steps=1, **keys).train(resume_from_checkpoint=True)
    assert isinstance(refused.value, ValueError)  # as transformers' "No valid checkpoint found"
    _built(tiny_model_dir, tmp_path, max_steps=2, **keys).train()
    (tmp_path / "checkpoint-2" / "trainer_state.json").unlink()  # a kill during its save
    trainer, count = _built(tiny_model_dir, tmp_path, max_steps=3, **keys), _StepCount()
    trainer.add_callback(count)
    with caplog.at_level(logging.WARNING, logger="prompt_aug"):
        trainer.train(resume_from_checkpoint=True)
    assert f"resume: skipping {tmp_path / 'checkpoint-2'}: trainer_state.json is missing" in caplog.text
    assert count.steps == 2 and trainer.state.global_step == 3  # from step 1, not from 0
    # As 2 processes would have saved it: their count, and each one's RNG state.
    saved = tmp_path / "checkpoint-3"
    (saved / faults.LAUNCH_FILE).write_text(json.dumps({"processes": 2}) + "\n")
    for rank in (0, 1):
        shutil.copy(saved / "rng_state.pth", saved / f"rng_state_{rank}.pth")
    with pytest.raises(faults.ResumeError, match="trained on 2 process\\(es\\), and this launch has 1"):
        _built(tiny_model_dir, tmp_path, max_steps=4, **keys).train(resume_from_checkpoint=True)


def test_the_final_save_ignores_a_late_warning_and_the_process_keeps_its_own_handler(tmp_path, monkeypatch):
    """After training, SIGUSR1 is ignored while the model, card and push are written (it would kill them),
    and the process's own handler is back afterwards: a test process, or a script, that trains in-process
    and then starts a job script must not pass an ignored SIGUSR1 on to it."""
    seen = []
    save_model = train.PromptAugGRPOTrainer.save_model

    def recording_save_model(self, *args, **kwargs):
        seen.append(signal.getsignal(signal.SIGUSR1))
        return save_model(self, *args, **kwargs)

    monkeypatch.setattr(train.PromptAugGRPOTrainer, "save_model", recording_save_model)
    own = signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    try:
        mine = signal.getsignal(signal.SIGUSR1)
        _train(tmp_path / "run", "--max_steps", "1")
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, own)
    assert seen and seen[-1] == signal.SIG_IGN  # the final save_model call


_SIGNAL_SCRIPT = """
import os, signal, sys
import datasets
from transformers import TrainerCallback
from trl import GRPOConfig
from prompt_aug import PromptAugGRPOConfig, PromptAugGRPOTrainer


class Cluster(TrainerCallback):  # what a cluster does before it stops a job
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)


kind, model, out = sys.argv[1:]
config = {"plain": GRPOConfig, "ours": PromptAugGRPOConfig}[kind](
    output_dir=out, report_to="none", use_cpu=True, bf16=False, max_steps=4, per_device_train_batch_size=2,
    num_generations=2, max_completion_length=4, save_strategy="no",
)
rows = {"question": ["What is 1 + 1?", "What is 2 + 2?"], "answer": ["2", "4"]}
trainer = PromptAugGRPOTrainer(
    model=model, reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=config,
    train_dataset=datasets.Dataset.from_dict(rows), callbacks=[Cluster()],
)
trainer.train()
print("AFTER TRAIN: the script goes on to save a final model", flush=True)
"""


@pytest.mark.parametrize("kind", ["ours", "plain"])
def test_a_signal_ends_a_script_of_ones_own_at_a_checkpoint_or_at_once_under_a_plain_grpo_config(
    kind, tiny_model_dir, tmp_path
):
    """With a `PromptAugGRPOConfig`, `train()` saves a checkpoint and raises `Preempted`, which ends the
    script with status 75 before anything after `train()` runs, so that nothing saves the unfinished model
    as final. Under a plain `GRPOConfig` the signal keeps its default action, as under TRL: the process ends
    at once, with nothing saved."""
    script = tmp_path / "script.py"
    script.write_text(_SIGNAL_SCRIPT)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(script), kind, str(tiny_model_dir), str(out)],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
    )  # fmt: skip
    assert "AFTER TRAIN" not in done.stdout, done.stdout + done.stderr[-2000:]
    if kind == "plain":
        assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
        assert not list(out.glob("checkpoint-*"))
        return
    assert done.returncode == faults.EXIT_PREEMPTED, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    marker = json.loads((out / faults.PREEMPTED_FILE).read_text())
    assert marker["signal"] == "SIGTERM" and (out / f"checkpoint-{marker['step']}").is_dir()
    assert marker["step"] < 4


# ---------------------------------------------------------------------------------------------
# Incomplete checkpoints


@pytest.fixture(scope="module")
def three_checkpoints(tmp_path_factory):
    out = tmp_path_factory.mktemp("checkpoints") / "run"
    _train(out, "--max_steps", "3", "--save_steps", "1")
    return out


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE = {
    "trainer_state.json missing": (
        lambda c: (c / "trainer_state.json").unlink(),
        "trainer_state.json is missing",
    ),
    "trainer_state.json half-written": (
        lambda c: _cut(c / "trainer_state.json"),
        "trainer_state.json is not valid",
    ),
    "optimizer.pt missing": (lambda c: (c / "optimizer.pt").unlink(), "no optimizer state"),
    "optimizer.pt cut short": (lambda c: _cut(c / "optimizer.pt"), "optimizer.pt is cut short"),
    "model.safetensors missing": (lambda c: (c / "model.safetensors").unlink(), "no model weights"),
    "model.safetensors cut short": (
        lambda c: _cut(c / "model.safetensors"),
        "model.safetensors is cut short",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_checkpoint_a_kill_left_incomplete_and_says_so(
    three_checkpoints, tmp_path, caplog, damage
):
    run = tmp_path / "run"
    shutil.copytree(three_checkpoints, run)
    harm, why = DAMAGE[damage]
    harm(run / "checkpoint-3")
    with caplog.at_level("INFO", logger="prompt_aug"):
        _train(run, "--max_steps", "4", "--resume_from_checkpoint", "true")
    skips = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume: skipping")]
    assert len(skips) == 1 and skips[0].startswith(f"resume: skipping {run / 'checkpoint-3'}: {why}"), skips
    assert f"resuming from {run / 'checkpoint-2'} (step 2)" in caplog.text
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 4
    assert faults.checkpoint_problem(run / "checkpoint-3") is None  # saved again, complete


def test_resolving_a_resume_names_what_is_incomplete(tmp_path):
    good = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-2", 2)
    bad = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-10", 10)  # newer: numbers sort as numbers
    (bad / "trainer_state.json").write_text('{"global_st')
    assert faults.resolve_resume("true", str(tmp_path)) == str(good)
    with pytest.raises(
        faults.ResumeError, match="checkpoint-10 is not a complete checkpoint: trainer_state.json is not"
    ):
        faults.resolve_resume(str(bad), str(tmp_path))
    shutil.rmtree(good)
    with pytest.raises(
        faults.ResumeError, match=r"no checkpoint in .* is complete \(checkpoint-10: trainer_state"
    ):
        faults.resolve_resume("true", str(tmp_path))
    assert faults.checkpoint_problem(bad, optimizer=False) is not None


def test_an_output_folder_given_as_the_checkpoint_is_told_apart_from_a_killed_save(tmp_path):
    # --resume_from_checkpoint with the run's folder instead of one of its checkpoints (or true) is a slip,
    # not a checkpoint a kill left incomplete: the line names the folder's newest checkpoint and true.
    run = tmp_path / "run"
    fault_harness.tiny_checkpoint(run / "checkpoint-2", 2)
    with pytest.raises(faults.ResumeError) as refused:
        faults.resolve_resume(str(run), str(run))
    assert str(refused.value) == (
        f"resume_from_checkpoint: {run} is an output folder, not a checkpoint; give one of its checkpoints "
        f"({run / 'checkpoint-2'}), or --resume_from_checkpoint true with --output_dir {run}"
    )


def test_a_weights_file_whose_header_length_runs_past_its_end_is_skipped(tmp_path):
    # A file that is not safetensors under that name (a Git LFS pointer, a damaged block) gives a header
    # length of exabytes: the folder is an incomplete checkpoint, skipped, not a crash of the resume.
    older, newer = (fault_harness.tiny_checkpoint(tmp_path / f"checkpoint-{n}", n) for n in (2, 4))
    (newer / "model.safetensors").write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    assert faults.checkpoint_problem(newer) == "model.safetensors is unreadable (half-written?)"
    assert faults.resolve_resume("true", tmp_path) == str(older)


def test_a_weights_file_deleted_while_it_is_checked_is_judged_as_read(tmp_path, monkeypatch):
    # Each process checks the checkpoints on its own before they compare what they found: a file that
    # another job deletes once it has been read must not raise on that process alone, which would leave the
    # others waiting in the comparison.
    folder = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-2", 2)
    weights, opened = folder / "model.safetensors", Path.open

    class DeletedOnceRead:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()
            weights.unlink()

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def open_then_deleted(self, *args, **kwargs):
        handle = opened(self, *args, **kwargs)
        return DeletedOnceRead(handle) if self == weights else handle

    monkeypatch.setattr(Path, "open", open_then_deleted)
    assert faults.checkpoint_problem(folder) is None  # whole, as it was read
    assert not weights.exists()


def test_a_checkpoint_of_two_processes_needs_each_ones_rng_state(tmp_path):
    # Process 0 writes trainer_state.json while process 1 may still be writing rng_state_1.pth: a kill then
    # leaves a folder that looks complete. transformers resumes it and restores no RNG state on process 1.
    import torch

    older, newer = (fault_harness.tiny_checkpoint(tmp_path / f"checkpoint-{n}", n) for n in (2, 4))
    for folder in (older, newer):
        (folder / faults.LAUNCH_FILE).write_text('{"processes": 2}\n')
        torch.save({"cpu": torch.random.get_rng_state()}, folder / "rng_state_0.pth")
    torch.save({"cpu": torch.random.get_rng_state()}, older / "rng_state_1.pth")
    assert (
        faults.checkpoint_problem(newer) == "rng_state_1.pth is missing (process 1 was killed while saving?)"
    )
    args = SimpleNamespace(output_dir=str(tmp_path), save_only_model=False)
    assert faults.check_resume("true", args, processes=2) == str(older)
    (newer / "rng_state_1.pth").write_bytes((older / "rng_state_1.pth").read_bytes()[:100])
    with pytest.raises(
        faults.ResumeError, match="checkpoint-4 is not a complete checkpoint: rng_state_1.pth is cut"
    ):
        faults.check_resume(str(newer), args, processes=2)
    shutil.copy(older / "rng_state_1.pth", newer / "rng_state_1.pth")
    assert faults.check_resume("true", args, processes=2) == str(newer)
    # Without launch.json (killed before it was written) the launch's count is taken.
    (older / faults.LAUNCH_FILE).unlink()
    (older / "rng_state_1.pth").unlink()
    assert faults.checkpoint_problem(older, processes=2) == (
        "rng_state_1.pth is missing (process 1 was killed while saving?)"
    )
    assert faults.checkpoint_problem(older) is None  # count unknown: not checked


AGREE_SCRIPT = """
import os, sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path[:0] = [os.environ["REPO"], os.environ["TESTS"]]
import fault_harness
from prompt_aug import faults

dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a process left waiting fails in a minute
rank = dist.get_rank()
base = Path(os.environ["BASE"])
# Each node's view of output_dir: a local folder of its own.
out = base / f"node{rank}"
args = SimpleNamespace(output_dir=str(out), save_only_model=False)


def checkpoint(step):
    folder = fault_harness.tiny_checkpoint(out / f"checkpoint-{step}", step)
    (folder / faults.LAUNCH_FILE).write_text('{"processes": 2}\\n')
    for r in range(2):
        torch.save({"cpu": torch.random.get_rng_state()}, folder / f"rng_state_{r}.pth")


def resume(phase, value="true"):
    try:
        said = Path(faults.check_resume(value, args, processes=2)).name
    except faults.ResumeError as err:
        said = str(err)
    (base / f"{phase}-{rank}.txt").write_text(said)
    dist.barrier()


for step in (2, 4) if rank == 0 else (2,):  # process 0's view holds a newer checkpoint
    checkpoint(step)
resume("newer")
if rank == 1:  # process 1's view holds no complete checkpoint: it finds nothing to resume
    (out / "checkpoint-2" / "trainer_state.json").unlink()
resume("none")
if rank == 1:  # both see the same newest checkpoint: the resume goes ahead on both
    checkpoint(4)
resume("same")
if rank == 0:  # process 0's view holds a later checkpoint than the one asked for, process 1's not (yet)
    checkpoint(6)
resume("later", str(out / "checkpoint-4"))  # the same folder on every node, by its path
dist.destroy_process_group()
"""


def test_processes_that_see_output_dir_differently_are_refused_on_every_one(tmp_path):
    # Nodes whose output_dir differs (a local disk each, or a lagging view of a shared one) would resume
    # different steps and optimizer states and hang or diverge; one that finds nothing would stop alone while
    # the others wait for it. Every process refuses, naming what each found.
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT)
    env = {**os.environ, "REPO": str(REPO), "TESTS": str(REPO / "tests"), "BASE": str(tmp_path),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    command = [*torchrun(2), str(script)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = {
        name: [(tmp_path / f"{name}-{r}.txt").read_text() for r in (0, 1)]
        for name in ("newer", "none", "same", "later")
    }
    head = (
        "resume_from_checkpoint: the processes see output_dir differently (process 0: checkpoint-4; "
        "process 1: "
    )
    tail = "); output_dir must be one folder that every node sees alike"
    assert said["newer"] == [said["newer"][0]] * 2
    assert said["newer"][0].startswith(f"{head}checkpoint-2{tail}")
    incomplete = f"none (true, but no checkpoint in {tmp_path / 'node1'} is complete"
    assert said["none"] == [said["none"][0]] * 2 and said["none"][0].startswith(f"{head}{incomplete}")
    assert said["same"] == ["checkpoint-4", "checkpoint-4"]
    # The same checkpoint chosen, but only process 0 sees the later one that refuses it: process 1 would
    # train on alone and wait for process 0 in its first collective. Both refuse, naming what each found.
    later = f"none ({tmp_path / 'node0' / 'checkpoint-4'} is at step 4, but "  # process 0's refusal
    assert said["later"] == [said["later"][0]] * 2
    assert said["later"][0].startswith(
        f"resume_from_checkpoint: the processes see output_dir differently (process 0: {later}"
    )
    assert f"; process 1: checkpoint-4{tail}" in said["later"][0]


def test_a_save_only_model_run_resumes_from_a_checkpoint_without_optimizer_state(tmp_path):
    # transformers resumes such a run on a fresh optimizer; a run that saves its optimizer does not skip it.
    only_model = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-3", 3)
    (only_model / "optimizer.pt").unlink()
    args = SimpleNamespace(output_dir=str(tmp_path), save_only_model=True)
    assert faults.check_resume("true", args, processes=1) == str(only_model)
    with pytest.raises(faults.ResumeError, match="no optimizer state"):
        faults.check_resume("true", SimpleNamespace(output_dir=str(tmp_path), save_only_model=False), 1)


def test_a_checkpoint_without_launch_json_is_counted_by_its_rng_states_where_they_are_sure(tmp_path):
    # TRL's trainer alone writes no launch.json. More rng_state files than this launch's processes, or the one
    # file of a single process, tell the count for sure: that count's one line. Fewer files may be a kill
    # during the save, so the folder is skipped, with both readings named.
    folder = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-4", 4)
    for rank in range(2):
        torch.save({"cpu": torch.random.get_rng_state()}, folder / f"rng_state_{rank}.pth")
    args = SimpleNamespace(output_dir=str(tmp_path), save_only_model=False)
    with pytest.raises(
        faults.ResumeError,
        match=r"checkpoint-4 was trained on 2 process\(es\) \(as its rng_state files show\), and this launch "
        r"has 1; .* Relaunch on 2 processes",
    ):
        faults.check_resume("true", args, processes=1)
    assert faults.check_resume("true", args, processes=2) == str(folder)
    assert faults.checkpoint_problem(folder, processes=4) == (
        "rng_state_2.pth is missing (process 2 was killed while saving, or the run had 2 process(es): then "
        "relaunch on 2)"
    )
    older = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-2", 2)  # a complete one of 4 processes
    for rank in range(4):
        torch.save({"cpu": torch.random.get_rng_state()}, older / f"rng_state_{rank}.pth")
    assert faults.check_resume("true", args, processes=4) == str(older)  # the newest was cut short
    (folder / "rng_state_1.pth").unlink()
    (folder / "rng_state_0.pth").rename(folder / "rng_state.pth")  # what one process writes
    with pytest.raises(faults.ResumeError, match=r"trained on 1 process\(es\) .*, and this launch has 2"):
        faults.check_resume(str(folder), args, processes=2)


def test_a_checkpoint_that_may_be_of_fewer_processes_is_not_met_with_start_over_advice_alone(tmp_path):
    # The only checkpoint records no process count and holds 2 processes' RNG state, and this launch has 4:
    # a save a kill cut short, or a whole save of 2 processes. Relaunching on 2 resumes it; starting over
    # (--overwrite_output_dir true) would delete it, so that is advised only for the other reading.
    folder = fault_harness.tiny_checkpoint(tmp_path / "checkpoint-4", 4)
    for rank in range(2):
        torch.save({"cpu": torch.random.get_rng_state()}, folder / f"rng_state_{rank}.pth")
    args = SimpleNamespace(output_dir=str(tmp_path), save_only_model=False)
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume("true", args, processes=4)
    said = str(refused.value)
    assert f"{folder} is complete on 2" in said and "relaunch on 2 to resume it" in said, said
    tail = "only if it had 4 (a process was killed while saving), start over with --overwrite_output_dir true"
    assert said.endswith(tail), said
    assert faults.check_resume("true", args, processes=2) == str(folder)  # the advice works
    # Where relaunching on 2 would not resume it either (no optimizer state), starting over is the advice.
    (folder / "optimizer.pt").unlink()
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume("true", args, processes=4)
    assert "relaunch" not in str(refused.value)
    assert str(refused.value).endswith("start over with --overwrite_output_dir true")


def test_adaptive_entropy_state_cut_short_is_skipped_and_a_missing_one_accepted(tmp_path):
    # TRL writes entropy_ctrl_state.json after trainer_state.json: one cut short would stop TRL's resume, so
    # the folder is skipped; a missing one TRL accepts (the coefficient restarts), as a run that turns the
    # flag on at a resume has none anywhere.
    older, newer = (fault_harness.tiny_checkpoint(tmp_path / f"checkpoint-{n}", n) for n in (2, 4))
    (older / faults.ENTROPY_FILE).write_text('{"entropy_coef": 0.01, "last_world_entropy": 0.5}')
    args = SimpleNamespace(output_dir=str(tmp_path), save_only_model=False, use_adaptive_entropy=True)
    assert faults.checkpoint_problem(newer, entropy=True) is None
    assert faults.check_resume("true", args, processes=1) == str(newer)
    (newer / faults.ENTROPY_FILE).write_text('{"entropy_co')
    assert faults.check_resume("true", args, processes=1) == str(older)
    with pytest.raises(faults.ResumeError, match="entropy_ctrl_state.json is not valid JSON"):
        faults.check_resume(str(newer), args, processes=1)
    assert faults.check_resume(
        "true", SimpleNamespace(**{**vars(args), "use_adaptive_entropy": False}), 1
    ) == (str(newer))


def test_a_full_disk_names_a_save_only_model_checkpoint_intact(tmp_path):
    # A run with save_only_model saves no optimizer state: its checkpoint is complete without it, and must not
    # be called incomplete (to be deleted to free space).
    out = tmp_path / "run"
    only_model = fault_harness.tiny_checkpoint(out / "checkpoint-2", 2)
    (only_model / "optimizer.pt").unlink()
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "model.safetensors"))
    with pytest.raises(faults.DiskFullError) as raised, faults.disk_full_is_one_line(out, optimizer=False):
        raise full
    assert f"The last complete checkpoint, {only_model}, is intact." in str(raised.value)
    assert "incomplete" not in str(raised.value)


def test_a_full_disk_on_several_processes_names_the_checkpoint_a_resume_takes(
    tiny_model_dir, tmp_path, monkeypatch
):
    # On 2 processes the disk fills while process 1 writes its RNG state into checkpoint-4, after process 0
    # wrote trainer_state.json there (and before launch.json, which follows the save). The resume on 2
    # processes skips checkpoint-4; the line must name checkpoint-2 as what is intact, not checkpoint-4.
    import transformers

    out = tmp_path / "run"
    older, newer = (fault_harness.tiny_checkpoint(out / f"checkpoint-{n}", n) for n in (2, 4))
    (older / faults.LAUNCH_FILE).write_text('{"processes": 2}\n')
    for folder, ranks in ((older, (0, 1)), (newer, (0,))):
        for rank in ranks:
            torch.save({"cpu": torch.random.get_rng_state()}, folder / f"rng_state_{rank}.pth")
    trainer = _built(tiny_model_dir, out, max_steps=6)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(newer / "rng_state_1.pth"))

    monkeypatch.setattr(transformers.Trainer, "train", full)
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    with pytest.raises(faults.DiskFullError) as raised:
        trainer.train()
    line = str(raised.value)
    assert f"The last complete checkpoint, {older}, is intact." in line, line
    assert "checkpoint-4 is incomplete (delete it to free space; a resume skips it)" in line
    args = SimpleNamespace(output_dir=str(out), save_only_model=False)
    assert faults.check_resume("true", args, processes=2) == str(older)  # what the line says a resume takes


def _deepspeed_layout(folder: Path, zero3: bool) -> Path:
    """A complete checkpoint as the Trainer saves one under DeepSpeed: the optimizer state per rank under
    ``global_step2/`` (ZeRO-3 keeps the model states per rank too), no ``optimizer.pt``."""
    (folder / "optimizer.pt").unlink()
    shards = folder / "global_step2"
    shards.mkdir()
    model_states = "zero_pp_rank_{}_mp_rank_00_model_states.pt" if zero3 else "mp_rank_00_model_states.pt"
    for rank in range(2):
        torch.save({}, shards / model_states.format(rank))
        torch.save({}, shards / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (folder / "latest").write_text("global_step2")
    return folder


def test_a_checkpoint_resumes_only_under_the_engine_whose_layout_it_holds(tmp_path, monkeypatch):
    # Without DeepSpeed the Trainer would take the weights and start a new optimizer without a word;
    # refused before the model loads, in one line naming the checkpoint and both engines.
    run = tmp_path / "run"
    zero2 = _deepspeed_layout(fault_harness.tiny_checkpoint(run / "checkpoint-2", 2), zero3=False)
    assert faults.checkpoint_problem(zero2) is None  # complete: only the engine differs
    with pytest.raises(
        SystemExit,
        match=r"checkpoint-2 was saved under DeepSpeed ZeRO-1/2, and this launch runs DDP or one process, "
        r"which cannot read its optimizer state\. Relaunch with the accelerate config",
    ):
        _train(run, "--max_steps", "4", "--resume_from_checkpoint", "true")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2"]  # nothing written, nothing lost

    plain = fault_harness.tiny_checkpoint(tmp_path / "plain" / "checkpoint-2", 2)
    zero3 = _deepspeed_layout(fault_harness.tiny_checkpoint(tmp_path / "z3" / "checkpoint-2", 2), zero3=True)
    fsdp = fault_harness.tiny_checkpoint(tmp_path / "fsdp" / "checkpoint-2", 2)
    (fsdp / "optimizer.pt").rename(fsdp / "optimizer.bin")
    torch.save({}, fsdp / "pytorch_model_fsdp.bin")
    # What TrainingArguments hold under each engine (the engine tier launches the real ones).
    one = faults.launch_engine(SimpleNamespace(deepspeed_plugin=None, fsdp=[]))
    zero2_now, zero3_now = (
        faults.launch_engine(SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=stage), fsdp=[]))
        for stage in (2, 3)
    )
    fsdp_now = faults.launch_engine(SimpleNamespace(deepspeed_plugin=None, fsdp=["full_shard"]))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # an FSDP accelerate config
    assert faults.launch_engine(SimpleNamespace(deepspeed_plugin=None, fsdp=[])) == fsdp_now
    for folder, fits in ((plain, one), (zero2, zero2_now), (zero3, zero3_now), (fsdp, fsdp_now)):
        for engine in {one, zero2_now, zero3_now, fsdp_now}:
            problem = faults.resume_engine_problem(folder, engine)
            assert (problem is None) == (engine == fits), (folder, engine, problem)
            assert problem is None or f"this launch runs {engine}," in problem


def test_a_model_only_checkpoint_and_a_warm_start_are_told_to_start_from_the_weights(tmp_path, monkeypatch):
    # save_only_model saves the weights alone under any engine, in the layout of a run without DeepSpeed or
    # FSDP: transformers resumes that only without them (on a new optimizer), so relaunching with the run's
    # own DeepSpeed or FSDP config cannot help. A warm start (a checkpoint outside output_dir) is a new run
    # already: it is not told to start one.
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    run, new = tmp_path / "run", tmp_path / "new"
    only_model = fault_harness.tiny_checkpoint(run / "checkpoint-4", 4)
    (only_model / "optimizer.pt").unlink()
    (only_model / faults.LAUNCH_FILE).write_text('{"processes": 2}\n')

    def launch(output_dir: Path, zero_stage: int | None = None, fsdp: list | None = None) -> SimpleNamespace:
        plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
        return SimpleNamespace(
            output_dir=str(output_dir), save_only_model=True, deepspeed_plugin=plugin, fsdp=fsdp or []
        )

    for args, engine in (
        (launch(run, zero_stage=2), "DeepSpeed ZeRO-1/2"),
        (launch(run, fsdp=["full_shard"]), "FSDP"),
    ):
        with pytest.raises(faults.ResumeError) as refused:
            faults.check_resume("true", args, processes=2)
        assert str(refused.value) == (
            f"resume_from_checkpoint: {only_model} was saved with save_only_model (model weights only), "
            f"which cannot be resumed under {engine}; start a new run from its weights "
            f"(--model_name_or_path {only_model}, another output_dir)"
        )
    assert faults.check_resume("true", launch(run), processes=2) == str(only_model)
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume(str(only_model), launch(new, zero_stage=3), processes=2)
    assert str(refused.value).endswith(
        "cannot be resumed under DeepSpeed ZeRO-3; start from its weights with --model_name_or_path "
        f"{only_model}"
    )
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume(str(only_model), launch(new), processes=1)
    assert str(refused.value).endswith(
        f"Relaunch on 2 processes, or start from its weights with --model_name_or_path {only_model}"
    )
    zero2 = _deepspeed_layout(
        fault_harness.tiny_checkpoint(tmp_path / "other" / "checkpoint-2", 2), zero3=False
    )
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume(str(zero2), SimpleNamespace(**{**vars(launch(new)), "save_only_model": False}), 1)
    assert str(refused.value).endswith(
        "Relaunch with the accelerate config the run was trained with, or start from its weights with "
        f"--model_name_or_path {zero2}"
    )


SMOKE_LAUNCH = fault_harness.SMOKE_LAUNCH
REFUSED_KEYS = (
    "; the question order and templates follow the seed, and the rounds the batch keys, so the resumed run "
    "would not continue the saved one. Relaunch with the saved values, or "
)


def _launch(output_dir: Path, **changed: int) -> SimpleNamespace:
    """TrainingArguments as the smoke recipe builds them on one process, with ``changed`` keys."""
    keys = {k: v for k, v in SMOKE_LAUNCH.items() if k != "processes"}
    return SimpleNamespace(
        output_dir=str(output_dir),
        save_only_model=False,
        deepspeed_plugin=None,
        fsdp=[],
        **{**keys, **changed},
    )


def test_a_resume_under_another_seed_or_round_is_refused_in_one_line(tmp_path):
    # The seed orders the questions and draws their templates, the batch keys size the round: resumed under
    # others, the run would train on other questions than the saved one went on to, without a word.
    run, new = tmp_path / "run", tmp_path / "new"
    saved = fault_harness.tiny_checkpoint(run / "checkpoint-4", 4)
    (saved / faults.LAUNCH_FILE).write_text(json.dumps(SMOKE_LAUNCH) + "\n")
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume("true", _launch(run, seed=7), processes=1)
    assert str(refused.value) == (
        f"resume_from_checkpoint: {saved} was trained with seed 42 (this launch: 7){REFUSED_KEYS}"
        "start a new run (another output_dir)"
    )
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume("true", _launch(run, per_device_train_batch_size=16, generation_batch_size=32), 1)
    assert str(refused.value) == (
        f"resume_from_checkpoint: {saved} was trained with per_device_train_batch_size 8 (this launch: 16), "
        f"generation_batch_size 16 (this launch: 32){REFUSED_KEYS}start a new run (another output_dir)"
    )
    # A warm start resumes the other run's optimizer, scheduler and data position too.
    with pytest.raises(faults.ResumeError) as refused:
        faults.check_resume(str(saved), _launch(new, num_iterations=2), processes=1)
    assert str(refused.value) == (
        f"resume_from_checkpoint: {saved} was trained with num_iterations 1 (this launch: 2){REFUSED_KEYS}"
        f"start from its weights with --model_name_or_path {saved}"
    )
    assert faults.check_resume("true", _launch(run), processes=1) == str(saved)
    assert faults.resume_keys_problem(saved, _launch(run)) is None
    # Another process count is named as before, whatever else differs.
    with pytest.raises(faults.ResumeError, match=r"trained on 1 process\(es\), and this launch has 2;"):
        faults.check_resume("true", _launch(run, seed=7), processes=2)


def test_a_checkpoint_that_records_no_seed_or_round_is_not_checked_for_them(tmp_path):
    # An older launch.json holds the process count alone; TRL's trainer alone writes none.
    run = tmp_path / "run"
    saved = fault_harness.tiny_checkpoint(run / "checkpoint-4", 4)
    (saved / faults.LAUNCH_FILE).write_text('{"processes": 1}\n')
    other = _launch(run, seed=7, per_device_train_batch_size=16, generation_batch_size=32)
    assert faults.resume_keys_problem(saved, other) is None
    assert faults.check_resume("true", other, processes=1) == str(saved)
    (saved / faults.LAUNCH_FILE).unlink()
    assert faults.check_resume("true", other, processes=1) == str(saved)


def test_each_checkpoint_records_the_round_as_the_built_config_holds_it(tmp_path):
    # steps_per_generation and generation_batch_size are filled in from each other: a recipe that sets one
    # and a command line that sets the other launch the same round.
    from prompt_aug.recipe import parse_args

    def built(*extra: str) -> Any:
        return parse_args(["--config", SMOKE, "--output_dir", str(tmp_path), *extra])[1]

    args = built()
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    state = SimpleNamespace(global_step=3, is_world_process_zero=True)
    faults.LaunchRecord().on_save(args, state, None)
    assert json.loads((folder / faults.LAUNCH_FILE).read_text()) == SMOKE_LAUNCH
    same = built("--steps_per_generation", "null", "--generation_batch_size", "16")
    assert faults.resume_keys_problem(folder, same) is None
    assert faults.resume_keys_problem(folder, built("--steps_per_generation", "4")) == (
        f"resume_from_checkpoint: {folder} was trained with steps_per_generation 2 (this launch: 4), "
        f"generation_batch_size 16 (this launch: 32){REFUSED_KEYS}start a new run (another output_dir)"
    )


# ---------------------------------------------------------------------------------------------
# Bad data


def _math_file(tmp_path: Path, rows: int, nan: int, missing: int, empty_question: int) -> Path:
    """``rows`` questions with float answers; the first rows of each kind spread over the file."""
    answers = [float(i) for i in range(rows)]
    questions = [f"What is {i} + 0?" for i in range(rows)]
    for k in range(nan):
        answers[7 + 10 * k] = math.nan
    for k in range(missing):
        answers[3 + 10 * k] = None
    for k in range(empty_question):
        questions[5 + 10 * k] = " "
    path = tmp_path / "math.parquet"
    # pyarrow from Python lists keeps NaN apart from None (from pandas, both would become null)
    pq.write_table(pa.table({"question": questions, "answer": pa.array(answers, pa.float64())}), path)
    return path


def test_one_percent_bad_rows_are_dropped_and_named_with_their_rows(tmp_path):
    path = _math_file(tmp_path, rows=200, nan=1, missing=0, empty_question=1)
    rows, report = load_math_dataset(str(path), max_bad_row_share=0.05)
    assert len(rows) == 198 and report.read == 200
    assert report.dropped["NaN gold answer"] == 1 and report.dropped["empty question"] == 1
    text = str(report)
    assert "dropped 1: NaN gold answer (rows 7, counted from 0)" in text
    assert "dropped 1: empty question (rows 5, counted from 0)" in text
    assert "nan" not in [str(a).lower() for a in rows["answer"]]


def test_twenty_percent_bad_rows_stop_the_run_in_one_line_naming_column_share_and_override(tmp_path, capsys):
    path = _math_file(tmp_path, rows=200, nan=20, missing=20, empty_question=0)
    with pytest.raises(DataError) as err:
        load_math_dataset(str(path), max_bad_row_share=0.05)
    message = str(err.value)
    assert message.startswith("20.0% of the 200 rows are unusable (")
    assert "20 NaN gold answer in column 'answer' (rows 7, 17, 27, 37, 47, ...)" in message
    assert "20 empty gold answer in column 'answer' (rows 3, 13, 23, 33, 43, ...)" in message
    assert message.endswith(
        "more than max_bad_row_share 0.05: fix the data, or allow them with --max_bad_row_share 0.2"
    )
    rows, _ = load_math_dataset(str(path), max_bad_row_share=0.2)  # the override lets it go on
    assert len(rows) == 160
    line = _error(["--config", SMOKE, "--output_dir", str(tmp_path / "out"), "--dataset_name", str(path)])
    assert (
        f"dataset_name {path}: 20.0% of the 200 rows are unusable" in line
        and "--max_bad_row_share 0.2" in line
    )
    assert not (tmp_path / "out" / "checkpoint-1").exists()


def test_answers_the_grader_does_not_know_are_bad_rows_and_the_text_nan_is_not():
    raw = datasets.Dataset.from_dict({"question": ["q1", "q2"], "answer": [{"value": 1}, {"value": 2}]})
    rows, dropped = to_rows(raw)
    assert (
        len(rows) == 0
        and dropped["gold answer of type dict"] == 2
        and dropped.rows["gold answer of type dict"] == [0, 1]
    )
    rows, dropped = to_rows(datasets.Dataset.from_dict({"question": ["q1", "q2"], "answer": ["nan", "3"]}))
    assert rows["answer"] == ["nan", "3"] and not dropped.bad()
    rows, dropped = to_rows(
        datasets.Dataset.from_dict({"question": ["q1", "q2"], "answer": [[1.5, math.nan], [math.nan]]})
    )
    assert rows["answer"] == [["1.5"]] and dropped["empty gold answer"] == 1


# ---------------------------------------------------------------------------------------------
# Reward functions

ROW = r"row uid 'synthetic-42-\d+', template '([\w-]+)'"
FAULTY_REWARDS = {
    "raises_on_one_row": (
        r"raised ZeroDivisionError: float division by zero at fault_harness\.py:\d+ on the completion of "
        r"row uid 'synthetic-42-00003', template '([\w-]+)'$"
    ),
    "nan_reward": rf"returned nan for {ROW}; return a finite number",
    "short_reward": rf"returned 15 rewards for 16 completions \({ROW} first\)",
}


@pytest.mark.slow
@pytest.mark.parametrize("reward", list(FAULTY_REWARDS))
def test_a_faulty_reward_stops_training_with_one_line(tmp_path, reward):
    # 4 questions: all of them (uids synthetic-42-00000..3) are in the first round.
    line = _error(
        ["--config", SMOKE, "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--num_synthetic", "4",
         "--reward_funcs", "correctness", f"fault_harness:{reward}"]
    )  # fmt: skip
    found = re.search(
        rf"^prompt-aug-train: error: reward function {reward!r} " + FAULTY_REWARDS[reward], line
    )
    assert found, line
    assert found.group(1) in load_templates()


# ---------------------------------------------------------------------------------------------
# A full disk


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


@pytest.mark.slow
def test_a_full_disk_at_a_save_is_one_line_naming_output_dir_and_the_last_checkpoint_stays_intact(
    tmp_path, monkeypatch
):
    out = tmp_path / "run"
    original, before = torch.save, {}

    def save(obj, f, *args, **kwargs):  # the disk fills while checkpoint-4 is written, after its weights
        if "checkpoint-4" in Path(str(f)).parts:
            before.update(_digests(out / "checkpoint-2"))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    line = _error(["--config", SMOKE, "--output_dir", str(out), "--max_steps", "4", "--save_steps", "2"])
    assert f"no space left on the disk of output_dir {out} while writing {out / 'checkpoint-4'}/" in line
    assert f"The last complete checkpoint, {out / 'checkpoint-2'}, is intact." in line
    assert "checkpoint-4 is incomplete (delete it to free space; a resume skips it)" in line
    assert line.endswith("then rerun with --resume_from_checkpoint true.")
    assert before and _digests(out / "checkpoint-2") == before
    assert faults.checkpoint_problem(out / "checkpoint-2") is None

    monkeypatch.setattr(torch, "save", original)  # space freed: the run resumes from checkpoint-2
    _train(out, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint", "true")
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


def _advised(line: str) -> list[str]:
    """The flags a fault's line ends by telling to rerun with (``... with --key value.``)."""
    found = re.search(r" with (--\w+ \w+)\.$", line)
    assert found, line
    return found.group(1).split()


@pytest.mark.slow
def test_a_full_disk_before_any_checkpoint_is_complete_says_how_to_start_over(tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = torch.save

    def save(obj, f, *args, **kwargs):  # the disk fills while the first checkpoint is written
        if "checkpoint-2" in Path(str(f)).parts:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    run = ("--max_steps", "2", "--save_steps", "2")
    line = _error(["--config", SMOKE, "--output_dir", str(out), *run])
    assert "No checkpoint is complete. checkpoint-2 is incomplete" in line
    monkeypatch.setattr(torch, "save", original)  # space freed: what the line says to do runs
    _train(out, *run, *_advised(line))
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


@pytest.fixture(scope="module")
def trained_two_steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    _train(out, "--max_steps", "2", "--save_steps", "2", *SPREAD)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["save_state", "save_model_unpushed"])
def test_a_full_disk_after_the_last_step_names_the_checkpoint_that_holds_the_trained_model(
    trained_two_steps, tmp_path, monkeypatch, writer
):
    # Training has finished and its last checkpoint is complete when the run's final writes fill the disk;
    # a resume at max_steps is refused (there is nothing left to train), so the line names that checkpoint.
    out = tmp_path / "run"

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "model.safetensors"))

    monkeypatch.setattr(train.PromptAugGRPOTrainer, writer, full)
    line = _error(
        ["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--save_steps", "2", *SPREAD]
    )
    last = out / "checkpoint-2"
    assert f"no space left on the disk of output_dir {out}" in line
    assert f"Training had reached max_steps 2: {last} holds the trained model" in line
    assert "rerun with --resume_from_checkpoint true." not in line
    expected, got = _weights(trained_two_steps), _weights(last)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)


def test_disk_full_is_recognised_however_the_writer_reports_it(tmp_path, monkeypatch):
    assert faults.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    safetensors_style = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert faults.is_disk_full(safetensors_style, tmp_path)
    torch_style = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert not faults.is_disk_full(torch_style, tmp_path)  # the test box has space: another write failure
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 100, 0))
    assert faults.is_disk_full(torch_style, tmp_path)
    assert not faults.is_disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path)


# ---------------------------------------------------------------------------------------------
# The Hub


@pytest.mark.slow
def test_a_failed_push_keeps_model_and_card_on_disk_and_says_how_to_push_later(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealTokenForTests")  # a token, so the push is tried at all
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="prompt_aug"):  # HF_HUB_OFFLINE=1 (conftest): every request fails
        line = _error(
            ["--config", SMOKE, "--output_dir", str(out), "--max_steps", "2", "--push_to_hub", "true",
             "--hub_model_id", "someone/x"]
        )  # fmt: skip
    assert "push_to_hub: cannot reach the Hub to create someone/x (OfflineModeIsEnabled" in caplog.text
    assert "training goes on without pushing checkpoints" in caplog.text
    assert line.startswith(
        "prompt-aug-train: error: push_to_hub: the upload to someone/x failed (OfflineModeIsEnabled"
    )
    assert f"The trained model and its model card are in {out}; push them later with: " in line
    assert line.endswith(f"hf upload someone/x {out} . --exclude 'checkpoint-*' --exclude '_*'")
    # The command is quoted for a shell: a folder with a space is one argument.
    from prompt_aug.faults import push_later_command

    spaced = SimpleNamespace(output_dir="/runs/my run", hub_revision=None, hub_private_repo=True)
    assert shlex.split(push_later_command(spaced, "someone/x")) == [
        "hf", "upload", "someone/x", "/runs/my run", ".", "--exclude", "checkpoint-*", "--exclude", "_*",
        "--private",
    ]  # fmt: skip
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2


def test_the_final_push_uploads_the_saved_model_without_writing_it_again(
    tiny_model_dir, tmp_path, monkeypatch
):
    """transformers' push_to_hub saves the model into output_dir again before it uploads, rewriting
    model.safetensors in place: a kill then would cut a finished model short. The end of a run pushes the
    folder as saved: the weights file is untouched when the upload reads it, and the upload is what
    transformers' push_to_hub sends. The Hub client's create and upload are recorded here, not sent."""
    from huggingface_hub import HfApi

    out, uploads = tmp_path / "run", []
    untouched = 1_000_000_000 * 10**9  # an mtime (ns) no write now can give

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        rewritten = os.stat(Path(folder_path) / "model.safetensors").st_mtime_ns != untouched
        uploads.append(((repo_id, kwargs, files), rewritten))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0")

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    trainer = _built(tiny_model_dir, out, push_to_hub=True, hub_model_id="someone/final")
    trainer.save_model_unpushed(str(out))
    trainer.create_model_card()
    for push in (trainer.push_saved_model, trainer.push_to_hub):
        os.utime(out / "model.safetensors", ns=(untouched, untouched))
        push(commit_message="prompt-aug GRPO, 0 steps")
    (ours, ours_rewritten), (theirs, theirs_rewritten) = uploads
    assert not ours_rewritten and theirs_rewritten  # transformers' own push saves the weights again
    assert ours == theirs and ours[1]["commit_message"] == "prompt-aug GRPO, 0 steps"
    assert {"README.md", "model.safetensors"} <= set(ours[2]) and not ours[1]["run_as_future"]


def test_a_refused_hub_request_is_not_mistaken_for_an_unreachable_hub():
    from huggingface_hub.errors import OfflineModeIsEnabled

    class Response:
        status_code = 401

    refused = Exception("401 Unauthorized")
    refused.response = Response()
    assert faults.hub_unreachable(OfflineModeIsEnabled("offline")) and faults.hub_unreachable(TimeoutError())
    assert not faults.hub_unreachable(refused)
    Response.status_code = 503
    assert faults.hub_unreachable(refused)


def test_a_staged_folder_left_by_a_killed_process_is_removed_by_the_next_write_and_no_other(tmp_path):
    """A SIGKILL during a fetch or merge leaves its hidden staging folder; the next write to that target
    removes it when its process (on this host) is gone, and keeps a live process's, another host's, and
    another target's."""
    import socket

    from prompt_aug.faults import staged_folder

    target = tmp_path / "model"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = f"{socket.gethostname()}-{os.stat('/proc/self/ns/pid').st_ino}"
    left = tmp_path / f".model.partial-{host}-{dead.pid}-abc123"
    live = tmp_path / f".model.partial-{host}-{os.getppid()}-def456"
    elsewhere = tmp_path / f".model.partial-other-host-1-{dead.pid}-ghi789"
    # A container with this host's name has its own process ids: not judged from here.
    other_namespace = tmp_path / f".model.partial-{socket.gethostname()}-1-{dead.pid}-mno345"
    other_target = tmp_path / f".merged.partial-{host}-{dead.pid}-jkl012"
    for folder in (left, live, elsewhere, other_namespace, other_target):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    with staged_folder(target) as work:
        assert work.parent == tmp_path and work.name.startswith(f".model.partial-{host}-{os.getpid()}-")
        (work / "config.json").write_text("{}")
        work.rename(target)
    assert not left.exists() and {live, elsewhere, other_namespace, other_target} <= set(tmp_path.iterdir())
    assert (target / "config.json").is_file()
    with pytest.raises(RuntimeError, match="killed"), staged_folder(tmp_path / "merged") as work:
        raise RuntimeError("killed")
    assert not work.exists() and not other_target.exists()  # its own staging goes, and the dead one left
