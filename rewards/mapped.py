"""Correctness mapped to chosen values, e.g. RLinf's +5 for a correct answer and -5 for a wrong one."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

RewardFunc = Callable[..., list[float | None]]


def mapped_correctness(
    base: RewardFunc, correct: float = 5.0, incorrect: float = -5.0, name: str | None = None
) -> RewardFunc:
    """A reward function that calls ``base`` (a 1/0 correctness reward) and maps 1 to ``correct``, 0 to
    ``incorrect``; ``None`` (a gold that cannot be parsed) stays ``None``, and so does a NaN (a fault of
    ``base``, which the trainer's checks then name, rather than a wrong answer). Every argument TRL passes
    (completions, dataset columns, ``log_metric``, ...) goes to ``base`` untouched.

    ``name`` becomes the function's ``__name__``, which TRL uses in ``rewards/<name>/mean``. The function
    keeps ``base``, ``correct`` and ``incorrect`` as attributes, for a reader of its scores. It is an object
    of a module-level class, so it pickles wherever ``base`` does (TRL's async GRPO scores in a spawned
    process), and it is async where ``base`` is (TRL awaits it).

    >>> def exact(completions, answer, **kwargs):
    ...     return [None if a == "?" else float(c == a) for c, a in zip(completions, answer)]
    >>> rlinf = mapped_correctness(exact, 5.0, -5.0, name="exact_pm5")
    >>> rlinf(["4", "5", "6"], answer=["4", "4", "?"]), rlinf.__name__
    ([5.0, -5.0, None], 'exact_pm5')
    >>> rlinf.base is exact, rlinf.correct, rlinf.incorrect
    (True, 5.0, -5.0)
    >>> import inspect; str(inspect.signature(rlinf))
    '(completions, answer, **kwargs)'
    >>> mapped_correctness(functools.partial(exact), 1.0, -1.0).__name__  # a partial: named by its function
    'exact_mapped'
    """
    kind = AsyncMappedCorrectness if _is_async(base) else MappedCorrectness
    return kind(base, correct, incorrect, name)


class MappedCorrectness:
    """`mapped_correctness`'s reward function for a synchronous ``base``."""

    def __init__(self, base: RewardFunc, correct: float, incorrect: float, name: str | None = None) -> None:
        base_name = reward_name(base)
        self.base, self.correct, self.incorrect = base, correct, incorrect
        self.__name__ = self.__qualname__ = name or f"{base_name}_mapped"
        self.__doc__ = f"`{base_name}` with correct -> {correct:g}, incorrect -> {incorrect:g}, None kept."
        try:  # the arguments it needs are ``base``'s: what a check of the data's columns reads
            # ``base``'s own: a wrapper (functools.wraps) is called with what it takes, not what it wraps
            self.__signature__ = inspect.signature(base, follow_wrapped=False)
        except (TypeError, ValueError):  # a callable with no signature to read
            pass

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        return self.mapped(self.base(*args, **kwargs))

    def mapped(self, scores: list[float | None]) -> list[float | None]:
        """``scores`` mapped: 1 (0.5 or more) to ``correct``, else ``incorrect``; ``None`` and NaN kept.

        >>> mapped_correctness(len, 1.0, -1.0).mapped([1.0, 0.0, None, float("nan")])
        [1.0, -1.0, None, nan]
        """
        return [
            s if s is None or math.isnan(s) else (self.correct if s >= 0.5 else self.incorrect)
            for s in scores
        ]

    def __repr__(self) -> str:
        return f"<reward {self.__name__}: {self.__doc__}>"


class AsyncMappedCorrectness(MappedCorrectness):
    """`mapped_correctness`'s reward function for an async ``base``: awaited as TRL awaits it."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        return self.mapped(await self.base(*args, **kwargs))


def called(func: Callable[..., Any]) -> Callable[..., Any]:
    """The function a `functools.partial` (of a partial ...) calls; ``func`` itself for any other callable."""
    while isinstance(func, functools.partial):
        func = func.func
    return func


def reward_name(func: Callable[..., Any]) -> str:
    """The name TRL gives ``func``: a partial's function's, else ``__name__``, else the class's."""
    named = called(func)
    return getattr(named, "__name__", type(named).__name__)


def _is_async(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` returns a coroutine, as TRL's `is_async_callable` reads it: a function, a
    partial of one, or an object whose ``__call__`` is async.

    >>> async def judge(completions, **kwargs): ...
    >>> _is_async(judge), _is_async(functools.partial(judge)), _is_async(len)
    (True, True, False)
    """
    func = called(func)
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
