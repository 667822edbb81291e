"""Collapse, watched and handled: the collapse guard.

Long GRPO runs collapse: entropy falls until accuracy crashes. This module holds

* `CollapseGuard`, a `TrainerCallback` that reads the trainer's log lines and watches five signals, each
  with a threshold, a window and an action (``log``, ``checkpoint`` or ``stop``):

  ========== ========================================= ===============================================
  signal     log key read                              fires when
  ========== ========================================= ===============================================
  entropy    ``entropy``                               below the floor for ``window`` rounds in a row
  accuracy   ``completions/accuracy`` (older logs: the   its mean over the last ``window`` rounds falls
             correctness reward's mean; else           more than the threshold below its best such mean
             ``reward``; or a chosen key)
  truncation ``completions/clipped_ratio``             above the ceiling for ``window`` rounds in a row
  repetition ``completions/repetition_ratio``          above the ceiling for ``window`` rounds in a row
  eval       ``eval/macro``                            like accuracy, over the last ``window`` evaluations
  ========== ========================================= ===============================================

  With dynamic sampling on, accuracy and truncation read those keys under ``dynamic_sampling/generated/``
  first: over every generated completion, where TRL's rewards cover only the trained groups (TRL's
  truncation share, taken in each generation pass, is the same).

  A window counts generation rounds (the ``round`` key of a log line; the trainer's count of its steps,
  which knows the short step that ends an epoch). A round is judged once, on the mean of all its log lines,
  at the last line that falls in it (the next regular line, ``logging_steps`` on, is in a later round), so
  it is never judged on its first lines alone; that line judges it even without the signal's key (TRL logs
  a round's reward and length metrics on its first line only). A log line that comes several rounds after
  the one before it (``logging_steps`` longer than a round) counts for each of them. Each evaluation is
  judged as it comes. A NaN or infinite value (a diverged run) counts as past the threshold, and so does a
  key logged as ``None`` (TRL leaves NaN values out of a line's mean, and logs ``None`` when all were NaN).
  With ``mask_truncated_completions`` on, entropy takes no reading from a line whose steps trained only on
  rounds where every completion was truncated (``completions/clipped_ratio`` 1: no token was trained on, and
  TRL logs an entropy of 0); the truncation signal is the one that speaks there. A line that trained on some
  fully masked micro-batches and some others still averages TRL's per-micro-batch entropies, the masked
  ones' 0 included. Each signal fires once when its condition starts to hold and again only after it has
  stopped holding. A firing on the end-of-training log line (what TRL logged after the last
  ``logging_steps``) is logged only: the run has ended, and its final model is saved anyway.
  It logs ``collapse/<signal>`` (rounds in a row past the threshold, or the fall from the best mean) on
  every log line that carries the signal or judges it, and ``collapse/fired/<signal>`` = 1 on the line
  where it fired. ``checkpoint`` saves a full checkpoint named ``_collapse-<signal>-round<N>`` in
  ``output_dir`` (the underscore keeps it out of pushes of the output folder, as transformers leaves out
  ``_*``; a ``checkpoint-<step>`` that ``hub_strategy`` ``checkpoint`` or ``all_checkpoints`` is still
  uploading is copied, not moved): the Trainer's rotation (``save_total_limit``) only deletes
  ``checkpoint-*`` folders, so it is kept, and it does not count against the limit: no regular checkpoint is
  deleted early to make room for it. ``stop`` saves it too and ends the run cleanly, with a message naming
  the signal, the values and the checkpoint, and the main process writes ``collapse_stop.json``
  (`prompt_aug.faults.COLLAPSE_STOP_FILE`) in ``output_dir``, so that a script can tell a guard stop from a
  run that trained to its end (``prompt-aug-train`` exits 0 for both: a stop is no failure to retry); a run
  that starts in that folder (or resumes there) deletes it. Resuming replays the restored log history, so
  smoothed bests and counts carry over.

ProRL's optimizer reset and RLinf's mini-batch skip are in `prompt_aug.extensions.stabilisers`.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME, TRAINING_ARGS_NAME

from ..config import ACTIONS, check_keys
from ..config import SIGNALS as SIGNAL_KEYS
from ..faults import COLLAPSE_PREFIX, COLLAPSE_STOP_FILE, LaunchRecord
from ..metrics import correctness_scores
from ..model_card import ACCURACY_KEYS as SHARE_KEYS
from ..records import ACCURACY_KEY, TRAINED_CLIPPED, generated_first, generation_round, is_number
from ..trl_seam import hub_push_running

logger = logging.getLogger("prompt_aug.collapse")

SIGNALS = tuple(SIGNAL_KEYS)  # entropy, accuracy, truncation, repetition, eval
KINDS = ("below", "above", "drop")
ACCURACY_KEYS = (*SHARE_KEYS, "reward")
REPETITION_KEY = "completions/repetition_ratio"
FINAL_KEY = "train_runtime"  # in the Trainer's end-of-training log line only
CHECKPOINT_PUSHES = ("checkpoint", "all_checkpoints")  # hub_strategy values that upload checkpoint-<step>
DIVERGED = "; a NaN or infinite value counts as past the threshold (the run diverged?)"


@dataclass(frozen=True)
class SignalSpec:
    """One watched signal.

    Args:
        name: The signal's name, used in metric keys and checkpoint names.
        keys: Log keys to read; the first one a log line has is used.
        kind: ``below`` / ``above``: the value is past ``threshold`` for ``window`` rounds in a row;
            ``drop``: the mean of the last ``window`` rounds is more than ``threshold`` below its best.
        threshold: The floor, ceiling or allowed fall.
        window: Rounds (evaluations for ``eval``) the condition is judged over.
        action: ``log``, ``checkpoint`` or ``stop``.
        masked_by: Log keys of the share of a round's completions left out of the loss (the first one a line
            has is used): a line whose steps trained only on rounds where it was 1 gives no reading.
    """

    name: str
    keys: tuple[str, ...]
    kind: str
    threshold: float
    window: int
    action: str = "log"
    masked_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"signal {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.action not in ACTIONS:
            raise ValueError(f"signal {self.name}: action {self.action!r} is not one of {ACTIONS}")
        if self.window < 1:
            raise ValueError(f"signal {self.name}: window must be at least 1, got {self.window}")


@dataclass(frozen=True)
class Firing:
    """A signal that fired: where, on which values, and what the guard does about it."""

    signal: str
    round: int
    step: int
    action: str
    detail: str


class _Watch:
    """The running state of one signal: the log lines of its window and whether it is firing.

    A log line stands for the rounds since the previous log line (TRL averages a line's metrics over its
    ``logging_steps``, which may span several rounds; `CollapseGuard.observe` counts them, over every line,
    so a signal missing from some lines is not stretched over the gap), so a window of ``window`` rounds
    holds the fewest latest lines that together stand for that many; for ``eval`` each evaluation counts one,
    however many fall in one round. The lines of a round not yet over are held apart (``open``) and judged
    together once it is.
    """

    def __init__(self, spec: SignalSpec) -> None:
        self.spec = spec
        self.lines: deque[list[float]] = deque()  # [round, sum, count, rounds it stands for]
        self.best = -math.inf  # best window mean over completed rounds (kind "drop")
        self.active = False
        self.stat = 0.0
        # Rounds in a row past the threshold before the latest line (kinds "below" / "above"): the run logged
        # keeps counting after the window's lines are gone.
        self.run_before = 0
        self.open: list[Any] | None = None  # the round not yet judged: [round, sum, count, span, key]
        # The key read, the first of ``spec.keys`` a line had: the run's other keys are not read after it, as
        # they may be on another scale (a correctness_pm5 run resumed from logs that had no accuracy share).
        self.key: str | None = None
        self.masked = False  # every completion of the latest round generated was left out of the loss

    @property
    def last(self) -> int:
        """The latest line's round."""
        return int(self.lines[-1][0])

    def _covered(self) -> int:
        return int(sum(line[3] for line in self.lines))

    def unread(self, entry: dict[str, Any], carried: bool, fresh: bool) -> bool:
        """Whether log line ``entry`` trained on no completion token (`SignalSpec.masked_by`), so gives no
        reading. ``carried``: its first step trained on a round generated before it; ``fresh``: a round was
        generated within it (TRL logs that round's share on that line). Fed every line, in order."""
        if not self.spec.masked_by:
            return False
        share = next((entry[k] for k in self.spec.masked_by if is_number(entry.get(k))), None)
        if share is None:
            if fresh:  # a round whose share was not logged: read as trained on
                self.masked = False
            return carried and not fresh and self.masked
        was, self.masked = self.masked, share >= 1.0
        return self.masked and (was or not carried)

    def add(
        self, round_: int, value: float, step: int, key: str, span: int = 1, ends_round: bool = True
    ) -> Firing | None:
        """A log line of round ``round_`` standing for ``span`` rounds (ignored for another line of the same
        round, and for ``eval``); ``ends_round``: no later line of that round is to come. A round is judged
        when it is over: at its last line, or at a line of a later round. Returns the firing, if any."""
        firing = self.close(step) if self.open is not None and round_ > self.open[0] else None
        if self.open is None:
            self.open = [round_, 0.0, 0, span, key]
        self.open[1] += value
        self.open[2] += 1
        if ends_round or self.spec.name == "eval":
            firing = self.close(step) or firing
        # An earlier round closed by this line fired, but the latest has cleared: nothing to act on now.
        return firing if self.active else None

    def close(self, step: int) -> Firing | None:
        """Judge the open round, if any, at optimizer step ``step``: it is over."""
        if self.open is None:
            return None
        (round_, value_sum, lines, span, key), self.open = self.open, None
        return self._judge(round_, value_sum, lines, span, step, key)

    def _judge(
        self, round_: int, value_sum: float, lines: int, span: int, step: int, key: str
    ) -> Firing | None:
        """Judge the window with round ``round_`` (the mean of its ``lines`` log lines) as the latest."""
        spec = self.spec
        same_round = self.lines and round_ <= self.lines[-1][0]
        if same_round and spec.name != "eval":  # a late line of a judged round (the end-of-training line)
            self.lines[-1][1] += value_sum
            self.lines[-1][2] += lines
        else:
            if spec.kind == "drop" and self._covered() >= spec.window:
                mean = self._window_mean()
                self.best = max(self.best, mean) if math.isfinite(mean) else self.best
            if spec.kind != "drop":
                self.run_before = self._run()
            self.lines.append([round_, value_sum, lines, 1 if spec.name == "eval" else max(1, span)])
            while len(self.lines) > 1 and self._covered() - self.lines[0][3] >= spec.window:
                self.lines.popleft()
        unit = "evaluations" if spec.name == "eval" else "rounds"

        if spec.kind == "drop":
            if self._covered() < spec.window:
                return self._settle(False, step, "")
            current = self._window_mean()
            finite = math.isfinite(current)
            best = max(self.best, current) if finite else self.best
            self.stat = best - current
            if spec.name == "eval":
                where = f"the last {len(self.lines)} evaluations (rounds {int(self.lines[0][0])}-{self.last})"
            else:
                where = f"rounds {max(self._first(len(self.lines)), self.last - spec.window + 1)}-{self.last}"
            if finite:
                detail = (
                    f"{spec.name} ({key}) averaged {current:.4g} over {where}, "
                    f"{self.stat:.4g} below its best {best:.4g}, more than the allowed {spec.threshold:g}"
                )
            else:
                detail = f"{spec.name} ({key}) averaged {_shown(current)} over {where}: not finite{DIVERGED}"
            return self._settle(not finite or self.stat > spec.threshold, step, detail)

        run, lines = self._run(), 0  # rounds in a row past the threshold; the window's lines among them
        for _, total, count, _ in reversed(self.lines):
            if not self._past(total / count):
                break
            lines += 1
        self.stat = float(run)
        word = "below the floor" if spec.kind == "below" else "above the ceiling"
        shown = [total / count for _, total, count, _ in list(self.lines)[-max(lines, 1) :]]
        finite = all(math.isfinite(v) for v in shown)
        detail = (
            f"{spec.name} ({key}) {word} {spec.threshold:g}{'' if finite else ' or not finite'} for {run} "
            f"{unit} in a row, {spec.window} or more asked (rounds {self.last - run + 1}-{self.last}: "
            f"{', '.join(_shown(v) for v in shown)}){'' if finite else DIVERGED}"
        )
        return self._settle(run >= spec.window, step, detail)

    def _past(self, value: float) -> bool:
        """Past the threshold; a NaN or infinite value (a diverged run) always is."""
        if not math.isfinite(value):
            return True
        return value < self.spec.threshold if self.spec.kind == "below" else value > self.spec.threshold

    def _run(self) -> int:
        """Rounds in a row past the threshold, through the latest line (0 before any)."""
        if not self.lines:
            return 0
        _, total, count, stands_for = self.lines[-1]
        return self.run_before + int(stands_for) if self._past(total / count) else 0

    def _first(self, lines: int) -> int:
        """The first round the latest ``lines`` log lines stand for."""
        round_, _, _, span = self.lines[-max(lines, 1)]
        return int(round_ - span + 1)

    def _window_mean(self) -> float:
        """The mean over the window's rounds: each line weighs the rounds it stands for, the oldest only those
        inside the window."""
        weights = [line[3] for line in self.lines]
        weights[0] -= max(0, self._covered() - self.spec.window)
        means = [total / count for _, total, count, _ in self.lines]
        return sum(w * m for w, m in zip(weights, means, strict=True)) / sum(weights)

    def _settle(self, holds: bool, step: int, detail: str) -> Firing | None:
        fired = holds and not self.active
        self.active = holds
        if not fired:
            return None
        return Firing(self.spec.name, int(self.lines[-1][0]), step, self.spec.action, detail)


class CollapseGuard(TrainerCallback):
    """Watches entropy, accuracy, truncation, self-repetition and evaluation accuracy for collapse.

    Args:
        specs: The signals to watch (see `SignalSpec` and `guard_from_args`).
        steps_per_round: Optimizer steps per generation round, to count rounds from the step (a log line
            with no ``round`` key, and where a round ends) until `attach` hands the count to the trainer's.

    Use `attach` to add it to a trainer (after `EvalCallback.attach`, so it sees the ``eval/*`` keys).
    `observe` is the whole decision, usable on its own on a stream of log lines; ``round_of_step`` (the round
    of an optimizer step) and ``logging_steps`` (the Trainer's, set at ``on_train_begin``; 1 until then) say
    where each round's last line falls. After training, ``fired`` lists every firing, ``checkpoints`` the
    folders saved, ``stop_message`` why it stopped and where it saved, ``stop_reason`` only why (all of the
    latest ``train()``: each starts them afresh).
    """

    def __init__(self, specs: list[SignalSpec], steps_per_round: float = 1.0) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"CollapseGuard: a signal is listed twice in {names}")
        if steps_per_round <= 0:
            raise ValueError(f"CollapseGuard: steps_per_round must be positive, got {steps_per_round}")
        self.specs = list(specs)
        self.steps_per_round = steps_per_round
        # The round of an optimizer step: by steps_per_round, or once attached, the trainer's own count (which
        # knows the short step that ends an epoch), as its log lines' `round` key gives it.
        self.round_of_step: Callable[[int], int] = partial(generation_round, steps_per_round=steps_per_round)
        self.logging_steps = 1  # the Trainer's, read at on_train_begin: where the next regular log line falls
        self._push_running: Callable[[], bool] = lambda: False  # the attached trainer's Hub upload
        self._reset()

    def _reset(self) -> None:
        self.fired: list[Firing] = []
        self.checkpoints: list[Path] = []
        self.stop_message: str | None = None
        self.stop_reason: str | None = None  # the stop message without what was saved (the model card's)
        self._stop_record: dict[str, Any] | None = None  # what `COLLAPSE_STOP_FILE` holds
        self._watches = {spec.name: _Watch(spec) for spec in self.specs}
        self._last_round = 0  # the round of the latest log line, whichever signals it carried
        self._last_step = 0  # the optimizer step of the latest log line
        self._pending: list[Firing] = []
        self._regular_save_due = False
        self._save_total_limit: int | None = None  # the user's limit while an unscheduled save is made

    def attach(self, trainer: Any) -> CollapseGuard:
        """Add the guard ahead of the trainer's loggers (W&B sees ``collapse/*``) but after any evaluation
        callback placed there (the guard sees ``eval/*``) and the launch record; returns ``self``."""
        from ..evaluation.callback import EvalCallback

        if hasattr(trainer, "micro_steps_per_epoch"):  # a PromptAugGRPOTrainer: its own round count
            args = trainer.args
            self.round_of_step = lambda step: generation_round(step, args, trainer.micro_steps_per_epoch)
        self._push_running = partial(hub_push_running, trainer)
        callbacks = trainer.callback_handler.callbacks
        # After the launch record too: it writes launch.json into the checkpoint the guard may rename.
        after = [i for i, cb in enumerate(callbacks) if isinstance(cb, (EvalCallback, LaunchRecord))]
        callbacks.insert(after[-1] + 1 if after else 0, self)
        return self

    def round_of(self, entry: dict[str, Any], step: int | None = None) -> int:
        """The generation round a log line belongs to: its ``round`` key, else its step over steps per
        round."""
        if isinstance(entry.get("round"), (int, float)):
            return int(entry["round"])
        step = int(entry.get("step", step or 0))
        return max(1, self.round_of_step(step))

    def _ends_round(self, step: int, round_: int) -> bool:
        """Whether no later regular log line (every ``logging_steps``) falls in round ``round_``: the line at
        ``step`` is the round's last."""
        following = (step // self.logging_steps + 1) * self.logging_steps
        return self.round_of_step(following) > round_

    def _trained_rounds(self, step: int) -> tuple[bool, bool]:
        """For a log line at ``step``: whether its first optimizer step trained on a round generated before
        it, and whether a round was generated within it (`_Watch.unread`)."""
        before = self._last_step
        if step <= before:  # no new step (an evaluation, the end-of-training line): the previous line's round
            return True, False
        generated = self.round_of_step(before)  # the latest round generated before the line's steps
        carried = before > 0 and self.round_of_step(before + 1) == generated
        return carried, self.round_of_step(step) > generated

    def observe(
        self, entry: dict[str, Any], step: int | None = None
    ) -> tuple[dict[str, float], list[Firing]]:
        """Feed one log line; returns the ``collapse/*`` metrics for it and the signals that fired on it."""
        step = int(entry.get("step", step or 0))
        round_ = self.round_of(entry, step)
        span = round_ - self._last_round  # the rounds since the previous log line: what this one stands for
        self._last_round = max(self._last_round, round_)
        carried, fresh = self._trained_rounds(step)
        self._last_step = max(self._last_step, step)
        metrics: dict[str, float] = {}
        firings: list[Firing] = []
        ends_round = FINAL_KEY in entry or self._ends_round(step, round_)
        for name, watch in self._watches.items():
            keys = watch.spec.keys if watch.key is None else (watch.key,)
            key = watch.key = next((k for k in keys if _logged(entry, k)), None) or watch.key
            unread = watch.unread(entry, carried, fresh)
            if key is not None and _logged(entry, key) and not unread:
                firing = watch.add(round_, _reading(entry[key]), step, key, span, ends_round)
            elif ends_round and watch.open is not None and watch.open[0] <= round_:
                # TRL logs a round's generation metrics (rewards, lengths) on its first line only: the line
                # that ends the round judges them.
                firing = watch.close(step)
            else:
                continue
            metrics[f"collapse/{name}"] = watch.stat
            if firing is not None:
                metrics[f"collapse/fired/{name}"] = 1.0
                firings.append(firing)
        return metrics, firings

    # -- TrainerCallback events ------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._save_total_limit is not None:  # a save that never came (it failed): the user's limit back
            args.save_total_limit = self._save_total_limit
        self.logging_steps = max(1, int(getattr(state, "logging_steps", 1) or 1))
        # A resumed run restores log_history: replay it so windows, bests and firing states carry over.
        self._reset()
        for entry in state.log_history:
            self.observe(entry)
        if state.is_world_process_zero:  # a run that starts here is no longer the stopped one
            (Path(args.output_dir) / COLLAPSE_STOP_FILE).unlink(missing_ok=True)
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        metrics: dict[str, float] = {}
        firings: list[Firing] = []
        if (
            state.is_world_process_zero and logs is not None
        ):  # evaluation metrics exist on the main process only
            metrics, firings = self.observe(logs, step=state.global_step)
        shared = [firings]
        broadcast_object_list(shared)  # every process must save (and stop) together
        firings = shared[0]
        if metrics and logs is not None:
            logs.update(metrics)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(metrics)
        for firing in firings:
            if state.is_world_process_zero:
                logger.warning(
                    "collapse guard: step %d (round %d): %s -> %s",
                    firing.step,
                    firing.round,
                    firing.detail,
                    firing.action,
                )
        self.fired += firings
        # The end-of-training line comes after the last step: nothing is left to save or stop.
        acting = [f for f in firings if f.action != "log"] if FINAL_KEY not in (logs or {}) else []
        if acting:
            self._pending = acting
            self._regular_save_due = bool(control.should_save)
            if not self._regular_save_due and args.save_total_limit and self._save_total_limit is None:
                # The Trainer rotates before `on_save` renames the folder, so an unscheduled save would
                # count against the limit and delete one regular checkpoint too early: make room for it.
                self._save_total_limit = args.save_total_limit
                args.save_total_limit += 1
            control.should_save = True
            if any(f.action == "stop" for f in acting):
                control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        made_room = self._save_total_limit is not None
        if made_room:
            args.save_total_limit, self._save_total_limit = self._save_total_limit, None
        if not self._pending:
            return control
        if self._pending[0].step != state.global_step:
            # The save asked for at that step never came (save_strategy "best" skips one that is no new best):
            # this save is another, which must not be renamed after those firings.
            self._unsaved(self._pending, state.is_world_process_zero)
            self._pending = []
            return control
        firings, self._pending = self._pending, []
        source = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        target = _free_path(  # named on every process before any renames
            Path(args.output_dir)
            / f"{COLLAPSE_PREFIX}-{'_'.join(f.signal for f in firings)}-round{firings[0].round}"
        )
        # Every process writes its part of the checkpoint (its random state; ZeRO its optimizer shard) and
        # the Trainer does not wait for the others before this event: a late one would otherwise write into
        # a new checkpoint folder after the rename. Every process gets here (the firings were broadcast).
        PartialState().wait_for_everyone()
        stops = [f for f in firings if f.action == "stop"]
        # A scheduled checkpoint, or one a run stopping early for another reason (a preemption signal) resumes
        # from: keep it and copy.
        early = control.should_training_stop and state.global_step < state.max_steps
        keep = self._regular_save_due or (early and not stops)
        if args.should_save:
            if not source.is_dir():
                logger.error("collapse guard: expected the checkpoint %s, found nothing to keep", source)
                return control
            # transformers uploads the checkpoint folder in the background: moving it would break that
            # upload, and waiting for it would hold this process while the others train on.
            uploading = args.push_to_hub and args.hub_strategy in CHECKPOINT_PUSHES and self._push_running()
            if uploading:
                logger.warning("collapse guard: %s is being pushed to the Hub: copied, and kept", source)
            keep = keep or uploading
            if keep:
                shutil.copytree(source, target)
            else:
                source.rename(target)
                if (target / TRAINER_STATE_NAME).is_file():  # the state a resume from it reads
                    saved = TrainerState.load_from_json(str(target / TRAINER_STATE_NAME))
                    if _names(saved.best_model_checkpoint, source):
                        saved.best_model_checkpoint = str(target)
                        saved.save_to_json(str(target / TRAINER_STATE_NAME))
            if made_room:  # the Trainer saved the arguments with the room made for this save: the user's now
                for folder in (target, source) if keep else (target,):
                    if (folder / TRAINING_ARGS_NAME).is_file():
                        torch.save(args, folder / TRAINING_ARGS_NAME)
            logger.warning("collapse guard: saved %s", target)
        if not keep and _names(state.best_model_checkpoint, source):
            # An evaluation at this step was a new best, recorded under the name gone now: the Trainer loads
            # it at the end (every process) and, with save_total_limit 1, compares each checkpoint with it.
            state.best_model_checkpoint = str(target)
        self.checkpoints.append(target)
        if stops:
            self._stopped(state.global_step, stops, target)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._save_total_limit is not None:
            args.save_total_limit, self._save_total_limit = self._save_total_limit, None
        if self._pending:  # the save asked for at the last firing never came
            self._unsaved(self._pending, state.is_world_process_zero)
            self._pending = []
        if self._stop_record is not None and state.is_world_process_zero:
            path = Path(args.output_dir) / COLLAPSE_STOP_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self._stop_record, indent=1) + "\n")
            logger.warning("%s. This stop is recorded in %s", self.stop_message, path)
        return control

    def _stopped(self, step: int, stops: list[Firing], checkpoint: Path | None) -> None:
        """Record why the run stopped at ``step`` (``stop_reason``), with the ``checkpoint`` saved there, if
        any (``stop_message``, and `COLLAPSE_STOP_FILE`'s record)."""
        details = "; ".join(f.detail for f in stops)
        self.stop_reason = (
            f"collapse guard stopped training at step {step} (round {stops[0].round}): {details}"
        )
        if checkpoint is not None:
            saved = f"Checkpoint: {checkpoint} (resume with --resume_from_checkpoint {checkpoint})"
        else:
            saved = "The Trainer saved no checkpoint at that step (save_strategy skipped it)"
        self.stop_message = f"{self.stop_reason}. {saved}"
        self._stop_record = {
            "stopped_by": "collapse guard",
            "signals": [f.signal for f in stops],
            "step": step,
            "round": stops[0].round,
            "detail": details,
            "checkpoint": None if checkpoint is None else str(checkpoint),
            "exit_status": 0,
        }

    def _unsaved(self, firings: list[Firing], main: bool) -> None:
        """Firings whose checkpoint the Trainer never saved: said so, and for a stop, why the run stopped."""
        stops = [f for f in firings if f.action == "stop"]
        if stops and self.stop_message is None:
            self._stopped(stops[0].step, stops, None)
        elif main:
            logger.warning(
                "collapse guard: no checkpoint was saved for %s at step %d: the Trainer skipped the save",
                ", ".join(f.signal for f in firings),
                firings[0].step,
            )


def _logged(entry: dict[str, Any], key: str) -> bool:
    """Whether log line ``entry`` has ``key``: a number, or ``None`` (TRL's mean of only NaN values).

    >>> _logged({"entropy": None}, "entropy"), _logged({"entropy": "x"}, "entropy"), _logged({}, "entropy")
    (True, False, False)
    """
    return key in entry and (entry[key] is None or is_number(entry[key]))


def _reading(value: float | None) -> float:
    """A logged value as a watch reads it: ``None`` (TRL's mean of only NaN values) is NaN.

    >>> _reading(None), _reading(1)
    (nan, 1.0)
    """
    return math.nan if value is None else float(value)


def _shown(value: float) -> str:
    """``value`` in a firing message: 4 significant digits, or NaN / inf / -inf.

    >>> _shown(0.123456), _shown(float("nan")), _shown(float("-inf"))
    ('0.1235', 'NaN', '-inf')
    """
    return "NaN" if math.isnan(value) else f"{value:.4g}"


def _names(checkpoint: str | None, folder: Path) -> bool:
    """Whether the Trainer's ``best_model_checkpoint`` (a path, or None) is ``folder``.

    >>> _names("out/checkpoint-5/", Path("out/checkpoint-5")), _names(None, Path("out/checkpoint-5"))
    (True, False)
    """
    return checkpoint is not None and Path(checkpoint) == folder


def _free_path(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... if it exists: a collapse checkpoint is never overwritten."""
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def guard_from_args(
    script_args: Any, steps_per_round: float, reward_funcs: list[Any] | None = None
) -> CollapseGuard | None:
    """The guard a recipe asks for (a signal is on when its threshold key is set), or ``None``.

    ``script_args`` is a `PromptAugGRPOConfig`; a bad action, window or threshold names its recipe key
    (`ValueError`): a threshold that is not finite, a fall of 1 or more of a share, which can never happen
    (``eval/macro``; the accuracy signal's share right, which it reads when ``reward_funcs`` holds a
    correctness reward and no other metric is chosen, or a chosen ``.../accuracy`` key), and a ceiling of 1
    on a share (truncation, repetition), which nothing is above.
    """
    check_keys(script_args, prefix="collapse_")  # again: the config may have changed since it was built
    a = script_args
    metric = a.collapse_accuracy_metric
    shares = {  # signal -> the share it reads, where it reads one
        "eval": "eval/macro",
        "accuracy": metric if metric and metric.rsplit("/", 1)[-1] == "accuracy" else None,
    }
    if not metric and reward_funcs is not None and correctness_scores(reward_funcs) is not None:
        shares["accuracy"] = ACCURACY_KEY
    for name, (threshold_key, _) in SIGNAL_KEYS.items():
        threshold = getattr(a, threshold_key)
        if threshold is None:
            continue
        if not math.isfinite(float(threshold)):
            raise ValueError(f"{threshold_key}: must be a finite number, got {threshold}")
        if shares.get(name) and threshold >= 1:
            raise ValueError(
                f"{threshold_key}: {threshold:g} can never fire: {shares[name]} is a share (0 to 1), which "
                "cannot fall by 1 or more; give the fall as a share (0.05 for 5 points)"
            )
        if name in ("truncation", "repetition") and threshold >= 1:  # the range check allows 1 itself
            raise ValueError(
                f"{threshold_key}: {threshold:g} can never fire: the signal fires above its ceiling, and its "
                "share (0 to 1) is never above 1; give a ceiling below 1 (0.9 fires above 90%)"
            )
    accuracy_keys = (a.collapse_accuracy_metric,) if a.collapse_accuracy_metric else ACCURACY_KEYS
    watched = {  # signal -> (the log keys it reads, its kind); its recipe keys are `config.SIGNALS`'
        "entropy": (("entropy",), "below"),
        "accuracy": (accuracy_keys, "drop"),
        "truncation": (("completions/clipped_ratio",), "above"),
        "repetition": ((REPETITION_KEY,), "above"),
        "eval": (("eval/macro",), "drop"),
    }
    if getattr(a, "dynamic_sampling", False):
        # TRL's reward metrics then cover the trained groups only, never those every rollout got right or
        # wrong: read them over everything generated first (a chosen metric stays as chosen, but for
        # `ACCURACY_KEY`, which is then logged over everything generated only). Truncation reads the same key
        # set; TRL's own already covers every generation pass.
        chosen = a.collapse_accuracy_metric not in (None, "", ACCURACY_KEY)
        for name in ("truncation",) if chosen else ("accuracy", "truncation"):
            keys, kind = watched[name]
            watched[name] = (generated_first(keys), kind)
    # With truncated completions masked out of the loss, a round cut in full trains on no token and TRL logs
    # its entropy as 0: entropy takes no reading there (truncation is the signal that speaks). Under dynamic
    # sampling that is the share of the rows trained, not of every row generated.
    masked = getattr(a, "mask_truncated_completions", False)
    cut = (TRAINED_CLIPPED,) if getattr(a, "dynamic_sampling", False) else watched["truncation"][0]
    masked_by = {"entropy": cut} if masked else {}
    specs = []
    for name, (threshold_key, window_key) in SIGNAL_KEYS.items():
        keys, kind = watched[name]
        threshold = getattr(a, threshold_key)
        if threshold is None:
            continue
        action, window = getattr(a, f"collapse_{name}_action"), getattr(a, window_key)
        spec = SignalSpec(name, keys, kind, float(threshold), int(window), action, masked_by.get(name, ()))
        specs.append(spec)
    return CollapseGuard(specs, steps_per_round) if specs else None
