"""TRL reward functions, registered by name so a recipe can list them (``reward_funcs: [...]``).

A recipe may also name any function by import path, ``package.module:function`` or, as ``trl grpo`` writes
it, ``package.module.function``, and TRL's own reward functions by the names ``trl grpo`` knows them by
(`TRL_REWARDS`; see `get_reward_funcs`).

Each function takes TRL's reward-function arguments: the ``completions`` of a generation round and
the dataset columns as lists: ``answer`` (the gold) and the format rules of each row's template.
Prompt augmentation writes those rules into every row (``answer_rule``, ``format_markers``, beside
the ``template`` name); without them, a ``template`` column of built-in names is read through
`rewards.formats.BUILTIN_FORMATS`, and with no template at all the last ``\\boxed{}`` is graded.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .formats import row_rules
from .grading.extract import number_text
from .grading.grade import format_score, grade_batch
from .mapped import called, mapped_correctness, reward_name


def _text(completion: Any) -> str:
    """The completion's text. TRL passes strings for text prompts and ``[{"role": "assistant", "content":
    ...}]`` for chat prompts; a missing one (``None``, no message, no content) is empty text.

    >>> _text("so 4"), _text([{"role": "assistant", "content": "so 4"}]), _text(None), _text([])
    ('so 4', 'so 4', '', '')

    A message's content may be a list of content blocks (as TRL writes multimodal messages): its text blocks,
    joined, are the text.

    >>> blocks = [{"type": "text", "text": "so "}, {"type": "image"}, {"type": "text", "text": "4"}]
    >>> _text([{"role": "assistant", "content": blocks}])
    'so 4'
    """
    if isinstance(completion, list):
        completion = completion[-1].get("content") if completion else ""
    if isinstance(completion, list):  # content blocks: [{"type": "text", "text": ...}, {"type": "image"}]
        texts = [b.get("text") for b in completion if isinstance(b, dict) and b.get("type") == "text"]
        completion = "".join(t for t in texts if isinstance(t, str))
    if completion is None:
        return ""
    return completion if isinstance(completion, str) else str(completion)


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

    A gold that cannot be parsed gives ``None`` (TRL sums the other rewards without it, and leaves a
    completion out of its group's baseline only where every reward is ``None``) and is counted in the
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
    The last box alone still counts: a completion is right if either reading is.

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
# guard's accuracy signal and dynamic sampling's all-right/all-wrong split read whichever of these a run uses
# (dynamic sampling also one mapped to other scores, `mapped.mapped_correctness`, by its attributes).
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


# TRL's reward functions, by the names `trl grpo` gives them (trl/scripts/grpo.py): import path and, for a
# factory, the arguments `trl grpo` calls it with. Imported only when a recipe names one, so that importing
# `rewards` imports no TRL.
TRL_REWARDS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "accuracy_reward": ("trl.rewards.accuracy_reward", None),
    "reasoning_accuracy_reward": ("trl.rewards.reasoning_accuracy_reward", None),
    "think_format_reward": ("trl.rewards.think_format_reward", None),
    "get_soft_overlong_punishment": (
        "trl.rewards.get_soft_overlong_punishment",
        {"max_completion_len": 1280, "soft_punish_cache": 256},
    ),
}


def get_reward_funcs(
    names: list[str], *, max_completion_length: int | None = None, soft_punish_cache: int | None = None
) -> list[Callable[..., list[float | None]]]:
    """The reward functions for ``names``: registered names (`REGISTRY`), TRL's by name (`TRL_REWARDS`), or
    import paths ``package.module:function`` / ``package.module.function`` (the folder the run starts in is
    searched too, as ``trl grpo`` does). A function of TRL (by name or path) reads this package's rows through
    `TRLConvention`. ``get_soft_overlong_punishment`` (DAPO's soft overlong penalty) is made for the run's
    ``max_completion_length`` and ``soft_punish_cache`` where given (``trl grpo`` fixes 1280 and 256).

    An unknown name raises and lists the registered ones; a bad import path raises and says why, as does a
    path to a function that takes none of TRL's reward arguments (a factory, such as
    ``trl.rewards.get_repetition_penalty_reward``: the reward is what it makes).

    >>> [f.__name__ for f in get_reward_funcs(["format", "rewards.controls:shuffled_format_reward"])]
    ['format_reward', 'shuffled_format_reward']
    >>> [f.__name__ for f in get_reward_funcs(["rewards.registry.format_reward", "think_format_reward"])]
    ['format_reward', 'think_format_reward']
    """
    unknown = [
        n for n in names if n not in REGISTRY and n not in TRL_REWARDS and ":" not in n and "." not in n
    ]
    if unknown:
        raise ValueError(
            f"unknown reward_funcs {unknown}; registered: {sorted(REGISTRY)}, TRL's: {sorted(TRL_REWARDS)}, "
            "or give an import path package.module:function (or package.module.function)"
        )
    funcs = []
    for name in names:
        if name in REGISTRY:
            funcs.append(REGISTRY[name])
            continue
        path, factory_args = TRL_REWARDS.get(name, (name, None))
        if name == "get_soft_overlong_punishment":
            factory_args = _overlong_args(max_completion_length, soft_punish_cache)
        func = _import_reward(path)
        if factory_args is not None:
            func = func(**factory_args)
        elif problem := _not_a_reward(path, func):
            raise ValueError(problem)
        funcs.append(TRLConvention(func) if _is_trls(func) else func)
    return funcs


# The arguments TRL calls every reward function with, by keyword (`GRPOTrainer._calculate_rewards`), besides
# the dataset's columns.
TRL_CALL_ARGUMENTS: tuple[str, ...] = ("completions", "prompts", "completion_ids")


def _not_a_reward(path: str, func: Callable[..., Any]) -> str | None:
    """Why ``func``, named by import path ``path``, cannot be a reward function, or None: it takes none of
    `TRL_CALL_ARGUMENTS` and no ``**kwargs``, as a factory that makes reward functions does.

    >>> _not_a_reward("m:make", lambda scale=1.0: None).split(": it")[0]
    "reward_funcs: 'm:make' is not a reward function"
    >>> _not_a_reward("m:f", lambda completions, **kwargs: None) is None
    True
    """
    try:
        parameters = inspect.signature(func, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):  # no signature to read: left to the checks of its first call
        return None
    if any(
        p.kind is p.VAR_KEYWORD or (p.name in TRL_CALL_ARGUMENTS and p.kind is not p.POSITIONAL_ONLY)
        for p in parameters
    ):
        return None
    name = getattr(func, "__name__", type(func).__name__)
    if name == "get_soft_overlong_punishment" and _is_trls(func):
        advice = f"name {name}, which is made for the run's max_completion_length and soft_punish_cache"
    else:
        advice = (
            f"if it makes one, make it in a module of yours (my_reward = {name}(...)) and name that, e.g. "
            "my_module:my_reward"
        )
    signature = ", ".join(str(p) for p in parameters)
    return (
        f"reward_funcs: {path!r} is not a reward function: it takes ({signature}), none of the arguments TRL "
        f"calls one with ({', '.join(TRL_CALL_ARGUMENTS)}, the columns as **kwargs); {advice}"
    )


def _is_trls(func: Callable[..., Any]) -> bool:
    """Whether ``func`` (a function, a callable object, or a `functools.partial` of one) is TRL's."""
    return (getattr(called(func), "__module__", None) or "").split(".")[0] == "trl"


def _overlong_args(max_completion_length: int | None, soft_punish_cache: int | None) -> dict[str, int]:
    """``get_soft_overlong_punishment``'s arguments: ``trl grpo``'s, with the run's lengths where given; an
    unset ``soft_punish_cache`` is 256, or a quarter of the length where that is less.

    >>> [tuple(_overlong_args(*lengths).values()) for lengths in [(3072, 512), (3072, None), (None, None)]]
    [(3072, 512), (3072, 256), (1280, 256)]
    >>> _overlong_args(32, None)
    {'max_completion_len': 32, 'soft_punish_cache': 8}
    """
    args = dict(TRL_REWARDS["get_soft_overlong_punishment"][1] or {})
    if max_completion_length is not None:
        args["max_completion_len"] = max_completion_length
    if soft_punish_cache is not None:
        args["soft_punish_cache"] = soft_punish_cache
    else:
        args["soft_punish_cache"] = min(args["soft_punish_cache"], args["max_completion_len"] // 4)
    if not 0 < args["soft_punish_cache"] < args["max_completion_len"]:
        raise ValueError(
            f"get_soft_overlong_punishment: soft_punish_cache {args['soft_punish_cache']} must be above 0 "
            f"and below max_completion_length {args['max_completion_len']} (the penalty ramps over the "
            "last soft_punish_cache tokens); set soft_punish_cache"
        )
    return args


def _import_reward(path: str) -> Callable[..., list[float | None]]:
    """The function named by ``package.module:function`` or ``package.module.function``."""
    module_name, colon, attr = path.partition(":")
    if not colon:
        module_name, _, attr = path.rpartition(".")
    if os.getcwd() not in sys.path:  # a module beside the recipe, as `trl grpo` finds it
        sys.path.append(os.getcwd())
    if not module_name or module_name.startswith("."):  # no module, or a relative name: nothing to import
        raise _cannot_load(path, "no module named")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 (whatever the module raises as it runs: named, in one line)
        missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
        if missing and f"{module_name}.".startswith(f"{missing}."):
            _refuse_if_shadowed(path, module_name)  # the module named is not there
            top = module_name.split(".")[0]
            where = f"; looked for {top}.py or {top}/ in {os.getcwd()} (the launch folder) and on sys.path"
            raise _cannot_load(path, str(err) + where) from None
        detail = str(err).splitlines()[0] if str(err) else ""  # a SyntaxError's names its file and line
        raise ValueError(
            f"reward_funcs: {path!r}: importing {module_name} failed ({type(err).__name__}: {detail}); fix "
            "the module, or install what it imports"
        ) from None
    func = getattr(module, attr, None)
    if func is None:
        _refuse_if_shadowed(path, module_name)
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        where = getattr(module, "__file__", None) or module_name
        raise ValueError(f"reward_funcs: {path!r}: {where} has no {attr!r}; its functions are {found}")
    if not callable(func):
        # TRY004: a bad recipe value, like the other reward_funcs errors (so a ValueError, not a TypeError)
        raise ValueError(f"reward_funcs: {path!r} is a {type(func).__name__}, not a function")  # noqa: TRY004
    # Found in the installed module: refused still where the launch folder has a module of that name.
    _refuse_if_shadowed(path, module_name, modules_only=True)
    return func


def _cannot_load(path: str, why: str) -> ValueError:
    """The error for an import path ``path`` naming no module there is (``why``): how to write one."""
    return ValueError(
        f"reward_funcs: cannot load {path!r} ({why}); write it as package.module:function or "
        "package.module.function"
    )


def _refuse_if_shadowed(path: str, module_name: str, *, modules_only: bool = False) -> None:
    """Refuse ``path`` when the module it names is an installed one and a file or folder of that name in the
    launch folder was meant (open-r1's `rewards.py` beside an installed `rewards` package). With
    ``modules_only`` (the installed module has what ``path`` names, as `rewards.format_reward` is both ours
    and open-r1's), only a file counts: a folder of that name is a copy of the package itself as often as not
    (a second clone of this repository launched from, an installed copy run from the repository)."""
    top = module_name.split(".")[0]
    loaded = getattr(sys.modules.get(top), "__file__", None) or ""
    mine = next((p for p in (Path(top + ".py"), Path(top)) if p.exists()), None)
    if modules_only and mine is not None and mine.is_dir():
        return
    if mine is not None and loaded and not Path(loaded).resolve().is_relative_to(mine.resolve()):
        raise ValueError(
            f"reward_funcs: cannot load {path!r}: {top!r} is the installed {loaded}, not your "
            f"{mine.resolve()}; rename yours (for example to my_{top}) and name it so in reward_funcs"
        )


class TRLConvention:
    """A reward function written for TRL's datasets, made to read this package's rows: its completions as
    TRL's conversational messages (``[{"role": "assistant", "content": text}]``, as TRL's rewards index
    them), and its ``solution`` column from ``answer``, the gold, as the package's own rewards grade (with
    several acceptable golds, the best score over them, as any gold counts). Each gold goes as math between
    ``$`` signs (`trl_solution`), as TRL's datasets hold it. A dataset's own ``solution``
    column, where the gold was read from another (a worked solution beside an ``answer``), is not what
    they get: TRL's rewards would parse the gold out of the working. Rows without ``answer`` pass as they
    are, and so do all rows for a function that takes no ``solution`` (TRL's format and length rewards): a
    row without a gold still has a format and a length to score. Everything else passes through; the name
    (``__name__``, which TRL logs under) is the function's own.

    With several golds the function is called once per gold; what it logs to the completions table
    (``log_extra``) is logged once, each row's values from the call that gave the row its score, and its
    ``log_metric`` values from the first call only, so that the table's columns stay one value per completion.

    >>> def exact(completions, solution, **kwargs):
    ...     return [float(f"${c[0]['content']}$" == s) for c, s in zip(completions, solution)]
    >>> TRLConvention(exact)(["4", "5", "6"], answer=["4", "4", ["7", "6"]])
    [1.0, 0.0, 1.0]
    >>> TRLConvention(exact)(["4"], answer=["4"], solution=["2 + 2 = 4, so the answer is 4."])
    [1.0]
    >>> TRLConvention(exact)(["1", "2", "3"], answer=[["1", "3"], [], None])  # no gold: no score
    [1.0, None, None]
    >>> def short(completions, **kwargs):  # reads no gold: every row is scored
    ...     return [float(len(c[0]["content"]) < 2) for c in completions]
    >>> TRLConvention(short)(["1", "22"], answer=[None, ["2", "3"]])
    [1.0, 0.0]
    """

    def __init__(self, func: Callable[..., list[float | None]]) -> None:
        self.func = func
        self.__name__ = reward_name(func)  # TRL names a partial by the function it calls
        self.__doc__ = getattr(func, "__doc__", None)
        self.reads_gold = _reads_gold(func)

    def __call__(self, completions: list[Any], **columns: Any) -> list[float | None]:
        messages = [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]
        golds = columns.get("answer")
        if golds is None or not self.reads_gold:
            return self.func(completions=messages, **columns)
        columns = {k: v for k, v in columns.items() if k != "solution"}
        if not any(g is None or isinstance(g, list) for g in golds):
            return self.func(completions=messages, solution=[trl_solution(g) for g in golds], **columns)
        golds = [[a for a in g if a is not None] if isinstance(g, list) else g for g in golds]
        none = [g is None or (isinstance(g, list) and not g) for g in golds]  # no gold: no score
        golds = ["" if empty else g for g, empty in zip(golds, none, strict=True)]
        log_extra, log_metric = columns.pop("log_extra", None), columns.pop("log_metric", None)
        passes: list[tuple[list[float | None], dict[str, list[Any]]]] = []  # each gold's scores and columns
        for k in range(max(len(g) if isinstance(g, list) else 1 for g in golds)):
            solution = [
                trl_solution((g[k] if k < len(g) else g[0]) if isinstance(g, list) else g) for g in golds
            ]
            logged: dict[str, list[Any]] = {}
            loggers: dict[str, Any] = {}
            if log_extra is not None:  # held, and logged once below: one value per completion
                loggers["log_extra"] = functools.partial(_hold_column, logged)
            if log_metric is not None:
                loggers["log_metric"] = log_metric if k == 0 else _ignore_metric
            scores = list(self.func(completions=messages, solution=solution, **columns, **loggers))
            passes.append((scores, logged))
        best = passes[0][0]
        for scores, _ in passes[1:]:
            best = [_best(a, b) for a, b in zip(best, scores, strict=True)]
        if log_extra is not None:
            _log_best_columns(log_extra, passes, best)
        return [None if empty else score for score, empty in zip(best, none, strict=False)]


def _reads_gold(func: Callable[..., Any]) -> bool:
    """Whether ``func`` takes a ``solution`` (the gold), or its signature cannot be read (then it may).

    >>> _reads_gold(lambda completions, solution, **kw: None), _reads_gold(lambda completion_ids, **kw: None)
    (True, False)
    """
    try:
        return "solution" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return True


def _hold_column(held: dict[str, list[Any]], column: str, values: list[Any]) -> None:
    held.setdefault(column, []).extend(values)


def _ignore_metric(name: str, value: float) -> None:
    return None


def _log_best_columns(
    log_extra: Callable[[str, list[Any]], Any],
    passes: list[tuple[list[float | None], dict[str, list[Any]]]],
    best: list[float | None],
) -> None:
    """Log each column the passes (one per gold) held, once: each row's value from the first pass that gave
    the row its best score (the first pass where none did). A column not one value per row is logged as the
    first pass held it."""
    rows = len(best)
    chosen = [next((k for k, (s, _) in enumerate(passes) if s[i] == best[i]), 0) for i in range(rows)]
    columns = list(dict.fromkeys(column for _, held in passes for column in held))
    for column in columns:
        values = [held.get(column) for _, held in passes]
        if any(v is None or len(v) != rows for v in values):
            if values[0] is not None:
                log_extra(column, values[0])
            continue
        log_extra(column, [values[k][i] for i, k in enumerate(chosen)])


def trl_solution(gold: Any) -> str:
    r"""A gold as a TRL reward's ``solution``: its text between ``$`` signs, unless it has math delimiters
    or a ``\boxed`` of its own. TRL's `accuracy_reward` parses the solution with math-verify, which finds only
    delimited math: a bare ``\sqrt{2}`` parses to nothing (the row's score would be ``None``).

    >>> trl_solution(r"\sqrt{2}"), trl_solution(18.0), trl_solution("$5$"), trl_solution(r"So \boxed{5}.")
    ('$\\sqrt{2}$', '$18$', '$5$', 'So \\boxed{5}.')

    An escaped dollar sign (MATH's ``\$18.90``) is a currency sign, not a delimiter:

    >>> trl_solution(r"\$18.90")
    '$\\$18.90$'
    """
    text = number_text(gold)
    if any(mark in text.replace("\\$", "") for mark in ("$", "\\(", "\\[", "\\boxed")):
        return text
    return f"${text}$"


def _best(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)
