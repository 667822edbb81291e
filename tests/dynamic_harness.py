"""Train the smoke recipe with test rewards whose spread is known per question (used by
test_dynamic_sampling).

``python tests/dynamic_harness.py --config recipes/smoke/tiny_cpu.yaml ...`` (also under torchrun) runs
`prompt_aug.train.main` with the given arguments. A run names the rewards below by import path, like any
reward of one's own (``--reward_funcs dynamic_harness:flat_half_reward``; this folder is on ``sys.path``
both in the tests and when this file runs), so the global ``rewards.REGISTRY`` is never changed. With
``DYNAMIC_HARNESS_TRAINED=<folder>`` each process writes the rows it computes the loss on to
``<folder>/rank<i>.jsonl`` (`record_trained_rows`).

The rewards key each question on the number at the end of its uid (``synthetic-42-00017`` -> 17):

* ``17 % 4 == 0``: every rollout gets 1.0 (an all-right group);
* ``17 % 4 == 1``: every rollout gets 0.0 (an all-wrong group);
* otherwise a number in [0, 1) hashed from the completion text, so the rollouts differ.

So half of all questions give zero-spread groups, whatever the tiny random model writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

# Every group has spread. Re-exported: a run may name it ``dynamic_harness:text_hash_reward`` too.
from fault_harness import text_hash_reward  # noqa: F401

ALL_RIGHT, ALL_WRONG = 0, 1


def question_number(uid: str) -> int:
    return int(str(uid).rsplit("-", 1)[-1])


def flat_half_reward(completions: list[Any], uid: list[str], **kwargs: Any) -> list[float]:
    """1.0 / 0.0 for every rollout of a quarter of the questions each, a text hash in [0, 1) for the
    others."""
    out = []
    for completion, u in zip(completions, uid, strict=True):
        kind = question_number(u) % 4
        if kind == ALL_RIGHT:
            out.append(1.0)
        elif kind == ALL_WRONG:
            out.append(0.0)
        else:
            digest = hashlib.blake2b(str(completion).encode(), digest_size=8).digest()
            out.append(int.from_bytes(digest, "big") / 2**64)
    return out


def record_trained_rows(folder: Path) -> None:
    """Each process appends, per loss call, one JSON line to ``folder/rank<i>.jsonl``: its process index,
    the global step, and each row's completion text (decoded as the completion records are) and advantage,
    as the loss receives them."""
    from prompt_aug.trainer import PromptAugGRPOTrainer

    compute_loss = PromptAugGRPOTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        process = self.accelerator.process_index
        ids, mask = inputs["completion_ids"], inputs["completion_mask"].bool()
        texts = self.processing_class.batch_decode(
            [row[keep] for row, keep in zip(ids, mask, strict=True)], skip_special_tokens=True
        )
        line = {"process": process, "step": self.state.global_step, "completions": texts,
                "advantages": inputs["advantages"].reshape(-1).tolist()}  # fmt: skip
        with (folder / f"rank{process}.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")
        return compute_loss(self, model, inputs, *args, **kwargs)

    PromptAugGRPOTrainer.compute_loss = recording_compute_loss


# How a run names them (``--reward_funcs``).
FLAT_HALF, TEXT_HASH = "dynamic_harness:flat_half_reward", "dynamic_harness:text_hash_reward"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from prompt_aug import train

    if os.environ.get("DYNAMIC_HARNESS_TRAINED"):
        record_trained_rows(Path(os.environ["DYNAMIC_HARNESS_TRAINED"]))
    train.main(sys.argv[1:])
