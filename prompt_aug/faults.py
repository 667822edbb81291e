"""What a run does when something goes wrong: it resumes exactly, leaves nothing half-done behind, and names
the fault in one line.

* Preemption (`PreemptionCallback`): SIGTERM or SIGUSR1 (what a cluster sends before it stops a job) only
  sets a flag; at the end of the current optimizer step the ranks agree on it, every rank saves the same
  checkpoint and training stops. The main process writes ``preempted.json`` in the output folder, and
  ``prompt-aug-train`` exits with `EXIT_PREEMPTED` (75), so that a requeue script can tell a preempted run
  from a failed one.
* Checkpoints (`checkpoint_problem`, `last_complete_checkpoint`): a folder that a kill during a save left
  without its trainer state, with a half-written one, or without (or with a half-written) model, optimizer
  or other file it holds is not a checkpoint to resume from; the one before it is.
* A full disk (`disk_full_is_one_line`) and a failed Hub push (`hub_push_failed`) end the run with one line
  naming the output folder, the last complete checkpoint and what to do.
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psutil
import torch
from transformers import TrainerCallback
from transformers.trainer_utils import HubStrategy

from .records import checkpoint_folders, checkpoint_number

logger = logging.getLogger("prompt_aug")

# sysexits.h's EX_TEMPFAIL: "a temporary failure, the user is invited to retry".
EXIT_PREEMPTED = 75
PREEMPTED_FILE = "preempted.json"
# Written in output_dir when the collapse guard stopped the run (exit status 0, as for a run trained to its
# end); deleted when a run starts there.
COLLAPSE_STOP_FILE = "collapse_stop.json"
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")


class FaultError(RuntimeError):
    """A run ended for a reason its message states in one line; `prompt-aug-train` prints only that line."""


class DiskFullError(FaultError):
    """The output folder's disk (or quota) was full while the run wrote to it."""


class HubPushError(FaultError):
    """The Hub repository could not be created, or the final upload failed."""


def one_line(err: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, cut to ``limit`` characters.

    >>> one_line(ValueError("a\\n  b"))
    'ValueError: a b'
    """
    text = " ".join(str(err).split())
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Preemption


LAUNCH_FILE = "launch.json"  # in each checkpoint: the process count, seed and round keys that saved it
# The GRPOConfig keys that size a generation round and the optimizer steps it serves, as GRPOConfig holds
# them once built (steps_per_generation and generation_batch_size filled in from each other).
ROUND_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
)
# What a resume must keep besides the process count: the seed orders the questions and draws the templates.
LAUNCH_KEYS = ("seed", *ROUND_KEYS)


def launch_record(args: Any, processes: int) -> dict[str, int]:
    """What ``launch.json`` holds for a run under ``args`` (a built GRPOConfig) on ``processes`` processes:
    the count and each of `LAUNCH_KEYS` that ``args`` has.

    >>> from types import SimpleNamespace
    >>> launch_record(SimpleNamespace(seed=7, num_generations=4, steps_per_generation=None), 2)
    {'processes': 2, 'seed': 7, 'num_generations': 4}
    """
    keys = {key: getattr(args, key, None) for key in LAUNCH_KEYS}
    return {"processes": processes, **{key: value for key, value in keys.items() if isinstance(value, int)}}


class LaunchRecord(TrainerCallback):
    """Writes into each checkpoint the launch that trained it (``launch.json``, `launch_record`), which a
    resume checks: the recipe's batch keys are per process, so another process count is another round size
    and another optimizer state layout (`resume_launch_problem`), and another seed or round key is another
    question order or round (`resume_keys_problem`)."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            (folder / LAUNCH_FILE).write_text(json.dumps(launch_record(args, args.world_size)) + "\n")


def saved_launch(checkpoint: str | Path) -> dict[str, Any]:
    """``checkpoint``'s ``launch.json``; empty without a readable one (a checkpoint saved by TRL's trainer
    alone, or killed before the file was written)."""
    try:
        saved = json.loads((Path(checkpoint) / LAUNCH_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def saved_processes(checkpoint: str | Path) -> int | None:
    """The process count ``checkpoint``'s ``launch.json`` records; None without a readable one (a checkpoint
    saved by TRL's trainer alone, or killed before the file was written)."""
    saved = saved_launch(checkpoint).get("processes")
    return saved if isinstance(saved, int) else None


def rng_processes(checkpoint: str | Path) -> int | None:
    """The process count ``checkpoint``'s RNG state files show, or None without any: one process writes
    ``rng_state.pth``, several ``rng_state_R.pth`` each, so the highest R found plus one (at least 2)."""
    folder = Path(checkpoint)
    ranks = [
        int(m.group(1))
        for p in folder.glob("rng_state_*.pth")
        if (m := re.fullmatch(r"rng_state_(\d+)\.pth", p.name))
    ]
    if ranks:
        return max(2, max(ranks) + 1)
    return 1 if (folder / "rng_state.pth").is_file() else None


def _warm_start(checkpoint: str | Path, output_dir: str | Path | None) -> bool:
    """Whether resuming ``checkpoint`` into ``output_dir`` is a warm start: a checkpoint outside the folder,
    which makes the launch a new run already."""
    return output_dir is not None and not is_inside(checkpoint, output_dir)


def _from_weights(checkpoint: str | Path, output_dir: str | Path | None) -> str:
    """How to train on from ``checkpoint``'s weights alone (a run's own checkpoint: in a new run)."""
    if _warm_start(checkpoint, output_dir):
        return f"start from its weights with --model_name_or_path {checkpoint}"
    return f"start a new run from its weights (--model_name_or_path {checkpoint}, another output_dir)"


def _other_start(checkpoint: str | Path, output_dir: str | Path | None) -> str:
    """The way out besides relaunching as ``checkpoint`` was saved."""
    if _warm_start(checkpoint, output_dir):
        return _from_weights(checkpoint, output_dir)
    return "start a new run (another output_dir)"


def resume_launch_problem(
    checkpoint: str | Path, processes: int, output_dir: str | Path | None = None
) -> str | None:
    """Why ``checkpoint`` should not be resumed on ``processes`` processes (it was saved by another count),
    or None. The count is ``launch.json``'s, else (a checkpoint saved by TRL's trainer alone, or killed
    before the file was written) the one its RNG state files show (`rng_processes`) where that is sure: more
    processes than this launch's, or one process (``rng_state.pth``) where this launch has several. Fewer
    files than this launch's processes may be a kill during the save: `checkpoint_problem` names that case.
    With neither, not checked. ``output_dir``, the run's folder, tells a warm start (a checkpoint outside
    it) from a resume, for what to do."""
    saved, source = saved_processes(checkpoint), ""
    if saved is None:
        shown = rng_processes(checkpoint)
        sure = shown is not None and (shown > processes or (shown == 1 and processes > 1))
        saved, source = (shown if sure else None), " (as its rng_state files show)"
    if saved is None or saved == processes:
        return None
    return (
        f"resume_from_checkpoint: {checkpoint} was trained on {saved} process(es){source}, and this launch "
        f"has {processes}; the batch keys are per process, so the round would change. Relaunch on {saved} "
        f"processes, or {_other_start(checkpoint, output_dir)}"
    )


def resume_keys_problem(
    checkpoint: str | Path, args: Any, output_dir: str | Path | None = None
) -> str | None:
    """Why ``checkpoint`` should not be resumed under ``args`` (a built GRPOConfig), or None: its
    ``launch.json`` records another value of a key of `LAUNCH_KEYS`. The seed orders the questions and draws
    their templates, and the round keys size each round and the steps it serves, so the resumed run would
    not train on what the saved run went on to. A key the file does not record (a checkpoint of TRL's
    trainer alone, or of an older version), or that ``args`` lacks, is not checked. A warm start is checked
    too: it resumes the other run's optimizer, scheduler and data position. ``output_dir``: as
    `resume_launch_problem`."""
    saved = saved_launch(checkpoint)
    differ = [
        f"{key} {saved[key]} (this launch: {now})"
        for key in LAUNCH_KEYS
        if key in saved and (now := getattr(args, key, None)) is not None and now != saved[key]
    ]
    if not differ:
        return None
    return (
        f"resume_from_checkpoint: {checkpoint} was trained with {', '.join(differ)}; the question order "
        "and templates follow the seed, and the rounds the batch keys, so the resumed run would not continue "
        f"the saved one. Relaunch with the saved values, or {_other_start(checkpoint, output_dir)}"
    )


def checkpoint_engine(folder: str | Path) -> str:
    """The engine whose layout a checkpoint's optimizer state is in: ``"DeepSpeed ZeRO-3"`` or ``"DeepSpeed
    ZeRO-1/2"`` (a ``global_step*/`` folder; ZeRO-3's model states are per rank), ``"FSDP"``
    (``pytorch_model_fsdp*``, ``optimizer.bin`` or ``optimizer_0/``), or ``"DDP or one process"``."""
    folder = Path(folder)
    if any(folder.glob("global_step*/zero_pp_rank_*_model_states.pt")):
        return "DeepSpeed ZeRO-3"
    if any(folder.glob("global_step*")):
        return "DeepSpeed ZeRO-1/2"
    if (
        any(folder.glob("pytorch_model_fsdp*"))
        or any(folder.glob("optimizer.bin"))
        or any(folder.glob("optimizer_0"))
    ):
        return "FSDP"
    return "DDP or one process"


def launch_engine(args: Any) -> str:
    """`checkpoint_engine`'s name for the engine a run with these TrainingArguments trains under: DeepSpeed
    from ``--deepspeed`` or a DeepSpeed accelerate config, FSDP from ``--fsdp`` or an FSDP accelerate config
    (which accelerate reports only once the Trainer has built its state, hence the environment)."""
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None:
        return "DeepSpeed ZeRO-3" if plugin.zero_stage == 3 else "DeepSpeed ZeRO-1/2"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("true", "1"):
        return "FSDP"
    return "DDP or one process"


def resume_engine_problem(
    checkpoint: str | Path, engine: str, output_dir: str | Path | None = None
) -> str | None:
    """Why ``checkpoint`` should not be resumed under ``engine`` (a `launch_engine` name), or None
    (``output_dir``: as `resume_launch_problem`).

    Each engine saves the optimizer state in its own layout, and none reads another's: the Trainer resumes a
    DeepSpeed checkpoint without DeepSpeed on a new optimizer, without a word, and the other ways round fails
    deep in loading. A checkpoint saved with ``save_only_model`` (model weights, no optimizer state, whatever
    the engine that trained it) resumes without DeepSpeed or FSDP only, on a new optimizer: transformers
    resumes DeepSpeed from a ``global_step*`` folder and FSDP from ``pytorch_model_fsdp*`` files alone."""
    saved = checkpoint_engine(checkpoint)
    if saved == engine:
        return None
    if saved == "DDP or one process" and not (Path(checkpoint) / "optimizer.pt").is_file():
        return (
            f"resume_from_checkpoint: {checkpoint} was saved with save_only_model (model weights only), "
            f"which cannot be resumed under {engine}; {_from_weights(checkpoint, output_dir)}"
        )
    return (
        f"resume_from_checkpoint: {checkpoint} was saved under {saved}, and this launch runs {engine}, which "
        "cannot read its optimizer state. Relaunch with the accelerate config the run was trained with, or "
        f"{_other_start(checkpoint, output_dir)}"
    )


@contextmanager
def signals_handled(signums: list[int], handler: Any) -> Iterator[bool]:
    """``handler`` for each of ``signums`` while the block runs, and the previous handlers after (the default
    action where Python had none). Only the main thread may set handlers (Python's rule): elsewhere nothing is
    set, and the block gets False."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.signal(sig, handler) for sig in signums}
    try:
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


class PreemptionCallback(TrainerCallback):
    """Stop at a step end, saved, when the job is told to stop (SIGTERM, SIGUSR1).

    The signal handler only records the signal; `catching_signals` installs it for the duration of
    ``trainer.train`` and restores the previous handlers after. At each step end the ranks agree on the flag
    twice, before and after the other step-end callbacks (an all-reduce of one number each; with one process
    none), and once more after each save, so every rank saves the same checkpoint and stops at the same step.
    A signal that arrives while a checkpoint is being written stops the run right after that save; one that
    arrives during the Trainer's own evaluation (``eval_strategy``, which runs after the step-end callbacks)
    stops it right after that evaluation, saved, rather than after another step; one that arrives during the
    last step lets the run finish normally.
    """

    def __init__(self, signals: tuple[str, ...] = PREEMPTION_SIGNALS) -> None:
        self.signals = [getattr(signal, name) for name in signals if hasattr(signal, name)]
        self.received: int | None = None  # set by the handler (any rank)
        self.stopped_by: str | None = None  # the agreed signal's name, once training stopped for it
        self.training = False  # inside `catching_signals`: every rank trains, so every rank agrees

    def attach(self, trainer: Any) -> PreemptionCallback:
        """Add this callback first, so that the stop is decided before an evaluation due at the same step
        (which could outlast the grace period a cluster gives before it kills the job), and a second one last,
        which drops the Trainer's own due evaluation (set by its flow callback) when the run stops for a
        signal; returns ``self``."""
        callbacks = trainer.callback_handler.callbacks
        callbacks[:] = [c for c in callbacks if c is not self and getattr(c, "preemption", None) is not self]
        callbacks.insert(0, self)
        callbacks.append(_NoEvaluationWhenPreempted(self))
        return self

    @contextmanager
    def catching_signals(self) -> Iterator[None]:
        """Record the preemption signals while the block runs (main thread only: Python's rule); each
        ``train()`` call starts with no signal received."""
        self.received, self.stopped_by = None, None
        with signals_handled(self.signals, self._on_signal) as installed:
            if not installed:
                logger.warning(
                    "save_on_preemption: training runs outside the main thread; signals are not caught"
                )
            self.training = True
            try:
                yield
            finally:
                self.training = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum

    def agreed_signal(self, args: Any) -> int | None:
        """The signal any rank received, the same on every rank (all ranks must call this together)."""
        received = self.received or 0
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([received], dtype=torch.int64, device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            received = int(flag.item())
        return received or None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:  # a run that starts here is no longer the preempted one
            (Path(args.output_dir) / PREEMPTED_FILE).unlink(missing_ok=True)

    def on_step_end(self, args, state, control, **kwargs):
        self._maybe_stop(args, state, control, save=True)

    def on_save(self, args, state, control, **kwargs):
        if not control.should_training_stop:  # a signal during this save: stop now, it is saved
            self._maybe_stop(args, state, control, save=False)

    def on_evaluate(self, args, state, control, **kwargs):
        # The Trainer's own evaluation runs after the step-end callbacks and can take minutes (GRPO
        # generates): a signal during it would otherwise wait for the next step's end, a generation round
        # later. The stop asks for the save that follows the evaluation; not under save_strategy "best",
        # which replaces that request with whether the metric improved (the stop could come without a save):
        # there the next step end decides. Only inside train(), where every rank evaluates.
        if self.training and not control.should_training_stop and args.save_strategy != "best":
            self._maybe_stop(args, state, control, save=True)

    def _maybe_stop(self, args: Any, state: Any, control: Any, save: bool) -> None:
        if self.stopped_by is not None or state.global_step >= state.max_steps:
            return
        signum = self.agreed_signal(args)
        if signum is None:
            return
        self.stopped_by = signal.Signals(signum).name
        control.should_training_stop = True
        control.should_save = control.should_save or save
        if state.is_world_process_zero:
            done = "saving" if save else "saved"
            logger.warning(
                "%s received: stopping at step %d, checkpoint %s", self.stopped_by, state.global_step, done
            )

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopped_by is None or not state.is_world_process_zero:
            return
        record = {
            "signal": self.stopped_by,
            "step": state.global_step,
            "checkpoint": str(Path(args.output_dir) / f"checkpoint-{state.global_step}"),
            "exit_status": EXIT_PREEMPTED,
            "resume": "the same command plus --resume_from_checkpoint true",
        }
        (Path(args.output_dir) / PREEMPTED_FILE).write_text(json.dumps(record, indent=1) + "\n")


class _NoEvaluationWhenPreempted(TrainerCallback):
    """The Trainer's due evaluation dropped at the step a preemption signal stops, before the save, and the
    evaluation and second save an epoch strategy asks for as the stopped epoch ends. Last among the step-end
    callbacks, it asks again for a signal that came while they ran (a benchmark evaluation can take minutes),
    so that the run stops at this step, not after another round."""

    def __init__(self, preemption: PreemptionCallback) -> None:
        self.preemption = preemption

    def on_step_end(self, args, state, control, **kwargs):
        self.preemption.on_step_end(args, state, control)
        if self.preemption.stopped_by is not None:
            control.should_evaluate = False

    def on_epoch_end(self, args, state, control, **kwargs):
        # The Trainer ends the stopped epoch too: under an epoch eval or save strategy its flow callback
        # would evaluate inside the grace period and save the checkpoint saved at the step end again.
        if self.preemption.stopped_by is not None:
            control.should_evaluate = False
            control.should_save = False


# ---------------------------------------------------------------------------------------------
# Checkpoints

# The collapse guard's checkpoints, ``_collapse-<signal>-round<N>``: the leading underscore keeps them out of
# every Hub push (transformers leaves out ``_*`` and ``checkpoint-*``): each holds a whole optimizer state.
COLLAPSE_PREFIX = "_collapse"
# TRL's adaptive entropy control (``use_adaptive_entropy``) writes its coefficient after trainer_state.json.
ENTROPY_FILE = "entropy_ctrl_state.json"
# The synced reference model's weights (``sync_ref_model``), written beside the model, before
# trainer_state.json, by `prompt_aug.extensions.stabilisers.ReferenceCheckpoint`.
# In a folder of its own: vLLM, given a checkpoint, loads every *.safetensors file at its top (there is no
# index beside one file of weights), and the reference's tensors have the policy's names.
REF_MODEL_FILE = "ref_model/model.safetensors"
_MODEL_FILES = ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "adapter_model.bin")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _safetensors_problem(path: Path, name: str | None = None) -> str | None:
    """Why a safetensors file is cut short (its header says where the data ends), or None; the file is named
    ``name`` (default: its own)."""
    name = name or path.name
    try:
        with path.open("rb") as handle:
            # The size of the file opened, not of the path: a file deleted or replaced meanwhile (on one
            # process only) must not fail the check there while the others go on.
            held = os.fstat(handle.fileno()).st_size
            size = int.from_bytes(handle.read(8), "little")
            # No more than the file holds: a length past its end (exabytes, from a file of another kind) is
            # no header, and fails to parse like any other.
            header = json.loads(handle.read(min(size, held)))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        short = held < 8 + size + end
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return f"{name} is unreadable (half-written?)"
    if short:
        return f"{name} is cut short (half-written?)"
    return None


def _model_problem(folder: Path) -> str | None:
    for index_name in _INDEX_FILES:
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError):
                return f"{index_name} is not valid JSON (half-written?)"
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                return f"model shard {missing[0]} is missing"
            return next(
                (p for s in shards if s.endswith(".safetensors") and (p := _safetensors_problem(folder / s))),
                None,
            )
    for name in _MODEL_FILES:
        if (folder / name).is_file():
            return _safetensors_problem(folder / name) if name.endswith(".safetensors") else None
    if any(folder.glob("pytorch_model_fsdp*")) or any(folder.glob("global_step*/*model_states.pt")):
        return None  # FSDP or DeepSpeed weights
    return "no model weights (model.safetensors or shards)"


def _optimizer_problem(folder: Path) -> str | None:
    if (folder / "optimizer.pt").is_file():
        return (
            None
            if zipfile.is_zipfile(folder / "optimizer.pt")
            else "optimizer.pt is cut short (half-written?)"
        )
    if any(folder.glob("optimizer*")) or any(folder.glob("global_step*/*optim_states.pt")):
        return None  # FSDP or DeepSpeed optimizer state
    return "no optimizer state (optimizer.pt)"


def _rng_problem(folder: Path, processes: int | None) -> str | None:
    """Why a checkpoint of several processes lacks one's RNG state (``rng_state_R.pth``), or None. The count
    is the checkpoint's own (``launch.json``), else ``processes`` (the launch's); one process is not checked
    (its RNG state is written before ``trainer_state.json``), nor is an unknown count. Without
    ``launch.json``, fewer files may also mean fewer processes saved it, and the line says so."""
    recorded = saved_processes(folder)
    shown = rng_processes(folder) if recorded is None else None  # TRL's own checkpoints record no count
    if shown == 1:
        return None  # one process's whole state: another launch count is `resume_launch_problem`'s
    count = recorded if recorded is not None else processes
    for rank in range(count if count is not None and count > 1 else 0):
        path = folder / f"rng_state_{rank}.pth"
        if not path.is_file():
            if shown is not None and shown < count:
                return (
                    f"{path.name} is missing (process {rank} was killed while saving, or the run had "
                    f"{shown} process(es): then relaunch on {shown})"
                )
            return f"{path.name} is missing (process {rank} was killed while saving?)"
        if not zipfile.is_zipfile(path):
            return f"{path.name} is cut short (half-written?)"
    return None


def _entropy_problem(folder: Path) -> str | None:
    """Why TRL's adaptive-entropy state in ``folder`` cannot be read, or None. A missing file is accepted, as
    TRL accepts it (the coefficient then starts from its initial value): a run that turns the flag on at a
    resume has none in any checkpoint. A file cut short would stop TRL's resume."""
    try:
        json.loads((folder / ENTROPY_FILE).read_text())["entropy_coef"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return f"{ENTROPY_FILE} is not valid JSON (half-written?)"
    return None


def _reference_problem(folder: Path) -> str | None:
    """Why the synced reference model's weights in ``folder`` (`REF_MODEL_FILE`) cannot be loaded, or None.
    As for TRL's entropy state, a missing file is accepted (a run without ``sync_ref_model``, an older run,
    ``save_only_model``, ZeRO-3 or FSDP: the resume says what the reference restarts from); one cut short
    would stop the resume. Checked wherever the file is, since only a run that syncs writes it."""
    path = folder / REF_MODEL_FILE
    return _safetensors_problem(path, REF_MODEL_FILE) if path.is_file() else None


def checkpoint_problem(
    folder: str | Path, optimizer: bool = True, processes: int | None = None, entropy: bool = False
) -> str | None:
    """Why ``folder`` is not a complete checkpoint to resume from, or None when it is.

    The Trainer writes the model, then the optimizer, scheduler and RNG states, and ``trainer_state.json``
    last; a kill during a save leaves the folder without it, or with a half-written one. The model and
    optimizer files are checked too (a safetensors file against the length its header gives, ``optimizer.pt``
    as the zip archive torch writes), for a folder whose files were removed or cut short. With several
    processes, each writes its own RNG state while process 0 writes ``trainer_state.json``, with no wait
    between them, so each ``rng_state_R.pth`` is checked too: for the count the checkpoint records, else
    (with ``processes``, the launch's, given) the one its RNG state files show, else ``processes``.
    ``optimizer=False`` (``save_only_model``, which writes neither) checks
    neither. ``entropy`` (``use_adaptive_entropy``) checks that TRL's ``entropy_ctrl_state.json``, which it
    writes after ``trainer_state.json``, is whole where it is there; and so is `REF_MODEL_FILE` (the synced
    reference model, written beside the model) whatever the flags.
    """
    folder = Path(folder)
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "trainer_state.json is missing (killed while saving?)"
    try:
        step = json.loads(state.read_text()).get("global_step")
    except (OSError, ValueError, AttributeError):
        return "trainer_state.json is not valid JSON (half-written?)"
    if not isinstance(step, int):
        return "trainer_state.json has no global_step"
    problem = _model_problem(folder)
    if optimizer:
        problem = problem or _optimizer_problem(folder) or _rng_problem(folder, processes)
    return problem or (_entropy_problem(folder) if entropy else None) or _reference_problem(folder)


def saved_parts(args: Any) -> dict[str, bool]:
    """What a complete checkpoint of a run under ``args`` (TrainingArguments) holds besides its model and
    trainer state, as `checkpoint_problem`'s keywords: ``optimizer`` (unless ``save_only_model``) and
    ``entropy`` (``use_adaptive_entropy``).

    >>> from types import SimpleNamespace
    >>> saved_parts(SimpleNamespace(save_only_model=True))
    {'optimizer': False, 'entropy': False}
    """
    return {
        "optimizer": not getattr(args, "save_only_model", False),
        "entropy": bool(getattr(args, "use_adaptive_entropy", False)),
    }


def last_complete_checkpoint(
    output_dir: str | Path, optimizer: bool = True, processes: int | None = None, entropy: bool = False
) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete ``checkpoint-N`` folder of ``output_dir`` (or None), and the newer folders skipped,
    each with why (``optimizer``, ``processes``, ``entropy``: as `checkpoint_problem`)."""
    skipped = []
    for path in checkpoint_folders(output_dir):
        problem = checkpoint_problem(path, optimizer, processes, entropy)
        if problem is None:
            return str(path), skipped
        skipped.append((str(path), problem))
    return None, skipped


def _resume_on_fewer(
    output_dir: str | Path, processes: int | None, optimizer: bool = True, entropy: bool = False
) -> str | None:
    """Where no checkpoint of ``output_dir`` is complete on ``processes`` processes (the launch's): the one a
    relaunch on fewer would resume, and how, in words that end with "start over" (the caller says how), or
    None. A checkpoint that records no process count (no ``launch.json``) with the RNG state of fewer
    processes than the launch's is a save a kill cut short, or the whole save of a run on as many processes
    as its files show (`_rng_problem`): starting over is the way only for the first reading, as it deletes
    the checkpoint. ``optimizer``, ``entropy``: as `checkpoint_problem`."""
    if processes is None or not Path(output_dir).is_dir():
        return None
    for path in checkpoint_folders(output_dir):  # newest first
        shown = rng_processes(path) if saved_processes(path) is None else None
        if shown is None or not 1 < shown < processes:
            continue
        found, _ = last_complete_checkpoint(output_dir, optimizer, shown, entropy)
        if found is not None and resume_launch_problem(found, shown) is None:
            return (
                f"no checkpoint in {output_dir} is complete on {processes} processes, and {found} is "
                f"complete on {shown} (it records no process count; its rng_state files show {shown}): if "
                f"the run had {shown} processes, relaunch on {shown} to resume it; only if it had "
                f"{processes} (a process was killed while saving), start over"
            )
    return None


class ResumeError(FaultError, ValueError):
    """A checkpoint that cannot be resumed from; the message names it and says what to do. A `ValueError`
    too, as transformers' own refusal of a ``resume_from_checkpoint`` (no checkpoint found) is."""


def resolve_resume(
    value: str | bool | None,
    output_dir: str | Path,
    log: bool = True,
    optimizer: bool = True,
    processes: int | None = None,
    entropy: bool = False,
) -> str | None:
    """The checkpoint ``resume_from_checkpoint`` names: ``true`` the last complete one in ``output_dir`` (a
    newer folder that a kill during a save left incomplete is skipped, with one log line naming it and why), a
    path itself if it is complete; ``None`` for none. ``optimizer=False`` (a run with ``save_only_model``,
    which transformers resumes on a fresh optimizer) does not ask for optimizer state; ``processes`` (the
    launch's count) and ``entropy`` are as in `checkpoint_problem`.

    Raises:
        ResumeError: no checkpoint, or an incomplete one, named with what to do.
    """
    if value is None or value is False or str(value).lower() in ("", "false", "none"):
        return None
    if str(value).lower() == "true":
        last, skipped = (
            last_complete_checkpoint(output_dir, optimizer, processes, entropy)
            if Path(output_dir).is_dir()
            else (None, [])
        )
        for path, why in skipped if log else []:
            logger.warning("resume: skipping %s: %s", path, why)
        on_fewer = _resume_on_fewer(output_dir, processes, optimizer, entropy) if last is None else None
        if on_fewer is not None:
            raise ResumeError(
                f"resume_from_checkpoint: true, but {on_fewer} with --overwrite_output_dir true"
            )
        if last is None and skipped:
            raise ResumeError(
                f"resume_from_checkpoint: true, but no checkpoint in {output_dir} is complete "
                f"({Path(skipped[0][0]).name}: {skipped[0][1]}); start over with --overwrite_output_dir true"
            )
        if last is None:
            raise ResumeError(
                f"resume_from_checkpoint: true, but there is no checkpoint-* folder in {output_dir}; "
                "check --output_dir, or start without --resume_from_checkpoint"
            )
        return last
    if not Path(value).is_dir():
        raise ResumeError(f"resume_from_checkpoint: no such checkpoint folder {value}")
    problem = checkpoint_problem(value, optimizer, processes, entropy)
    inner = checkpoint_folders(value) if problem is not None else []
    if inner:  # a run's folder given for one of its checkpoints: not a save a kill cut short
        raise ResumeError(
            f"resume_from_checkpoint: {value} is an output folder, not a checkpoint; give one of its "
            f"checkpoints ({inner[0]}), or --resume_from_checkpoint true with --output_dir {value}"
        )
    if problem is not None:
        raise ResumeError(f"resume_from_checkpoint: {value} is not a complete checkpoint: {problem}")
    return str(value)


def checkpoint_step(checkpoint: str | Path) -> int:
    """The optimizer step a checkpoint folder was saved at."""
    state = Path(checkpoint) / "trainer_state.json"
    if state.is_file():
        return int(json.loads(state.read_text()).get("global_step", 0))
    digits = Path(checkpoint).name.split("-")[-1]
    return int(digits) if digits.isdigit() else 0


def is_inside(path: str | Path, folder: str | Path) -> bool:
    """Whether ``path`` lies inside ``folder`` (links resolved)."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def later_checkpoints_problem(
    checkpoint: str, output_dir: str | Path, optimizer: bool, processes: int, entropy: bool
) -> str | None:
    """Why resuming from ``checkpoint`` in ``output_dir`` would leave complete ``checkpoint-N`` folders of
    later steps there (an earlier checkpoint or a collapse guard's folder resumed), or None: the next
    ``--resume_from_checkpoint true``, as every Slurm requeue gives, would take the newest of them and
    continue the abandoned line. A later folder a kill left incomplete is what a resume skips anyway."""
    if not is_inside(checkpoint, output_dir):
        return None  # a warm start: the folder must hold no run (`prompt_aug.cli.check_output_dir`)
    step = checkpoint_step(checkpoint)
    later = [
        p.name
        for p in reversed(checkpoint_folders(output_dir))  # oldest first
        if checkpoint_number(p) > step and checkpoint_problem(p, optimizer, processes, entropy) is None
    ]
    if not later:
        return None
    names = ", ".join(later[:6]) + (", ..." if len(later) > 6 else "")
    return (
        f"resume_from_checkpoint: {checkpoint} is at step {step}, but {output_dir} holds later checkpoints "
        f"({names}), which the next --resume_from_checkpoint true would resume instead; move them out of "
        "output_dir (or delete them) first, or resume into another --output_dir"
    )


def check_resume(value: str | bool | None, args: Any, processes: int, log: bool = True) -> str | None:
    """`resolve_resume` under these TrainingArguments, and the checkpoint refused when this launch has
    another process count, seed, round key (`resume_keys_problem`) or engine than the one that saved it, or
    when later complete checkpoints of ``output_dir`` would take over at the next resume
    (`later_checkpoints_problem`). Every process decides on its own view of ``output_dir``, then all
    compare their decisions (`_same_on_every_process`), so all refuse or none: one that refused alone would
    leave the others waiting for it in their first collective.

    Raises:
        ResumeError: the checkpoint, what differs and what to do.
    """
    parts = saved_parts(args)
    try:
        checkpoint = resolve_resume(value, args.output_dir, log, processes=processes, **parts)
        problem = checkpoint and (
            resume_launch_problem(checkpoint, processes, args.output_dir)
            or resume_keys_problem(checkpoint, args, args.output_dir)
            or resume_engine_problem(checkpoint, launch_engine(args), args.output_dir)
            or later_checkpoints_problem(checkpoint, args.output_dir, processes=processes, **parts)
        )
        refused = ResumeError(problem) if problem else None
    except ResumeError as err:  # said on every process at once, after they have compared what they found
        refused = err
    if refused is not None:
        checkpoint = None
    if checkpoint is not None or refused is not None:  # a resume was asked, alike on every process
        _same_on_every_process(checkpoint, refused)
    if refused is not None:
        raise refused
    return checkpoint


def _same_on_every_process(checkpoint: str | None, refused: ResumeError | None) -> None:
    """Refuse a resume whose processes found different things in ``output_dir``: each looks at it on its own,
    and nodes whose view of a shared folder lags (an NFS attribute cache) or that each write a folder of their
    own would resume different steps and states, and hang or diverge; or one would stop alone while the
    others wait for it. ``checkpoint`` is what this process chose, ``refused`` why it found none. Without a
    process group (one process) there is nothing to compare.

    Raises:
        ResumeError: on every process, what each found, and what to do.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if checkpoint:
        found = Path(checkpoint).name
    else:
        why = str(refused).removeprefix("resume_from_checkpoint: ")
        found = f"none ({why if len(why) <= 200 else why[:197] + '...'})"
    seen: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(seen, found)  # by the folder's name: every process has one output_dir
    if len(set(seen)) > 1:
        each = "; ".join(f"process {rank}: {s}" for rank, s in enumerate(seen))
        raise ResumeError(
            f"resume_from_checkpoint: the processes see output_dir differently ({each}); output_dir must be "
            "one folder that every node sees alike (a shared filesystem, its writes visible on every node): "
            "check it there, and delete nothing until they agree"
        )


# ---------------------------------------------------------------------------------------------
# A full disk

_DISK_FULL = re.compile(
    r"No space left on device|Disk quota exceeded|os error (28|122)\b|StorageFull", re.IGNORECASE
)
# torch.save's zip writer reports a failed write without the OS error: judged by the space left.
_TORCH_WRITER = re.compile(r"inline_container\.cc|file write failed|PytorchStreamWriter")
_LOW_SPACE = 256 * 2**20


def is_disk_full(err: BaseException, output_dir: str | Path) -> bool:
    """Whether ``err`` (or an error it was raised from) is a write that failed for want of space or quota."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if _DISK_FULL.search(str(err)):
            return True
        if isinstance(err, RuntimeError) and _TORCH_WRITER.search(str(err)):
            try:
                return shutil.disk_usage(output_dir).free < _LOW_SPACE
            except OSError:
                return False
        err = err.__cause__ or err.__context__
    return False


def disk_full_message(
    output_dir: str | Path,
    err: BaseException,
    optimizer: bool = True,
    entropy: bool = False,
    max_steps: int = -1,
    processes: int | None = None,
) -> str:
    """One line: where the disk is full, what is safe, what to do. ``optimizer``, ``entropy``: what the run's
    checkpoints hold (`saved_parts`); ``processes``: the run's count, so that a checkpoint missing a process's
    RNG state (the disk filled while that process wrote it) is the incomplete one, as a resume judges it
    (`checkpoint_problem`). What to do is what the next launch accepts: a resume from the last complete
    checkpoint; with none, a start over (a resume would find nothing to resume); with one at ``max_steps``
    (the run's, when above 0), that checkpoint as the trained model (a resume there is refused: nothing is
    left to train)."""
    last, skipped = (
        last_complete_checkpoint(output_dir, optimizer, processes, entropy)
        if Path(output_dir).is_dir()
        else (None, [])
    )
    where = f" while writing {err.filename}" if isinstance(err, OSError) and err.filename else ""
    message = f"no space left on the disk of output_dir {output_dir}{where} ({one_line(err, 160)}). "
    finished = last is not None and 0 < max_steps <= checkpoint_step(last)
    if finished:
        message += f"Training had reached max_steps {max_steps}: {last} holds the trained model. "
    elif last:
        message += f"The last complete checkpoint, {last}, is intact. "
    else:
        message += "No checkpoint is complete. "
    if skipped:
        message += f"{Path(skipped[0][0]).name} is incomplete (delete it to free space; a resume skips it). "
    message += "Free space or raise the quota, then "
    if finished:
        return message + "use that checkpoint as the model (to train on, raise max_steps and resume)."
    if last:
        return message + "rerun with --resume_from_checkpoint true."
    return message + "start over with --overwrite_output_dir true."


@contextmanager
def disk_full_is_one_line(
    output_dir: str | Path,
    optimizer: bool = True,
    entropy: bool = False,
    max_steps: int = -1,
    processes: int | None = None,
) -> Iterator[None]:
    """Turn a write that failed for want of space into a `DiskFullError` naming ``output_dir``
    (``optimizer``, ``entropy``, ``max_steps``, ``processes``: as `disk_full_message`)."""
    try:
        yield
    except Exception as err:
        if isinstance(err, FaultError) or not is_disk_full(err, output_dir):
            raise
        message = disk_full_message(output_dir, err, optimizer, entropy, max_steps, processes)
        raise DiskFullError(message) from err


# ---------------------------------------------------------------------------------------------
# A folder written whole or not at all


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new hidden folder beside ``target`` (``.NAME.partial-HOST-NS-PID-XXXX``) to build it in; the caller
    renames it to ``target`` once complete, and it is removed on the way out otherwise. Such folders that a
    killed process left are removed first: those of this host and PID namespace (``NS``: a container with the
    host's name has its own process ids) whose process is gone. It opens to other users as any folder made
    here would (a vLLM server's user reads a merged model), not as ``mkdtemp``'s owner-only one; so do the
    files in ``target`` once the block ends without error (safetensors writes its files owner-only).
    """
    host, prefix = f"{socket.gethostname()}-{_pid_namespace()}", f".{target.name}.partial-"
    for old in target.parent.glob(f"{glob.escape(prefix)}*"):
        owner = old.name[len(prefix) :].rsplit("-", 2)  # mkdtemp's suffix has no dash
        ours = len(owner) == 3 and owner[0] == host and owner[1].isdigit()
        if ours and not psutil.pid_exists(int(owner[1])):
            logger.info("removing %s, left by a process that was killed while writing %s", old, target)
            shutil.rmtree(old, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}{host}-{os.getpid()}-", dir=target.parent))
    umask = os.umask(0o022)  # read, and put back
    os.umask(umask)
    work.chmod(0o777 & ~umask)
    try:
        yield work
        _open_files(target, 0o666 & ~umask)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _open_files(folder: Path, mode: int) -> None:
    """Give the files of this user under ``folder`` (links not followed) ``mode``."""
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if not path.is_symlink() and path.stat().st_uid == os.geteuid():
                path.chmod(mode)


def _pid_namespace() -> int:
    """This process's PID namespace (its inode; 0 where the system does not say)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


# ---------------------------------------------------------------------------------------------
# The Hub

_NETWORK_ERRORS = {"TransportError", "NetworkError", "ConnectError", "TimeoutException", "ConnectionError"}


def hub_unreachable(err: BaseException) -> bool:
    """Whether ``err`` says the Hub could not be reached (offline mode, the network, a server error), rather
    than that the request was refused (a token, an id)."""
    if isinstance(err, (ConnectionError, TimeoutError)):  # OfflineModeIsEnabled is a ConnectionError
        return True
    if _NETWORK_ERRORS & {cls.__name__ for cls in type(err).__mro__}:
        return True
    status = getattr(getattr(err, "response", None), "status_code", None)
    return isinstance(status, int) and status >= 500


def push_later_command(args: Any, repo_id: str) -> str:
    """The ``hf upload`` command that pushes the output folder as the Trainer would (no checkpoints), quoted
    for a shell."""
    parts = ["hf", "upload", repo_id, str(args.output_dir), "."]
    parts += ["--exclude", "checkpoint-*", "--exclude", "_*"]
    if getattr(args, "hub_revision", None):
        parts += ["--revision", args.hub_revision]
    if getattr(args, "hub_private_repo", None):
        parts.append("--private")
    return shlex.join(parts)


def hub_push_failed(args: Any, repo_id: str, err: BaseException) -> HubPushError:
    """The one-line error of a failed final push: the model and card are on disk, and how to push them."""
    return HubPushError(
        f"push_to_hub: the upload to {repo_id} failed ({one_line(err, 200)}). The trained model and its "
        f"model card are in {args.output_dir}; push them later with: {push_later_command(args, repo_id)}"
    )


@contextmanager
def signal_ignored(name: str) -> Iterator[None]:
    """Signal ``name`` (``"SIGUSR1"``) ignored while the block runs, where the platform has it
    (`signals_handled`: main thread only, the previous handler restored after, so that the process, and what
    it starts later, keep their own)."""
    signum = getattr(signal, name, None)
    with signals_handled([signum] if signum is not None else [], signal.SIG_IGN):
        yield


class Preempted(SystemExit):
    """What `train()` raises after a preemption signal stopped it at a saved checkpoint: a `SystemExit` with
    status `EXIT_PREEMPTED` (75), so a script that does not catch it ends there, with the status a requeue
    looks for. ``signal`` is the signal's name, ``step`` the step saved, ``output_dir`` where."""

    def __init__(self, signal: str, step: int, output_dir: str) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.signal, self.step, self.output_dir = signal, step, output_dir


class HubAndPreemption:
    """A `transformers.Trainer` mixin: preemption signals caught while training, a full disk in one line, and
    a Hub that cannot be reached or refuses in one line. ``self.preemption`` is the run's `PreemptionCallback`
    (``None``: signals keep their default action)."""

    preemption: PreemptionCallback | None = None
    hub_error: str | None = None  # why the Hub could not be reached when the trainer was built
    _final_push = False  # inside push_to_hub: a failed repository creation is push_to_hub's error
    resume_checkpoint: str | None = None  # the checkpoint the current train() call resumes from, checked

    @property
    def preempted(self) -> str | None:
        """The signal (``"SIGTERM"``, ``"SIGUSR1"``) that stopped the last ``train()`` call, or None."""
        return self.preemption.stopped_by if self.preemption is not None else None

    # Why: a preemption signal is caught only while training (the handlers are restored after), and a write
    # that fails for want of disk space, in a checkpoint save or elsewhere, is one line naming output_dir
    # instead of a stack trace from deep inside the save. A run stopped by a signal does not return as if it
    # had finished: `Preempted` ends the caller's script with status 75 unless it is caught, so that nothing
    # saves, evaluates or pushes the unfinished model as final. ``resume_from_checkpoint`` is checked as
    # `prompt-aug-train` checks it: transformers' ``True`` takes the newest folder even when a kill during its
    # save left it incomplete, and resumes under another process count or engine.
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        resume_from_checkpoint = check_resume(
            resume_from_checkpoint, self.args, self.accelerator.num_processes, self.is_world_process_zero()
        )
        self.resume_checkpoint = resume_from_checkpoint  # what callbacks restore their own state from
        catching = self.preemption.catching_signals() if self.preemption is not None else nullcontext()
        full_disk = disk_full_is_one_line(
            self.args.output_dir,
            max_steps=self.args.max_steps,
            processes=self.accelerator.num_processes,
            **saved_parts(self.args),
        )
        with catching, full_disk:
            result = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.preempted:
            # Every rank has written its part of the checkpoint before any leaves: a launcher stops the
            # others once one process exits, and rank 0 may still be saving.
            self.accelerator.wait_for_everyone()
            raise Preempted(self.preempted, self.state.global_step, self.args.output_dir)
        return result

    # Why: transformers creates the Hub repository while the trainer is built, so a Hub that could not be
    # reached then (offline, the network) stopped the run before it trained. Now the run trains without
    # pushing checkpoints and pushes at the end; a refused request (a token, an id) still fails at once, in
    # one line.
    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        repo_id = self._hub_repo_id()
        try:
            super().init_hf_repo(token, private)
        except Exception as err:
            if self._final_push:  # push_to_hub's error says that the model is on disk and how to push it
                raise
            if not hub_unreachable(err):
                raise HubPushError(
                    f"push_to_hub: cannot create the Hub repository {repo_id} ({one_line(err, 200)}); check "
                    "hub_model_id and your token (hf auth login), or set push_to_hub false"
                ) from err
            self.hub_error = one_line(err, 200)
            self.args.hub_strategy = HubStrategy.END  # no checkpoint pushes: no repository to push to
            logger.warning(
                "push_to_hub: cannot reach the Hub to create %s (%s); training goes on without pushing "
                "checkpoints, and the model is pushed at the end", repo_id, self.hub_error,
            )  # fmt: skip

    # Why: a failed upload at the end of a run is one line saying that the model and card are on disk and how
    # to push them later, not a network stack trace.
    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        self._final_push = True
        try:
            return super().push_to_hub(*args, **kwargs)
        except Exception as err:
            raise hub_push_failed(self.args, self._hub_repo_id(), err) from err
        finally:
            self._final_push = False

    def _hub_repo_id(self) -> str:
        """The repository pushed to: the one created, else the one asked for (as transformers names it)."""
        return self.hub_model_id or self.args.hub_model_id or Path(self.args.output_dir).absolute().name
