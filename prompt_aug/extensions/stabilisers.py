"""The stabilisers of the seed systems that act on the optimizer: ProRL's reset and RLinf's mini-batch skip.

* `OptimizerResetCallback`: ProRL resets the reference policy *and* reinitialises the optimizer; TRL does
  the first (``sync_ref_model``), this zeroes the optimizer state at each of those syncs.
* `ReferenceCheckpoint`: the synced reference model saved in each checkpoint and restored at a resume.
* `MinibatchSkip`: RLinf discards the update of a mini-batch whose importance ratio explodes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import SyncRefModelCallback

from ..config import SKIP_UNDER_DEEPSPEED
from ..faults import REF_MODEL_FILE, launch_engine

logger = logging.getLogger("prompt_aug.collapse")


# -- ProRL: the optimizer reset at each reference sync ---------------------------------------------------


_CODEBOOKS = ("qmap",)  # bitsandbytes' quantization maps: what its 8-bit states decode through


def zero_optimizer_state(optimizer: Any) -> int:
    """Zero every tensor of ``optimizer``'s state in place (AdamW: moments and step count); returns how many.

    Follows wrappers through their ``.optimizer`` attribute (accelerate's, DeepSpeed's). Zeroed in place
    rather than cleared, so an optimizer or a checkpoint writer that expects the entries still finds them;
    for Adam(W) a zeroed state is exactly a fresh one (the next step counts as step 1), and so for
    bitsandbytes' 8-bit optimizers, whose quantization maps (``qmap1``, ``qmap2``: constants, shared by
    every parameter) are left as they are. A step count kept in a parameter group rather than per
    parameter (apex's fused Adam, optimi's StableAdamW: ``group["step"]``, which their bias correction
    reads) is zeroed too; left as it was, the zeroed moments would be used without bias correction.
    """
    zeroed, seen, obj = 0, set(), optimizer
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        state = getattr(obj, "state", None)
        if isinstance(state, dict) and id(state) not in seen:
            seen.add(id(state))
            for per_param in state.values():
                if isinstance(per_param, dict):
                    zeroed += _zero_entries(per_param, per_param.keys())
        groups = getattr(obj, "param_groups", None)
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, dict) and id(group) not in seen:
                seen.add(id(group))
                zeroed += _zero_entries(group, ["step"] if "step" in group else [])
        obj = getattr(obj, "optimizer", None)
    return zeroed


def _zero_entries(entries: dict, keys: Any) -> int:
    """Zero ``entries[key]`` in place for each of ``keys`` that holds a tensor or a number (quantization maps
    excepted); returns how many."""
    zeroed = 0
    for key in list(keys):
        value = entries[key]
        if str(key).startswith(_CODEBOOKS):
            continue
        if torch.is_tensor(value):
            value.zero_()
            zeroed += 1
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            entries[key] = type(value)(0)
            zeroed += 1
    return zeroed


class OptimizerResetCallback(TrainerCallback):
    """Zeroes the optimizer state whenever TRL syncs the reference model (``sync_ref_model``), as ProRL does.

    TRL's `SyncRefModelCallback` copies the policy into the reference at the end of every step that is a
    multiple of ``ref_model_sync_steps``; this runs on the same steps.
    """

    def __init__(self) -> None:
        self.reset_steps: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> Any:
        if not args.sync_ref_model or optimizer is None or state.global_step % args.ref_model_sync_steps:
            return control
        zeroed = zero_optimizer_state(optimizer)
        self.reset_steps.append(state.global_step)
        if state.is_world_process_zero:
            logger.info(
                "step %d: reference model synced, optimizer state zeroed (%d tensors)",
                state.global_step,
                zeroed,
            )
        return control


_SHARDED = ("DeepSpeed ZeRO-3", "FSDP")  # `launch_engine` names: each process holds a shard of the reference


class ReferenceCheckpoint(TrainerCallback):
    """Keeps TRL's synced reference model (``sync_ref_model``) across a resume.

    TRL builds the reference from the base model and copies the policy into it only at the end of every
    ``ref_model_sync_steps``-th step; its checkpoints do not hold it. So the saving process writes the
    reference's weights into each checkpoint (``ref_model/model.safetensors``, `save`, which the trainer's
    ``save_model`` calls for a checkpoint: beside the model, before ``trainer_state.json`` marks the
    checkpoint complete and before a Hub push of it), and a resume loads them back before the first step.
    Written and loaded under DDP, one process and DeepSpeed ZeRO-1/2, where every process holds the reference
    whole (TRL prepares it at ZeRO stage 0); not with ``save_only_model``, nor under ZeRO-3 or
    FSDP, where it is sharded. A resume without the file is exact before the first sync (the reference is
    still the base model) and on a sync step with ``ref_model_mixup_alpha`` 1 (the policy restored is the
    reference: it is copied in, as TRL's sync does); elsewhere it warns once that the reference restarts
    from the base model until the next sync.
    """

    def __init__(self, trainer: Any) -> None:
        # A `PromptAugGRPOTrainer`: its ref_model, model, accelerator and resume_checkpoint are read.
        self.trainer = trainer

    def attach(self) -> ReferenceCheckpoint:
        """Add this callback to the trainer (it restores the reference at a resume); returns ``self``."""
        self.trainer.add_callback(self)
        return self

    def _reference(self) -> torch.nn.Module:
        return self.trainer.accelerator.unwrap_model(self.trainer.ref_model)

    def save(self, folder: str | Path) -> None:
        """Write the reference's weights into ``folder`` when it is one of the Trainer's checkpoints of the
        run (``checkpoint-N`` in ``output_dir``, not a final save named so), by the process(es) that write
        its shared files; none with ``save_only_model`` or under a sharding engine."""
        args, folder = self.trainer.args, Path(folder)
        checkpoint = folder.name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") and (
            folder.parent.resolve() == Path(args.output_dir).resolve()
        )
        if not checkpoint or args.save_only_model or launch_engine(args) in _SHARDED or not args.should_save:
            return
        # safetensors' save_model writes tied weights (embeddings and LM head) once
        path = folder / REF_MODEL_FILE
        path.parent.mkdir(exist_ok=True)
        save_model(self._reference(), str(path), metadata={"format": "pt"})

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # Runs once the Trainer has restored the checkpoint's policy and state, before the first step.
        checkpoint = self.trainer.resume_checkpoint
        step, every = state.global_step, args.ref_model_sync_steps
        if checkpoint is None or step == 0:
            return control
        path, engine = Path(checkpoint) / REF_MODEL_FILE, launch_engine(args)
        if path.is_file() and engine not in _SHARDED:
            reference = self._reference()
            load_model(reference, str(path), device=str(next(reference.parameters()).device))
            if state.is_world_process_zero:
                logger.info("step %d: reference model restored from %s", step, path)
        elif step < every:
            pass  # no sync yet: the reference is the base model, as built
        elif step % every == 0 and args.ref_model_mixup_alpha == 1.0:
            policy = self.trainer.accelerator.unwrap_model(self.trainer.model)
            SyncRefModelCallback.sync_target_model(policy, self.trainer.ref_model, 1.0)
        elif state.is_world_process_zero:
            if path.is_file():
                why = f"{REF_MODEL_FILE} is not loaded under {engine}"
            elif engine in _SHARDED:
                why = f"it is not saved under {engine}"
            else:
                why = f"{checkpoint} holds no {REF_MODEL_FILE}"
            following = (step // every + 1) * every
            logger.warning(
                "resume at step %d: the synced reference model is not restored (%s); it restarts from the "
                "base model until the next sync at step %d", step, why, following,
            )  # fmt: skip
        return control


# -- RLinf: skip the update of a mini-batch whose importance ratio explodes ---------------------------------


class MinibatchSkip:
    """Skips the optimizer update of a mini-batch whose mean max(r, 1/r) over its tokens is at least
    ``threshold`` (r the policy ratio), as RLinf does; counted in ``stability/skipped_minibatches``.

    The trainer hands it each micro-batch's loss-pass log-probs (`add`) and, after each backward, the model
    (`after_backward`). A mini-batch's gradient is complete once its last micro-batch's backward has run (DDP
    has all-reduced it), and the Trainer steps the optimizer right after: dropping the gradients then makes
    torch's optimizers skip every parameter (no update, no weight decay, no moment change), while the
    scheduler and the round go on. DeepSpeed steps inside backward, so it is refused (`check`); fp16's
    gradient scaler asserts on an optimizer with no gradients (it records no inf check), so
    `prompt_aug.config.check_config` refuses fp16 with it.
    """

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self._window: torch.Tensor | None = None  # [sum, count] of max(r, 1/r) over this mini-batch so far
        self.skipped: int | None = None  # mini-batches skipped in the run; None until read from the logs

    @staticmethod
    def check(trainer: Any) -> None:
        """Refuse a trainer whose optimizer steps inside backward (DeepSpeed), before a mini-batch can be
        judged."""
        if trainer.is_deepspeed_enabled:
            raise ValueError(SKIP_UNDER_DEEPSPEED)

    def add(self, logps: torch.Tensor, inputs: dict, mask: torch.Tensor) -> None:
        """Add a training micro-batch's tokens to the mini-batch's ratio window."""
        old = inputs.get("old_per_token_logps")
        window = ratio_deviation_sums(logps, logps if old is None else old, mask)
        self._window = window if self._window is None else self._window + window

    def after_backward(self, trainer: Any, model: Any, device: Any) -> None:
        """At a mini-batch's end (``sync_gradients``), judge its ratio; drop its gradients when too large."""
        if not trainer.accelerator.sync_gradients:
            return
        window = self._window if self._window is not None else torch.zeros(2, device=device)
        self._window = None
        total, count = trainer.accelerator.reduce(window.to(device), reduction="sum").tolist()
        ratio = total / count if count else 1.0
        if self.skipped is None:  # carry the count over a resume
            key = "stability/skipped_minibatches"
            logged = [e[key] for e in trainer.state.log_history if key in e]
            self.skipped = int(logged[-1]) if logged else 0
        if ratio >= self.threshold:
            model.zero_grad(set_to_none=True)
            self.skipped += 1
        metrics = trainer.metric_buffer("train")
        metrics["stability/minibatch_ratio"].append(ratio)
        metrics["stability/skipped_minibatches"] = [float(self.skipped)]


def ratio_deviation_sums(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[sum, count]`` over masked tokens of max(r, 1/r), r = exp(logps - old_logps) the policy ratio.

    The mean (sum / count) is 1 when the mini-batch is exactly on-policy and grows as the policy drifts,
    in either direction. A log-ratio is capped at 20 (r up to e^20); a NaN one (a diverged forward) counts
    as that cap, so the mini-batch is skipped rather than stepped on.

    >>> logps = torch.log(torch.tensor([[2.0, 0.5, 9.0]]))
    >>> ratio_deviation_sums(logps, torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    tensor([4., 2.])
    >>> diverged = torch.tensor([[float("nan"), 0.0]])
    >>> ratio_deviation_sums(diverged, torch.zeros(1, 2), torch.ones(1, 2))[0] > 1e8
    tensor(True)
    """
    log_ratio = (logps - old_logps).abs().nan_to_num(nan=20.0)
    deviation = torch.exp(log_ratio.clamp(max=20.0))
    mask = mask.to(deviation.dtype)
    return torch.stack([(deviation * mask).sum(), mask.sum()]).float()
