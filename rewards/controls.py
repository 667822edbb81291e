"""Control rewards: the real rewards, shuffled among the completions of a generation round.

A shuffled reward keeps the round's reward values (so its logged mean is the true mean) but pairs
them with the wrong completions, so the policy gradient carries no information about which
completion was good. A recipe names them by import path::

    reward_funcs: [rewards.controls:shuffled_correctness_reward, rewards.controls:shuffled_format_reward]

Training that still improves under them is improving for some other reason than the reward.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from typing import Any

from .registry import CORRECTNESS_KEYS, _text, correctness_reward, format_reward, mean_key


def shuffled(rewards: list[Any], completions: list[Any], salt: str) -> list[Any]:
    """``rewards`` permuted by a shuffle seeded from the completions' text and ``salt`` (deterministic).

    >>> sorted(shuffled([0.0, 1.0, 2.0], ["a", "b", "c"], "x"))
    [0.0, 1.0, 2.0]
    >>> shuffled([0.0, 1.0, 2.0], ["a", "b", "c"], "x") == shuffled([0.0, 1.0, 2.0], ["a", "b", "c"], "x")
    True
    """
    digest = hashlib.blake2b(salt.encode(), digest_size=8)
    for completion in completions:
        digest.update(_text(completion).encode() + b"\x00")
    out = list(rewards)
    random.Random(digest.hexdigest()).shuffle(out)
    return out


def _shuffle(func: Callable[..., list[Any]], completions: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    return shuffled(func(completions, **kwargs), completions, func.__name__)


def shuffled_correctness_reward(
    completions: list[Any], answer: list[Any], **kwargs: Any
) -> list[float | None]:
    """`correctness_reward` of the round, shuffled among its completions (a control). It names ``answer``, as
    `correctness_reward` does, so that a run without that column is refused before the model loads.

    >>> completions = ["\\\\boxed{4}", "\\\\boxed{5}", "\\\\boxed{6}"]
    >>> sorted(shuffled_correctness_reward(completions, answer=["4"] * 3))
    [0.0, 0.0, 1.0]
    """
    return _shuffle(correctness_reward, completions, {"answer": answer, **kwargs})


def shuffled_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """`format_reward` of the round, shuffled among its completions (a control).

    >>> completions = ["<think>\\nx\\n</think>\\n<answer>\\n1\\n</answer>", "none"]
    >>> sorted(shuffled_format_reward(completions, template=["open-r1"] * 2))
    [0.0, 1.0]
    """
    return _shuffle(format_reward, completions, kwargs)


# Log keys whose round mean is the run's accuracy, or its format score: the real rewards', then the
# controls' (a shuffle keeps the round's values, so its mean is the true one). The console line, the plot
# and the collapse guard read the first a run logs. Only round means may read a control's key: per
# completion or per template its values belong to other completions.
ACCURACY_MEAN_KEYS: tuple[str, ...] = (*CORRECTNESS_KEYS, mean_key(shuffled_correctness_reward))
FORMAT_MEAN_KEYS: tuple[str, ...] = (mean_key(format_reward), mean_key(shuffled_format_reward))
