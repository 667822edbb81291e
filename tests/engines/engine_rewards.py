"""Test-only rewards for the engine tier, named in a recipe as ``engine_rewards:char_length`` (or
``:half_flat``).

The smoke model never answers right, so correctness and format give every group zero spread and the
weights never move. Completions of a random model differ in length (in characters, not tokens), so
this reward gives groups a spread, the loss a gradient, and the weight updates (and their sync to
vLLM) something to carry.
"""

from __future__ import annotations

from typing import Any


def char_length(completions: list[Any], **kwargs: Any) -> list[float]:
    """A completion's length in characters, divided by 100.

    >>> char_length(["abcd", ""])
    [0.04, 0.0]
    """
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 100 for t in texts]


def half_flat(completions: list[Any], uid: list[str], **kwargs: Any) -> list[float]:
    """0.0 for every rollout of a question whose uid ends in an even number (a zero-spread group, which
    dynamic sampling drops), else `char_length`.

    >>> half_flat(["abcd", "ab", "abcd"], uid=["synthetic-0-00002", "synthetic-0-00002", "synthetic-0-00003"])
    [0.0, 0.0, 0.04]
    """
    lengths = char_length(completions)
    return [0.0 if int(str(u).rsplit("-", 1)[-1]) % 2 == 0 else x for u, x in zip(uid, lengths, strict=True)]
