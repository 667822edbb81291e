"""TRL reward functions, registered by name so a recipe can list them (``reward_funcs: [...]``).

A recipe may also name any function by import path, ``package.module:function`` (see `get_reward_funcs`).

Each function takes TRL's reward-function arguments: the ``completions`` of a generation round and
the dataset columns as lists: ``answer`` (the gold) and the format rules of each row's template.
Prompt augmentation writes those rules into every row (``answer_rule``, ``format_markers``, beside
the ``template`` name); without them, a ``template`` column of built-in names is read through
`rewards.formats.BUILTIN_FORMATS`, and with no template at all the last ``\\boxed{}`` is graded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .formats import row_rules
from .grading.grade import format_score, grade_batch
from .mapped import mapped_correctness


def _text(completion: Any) -> str:
    # TRL passes strings for text prompts and [{"role": "assistant", "content": ...}] for chat prompts.
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion


def correctness_reward(
    completions: list[Any],
    answer: list[str],
    template: list[str] | None = None,
    answer_rule: list[str] | None = None,
    format_markers: list[list[str]] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """1.0 if the completion's answer equals the gold, else 0.0 (the paper's lenient rule).

    A gold that cannot be parsed gives ``None`` (TRL leaves the completion out) and is counted in the
    ``rewards/unparseable_gold`` metric. A completion whose grading times out or crashes scores 0 and
    is counted in ``rewards/timeouts`` or ``rewards/errors`` (counts per call).

    >>> correctness_reward(["... \\\\boxed{4}", "... \\\\boxed{5}"], answer=["4", "4"])
    [1.0, 0.0]
    """
    rules = row_rules(len(completions), template, answer_rule, format_markers)
    return _correctness(completions, answer, rules, log_metric, strict=False)


def strict_correctness_reward(
    completions: list[Any],
    answer: list[str],
    template: list[str] | None = None,
    answer_rule: list[str] | None = None,
    format_markers: list[list[str]] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Like `correctness_reward`, but the answer must be boxed (inside ``<answer>`` for tag templates).

    >>> strict_correctness_reward(["The answer is 4."], answer=["4"])
    [0.0]
    """
    rules = row_rules(len(completions), template, answer_rule, format_markers)
    return _correctness(completions, answer, rules, log_metric, strict=True)


def joined_boxes_correctness_reward(
    completions: list[Any],
    answer: list[str],
    log_metric: Callable[[str, float], None] | None = None,
    **columns: Any,
) -> list[float | None]:
    """Like `correctness_reward`, but several boxes in the last box's paragraph may together form the
    gold's set or tuple (beyond the paper's rule, which reads the last box only; opt in by naming it).

    >>> joined_boxes_correctness_reward(
    ...     ["The solutions are \\\\boxed{1} and \\\\boxed{-2}."], answer=["-2, 1"]
    ... )
    [1.0]
    >>> correctness_reward(["The solutions are \\\\boxed{1} and \\\\boxed{-2}."], answer=["-2, 1"])
    [0.0]
    """
    rules = row_rules(
        len(completions), *(columns.get(k) for k in ("template", "answer_rule", "format_markers"))
    )
    return _correctness(completions, answer, rules, log_metric, strict=False, join_boxes=True)


def _correctness(
    completions, answer, rules, log_metric, *, strict: bool, join_boxes: bool = False
) -> list[float | None]:
    # The whole batch goes to `grade_batch` at once: fast path here, math-verify in the worker pool.
    texts = [_text(c) for c in completions]
    grades = grade_batch(texts, list(answer), rules, strict=strict, join_boxes=join_boxes)
    rewards: list[float | None] = [float(g.correct) if g.gold_ok else None for g in grades]
    if log_metric is not None:
        log_metric("rewards/unparseable_gold", float(sum(not g.gold_ok for g in grades)))
        log_metric("rewards/timeouts", float(sum(g.timed_out for g in grades)))
        log_metric("rewards/errors", float(sum(g.error for g in grades)))
    return rewards


def format_reward(
    completions: list[Any],
    template: list[str] | None = None,
    answer_rule: list[str] | None = None,
    format_markers: list[list[str]] | None = None,
    **kwargs: Any,
) -> list[float]:
    """The template's format score in [0, 1]: 1 for free-form templates, else a share per marker seen once.

    >>> format_reward(
    ...     ["<think>\\nx\\n</think>\\n<answer>\\n1\\n</answer>", "no tags"], template=["open-r1"] * 2
    ... )
    [1.0, 0.0]
    >>> format_reward(["Answer: 3", "3"], template=["mine"] * 2, format_markers=[["Answer:"]] * 2)
    [1.0, 0.0]
    """
    rules = row_rules(len(completions), template, answer_rule, format_markers)
    return [format_score(_text(c), r) for c, r in zip(completions, rules, strict=True)]


# The 0/1 correctness rewards: the trainer's per-template accuracy, the console log, the plot, the collapse
# guard's accuracy signal and dynamic sampling's all-right/all-wrong split read whichever of these a run uses.
CORRECTNESS_REWARDS: tuple[Callable[..., list[float | None]], ...] = (
    correctness_reward,
    strict_correctness_reward,
    joined_boxes_correctness_reward,
)


def mean_key(func: Callable[..., Any]) -> str:
    """The key under which TRL logs the round mean of reward ``func``.

    >>> mean_key(correctness_reward)
    'rewards/correctness_reward/mean'
    """
    return f"rewards/{func.__name__}/mean"


CORRECTNESS_KEYS: tuple[str, ...] = tuple(mean_key(f) for f in CORRECTNESS_REWARDS)

REGISTRY: dict[str, Callable[..., list[float | None]]] = {
    "correctness": correctness_reward,
    "strict_correctness": strict_correctness_reward,
    "format": format_reward,
    # Several boxes read as one set or tuple answer (off the paper's rule: opt in by naming it).
    "correctness_joined_boxes": joined_boxes_correctness_reward,
    # RLinf's reward: +5 correct, -5 wrong (lenient grading); `mapped_correctness` builds other values.
    "correctness_pm5": mapped_correctness(correctness_reward, 5.0, -5.0, name="correctness_pm5_reward"),
}


def get_reward_funcs(names: list[str]) -> list[Callable[..., list[float | None]]]:
    """The reward functions for ``names``: registered names, or import paths ``package.module:function``.

    An unknown name raises and lists the registered ones; a bad import path raises and says why.

    >>> [f.__name__ for f in get_reward_funcs(["format", "rewards.controls:shuffled_format_reward"])]
    ['format_reward', 'shuffled_format_reward']
    """
    unknown = [n for n in names if n not in REGISTRY and ":" not in n]
    if unknown:
        raise ValueError(
            f"unknown reward_funcs {unknown}; registered: {sorted(REGISTRY)}, or give an import path "
            "package.module:function"
        )
    return [REGISTRY[n] if n in REGISTRY else _import_reward(n) for n in names]


def _import_reward(path: str) -> Callable[..., list[float | None]]:
    """The function named by ``package.module:function``."""
    module_name, _, attr = path.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(
            f"reward_funcs: cannot load {path!r} ({err}); write it as package.module:function"
        ) from None
    if not callable(func):
        # TRY004: a bad recipe value, like the other reward_funcs errors (so a ValueError, not a TypeError)
        raise ValueError(f"reward_funcs: {path!r} is a {type(func).__name__}, not a function")  # noqa: TRY004
    return func
