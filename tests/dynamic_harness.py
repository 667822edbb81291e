"""Train the smoke recipe with test rewards whose spread is known per question (used by
test_dynamic_sampling).

``python tests/dynamic_harness.py --config recipes/smoke/tiny_cpu.yaml ...`` (also under torchrun) runs
`prompt_aug.train.main` with the given arguments. A run names the rewards below by import path, like any
reward of one's own (``--reward_funcs dynamic_harness:flat_half_reward``; this folder is on ``sys.path``
both in the tests and when this file runs), so the global ``rewards.REGISTRY`` is never changed.

The rewards key each question on the number at the end of its uid (``synthetic-42-00017`` -> 17):

* ``17 % 4 == 0``: every rollout gets 1.0 (an all-right group);
* ``17 % 4 == 1``: every rollout gets 0.0 (an all-wrong group);
* otherwise a number in [0, 1) hashed from the completion text, so the rollouts differ.

So half of all questions give zero-spread groups, whatever the tiny random model writes.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

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


def text_hash_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """A number in [0, 1) hashed from the completion text: every group has spread."""
    return [
        int.from_bytes(hashlib.blake2b(str(c).encode(), digest_size=8).digest(), "big") / 2**64
        for c in completions
    ]


# How a run names them (``--reward_funcs``).
FLAT_HALF, TEXT_HASH = "dynamic_harness:flat_half_reward", "dynamic_harness:text_hash_reward"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from prompt_aug import train

    train.main(sys.argv[1:])
