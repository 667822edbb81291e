"""A reward function that fails is named in one line, with the row it failed on.

* `checked_reward_funcs` wraps each reward function as TRL calls it: one that raises, returns NaN or returns a
  list of the wrong length is a `RewardFunctionError` naming the first row (uid and template) that raises it
  alone.
* `check_reward_arguments` refuses, before the model loads, a reward function that needs an argument no
  column gives (naming the argument and the columns there are), or that takes no ``**kwargs``.
* `check_reward_names` refuses two reward functions of one name, in the dry run too (where the recipe's
  names are made).
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from trl.trainer.utils import is_async_callable

from .collator import TRL_REWARD_ARGUMENTS
from .faults import one_line


class RewardFunctionError(ValueError):
    """A reward function raised, or returned something that is not one number (or None) per completion."""


def _row_kwargs(kwargs: dict[str, Any], index: int, size: int) -> dict[str, Any]:
    """The keyword arguments of one row: every per-row list cut to that row, loggers silenced."""
    row = {
        k: v[index : index + 1] if isinstance(v, (list, tuple)) and len(v) == size else v
        for k, v in kwargs.items()
    }
    for logger_name in ("log_extra", "log_metric"):
        if logger_name in row:
            row[logger_name] = lambda *a, **k: None
    return row


def _where(kwargs: dict[str, Any], index: int) -> str:
    """``row uid 'x', template 'y'`` for row ``index`` of the round."""
    parts = []
    for key in ("uid", "template"):
        values = kwargs.get(key)
        if isinstance(values, (list, tuple)) and index < len(values):
            parts.append(f"{key} {values[index]!r}")
    return "row " + (", ".join(parts) if parts else f"{index} of the round")


def _raise_site(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""


def _raised(name: str, err: Exception, kwargs: dict[str, Any], culprit: int | None) -> RewardFunctionError:
    size = len(kwargs.get("prompts") or [])
    if culprit is not None:
        where = f"on the completion of {_where(kwargs, culprit)}"
    else:
        where = f"on a round of {size} completions ({_where(kwargs, 0)} first; no single row raises it alone)"
    return RewardFunctionError(
        f"reward function {name!r} raised {one_line(err, 200)}{_raise_site(err)} {where}"
    )


def _check_output(name: str, output: Any, kwargs: dict[str, Any]) -> None:
    size = len(kwargs.get("prompts") or [])
    # A 0-d tensor or array has __len__ but no length: one number, not one per completion.
    if (
        isinstance(output, (str, bytes, dict))
        or not hasattr(output, "__len__")
        or getattr(output, "ndim", 1) == 0
    ):
        raise RewardFunctionError(
            f"reward function {name!r} returned a {type(output).__name__}, not a list of one reward per "
            f"completion ({size} for this round, {_where(kwargs, 0)} first)"
        )
    if len(output) != size:
        raise RewardFunctionError(
            f"reward function {name!r} returned {len(output)} rewards for {size} completions "
            f"({_where(kwargs, 0)} first); return one per completion, None where it cannot score one"
        )
    for index, value in enumerate(output):
        if value is None:
            continue
        try:
            number = None if isinstance(value, (str, bytes)) else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise RewardFunctionError(
                f"reward function {name!r} returned {value!r} ({type(value).__name__}) for "
                f"{_where(kwargs, index)}; a reward is a number, or None where it cannot score the completion"
            )
        if not math.isfinite(number):
            raise RewardFunctionError(
                f"reward function {name!r} returned {number} for {_where(kwargs, index)}; return a finite "
                "number, or None where it cannot score the completion (TRL then leaves it out)"
            )


def checked_reward(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``func`` (called as TRL calls a reward function), whose faults are a one-line `RewardFunctionError`:
    an exception (with the first row that raises it alone, found by calling ``func`` row by row), a
    NaN or infinite reward, a value that is not a number, a list of the wrong length. A reward model (an
    ``nn.Module``) is returned as it is."""
    if isinstance(func, torch.nn.Module):
        return func

    if is_async_callable(func):

        async def checked_async(**kwargs: Any) -> Any:
            try:
                output = await func(**kwargs)
            except Exception as err:
                if isinstance(err, TypeError) and (missing := missing_reward_arguments(func, kwargs)):
                    raise RewardFunctionError(missing_arguments_message(name, missing, kwargs)) from err
                raise _raised(name, err, kwargs, await _culprit_async(func, err, kwargs)) from err
            _check_output(name, output, kwargs)
            return output

        return checked_async

    def checked(**kwargs: Any) -> Any:
        try:
            output = func(**kwargs)
        except Exception as err:
            if isinstance(err, TypeError) and (missing := missing_reward_arguments(func, kwargs)):
                raise RewardFunctionError(missing_arguments_message(name, missing, kwargs)) from err
            raise _raised(name, err, kwargs, _culprit(func, err, kwargs)) from err
        _check_output(name, output, kwargs)
        return output

    return checked


def _rows(kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each row's keyword arguments in turn."""
    size = len(kwargs.get("prompts") or [])
    return (_row_kwargs(kwargs, index, size) for index in range(size))


def _culprit(func: Callable[..., Any], err: Exception, kwargs: dict[str, Any]) -> int | None:
    """The first row that raises on its own, when it raises ``err``'s type (the same fault), else None."""
    for index, row in enumerate(_rows(kwargs)):
        try:
            func(**row)
        except Exception as row_err:  # noqa: BLE001 (any exception: the same type is the culprit)
            return index if type(row_err) is type(err) else None
    return None


async def _culprit_async(func: Callable[..., Any], err: Exception, kwargs: dict[str, Any]) -> int | None:
    """`_culprit` of an async reward function, each row awaited in turn."""
    for index, row in enumerate(_rows(kwargs)):
        try:
            await func(**row)
        except Exception as row_err:  # noqa: BLE001 (any exception: the same type is the culprit)
            return index if type(row_err) is type(err) else None
    return None


def missing_reward_arguments(func: Callable[..., Any], available: Any) -> list[str]:
    """The arguments ``func`` requires (no default) that are not among ``available`` (names).

    >>> def reward(completions, difficulty, scale=1.0, **kwargs): ...
    >>> missing_reward_arguments(reward, ["completions", "answer"])
    ['difficulty']
    """
    try:
        # The function's own signature: a wrapper (functools.wraps) is called with what it takes.
        parameters = inspect.signature(func, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin, some callables)
        return []
    required = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p.name for p in parameters if p.kind in required and p.default is p.empty and p.name not in available
    ]


def unaccepted_reward_arguments(func: Callable[..., Any], available: Any) -> list[str]:
    """The names among ``available`` that ``func`` cannot be called with: all it does not name, where it takes
    no ``**kwargs`` (TRL passes every one); none where it does.

    >>> def brevity(completions, difficulty): ...
    >>> unaccepted_reward_arguments(brevity, ["completions", "difficulty", "prompts"])
    ['prompts']
    """
    try:
        parameters = inspect.signature(func, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    named = {n for n, p in parameters.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return sorted(set(available) - named)


def missing_arguments_message(name: str, missing: list[str], available: Any) -> str:
    """One line: reward function ``name`` needs ``missing``, which no column gives; what there is."""
    columns = sorted(set(available) - set(TRL_REWARD_ARGUMENTS) - {"environments"})
    needs = ", ".join(f"`{m}`" for m in missing)
    return (
        f"reward function {name!r} needs {needs}, which no column of the training data gives; reward "
        f"functions receive the columns {columns} and TRL's {', '.join(TRL_REWARD_ARGUMENTS)}: add the "
        "column to the data (or to a mixture source's `columns`) or give the argument a default"
    )


def check_reward_arguments(funcs: list[Any], names: list[str], columns: list[str]) -> None:
    """Raise `RewardFunctionError` for the first reward function that needs an argument neither ``columns``
    (what each row will carry to the rewards) nor TRL gives, or that cannot take all of them."""
    available = (set(columns) - {"prompt", "completion"}) | set(TRL_REWARD_ARGUMENTS)
    for func, name in zip(funcs, names, strict=True):
        if isinstance(func, torch.nn.Module):
            continue
        if missing := missing_reward_arguments(func, available):
            raise RewardFunctionError(missing_arguments_message(name, missing, available))
        if unaccepted := unaccepted_reward_arguments(func, available):
            raise RewardFunctionError(
                f"reward function {name!r} takes no **kwargs, and TRL calls it with every column and its own "
                f"arguments, so it would refuse {', '.join(f'`{u}`' for u in unaccepted)}; add **kwargs to "
                "its signature"
            )


def check_reward_names(names: list[str]) -> None:
    """Raise `RewardFunctionError` where two reward functions have one name: TRL logs each reward under its
    function's name (``rewards/<name>/mean``, the completions table's column ``<name>``), so two of one name
    would be averaged into one metric, and one column of the table would hold both functions' scores.

    >>> check_reward_names(["correctness_reward", "format_reward"])
    >>> check_reward_names(["format_reward", "correctness_reward", "format_reward"])
    Traceback (most recent call last):
    ...
    prompt_aug.reward_checks.RewardFunctionError: reward_funcs: entries 1 and 3 are both named ...
    """
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in seen:
            raise RewardFunctionError(
                f"reward_funcs: entries {seen[name] + 1} and {index + 1} are both named {name!r} (one "
                "function twice, or two made from one: TRL names a partial or a factory's reward by its "
                f"function); TRL would log both as rewards/{name}/mean and in one column of the completions "
                "table, their scores mixed; keep one, or give the other a name of its own (a function of "
                "yours that calls it)"
            )
        seen[name] = index


def checked_reward_funcs(funcs: list[Any], names: list[str]) -> list[Any]:
    """`checked_reward` of each reward function, named as TRL named it."""
    return [checked_reward(func, name) for func, name in zip(funcs, names, strict=True)]
