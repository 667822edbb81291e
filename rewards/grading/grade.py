"""Grading completions: correctness and format score, following each template's rules.

`grade_batch` grades a whole batch: answers are extracted here, easy pairs are settled by the
in-process fast path (`rewards.grading.fastpath`), and only the rest go, deduplicated and in one round trip,
to the worker processes of `rewards.grading.pool`, where math-verify runs under hard time and memory limits.
`grade` is the one-completion form of the same path, with the same guarantees: it returns within
the time limit whatever the completion holds.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..formats import resolve_rules
from . import pool
from .extract import (
    extract_lenient,
    extract_strict,
    final_boxes,
    scale_readings,
    scales_differ,
    split_temperature,
)
from .fastpath import (
    answer_too_costly,
    base_verdict,
    decimal_comma_verdict,
    fast_verdict,
    percent_verdict,
    reads_as_prose,
    scientific_verdict,
    surely_parseable,
    word_verdict,
)
from .verify import check, normalize_gold


@dataclass(frozen=True)
class Grade:
    """The verdict on one completion.

    Attributes:
        correct: The extracted answer equals the gold.
        format_score: The template's format score in [0, 1].
        extracted: The normalised answer read from the completion, or ``None``.
        gold_ok: ``False`` when the gold itself cannot be parsed (then ``correct`` is ``False`` and a
            reward function should return ``None`` rather than a score).
        timed_out: Grading hit the time limit, or the answer was refused up front as one that could
            not be evaluated within it (far longer or deeper than any gold, or a number with over a
            million bits); ``correct`` is then ``False``.
        error: Grading crashed (an exception in math-verify, the memory cap, a killed worker);
            ``correct`` is then ``False``.
    """

    correct: bool
    format_score: float
    extracted: str | None
    gold_ok: bool = True
    timed_out: bool = False
    error: bool = False


def _resolve(template: Any) -> Any:
    return resolve_rules(template)  # a built-in name, or rules that travelled with the row


def format_score(completion: str, template: Any = None) -> float:
    """The paper's format score on the whole, uncut completion.

    Free-form templates (no markers) score 1. Otherwise each marker that appears exactly once earns an
    equal share.

    >>> format_score("<think>\\nhm\\n</think>\\n<answer>\\n\\\\boxed{1}\\n</answer>", "open-r1")
    1.0
    >>> format_score("<think>\\nhm\\n</think>\\n<think>\\n", "open-r1")
    0.25
    >>> format_score("anything", "qwen-math")
    1.0
    """
    template = _resolve(template)
    markers = template.markers if template is not None else ()
    if not markers:
        return 1.0
    return sum(completion.count(marker) == 1 for marker in markers) / len(markers)


def grade(
    completion: str,
    gold: str | list[str],
    template: Any = None,
    *,
    strict: bool = False,
    join_boxes: bool = False,
) -> Grade:
    """Grade ``completion`` against ``gold`` under ``template``: a built-in template's name, the rules of
    any template (a `rewards.formats.FormatRules` or a template object), or ``None``.

    ``gold`` may be a list of acceptable answers (Minerva, OlympiadBench): any match counts.

    Lenient mode (default) is the paper's training rule; strict mode requires the template's answer
    rule (a boxed answer, inside ``<answer>`` for tag templates; markers count in the format reward
    only). With no template, the last boxed answer is read. Returns within the pool's time limit on
    any input (see `grade_batch`).

    ``join_boxes=True`` (off by default: the paper reads the last box only) reads several boxes in
    the last box's paragraph as one answer when the gold is a set, tuple or list: ``\\boxed{1}`` and
    ``\\boxed{2}`` for ``\\{1, 2\\}``. The last box alone is still read too: the completion is right
    if either reading is (``a = \\boxed{3}``, then ``\\boxed{(3, 4)}``, for ``(3, 4)``).

    >>> grade("so \\\\boxed{\\\\dfrac{1}{2}}", "\\\\frac12").correct
    True
    >>> g = grade("<think>\\nx\\n</think>\\n<answer>\\n7\\n</answer>", "7", "open-r1", strict=True)
    >>> g.correct, g.format_score
    (False, 1.0)
    >>> grade("\\\\boxed{10^{10^{10}}}", "5").timed_out
    True
    """
    return grade_batch([completion], [gold], [template], strict=strict, join_boxes=join_boxes)[0]


# -- the batch path ---------------------------------------------------------------------------------

IN_PROCESS_MAX_CHARS = 50_000  # longer completions are extracted in a worker, under the time limit
# Extraction regexes that scan from each of these to the end of the text: quadratic when repeated.
_SCAN_OPENERS = ("final answer is $", "<answer>")
_MAX_OPENERS = 8
_REMOTE = "rewards.grading.grade:remote_task"
_PARSEABLE: dict[str, bool] = {}  # normalised gold -> math-verify reads it (learned from the workers)
_MAX_KNOWN_GOLDS = 1 << 17


@functools.lru_cache(maxsize=65536)  # keyed by `_gold_key`, which tells a bool from 1.0
def _gold_texts(gold: Any) -> tuple[str, ...]:
    """The normalised, non-empty texts of a gold (a list means any of them), computed once per gold."""
    golds = gold if isinstance(gold, tuple) else (gold,)
    return tuple(t for t in (normalize_gold(g) for g in golds) if t)


def _gold_key(gold: Any) -> Any:
    """A hashable key for a gold: a string, number or tuple (a numpy array from parquet becomes one).
    A bool becomes its text: as a key, ``True`` would equal ``1`` and ``1.0`` and share their cache entry.

    >>> _gold_key(True), _gold_key([1.0, False]), _gold_key(None)
    ('True', (1.0, 'False'), None)
    """
    if hasattr(gold, "tolist") and not isinstance(gold, (str, bytes)):
        gold = gold.tolist()
    if isinstance(gold, (list, tuple)):
        return tuple(_scalar_key(g) for g in gold)
    return _scalar_key(gold)


def _scalar_key(gold: Any) -> Any:
    if gold is None or (isinstance(gold, (str, int, float)) and not isinstance(gold, bool)):
        return gold  # None: no gold
    return str(gold)


def _parseable(text: str) -> bool | None:
    """Whether math-verify parses this normalised gold: known for what our evaluator reads
    (`rewards.grading.fastpath.surely_parseable`), learned from the workers otherwise, else ``None``."""
    known = _PARSEABLE.get(text)
    if known is None and surely_parseable(text):
        _PARSEABLE[text] = known = True
    return known


def _learn(golds: tuple[str, ...], parseable: tuple[bool, ...]) -> None:
    if len(_PARSEABLE) > _MAX_KNOWN_GOLDS:
        _PARSEABLE.clear()
    _PARSEABLE.update(zip(golds, parseable))


def _readings(
    text: str, strict: bool, answer_rule: str, golds: tuple[str, ...] = (), join_boxes: bool = False
) -> list[str | None]:
    """The answers read from a completion: the rule's answer (a choice with its value as the gold asks:
    `choice_readings`; a number with a scale word as its value and as written: `scale_readings`); with
    ``join_boxes``, first the boxes of the last box's paragraph joined (`joined_boxes`), where that reads
    something else."""
    answer = extract_strict(text, answer_rule) if strict else extract_lenient(text)
    readings = [
        one for reading in choice_readings(answer, golds) for one in scale_readings(reading) or [reading]
    ]
    if len(readings) > 1 or readings[0] != answer:
        return readings
    if join_boxes:
        joined = joined_boxes(final_boxes(text, strict, answer_rule), golds)
        if joined is not None and joined != answer:
            return [joined, answer]
    return [answer]


# A multiple-choice letter and its value, as AMC solutions box them: `\textbf{(C)}\ 142`, `(C) 142`.
# The value holds a digit or a command, and no other choice or list word (`(A) and (B)`, `(A), 5`).
_CHOICE_AND_VALUE = re.compile(
    r"\(([A-E])\)(?:\s|\\ |~|\\q?quad)*(?![,;]|(?:and|or)\b)(?=.*[\d\\])(?!.*\([A-Ea-e]\))(\S.*)"
)
_CHOICE_GOLD = re.compile(r"\(?[A-E]\)?")


def choice_readings(answer: str | None, golds: tuple[str, ...]) -> list[str | None]:
    """A choice written with its value (``(C) 142``) read as the gold asks: as written, then the letter
    ``(C)`` against a gold that is a letter, the value ``142`` against any other gold; any other answer as
    it is.

    >>> choice_readings("(C) 142", ("142",)), choice_readings("(C) 142", ("(C)",))
    (['(C) 142', '142'], ['(C) 142', '(C)'])
    >>> choice_readings("(A) and (B)", ("(A)",)), choice_readings("7", ("7",))
    (['(A) and (B)'], ['7'])
    >>> choice_readings("(C) 142", ("(B)", "142")), choice_readings("(C) 142", ())
    (['(C) 142', '(C)', '142'], ['(C) 142'])
    """
    match = _CHOICE_AND_VALUE.fullmatch(answer) if answer else None
    if match is None or not golds:
        return [answer]
    letters = [bool(_CHOICE_GOLD.fullmatch(g)) for g in golds]
    # The answer as written too, for a gold written the same way (`(C) 142`).
    return [answer] + [f"({match.group(1)})"] * any(letters) + [match.group(2).strip()] * (not all(letters))


_THOUSANDS_OR_SPACE = re.compile(r"\s+|(?<=\d),(?=\d{3}(?!\d))")


def joined_boxes(boxes: list[str], golds: tuple[str, ...]) -> str | None:
    """Several boxed answers written as one, in the shape of the first gold that is a set
    (``\\{...\\}``), a tuple (``(...)``) or a bare list; ``None`` for fewer than two boxes, boxes that all
    hold one answer (``\\boxed{(3, 4)}``, boxed again) or no such gold.

    >>> (joined_boxes(["1", "-2"], ("\\\\{-2, 1\\\\}",)), joined_boxes(["3", "4"], ("(3, 4)",)),
    ...  joined_boxes(["1", "2"], ("1, 2",)))
    ('\\\\{1, -2\\\\}', '(3, 4)', '1, 2')
    >>> joined_boxes(["1", "2"], ("2",)) is None, joined_boxes(["1"], ("1, 2",)) is None
    (True, True)
    >>> joined_boxes(["(3, 4)", "(3,4)"], ("(3, 4)",)) is None, joined_boxes(["15600", "15,600"], ("1, 2",))
    (True, None)
    """
    if len(boxes) < 2 or len({_THOUSANDS_OR_SPACE.sub("", box) for box in boxes}) == 1:
        return None  # one answer written again (`(3, 4)`, then `(3,4)`): the last box is it
    body = ", ".join(boxes)
    for gold in golds:
        if "," not in gold:
            continue
        if gold.startswith("\\{") and gold.endswith("\\}"):
            return f"\\{{{body}\\}}"
        if gold.startswith("(") and gold.endswith(")"):
            return f"({body})"
        if gold[0] not in "([" and gold[-1] not in ")]":
            return body
    return None


def _in_process_ok(text: str) -> bool:
    """Whether extraction is cheap enough to run here (it is linear but for repeated scan openers)."""
    return len(text) <= IN_PROCESS_MAX_CHARS and all(text.count(o) <= _MAX_OPENERS for o in _SCAN_OPENERS)


@dataclass(frozen=True)
class _Settled:
    correct: bool
    gold_ok: bool
    refused: bool = False


def _screen(answer: str | None, golds: tuple[str, ...]) -> str:
    """``"none"`` (no answer), ``"costly"`` (refused: counted as a timeout), ``"prose"`` (wrong without
    evaluation) or ``"ok"`` (to be compared)."""
    if answer is None:
        return "none"
    if answer in golds:
        return "ok"
    if answer_too_costly(answer, golds):
        return "costly"
    return "prose" if reads_as_prose(answer, golds) else "ok"


def _verdict(answer: str, gold: str) -> bool | None:
    """The in-process verdict: temperatures in two scales are different (``100^\\circ C`` and
    ``100^\\circ F``), and otherwise their values are compared (a value may come without its scale); then
    numerals in a base (math-verify ignores the base), a decimal comma (math-verify reads ``3,14`` as a
    set), a gold that is a word (math-verify, given it normalised, reads a product of letters), a decimal
    in scientific notation equal to a number (math-verify reads a float and may miss it), a percent and
    its number (math-verify takes ``12.5\\%`` for ``0.125`` only, though ``50\\%`` for ``50`` too), then
    the fast path."""
    if scales_differ(answer, gold):
        return False if surely_parseable(gold) else None  # else a worker parses the gold, then says so
    answer, gold = split_temperature(answer)[0], split_temperature(gold)[0]
    rules = (
        base_verdict,
        decimal_comma_verdict,
        word_verdict,
        scientific_verdict,
        percent_verdict,
        fast_verdict,
    )
    for rule in rules:
        verdict = rule(answer, gold)
        if verdict is not None:
            return verdict
    return None


def _verdicts(answer: str, golds: tuple[str, ...]) -> tuple[bool | None, ...]:
    return tuple(_verdict(answer, g) for g in golds)


def _settle(answer: str | None, golds: tuple[str, ...]) -> _Settled | None:
    """Decide in-process what can be decided without math-verify; ``None`` means ask a worker."""
    known = [_parseable(g) for g in golds]
    screen = _screen(answer, golds)
    if screen != "ok":
        if any(k is True for k in known):
            return _Settled(False, True, screen == "costly")
        if all(k is False for k in known):
            return _Settled(False, False, screen == "costly")
        return None  # only the golds need parsing
    verdicts = _verdicts(answer, golds)
    if any(v is True and k is True for v, k in zip(verdicts, known)):
        return _Settled(True, True)
    if all(v is False for v in verdicts):
        return _Settled(False, True)  # the fast path says False only for two numbers: both parseable
    return None


def remote_task(task: tuple[Any, ...]) -> tuple[bool, tuple[bool, ...], bool, str | None]:
    """What a worker runs for one completion: ``(correct, parseable golds, refused, extracted)``.

    ``("check", answer, golds)`` compares an answer extracted by the caller (an empty answer only
    parses the golds); ``("full", completion, golds, strict, answer_rule, join_boxes)`` also extracts it
    (and is right if any reading is).

    >>> remote_task(("full", "so \\\\boxed{0.5}", ("\\\\frac{1}{2}",), False, "boxed", False))
    (True, (True,), False, '0.5')
    """
    if task[0] == "check":
        _, answer, golds = task
        return (*check((answer, golds)), None)
    _, completion, golds, strict, answer_rule, join_boxes = task
    results = [
        _remote_reading(a, golds) for a in _readings(completion, strict, answer_rule, golds, join_boxes)
    ]
    return max(results, key=lambda result: result[0])  # the first reading unless only another is right


def _remote_reading(
    answer: str | None, golds: tuple[str, ...]
) -> tuple[bool, tuple[bool, ...], bool, str | None]:
    """One reading of a ``"full"`` task, graded as `grade_batch` grades it once the golds are known."""
    screen = _screen(answer, golds)
    _, parseable, _ = check(("", golds))
    if screen != "ok":
        return False, parseable, screen == "costly", answer
    settled = _settle(answer, golds)
    if settled is not None:
        return settled.correct, parseable, False, answer
    if any(p and v is True for p, v in zip(parseable, _verdicts(answer, golds))):
        return True, parseable, False, answer  # as `_settle` says once the golds are known to parse
    return (*check((answer, golds)), answer)


# Pairs of the shapes models write, compared once in the server before it forks: the first comparison
# of each shape pays SymPy's lazy imports and caches (0.1-0.6 s each), which forked workers then share.
_WARM_UP = (
    ("0.5", "\\frac{1}{2}"),
    ("(1, 2]", "(1,2]"),
    ("x^2+1", "1+x^2"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("(-\\infty, 0) \\cup (3, 1) \\cup (5, 7)", "(-\\infty, 0) \\cup (1, 3)"),
    ("1 + 2i", "3 - 4i"),
    ("\\frac{1}{3} - \\frac{2}{3}i", "x^2 - 4x + 1"),
    ("\\cot 20", "7"),
    ("\\cos \\phi = \\phi", "5"),
    ("-1 <= f(t) <= 1", "2"),
    ("(3) (y+1) (y-1)", "12"),
    ("101_{2}", "(0, 1) \\cup (2, 3)"),
    ("x + 2y = 6", "y = 3 - \\frac{x}{2}"),
    ("x >= 3", "x > 3"),
    ("\\{1, 2\\}", "(1, 2)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"),
    ("5^t - 3^t", "16"),
    ("\\log_2 8", "3"),
    ("\\sin 30", "\\frac{1}{2}"),
    ("50\\%", "0.5"),
    ("\\text{B}", "B"),
)


def worker_init() -> None:
    """Run once in the pool's server before it forks workers: limits are the pool's, so math-verify's
    signal timeouts go off; warnings are silenced; a few forms are parsed so that the parser is warm;
    the heap is frozen so that forked workers share it."""
    import gc
    import warnings

    from .verify import use_signal_timeouts

    use_signal_timeouts(False)
    warnings.filterwarnings("ignore")  # SymPy's warnings about a model's odd input help nobody
    for answer, gold in _WARM_UP:
        check((answer, (gold,)))
    gc.collect()
    gc.freeze()


def grade_batch(
    completions: Sequence[str],
    golds: Sequence[Any],
    templates: Sequence[Any] | None = None,
    *,
    strict: bool = False,
    join_boxes: bool = False,
) -> list[Grade]:
    """Grade many completions at once; the same verdicts as `grade` on each, with one pool round trip.

    Each gold may be a string, a number or a list of acceptable answers; each template a name, a
    `Template` or ``None``. Never raises because of a completion: a completion whose grading overruns
    the pool's time limit gets ``timed_out=True``, one whose grading crashes ``error=True``; both
    score ``correct=False``.

    >>> grades = grade_batch(["\\\\boxed{4}", "\\\\boxed{5}", "\\\\boxed{0.25}"], ["4", "4", "\\\\frac14"])
    >>> [g.correct for g in grades]
    [True, False, True]
    """
    n = len(completions)
    if len(golds) != n or (templates is not None and len(templates) != n):
        raise ValueError(
            f"grade_batch: {n} completions, {len(golds)} golds, {len(templates or [])} templates"
        )
    templates = list(templates) if templates is not None else [None] * n
    # The grades of each completion's readings (two with `join_boxes`), in `_readings`' order.
    readings: list[list[Grade | None]] = [[] for _ in range(n)]
    # Identical tasks are sent once; each waits with (completion, reading, answer, refused, verdicts).
    remote: dict[tuple[Any, ...], list[tuple[int, int, str | None, bool, tuple[bool | None, ...]]]] = {}
    scores: list[float] = []
    for i, (completion, gold, template) in enumerate(zip(completions, golds, templates)):
        completion = completion if isinstance(completion, str) else str(completion)
        template = _resolve(template)
        rule = template.answer if (strict and template is not None) else "boxed"
        scores.append(format_score(completion, template))
        gold_texts = _gold_texts(_gold_key(gold))
        if not gold_texts:
            answer = _readings(completion, strict, rule)[0] if _in_process_ok(completion) else None
            readings[i].append(Grade(correct=False, format_score=scores[i], extracted=answer, gold_ok=False))
            continue
        if not _in_process_ok(completion):
            readings[i].append(None)
            task = ("full", completion, gold_texts, strict, rule, join_boxes)
            remote.setdefault(task, []).append((i, 0, None, False, ()))
            continue
        for k, answer in enumerate(_readings(completion, strict, rule, gold_texts, join_boxes)):
            readings[i].append(None)
            settled = _settle(answer, gold_texts)
            if settled is not None:
                readings[i][k] = Grade(
                    settled.correct, scores[i], answer, settled.gold_ok, timed_out=settled.refused
                )
                continue
            screen = _screen(answer, gold_texts)
            # In-process verdicts count once the worker says their gold parses (as `_settle` counts them);
            # an answer identical to a gold, or right by every gold's verdict, needs only that: an empty
            # answer asks for it.
            verdicts = _verdicts(answer, gold_texts) if screen == "ok" else ()
            only_parse = answer in gold_texts or all(v is True for v in verdicts)
            ask = answer if screen == "ok" and not only_parse else ""
            remote.setdefault(("check", ask, gold_texts), []).append(
                (i, k, answer, screen == "costly", verdicts)
            )
    if remote:
        # Grouped by gold, so that one worker parses each gold (chunks are consecutive tasks).
        tasks = sorted(remote, key=lambda task: task[2])
        for task, outcome in zip(tasks, pool.get_pool().map(_REMOTE, tasks), strict=True):
            for i, k, answer, refused, verdicts in remote[task]:
                readings[i][k] = _from_outcome(task, outcome, scores[i], answer, refused, verdicts)
    # The first reading's grade, unless only another reading is right.
    return [max(graded, key=lambda g: g.correct) for graded in readings]  # type: ignore[arg-type]


def _from_outcome(
    task: tuple[Any, ...],
    outcome: pool.Outcome,
    score: float,
    answer: str | None,
    refused: bool,
    verdicts: tuple[bool | None, ...],
) -> Grade:
    status, value = outcome
    golds = task[2]
    if status == pool.OK:
        correct, parseable, refused_there, extracted = value
        _learn(golds, parseable)
        answer = extracted if task[0] == "full" else answer
        correct = correct or any(p and v is True for p, v in zip(parseable, verdicts))
        return Grade(correct, score, answer, any(parseable), timed_out=refused or refused_there)
    gold_ok = any(_parseable(g) is not False for g in golds)
    return Grade(False, score, answer, gold_ok, timed_out=status == pool.TIMEOUT, error=status == pool.ERROR)
