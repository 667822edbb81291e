"""Correctness mapped to chosen values, e.g. RLinf's +5 for a correct answer and -5 for a wrong one."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

RewardFunc = Callable[..., list[float | None]]


def mapped_correctness(
    base: RewardFunc, correct: float = 5.0, incorrect: float = -5.0, name: str | None = None
) -> RewardFunc:
    """A reward function that calls ``base`` (a 1/0 correctness reward) and maps 1 to ``correct``, 0 to
    ``incorrect``; ``None`` (a gold that cannot be parsed) stays ``None``. Every argument TRL passes
    (completions, dataset columns, ``log_metric``, ...) goes to ``base`` untouched.

    ``name`` becomes the function's ``__name__``, which TRL uses in ``rewards/<name>/mean``. The function
    keeps ``base``, ``correct`` and ``incorrect`` as attributes, for a reader of its scores.

    >>> def exact(completions, answer, **kwargs):
    ...     return [None if a == "?" else float(c == a) for c, a in zip(completions, answer)]
    >>> rlinf = mapped_correctness(exact, 5.0, -5.0, name="exact_pm5")
    >>> rlinf(["4", "5", "6"], answer=["4", "4", "?"]), rlinf.__name__
    ([5.0, -5.0, None], 'exact_pm5')
    >>> rlinf.base is exact, rlinf.correct, rlinf.incorrect
    (True, 5.0, -5.0)
    >>> import inspect; str(inspect.signature(rlinf))
    '(completions, answer, **kwargs)'
    """

    def mapped(scores: list[float | None]) -> list[float | None]:
        return [None if s is None else (correct if s >= 0.5 else incorrect) for s in scores]

    if _is_async(base):  # TRL awaits an async reward function: this one too

        async def reward(*args: Any, **kwargs: Any) -> list[float | None]:
            return mapped(await base(*args, **kwargs))

    else:

        def reward(*args: Any, **kwargs: Any) -> list[float | None]:
            return mapped(base(*args, **kwargs))

    reward.__name__ = reward.__qualname__ = name or f"{base.__name__}_mapped"
    reward.__doc__ = f"`{base.__name__}` with correct -> {correct:g}, incorrect -> {incorrect:g}, None kept."
    reward.base, reward.correct, reward.incorrect = base, correct, incorrect  # type: ignore[attr-defined]
    try:  # the arguments it needs are ``base``'s: what a check of the data's columns reads
        # ``base``'s own: a wrapper (functools.wraps) is called with what it takes, not what it wraps
        reward.__signature__ = inspect.signature(base, follow_wrapped=False)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a callable with no signature to read
        pass
    return reward


def _is_async(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` returns a coroutine, as TRL's `is_async_callable` reads it: a function, a
    partial of one, or an object whose ``__call__`` is async.

    >>> async def judge(completions, **kwargs): ...
    >>> _is_async(judge), _is_async(functools.partial(judge)), _is_async(len)
    (True, True, False)
    """
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
