"""TEST HARNESS of tests/test_faults.py and tests/test_reward_checks.py, not part of the package: test
rewards (``text_hash_reward`` serves other tests too, tests/dynamic_harness.py among them), a tiny complete
checkpoint, and `prompt_aug.train.main` run as a script.

``python tests/fault_harness.py --config recipes/smoke/tiny_cpu.yaml ...`` (also under torchrun) runs the
entry point with the given arguments. With ``FAULT_HARNESS_HOLD_STEP=N`` the end of step N waits (up to 2
minutes) until a preemption signal has arrived, so that a test's signal lands in that step however fast the
steps run; with ``FAULT_HARNESS_HOLD_RANK=R`` too, only rank R waits (the one the test signals: the others
learn of it at that step's end, in the collective that waits for R). A run names the rewards below by
import path (``--reward_funcs fault_harness:text_hash_reward``; this folder is on ``sys.path`` in the tests
and when this file runs), so the global ``rewards.REGISTRY`` is never changed.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

# What the smoke recipe's launch records on one process: 4 questions x 4 rollouts a round, 2 steps of 8.
SMOKE_LAUNCH = {
    "processes": 1,
    "seed": 42,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_generations": 4,
    "steps_per_generation": 2,
    "generation_batch_size": 16,
    "num_iterations": 1,
}


def text_hash_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A number in [0, 1) hashed from the completion text: every group has spread, so the weights move."""
    return [
        int.from_bytes(hashlib.blake2b(str(c).encode(), digest_size=8).digest(), "big") / 2**64
        for c in completions
    ]


def raises_on_one_row(completions: list[Any], uid: list[str], **kwargs: Any) -> list[float]:
    """Fails on the question whose uid ends in ``-00003`` (the bug a reward of one's own may have)."""
    return [1.0 / (0 if str(u).endswith("-00003") else 1) for u in uid]


def nan_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """NaN for the third completion (a reward computed as 0/0), 0.5 for the others."""
    return [float("nan") if i == 2 else 0.5 for i in range(len(completions))]


def short_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """One reward too few."""
    return [0.0] * (len(completions) - 1)


def tiny_checkpoint(folder: Path, step: int) -> Path:
    """A checkpoint folder `prompt_aug.faults.checkpoint_problem` takes as complete: weights, optimizer state
    and ``trainer_state.json`` at ``step``, each a real file of its format (tiny)."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(4)}, str(folder / "model.safetensors"))
    torch.save({"state": {}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from prompt_aug import faults, train

    held_rank = os.environ.get("FAULT_HARNESS_HOLD_RANK")
    if os.environ.get("FAULT_HARNESS_HOLD_STEP") and held_rank in (None, os.environ.get("RANK", "0")):
        hold, step_end = int(os.environ["FAULT_HARNESS_HOLD_STEP"]), faults.PreemptionCallback.on_step_end

        def held_step_end(self, args, state, control, **kwargs):
            deadline = time.monotonic() + 120
            while state.global_step == hold and self.received is None and time.monotonic() < deadline:
                time.sleep(0.05)
            return step_end(self, args, state, control, **kwargs)

        faults.PreemptionCallback.on_step_end = held_step_end
    train.main(sys.argv[1:])
