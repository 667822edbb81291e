"""What the training console shows: one short line per logged step, and each repeated warning once.

TRL logs about 60 keys per step (more with per-template metrics); transformers' progress bar prints them all
as one dict. `use_compact_log` swaps its printing callback for one that prints::

    round 3 | step 6/8 | reward 1.250 | accuracy 0.312 | format 0.938 | entropy 0.412 | length 312 \
| truncated 0.062 | 1.9 s/step

With dynamic sampling, reward, accuracy, format and truncation are over every generated completion
(``dynamic_sampling/generated/...``), as the collapse guard reads them, not TRL's over the trained groups, and
``kept`` is the share of generated groups trained. TRL's evaluation (``eval_strategy``) prints the same
metrics of the evaluation set, after ``eval``.

The full metrics still reach ``trainer_state.json``, W&B and ``OUTPUT_DIR/logs.jsonl`` (one JSON object per
logged step, written as training goes, so it survives a crash between checkpoints; a resumed run skips a last
line cut short by a crash, with a warning).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from rewards.controls import FORMAT_MEAN_KEYS

from .model_card import ACCURACY_KEYS
from .records import LOG_FILE, generated_first, generation_round, is_number, read_log_entries

logger = logging.getLogger("prompt_aug")


# (label, keys: the first present is shown, format)
_STEP_FIELDS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", generated_first(["reward"]), "{:.3f}"),
    ("accuracy", generated_first(ACCURACY_KEYS), "{:.3f}"),
    ("format", generated_first(FORMAT_MEAN_KEYS), "{:.3f}"),
    ("entropy", ("entropy",), "{:.3f}"),
    ("length", ("completions/mean_length",), "{:.0f}"),
    ("truncated", generated_first(["completions/clipped_ratio"]), "{:.3f}"),
    ("kept", ("dynamic_sampling/kept_share",), "{:.2f}"),
)

# TRL's evaluation logs its metrics under this prefix (``eval_reward``, ``eval_loss``, ...).
_TRL_EVAL = "eval_"


def quiet_deprecations() -> None:
    """Hide transformers' deprecation warnings of the ``gradient_checkpointing`` names in this process.

    transformers 5.24 (the CPU pins) renames the recipe key to ``activation_checkpointing``, which 5.17 (the
    GPU and engine pins) does not have, so a recipe that runs on both keeps the old name and is warned; and
    TRL 1.16 calls the renamed methods around each generation round. Neither can be acted on, and shown,
    the warning would stand before each one-line error. A warning filter would not hold (libraries reset
    the filters every round), so the showing drops them instead.
    """
    show = warnings.showwarning
    if getattr(show, "hides_deprecations", False):
        return

    def show_others(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
        if issubclass(category, FutureWarning) and "gradient_checkpointing" in str(message):
            return
        show(message, category, *args, **kwargs)

    show_others.hides_deprecations = True  # type: ignore[attr-defined]
    warnings.showwarning = show_others


def round_of(logs: dict[str, Any], step: int, args: Any) -> int:
    """The generation round of a log entry: its ``round`` key when logged, else derived from the step.

    >>> from types import SimpleNamespace as NS
    >>> args = NS(steps_per_generation=2, gradient_accumulation_steps=1, num_iterations=1)
    >>> [round_of({}, s, args) for s in (1, 2, 3)], round_of({"round": 7}, 3, args)
    ([1, 1, 2], 7)
    """
    if isinstance(logs.get("round"), (int, float)):
        return int(logs["round"])
    return max(1, generation_round(step, args))


def compact_line(logs: dict[str, Any], step: int, max_steps: int, args: Any) -> str:
    """One line for a log entry: round and step, the watched metrics, time per step, evaluation if any.

    >>> from types import SimpleNamespace as NS
    >>> args = NS(steps_per_generation=2, gradient_accumulation_steps=1, num_iterations=1)
    >>> compact_line({"reward": 1.25, "entropy": 0.41, "step_time": 1.93, "loss": 0.1}, 3, 8, args)
    'round 2 | step 3/8 | reward 1.250 | entropy 0.410 | 1.9 s/step'
    >>> logs = {"loss": 0.0, "eval/macro": 0.41, "eval/micro": 0.45, "eval/math500/accuracy": 0.5}
    >>> compact_line(logs, 4, 8, args)
    'round 2 | step 4/8 | eval macro 0.410 micro 0.450'
    >>> dapo = {"reward": 1.0, "dynamic_sampling/generated/reward": 0.5, "loss": 0.1}  # dynamic sampling
    >>> compact_line(dapo, 3, 8, args)
    'round 2 | step 3/8 | reward 0.500'
    >>> trl_eval = {"eval_loss": 0.0, "eval_reward": 0.75, "eval_runtime": 12.3, "eval_templates/a/count": 4}
    >>> compact_line(trl_eval, 4, 8, args)
    'round 2 | step 4/8 | eval reward 0.750 | 12.3 s'
    """
    where = f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"
    if "train_runtime" in logs:
        loss = f", mean loss {logs['train_loss']:.4g}" if isinstance(logs.get("train_loss"), float) else ""
        return f"done: {where} in {logs['train_runtime']:.1f} s{loss}"
    if "loss" not in logs and isinstance(logs.get(_TRL_EVAL + "loss"), (int, float)):
        cells = _cells(logs, _TRL_EVAL)
        if cells:
            cells[0] = f"eval {cells[0]}"
        if isinstance(logs.get(_TRL_EVAL + "runtime"), (int, float)):
            cells.append(f"{logs[_TRL_EVAL + 'runtime']:.1f} s")
        return " | ".join([f"round {round_of(logs, step, args)}", where, *cells])
    cells = _cells(logs)
    if isinstance(logs.get("step_time"), (int, float)):
        cells.append(f"{logs['step_time']:.1f} s/step")
    if isinstance(logs.get("eval/macro"), (int, float)):
        cells.append(f"eval macro {logs['eval/macro']:.3f} micro {logs.get('eval/micro', float('nan')):.3f}")
    if cells or "loss" in logs:
        return " | ".join([f"round {round_of(logs, step, args)}", where, *cells])
    # Something else (another callback's keys): a few of them, not all.
    shown = [
        (k, v) for k, v in logs.items() if isinstance(v, (int, float)) and not k.startswith("templates/")
    ]
    return " | ".join([where, *(f"{k} {v:.4g}" for k, v in shown[:8])])


def _cells(logs: dict[str, Any], prefix: str = "") -> list[str]:
    """``label value`` of each watched metric in ``logs`` (its keys under ``prefix``), in `_STEP_FIELDS`
    order."""
    cells = []
    for label, keys, fmt in _STEP_FIELDS:
        key = next((prefix + k for k in keys if is_number(logs.get(prefix + k))), None)
        if key is not None:
            cells.append(f"{label} {fmt.format(logs[key])}")
    return cells


class CompactProgressCallback(ProgressCallback):
    """transformers' progress bar, printing `compact_line` instead of the whole log dict."""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero and self.training_bar is not None and logs:
            self.training_bar.write(compact_line(logs, state.global_step, state.max_steps, args))


class CompactPrinterCallback(TrainerCallback):
    """With ``disable_tqdm``: print `compact_line` instead of the whole log dict."""

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero and logs:
            print(compact_line(logs, state.global_step, state.max_steps, args), flush=True)


def check_log_file(output_dir: str | Path) -> None:
    """Read the ``logs.jsonl`` of a run about to resume, so that a bad line stops it now, in one line on every
    process, rather than at its first log line, a round later, on the main process alone.

    Raises:
        LogFileError: as `read_log_entries`.
    """
    path = Path(output_dir) / LOG_FILE
    if path.is_file():  # a last line cut short is said when the run drops it (`JsonlLogCallback`)
        read_log_entries(path, warn=False)


class JsonlLogCallback(TrainerCallback):
    """Append every log entry, all keys, to ``OUTPUT_DIR/logs.jsonl`` on the main process.

    A resumed run first drops the entries an interrupted run logged after its checkpoint, so each step
    appears once, as the resumed run logged it, and the end-of-training summary (``train_runtime``, ...)
    of the earlier start, so the file ends with one summary, the run's; and a last line a crash cut short
    (`read_log_entries`).
    """

    def __init__(self) -> None:
        self._started = False
        self._resumed_at: int | None = None  # the checkpoint's step, once training has begun

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._resumed_at = state.global_step  # the Trainer has loaded the checkpoint's state by now

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if state.is_world_process_zero and logs:
            path = Path(args.output_dir) / LOG_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            if not self._started and path.is_file():
                entries = read_log_entries(path)
                # Up to the checkpoint's step (its own entry too: a run resumed at its last step logs only the
                # summary), else before this log's step.
                last = self._resumed_at if self._resumed_at is not None else state.global_step - 1
                kept = [
                    line for line, entry in entries if entry["step"] <= last and "train_runtime" not in entry
                ]
                path.write_text("".join(line + "\n" for line in kept))
            self._started = True
            with path.open("a") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")


def use_compact_log(trainer: Any) -> None:
    """Replace the trainer's dict-printing callback with the compact one and add the ``logs.jsonl`` writer."""
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactProgressCallback)
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(CompactPrinterCallback)
    trainer.add_callback(JsonlLogCallback)
