"""Template-diversity ablation: does training under the 13-template bank hold the entropy up and keep held-out
accuracy robust across templates, compared with training under one template?

    python bench/ablation.py --out /work/ablation-runs          # run, or resume, every run; then report
    python bench/ablation.py --out /work/ablation-runs --report_only
    python bench/ablation.py --out /tmp/measure --measure        # a short run: seconds per round and per eval

Arms (recipes under ``recipes/smollm2-135m/``): ``bank`` (ablation_bank.yaml, all 13 templates), ``one``
(ablation_one_template.yaml, ``templates: [qwen-math]``) and, if asked for, ``bank_high_lr``
(ablation_bank_high_lr.yaml). Each arm is trained for every ``--seeds`` seed with the package's own trainer,
``python -m prompt_aug.train --config RECIPE --output_dir OUT/ARM-sSEED/train --seed SEED``, one torch
thread per process, ``--jobs`` runs side by side.

Resumable. A run is trained in segments that end at the evaluation rounds (every ``--eval_every`` rounds and
at ``--rounds``): each segment is one launch with ``--max_steps`` at the segment's end, a relaunch adding
``--resume_from_checkpoint true`` (the recipes save a checkpoint every 5 rounds and keep two). After a
segment, its last checkpoint is evaluated before the next segment starts, so every evaluation round keeps
its checkpoint until it has been scored. Rerunning the same command skips what is finished (``done.json``,
each evaluation's ``scores.json``) and continues what is not: a run stopped in its middle loses the rounds
since its last checkpoint, an evaluation stopped in its middle keeps the completions it saved. The recipes'
learning rate is constant, so training in segments is training in one go (``tests/test_resume.py`` checks
that a resumed run replays the uninterrupted one's questions and templates).

Held-out questions: the recipes set ``heldout_questions: 30`` (of the 45 digit sums, which leaves 15 to train
on), which `prompt_aug.demo.warmstart.split_heldout` draws with the run's seed and keeps out of training. The
recipe writes them to ``heldout.jsonl`` only with ``before_after: true``, and only at the end of training,
while the ablation scores checkpoints on the way, so the runner writes the same file first, through the
same functions the training script calls (`prompt_aug.data.load_train_dataset`, then ``split_heldout``);
``tests/test_ablation.py`` checks it equals the recipe's own file.

Evaluation: ``prompt-aug-eval --template all`` (greedy, hf backend, float32, 64 new tokens) on the held-out
questions, for the base model (round 0, once per seed) and each evaluation round's checkpoint, through
``bench/real_model_robustness.py``, which also regrades leniently (the `correctness` reward's rule) beside
the evaluator's strict one (the last ``\\boxed{}``).

Report (``OUT/ablation.md``, ``OUT/ablation.json`` and ``--figure``, default ``OUT/ablation.png``, drawn
by `prompt_aug.plot`): per run and per arm (mean ± standard deviation over seeds), from each run's
``logs.jsonl``, the entropy, training accuracy (``rewards/correctness_reward/mean``) and truncation
(``completions/clipped_ratio``) over the first and last 10 rounds (every round's value in the JSON), the
first round whose entropy, and the first whose 5-round trailing mean, is below ``--entropy_floor``; and at
each evaluation round the held-out lenient, strict and format scores: the mean over the 13 templates, the
spread (best minus worst template) and the standard deviation across templates.

``--model tiny`` runs the same pipeline on the package's built-in random model with small shapes (tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
if str(REPO) not in sys.path:  # this checkout's prompt_aug, also for the report's imports
    sys.path.insert(0, str(REPO))
RECIPES = REPO / "recipes" / "smollm2-135m"
ARMS = {
    "bank": RECIPES / "ablation_bank.yaml",
    "one": RECIPES / "ablation_one_template.yaml",
    "bank_high_lr": RECIPES / "ablation_bank_high_lr.yaml",
}
# Rounds per run by default: see `recipes/smollm2-135m/ablation_bank.yaml` for the measured cost behind it.
DEFAULT_ROUNDS = 60
DEFAULT_EVAL_EVERY = 30
# `--model tiny`: the built-in random Qwen2, small shapes, a checkpoint every round (tests).
TINY_OVERRIDES = [
    "--model_name_or_path", "tiny-random-qwen2",
    "--max_completion_length", "8",
    "--num_generations", "2",
    "--per_device_train_batch_size", "4",
    "--heldout_questions", "4",
    "--dataset_num_rows", "41",
    "--save_steps", "1",
    "--learning_rate", "1e-4",
]  # fmt: skip
TINY_EVAL_TOKENS = 8
ACCURACY_KEY = "rewards/correctness_reward/mean"
TRUNCATION_KEY = "completions/clipped_ratio"
WINDOW = 10  # rounds averaged at the start and the end of a run
SMOOTH = 5  # rounds of the trailing mean whose crossing of the entropy floor is also reported
FLOOR_KEYS = ("first_round_entropy_below_floor", f"first_round_entropy_{SMOOTH}_round_mean_below_floor")
DONE_FILE, SCORES_FILE, HELDOUT_FILE, PREPARED_FILE = (
    "done.json",
    "scores.json",
    "heldout.jsonl",
    "prepared.json",
)


class RunFailed(RuntimeError):
    """A training or evaluation subprocess of one run failed; the message names its log."""


# -- Subprocesses -----------------------------------------------------------------------------------------

_ACTIVE: set[subprocess.Popen] = set()
_ACTIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set on SIGTERM: no new subprocess starts


def child_env() -> dict[str, str]:
    """One torch thread, offline, this checkout first on the path."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_logged(cmd: list[str], log: Path) -> tuple[int, float, float]:
    """Run ``cmd`` with its output appended to ``log``; returns (exit code, seconds, CPU seconds).

    The CPU seconds are the process's and its reaped children's (grading workers), user and system: on a
    box shared with other jobs they say what a run costs better than the wall clock does."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(cmd)}\n")
        handle.flush()
        with _ACTIVE_LOCK:
            if _STOPPING.is_set():
                raise RunFailed("stopped before it started")
            proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
            _ACTIVE.add(proc)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(proc)
    return proc.returncode, time.perf_counter() - started, usage.ru_utime + usage.ru_stime


def stop_children(*_: Any) -> None:
    """On SIGTERM: stop the training and evaluation processes this runner started, then exit. (Their
    threads reap them; a run so stopped resumes from its last checkpoint next time.)"""
    with _ACTIVE_LOCK:
        _STOPPING.set()
        pids = [proc.pid for proc in _ACTIVE]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with _ACTIVE_LOCK:
            if not _ACTIVE:
                break
        time.sleep(0.5)
    with _ACTIVE_LOCK:
        for proc in _ACTIVE:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    raise SystemExit(143)


# -- One run ----------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What the whole ablation is: arms, seeds, rounds, where and how."""

    out: Path
    arms: list[str]
    seeds: list[int]
    rounds: int
    eval_every: int
    model: str = "smollm2"
    max_tokens: int = 64
    entropy_floor: float = 0.2
    extra: list[str] = field(default_factory=list)

    def overrides(self) -> list[str]:
        return [*(TINY_OVERRIDES if self.model == "tiny" else []), *self.extra]

    def eval_rounds(self) -> list[int]:
        every = list(range(self.eval_every, self.rounds, self.eval_every)) if self.eval_every > 0 else []
        return [*every, self.rounds]


def run_dir(plan: Plan, arm: str, seed: int) -> Path:
    return plan.out / f"{arm}-s{seed}"


def checkpoint_steps(train_dir: Path) -> list[int]:
    """Steps of the complete checkpoints in ``train_dir`` (``trainer_state.json`` is written last)."""
    if not train_dir.is_dir():
        return []
    return sorted(
        int(p.name.split("-")[-1])
        for p in train_dir.glob("checkpoint-*")
        if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").is_file()
    )


def drop_incomplete_checkpoints(train_dir: Path, log: Path) -> None:
    """A launch stopped while saving leaves a checkpoint without ``trainer_state.json``; the trainer's
    ``--resume_from_checkpoint true`` would pick it, so it goes."""
    for path in train_dir.glob("checkpoint-*"):
        if path.is_dir() and not (path / "trainer_state.json").is_file():
            with log.open("a") as handle:
                handle.write(f"removing incomplete {path}\n")
            shutil.rmtree(path)


def prepare(plan: Plan, arm: str, seed: int) -> dict[str, Any]:
    """The run's held-out questions (``heldout.jsonl``), model path and optimizer steps per round, written
    once by a subprocess (`prepare_main`)."""
    folder = run_dir(plan, arm, seed)
    prepared = folder / PREPARED_FILE
    if not prepared.is_file():
        cmd = [sys.executable, str(Path(__file__).resolve()), "_prepare", "--recipe", str(ARMS[arm])]
        cmd += ["--train_dir", str(folder / "train"), "--seed", str(seed), "--write", str(folder)]
        cmd += ["--", *plan.overrides()]
        code, _, _ = run_logged(cmd, folder / "logs" / "prepare.log")
        if code != 0:
            raise RunFailed(f"{arm} seed {seed}: preparing failed, see {folder / 'logs' / 'prepare.log'}")
    return json.loads(prepared.read_text())


def evaluate(model: str, questions: Path, out: Path, max_tokens: int, log: Path) -> dict[str, Any]:
    """``out/scores.json``: every template's strict, lenient and format score of ``model`` on ``questions``
    (made by a subprocess, `eval_main`, unless there)."""
    scores = out / SCORES_FILE
    if not scores.is_file():
        cmd = [sys.executable, str(Path(__file__).resolve()), "_eval", "--model", model]
        cmd += ["--questions", str(questions), "--out", str(out), "--max_tokens", str(max_tokens)]
        code, _, cpu = run_logged(cmd, log)
        if code != 0:
            raise RunFailed(f"evaluation of {model} failed, see {log}")
        result = json.loads(scores.read_text())
        scores.write_text(json.dumps({**result, "cpu_seconds": round(cpu, 1)}, indent=2) + "\n")
    return json.loads(scores.read_text())


_SEED_LOCKS: dict[int, threading.Lock] = {}
_SEED_LOCKS_GUARD = threading.Lock()


def base_eval(plan: Plan, seed: int, info: dict[str, Any], heldout: Path) -> None:
    """Round 0: the base model on this seed's held-out questions, once per seed, shared by the arms."""
    with _SEED_LOCKS_GUARD:
        lock = _SEED_LOCKS.setdefault(seed, threading.Lock())
    base = plan.out / f"base-s{seed}"
    with lock:
        base.mkdir(parents=True, exist_ok=True)
        if (base / HELDOUT_FILE).is_file():
            if (base / HELDOUT_FILE).read_text() != heldout.read_text():
                raise RunFailed(
                    f"{heldout} differs from {base / HELDOUT_FILE}: arms of seed {seed} must share it"
                )
        else:
            shutil.copy(heldout, base / HELDOUT_FILE)
        evaluate(info["model_path"], base / HELDOUT_FILE, base / "eval", plan.max_tokens, base / "eval.log")


def train_to(plan: Plan, arm: str, seed: int, round_: int, steps_per_round: int) -> None:
    """Train the run until round ``round_`` (one launch, resuming from its last checkpoint if any)."""
    folder = run_dir(plan, arm, seed)
    train_dir, logs = folder / "train", folder / "logs"
    target = round_ * steps_per_round
    done = checkpoint_steps(train_dir)
    if done and done[-1] >= target:
        return
    logs.mkdir(parents=True, exist_ok=True)
    launches = folder / "launches.jsonl"
    number = len(launches.read_text().splitlines()) + 1 if launches.is_file() else 1
    log = logs / f"train-{number}.log"
    drop_incomplete_checkpoints(train_dir, log)
    done = checkpoint_steps(train_dir)
    cmd = [
        sys.executable,
        "-m",
        "prompt_aug.train",
        "--config",
        str(ARMS[arm]),
        "--output_dir",
        str(train_dir),
    ]
    cmd += ["--seed", str(seed), "--max_steps", str(target), *plan.overrides()]
    if done:
        cmd += ["--resume_from_checkpoint", "true"]
    elif train_dir.is_dir():  # stopped before its first checkpoint: start over
        cmd += ["--overwrite_output_dir", "true"]
    print(
        f"[{arm}-s{seed}] training to round {round_} (from step {done[-1] if done else 0}), log {log}",
        flush=True,
    )
    code, seconds, cpu = run_logged(cmd, log)
    record = {"launch": number, "from_step": done[-1] if done else 0, "to_step": target, "exit": code}
    with launches.open("a") as handle:
        handle.write(
            json.dumps({**record, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1)}) + "\n"
        )
    if code != 0:
        raise RunFailed(f"{arm} seed {seed}: training exited with {code}, see {log}")


def run_one(plan: Plan, arm: str, seed: int) -> str:
    """Train and evaluate one run as far as ``plan`` asks; returns a one-line status."""
    folder = run_dir(plan, arm, seed)
    done_file = folder / DONE_FILE
    wanted = plan.eval_rounds()
    if done_file.is_file():
        done = json.loads(done_file.read_text())
        if done.get("rounds", 0) >= plan.rounds and set(wanted) <= set(done.get("eval_rounds", [])):
            return f"{arm}-s{seed}: finished earlier ({done['rounds']} rounds), skipped"
    folder.mkdir(parents=True, exist_ok=True)
    info = prepare(plan, arm, seed)
    heldout, spr = folder / HELDOUT_FILE, int(info["steps_per_round"])
    base_eval(plan, seed, info, heldout)
    scored = []
    for round_ in wanted:
        out = folder / "eval" / f"round-{round_}"
        if not (out / SCORES_FILE).is_file():
            train_to(plan, arm, seed, round_, spr)
            checkpoint = folder / "train" / f"checkpoint-{round_ * spr}"
            if not (checkpoint / "trainer_state.json").is_file():
                print(
                    f"[{arm}-s{seed}] no {checkpoint.name} left to score (trained past it earlier)",
                    flush=True,
                )
                continue
            print(f"[{arm}-s{seed}] scoring {checkpoint.name} under every template", flush=True)
            evaluate(
                str(checkpoint), heldout, out, plan.max_tokens, folder / "logs" / f"eval-round-{round_}.log"
            )
        scored.append(round_)
    train_to(plan, arm, seed, plan.rounds, spr)
    done_file.write_text(json.dumps({"rounds": plan.rounds, "eval_rounds": scored}) + "\n")
    return f"{arm}-s{seed}: finished {plan.rounds} rounds, scored at rounds {scored}"


def run_all(plan: Plan, jobs: int) -> list[str]:
    """Every (arm, seed) run, ``jobs`` at a time, seed by seed so that the first seeds finish first."""
    order = [(arm, seed) for seed in plan.seeds for arm in plan.arms]
    failures: list[str] = []

    def one(pair: tuple[str, int]) -> None:
        try:
            print(run_one(plan, *pair), flush=True)
        except RunFailed as err:
            print(f"[{pair[0]}-s{pair[1]}] FAILED: {err}", flush=True)
            failures.append(str(err))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, order))
    return failures


# -- Subcommands run in their own processes ---------------------------------------------------------------


def prepare_main(argv: list[str]) -> None:
    """``_prepare``: write the run's ``heldout.jsonl`` (exactly the questions the trainer keeps out) and
    ``prepared.json`` (model path, optimizer steps per round)."""
    parser = argparse.ArgumentParser(prog="ablation.py _prepare")
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--train_dir", required=True)
    parser.add_argument("--seed", required=True)
    parser.add_argument("--write", required=True, type=Path)
    parser.add_argument("overrides", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    overrides = [a for a in ns.overrides if a != "--"]

    from prompt_aug import train
    from prompt_aug.batches import batch_arithmetic
    from prompt_aug.data import load_train_dataset
    from prompt_aug.demo.warmstart import split_heldout
    from prompt_aug.models import load_tokenizer, resolve_model_path
    from prompt_aug.sources import read_training_data
    from prompt_aug.templates import templates_for

    argv_train = ["--config", ns.recipe, "--output_dir", ns.train_dir, "--seed", ns.seed, *overrides]
    script_args, args, model_args, demo_args = train.parse_args(argv_train)
    if demo_args.heldout_questions <= 0:
        raise SystemExit(
            f"{ns.recipe}: heldout_questions must be set, the ablation scores held-out questions"
        )
    templates, _, eval_template = templates_for(args)
    model_path = resolve_model_path(model_args, args)  # a built-in model is built where training builds it
    tokenizer = load_tokenizer(model_path, model_args, args, script_args.chat_template)
    read = read_training_data(script_args, seed=args.seed)
    dataset, _ = load_train_dataset(read, script_args, args, templates, eval_template, tokenizer)
    _, heldout = split_heldout(dataset, demo_args.heldout_questions, args.seed)
    ns.write.mkdir(parents=True, exist_ok=True)
    rows = heldout.to_list()  # written as `BeforeAfter.write` writes the recipe's own heldout.jsonl
    (ns.write / HELDOUT_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = batch_arithmetic(args, script_args).optimizer_steps_per_round
    if steps != int(steps):
        raise SystemExit(f"{ns.recipe}: {steps} optimizer steps per round; the ablation needs a whole number")
    info = {"model_path": model_path, "steps_per_round": int(steps), "heldout": len(rows)}
    (ns.write / PREPARED_FILE).write_text(json.dumps(info, indent=2) + "\n")


def eval_main(argv: list[str]) -> None:
    """``_eval``: `real_model_robustness.evaluate` (``prompt-aug-eval --template all``) and its lenient
    regrading, written to ``OUT/scores.json``."""
    parser = argparse.ArgumentParser(prog="ablation.py _eval")
    parser.add_argument("--model", required=True)
    parser.add_argument("--questions", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--max_tokens", type=int, default=64)
    ns = parser.parse_args(argv)
    sys.path.insert(0, str(BENCH))
    import real_model_robustness as robustness

    started = time.perf_counter()
    records = robustness.evaluate(ns.model, ns.questions, ns.out, ns.max_tokens)
    scores = robustness.per_template(records)
    result = {"model": ns.model, "seconds": round(time.perf_counter() - started, 1), "templates": scores}
    (ns.out / SCORES_FILE).write_text(json.dumps(result, indent=2) + "\n")


# -- Report -----------------------------------------------------------------------------------------------


def read_log(train_dir: Path) -> list[dict[str, Any]]:
    """The per-step entries of ``logs.jsonl`` (else of the last checkpoint's ``trainer_state.json``)."""
    path = train_dir / "logs.jsonl"
    if path.is_file():
        entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        steps = checkpoint_steps(train_dir)
        if not steps:
            return []
        state = json.loads((train_dir / f"checkpoint-{steps[-1]}" / "trainer_state.json").read_text())
        entries = state.get("log_history", [])
    return [e for e in entries if "entropy" in e and "round" in e]


def per_round(entries: list[dict[str, Any]], key: str) -> dict[int, float]:
    """Round → mean of ``key`` over that round's logged steps."""
    values: dict[int, list[float]] = {}
    for entry in entries:
        value = entry.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            values.setdefault(int(entry["round"]), []).append(float(value))
    return {r: statistics.fmean(v) for r, v in sorted(values.items())}


def window_mean(curve: dict[int, float], first: bool) -> float | None:
    rounds = sorted(curve)[:WINDOW] if first else sorted(curve)[-WINDOW:]
    return statistics.fmean(curve[r] for r in rounds) if rounds else None


def across_templates(scores: dict[str, dict[str, float]], markers: set[str]) -> dict[str, Any]:
    """Mean, spread (best minus worst) and standard deviation across templates of each metric."""
    out: dict[str, Any] = {}
    for metric in ("lenient", "strict", "format"):
        values = [s[metric] for s in scores.values()]
        out[metric] = {
            "mean": statistics.fmean(values),
            "spread": max(values) - min(values),
            "std": statistics.pstdev(values),
        }
    marked = [s["format"] for name, s in scores.items() if name in markers]
    out["format_marker_templates"] = statistics.fmean(marked) if marked else None
    worst = min(scores.values(), key=lambda s: s["lenient"])["lenient"]
    out["worst_lenient"] = {
        "value": worst,
        "templates": sorted(n for n, s in scores.items() if s["lenient"] == worst),
    }
    return out


def summarize_run(plan: Plan, arm: str, seed: int, markers: set[str]) -> dict[str, Any]:
    folder = run_dir(plan, arm, seed)
    entries = read_log(folder / "train")
    curves = {
        "entropy": per_round(entries, "entropy"),
        "accuracy": per_round(entries, ACCURACY_KEY),
        "truncation": per_round(entries, TRUNCATION_KEY),
    }
    below = [r for r, v in curves["entropy"].items() if v < plan.entropy_floor]
    smoothed = trailing_mean(curves["entropy"], SMOOTH)
    below_smoothed = [r for r, v in smoothed.items() if v < plan.entropy_floor]
    evals: dict[int, Any] = {}
    base = plan.out / f"base-s{seed}" / "eval" / SCORES_FILE
    if base.is_file():
        evals[0] = json.loads(base.read_text())
    for path in sorted((folder / "eval").glob(f"round-*/{SCORES_FILE}")):
        evals[int(path.parent.name.split("-")[1])] = json.loads(path.read_text())
    launches = folder / "launches.jsonl"
    launched = [json.loads(x) for x in launches.read_text().splitlines()] if launches.is_file() else []
    return {
        "arm": arm,
        "seed": seed,
        "rounds": max(curves["entropy"], default=0),
        "finished": (folder / DONE_FILE).is_file(),
        "training_seconds": round(sum(x["seconds"] for x in launched), 1),
        "training_cpu_seconds": round(sum(x.get("cpu_seconds", 0.0) for x in launched), 1),
        "first_round_entropy_below_floor": below[0] if below else None,
        f"first_round_entropy_{SMOOTH}_round_mean_below_floor": below_smoothed[0] if below_smoothed else None,
        "windows": {
            name: {"first": window_mean(curve, True), "last": window_mean(curve, False)}
            for name, curve in curves.items()
        },
        "curves": {name: {str(r): v for r, v in curve.items()} for name, curve in curves.items()},
        "eval": {
            str(r): {
                "summary": across_templates(e["templates"], markers),
                "templates": e["templates"],
                "seconds": e.get("seconds"),
            }
            for r, e in sorted(evals.items())
        },
    }


def trailing_mean(curve: dict[int, float], window: int) -> dict[int, float]:
    """Round → mean of the last ``window`` logged rounds up to it (fewer at the start).

    >>> trailing_mean({1: 1.0, 2: 0.0, 3: 0.5}, 2)
    {1: 1.0, 2: 0.5, 3: 0.25}
    """
    rounds = sorted(curve)
    return {
        r: statistics.fmean(curve[x] for x in rounds[max(0, i - window + 1) : i + 1])
        for i, r in enumerate(rounds)
    }


def mean_sd(values: list[float | None]) -> tuple[float, float, int] | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    return statistics.fmean(got), (statistics.stdev(got) if len(got) > 1 else 0.0), len(got)


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def fmt_ms(stats: tuple[float, float, int] | None, digits: int = 2) -> str:
    if stats is None:
        return "–"
    mean, sd, n = stats
    return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def report(plan: Plan, figure: Path | None) -> dict[str, Any]:
    """Write ``OUT/ablation.md`` and ``OUT/ablation.json`` (and the figure) from what the runs hold now."""
    from prompt_aug.templates import load_templates

    markers = {name for name, t in load_templates().items() if t.markers}
    runs = [
        summarize_run(plan, arm, seed, markers)
        for arm in plan.arms
        for seed in plan.seeds
        if (run_dir(plan, arm, seed) / "train").is_dir()
    ]
    arms: dict[str, Any] = {}
    for arm in plan.arms:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        # Training curves: finished runs only (an unfinished run's "last 10 rounds" are other rounds).
        # Held-out scores: every run scored at that round.
        done = [r for r in mine if r["finished"]]
        summary: dict[str, Any] = {
            "seeds": [r["seed"] for r in done], "unfinished": [r["seed"] for r in mine if not r["finished"]],
            "windows": {}, "eval": {},
        }  # fmt: skip
        for name in ("entropy", "accuracy", "truncation"):
            summary["windows"][name] = {
                at: mean_sd([r["windows"][name][at] for r in done]) for at in ("first", "last")
            }
        for key in FLOOR_KEYS:
            summary[key] = [r[key] for r in done]
        rounds = sorted({int(k) for r in mine for k in r["eval"]})
        for round_ in rounds:
            got = [r["eval"][str(round_)]["summary"] for r in mine if str(round_) in r["eval"]]
            summary["eval"][str(round_)] = {
                f"{metric}/{stat}": mean_sd([g[metric][stat] for g in got])
                for metric in ("lenient", "strict", "format")
                for stat in ("mean", "spread", "std")
            } | {"format_marker_templates": mean_sd([g["format_marker_templates"] for g in got])}
        arms[arm] = summary
    result = {
        "plan": {
            "arms": plan.arms, "seeds": plan.seeds, "rounds": plan.rounds, "eval_every": plan.eval_every,
            "model": plan.model, "max_tokens": plan.max_tokens, "entropy_floor": plan.entropy_floor,
            "recipes": {a: str(ARMS[a].relative_to(REPO)) for a in plan.arms}, "overrides": plan.overrides(),
        },
        "runs": runs,
        "arms": arms,
    }  # fmt: skip
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "ablation.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(plan, runs, arms)
    if figure is not None:
        text += draw(plan, runs, figure)
    (plan.out / "ablation.md").write_text(text)
    print(text)
    return result


def table_row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


TRAINING_HEAD = ["run", "rounds", "entropy", "first round < floor",
                 f"first round < floor, {SMOOTH}-round mean", "training accuracy", "truncation"]  # fmt: skip
EVAL_HEAD = ["run", "round", "lenient mean", "lenient spread", "lenient std", "strict mean", "format mean",
             "format (markers)", "worst template (lenient)"]  # fmt: skip
EVAL_CELLS = [("lenient", "mean"), ("lenient", "spread"), ("lenient", "std"), ("strict", "mean"),
              ("format", "mean")]  # fmt: skip
CURVES = ("entropy", "accuracy", "truncation")


def markdown(plan: Plan, runs: list[dict[str, Any]], arms: dict[str, Any]) -> str:
    """The two tables: the training log per run and arm, then the held-out scores per evaluation round."""
    lines = [
        (
            f"Training log (`logs.jsonl`): mean of the first {WINDOW} → last {WINDOW} logged rounds; entropy "
            f"in nats per token, training accuracy = `{ACCURACY_KEY}`, truncation = `{TRUNCATION_KEY}`; "
            f"first round < floor: the first round whose entropy is below {plan.entropy_floor:g} (–: none); "
            f"also for the mean entropy of the last {SMOOTH} rounds (one round's 16 completions are noisy)."
        ),
        "",
        table_row(TRAINING_HEAD),
        "|---|---:|---|---:|---:|---|---|",
    ]
    for r in runs:
        cells = [f"{fmt(r['windows'][n]['first'])} → {fmt(r['windows'][n]['last'])}" for n in CURVES]
        floors = ["–" if r[key] is None else r[key] for key in FLOOR_KEYS]
        name = f"{r['arm']} s{r['seed']}" + ("" if r["finished"] else " (unfinished)")
        lines.append(table_row([name, r["rounds"], cells[0], *floors, *cells[1:]]))
    for arm, s in arms.items():
        cells = [f"{fmt_ms(s['windows'][n]['first'])} → {fmt_ms(s['windows'][n]['last'])}" for n in CURVES]
        floors = [", ".join("–" if f is None else str(f) for f in s[key]) for key in FLOOR_KEYS]
        if not s["seeds"]:
            continue
        label = f"**{arm}** (mean ± sd, seeds {', '.join(map(str, s['seeds']))})"
        if s["unfinished"]:
            label += f"; unfinished: {', '.join(map(str, s['unfinished']))}"
        lines.append(table_row([label, "", cells[0], *floors, *cells[1:]]))
    lines += [
        "",
        (
            f"Held-out questions under all 13 templates (`prompt-aug-eval --template all`, greedy, "
            f"{plan.max_tokens} tokens; round 0 = the base model): mean over the templates, spread = best − "
            "worst template, std across templates; lenient = the `correctness` reward's rule, strict = the "
            "last `\\boxed{}`; format (markers) = the mean format score over the templates with markers."
        ),
        "",
        table_row(EVAL_HEAD),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        for round_, e in r["eval"].items():
            s = e["summary"]
            worst = s["worst_lenient"]
            names = ", ".join(worst["templates"][:3]) + (", …" if len(worst["templates"]) > 3 else "")
            cells = [fmt(s[m][stat]) for m, stat in EVAL_CELLS] + [fmt(s["format_marker_templates"])]
            lines.append(
                table_row([f"{r['arm']} s{r['seed']}", round_, *cells, f"{names} {worst['value']:.2f}"])
            )
    for arm, s in arms.items():
        for round_, e in s["eval"].items():
            n = e["lenient/mean"][2] if e["lenient/mean"] else 0
            cells = [fmt_ms(e[f"{m}/{stat}"]) for m, stat in EVAL_CELLS] + [
                fmt_ms(e["format_marker_templates"])
            ]
            label = f"**{arm}** (mean ± sd, {n} seed{'s' if n != 1 else ''})"
            lines.append(table_row([label, round_, *cells, ""]))
    return "\n".join(lines) + "\n"


def draw(plan: Plan, runs: list[dict[str, Any]], figure: Path) -> str:
    """The runs' curves overlaid by `prompt_aug.plot` (one colour per arm, a line style per seed, x =
    generation round)."""
    from prompt_aug.plot import PlotError, plot_runs

    drawn = [r for r in runs if r["rounds"]]
    if not drawn:
        return ""
    try:
        plot_runs(
            [run_dir(plan, r["arm"], r["seed"]) / "train" for r in drawn],
            figure,
            smooth=5,
            title="Template ablation: training curves (5-round mean)",
            x="round",
            names=[f"{r['arm']} s{r['seed']}" for r in drawn],
            groups=[r["arm"] for r in drawn],
            templates=False,
        )
    except PlotError as err:
        return f"\nNo figure: {err}\n"
    return f"\nFigure: {figure}\n"


# -- Measuring one round ----------------------------------------------------------------------------------


def measure(plan: Plan, rounds: int) -> dict[str, Any]:
    """Time the first arm, seed 0, in ``OUT/measure``: one launch of 1 round, a resumed launch to ``rounds``
    rounds, and an evaluation of the last checkpoint; print the seconds (wall and CPU) per round, per
    launch's start-up and per evaluation, and what the whole plan would cost at that rate."""
    if rounds < 3:
        raise SystemExit("--measure needs at least 3 rounds (1, then 2 or more resumed)")
    arm = plan.arms[0]
    trial = Plan(plan.out / "measure", [arm], [0], rounds, 0, plan.model, plan.max_tokens, plan.entropy_floor,
                 plan.extra)  # fmt: skip
    folder = run_dir(trial, arm, 0)
    shutil.rmtree(folder, ignore_errors=True)
    info = prepare(trial, arm, 0)
    spr = int(info["steps_per_round"])
    train_to(trial, arm, 0, 1, spr)
    train_to(trial, arm, 0, rounds, spr)
    first, second = (json.loads(x) for x in (folder / "launches.jsonl").read_text().splitlines()[-2:])
    cpu_round = (second["cpu_seconds"] - first["cpu_seconds"]) / (rounds - 2)
    startup_cpu = first["cpu_seconds"] - cpu_round
    step_times = [e["step_time"] for e in read_log(folder / "train") if isinstance(e.get("step_time"), float)]
    checkpoint = folder / "train" / f"checkpoint-{rounds * spr}"
    scores = evaluate(str(checkpoint), folder / HELDOUT_FILE, folder / "eval", plan.max_tokens,
                      folder / "logs" / "eval.log")  # fmt: skip
    runs, evals = len(plan.arms) * len(plan.seeds), len(plan.eval_rounds())
    per_run = evals * startup_cpu + plan.rounds * cpu_round + evals * scores["cpu_seconds"]
    total = runs * per_run + len(plan.seeds) * scores["cpu_seconds"]  # the base model once per seed
    result = {
        "arm": arm, "rounds": rounds, "heldout": info["heldout"],
        "wall_seconds_per_round": [round(t * spr, 1) for t in step_times],
        "launches": [first, second],
        "cpu_seconds_per_round": round(cpu_round, 1), "startup_cpu_seconds": round(startup_cpu, 1),
        "eval_seconds": scores["seconds"], "eval_cpu_seconds": scores["cpu_seconds"],
        "plan": {"runs": runs, "rounds": plan.rounds, "evals_per_run": evals,
                 "cpu_hours": round(total / 3600, 2)},
    }  # fmt: skip
    (trial.out / "measure.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


# -- Command line -----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/ablation"), help="Where the runs go.")
    parser.add_argument("--arms", nargs="+", default=["bank", "one"], choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="Generation rounds per run.")
    parser.add_argument(
        "--eval_every", type=int, default=DEFAULT_EVAL_EVERY,
        help="Score the checkpoint every N rounds (and at the end; 0: at the end only).",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="Runs side by side (1 torch thread each).")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument(
        "--max_tokens", type=int, default=None, help="Evaluation tokens (default 64; tiny 8)."
    )
    parser.add_argument("--entropy_floor", type=float, default=0.2)
    parser.add_argument("--figure", type=Path, default=None, help="Default OUT/ablation.png.")
    parser.add_argument("--no_figure", action="store_true")
    parser.add_argument("--report_only", action="store_true", help="Only tables, JSON and figure.")
    parser.add_argument(
        "--measure",
        type=int,
        nargs="?",
        const=3,
        default=None,
        metavar="ROUNDS",
        help="Time a short run of the first arm (default 3 rounds) and one evaluation.",
    )
    parser.add_argument(
        "--train_arg",
        action="append",
        default=[],
        metavar="ARG",
        help="Passed on to every training launch (repeat; e.g. --train_arg=--save_steps).",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.rounds < 1 or args.eval_every < 0:
        parser.error("--rounds must be at least 1 and --eval_every at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_prepare":
        prepare_main(argv[1:])
        return 0
    if argv and argv[0] == "_eval":
        eval_main(argv[1:])
        return 0
    args = parse_args(argv)
    max_tokens = args.max_tokens or (TINY_EVAL_TOKENS if args.model == "tiny" else 64)
    plan = Plan(
        args.out.resolve(), args.arms, args.seeds, args.rounds, args.eval_every, args.model, max_tokens,
        args.entropy_floor, args.train_arg,
    )  # fmt: skip
    signal.signal(signal.SIGTERM, stop_children)
    if args.measure is not None:
        measure(plan, args.measure)
        return 0
    failures = [] if args.report_only else run_all(plan, args.jobs)
    figure = None if args.no_figure else (args.figure or plan.out / "ablation.png")
    report(plan, figure)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
