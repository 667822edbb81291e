"""A test-only reward for the engine tier, named in a recipe as ``engine_rewards:char_length``.

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
