"""Answer equivalence: the one place that calls math-verify.

``parse_gold`` turns a gold answer into math-verify's parsed form once per distinct gold (cached);
``is_equivalent`` compares an extracted answer against it. Both answer and gold are wrapped in
``\\boxed{}`` and compared with float rounding 6 in strict mode, the paper's setting.

These functions run math-verify in the calling process with no hard limit. Training and evaluation
call them inside the worker processes of `rewards.grading.pool` (through `check`), which enforce the time
and memory limits; use `rewards.grading.grade.grade` / `grade_batch` rather than calling them directly.

Gold answers are normalised once by `normalize_gold` (the answer side is normalised by
`rewards.grading.extract.normalize` at extraction time), so the in-process fast path
(`rewards.grading.fastpath`) and math-verify see the same two strings.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from math_verify import LatexExtractionConfig, parse, verify

from .extract import normalize, number_text, scales_differ, split_temperature
from .fastpath import free_letters

_EXTRACTION = [LatexExtractionConfig(boxed_match_priority=0)]
# math-verify's own timeouts use signal.alarm (main thread only, whole seconds). The grading workers
# enforce their own limits and switch these off (`use_signal_timeouts(False)`).
_SIGNAL_TIMEOUT_S: int | None = 5
MAX_LOG_CHARS = 200
MAX_INTEGER_BITS = 1 << 20  # about 315,000 decimal digits: larger values are refused, not evaluated


class _Truncate(logging.Filter):
    """Caps a record's message at ``MAX_LOG_CHARS`` (math-verify logs whole inputs on a timeout) and
    drops its "Timeout is disabled" notice (our workers enforce their own limits).

    >>> record = logging.LogRecord("math_verify.parser", logging.WARNING, "", 0, "Timeout during parsing: %s",
    ...                            ("x" * 10_000,), None)
    >>> _Truncate().filter(record), len(record.getMessage()) < 300
    (True, True)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Timeout is disabled"):
            return False
        if len(message) > MAX_LOG_CHARS:
            record.msg = f"{message[:MAX_LOG_CHARS]}... [{len(message) - MAX_LOG_CHARS} more characters]"
            record.args = ()
        return True


for _name in (
    "math_verify",
    "math_verify.parser",
    "math_verify.grader",
    "math_verify.utils",
    "latex2sympy2_extended",
    "latex2sympy2_extended.math_normalization",
):
    _logger = logging.getLogger(_name)
    _logger.setLevel(logging.WARNING)  # no per-input debug records ("Error parsing: <whole input>")
    if not any(isinstance(f, _Truncate) for f in _logger.filters):
        _logger.addFilter(_Truncate())


def use_signal_timeouts(enabled: bool) -> None:
    """Turn math-verify's own ``signal.alarm`` timeouts (5 s, main thread only) on or off."""
    global _SIGNAL_TIMEOUT_S
    _SIGNAL_TIMEOUT_S = 5 if enabled else None


def _timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    return _SIGNAL_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# -- gold normalisation -----------------------------------------------------------------------------

_GOLD_TEXT_ANSWER = re.compile(r"\\text\{\s*\(?([A-E])\)?\s*\}")


def normalize_gold(gold: Any) -> str:
    """Canonical text for a gold answer: `rewards.grading.extract.normalize` plus gold-only fixes.

    Floats from a dataset (AMC) lose a trailing ``.0``; surrounding ``$`` and newlines go. A missing
    gold (``None``, NaN) and a malformed one (unbalanced braces: ``\\frac{``) give ``""``, which
    grades as an unparseable gold (``gold_ok=False``), never as the text ``"None"``.

    >>> normalize_gold(18.0), normalize_gold(" $\\\\frac{9}{32}$\\n"), normalize_gold("90^\\\\circ")
    ('18', '\\\\frac{9}{32}', '90')
    >>> normalize_gold(None), normalize_gold(float("nan")), normalize_gold("\\\\frac{")
    ('', '', '')
    """
    if gold is None or (isinstance(gold, float) and math.isnan(gold)):
        return ""
    text = normalize(number_text(gold))  # normalize ends with number_text too: exponent text inside ``$``
    return text if braces_balanced(text) else ""


def braces_balanced(text: str) -> bool:
    """Whether every ``{`` of ``text`` is closed, in order (escaped ``\\{``, ``\\}`` are not braces).

    >>> (braces_balanced("\\\\frac{1}{2}"), braces_balanced("\\\\frac{"), braces_balanced("}{"),
    ...  braces_balanced("\\\\{1\\\\} \\\\cup \\\\{"))
    (True, False, False, True)
    """
    depth = 0
    for index, char in enumerate(text):
        if index and text[index - 1] == "\\":
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


# -- parsing and comparing --------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def parse_text(text: str) -> tuple[Any, ...] | None:
    """math-verify's parse of ``\\boxed{text}`` (cached per distinct text), or ``None`` if it reads nothing.
    A temperature scale that ends ``text`` (`rewards.grading.extract.split_temperature`) is not parsed:
    `check` compares scales.

    >>> parse_text("\\\\frac{1}{2}") is not None, parse_text("") is None, parse_text("}{") is None
    (True, True, True)
    >>> parse_text("100^{\\\\circ}\\\\mathrm{F}") == parse_text("100")
    True
    """
    text = split_temperature(text)[0].strip()
    if not text:
        return None
    parsed = parse(f"\\boxed{{{text}}}", extraction_config=_EXTRACTION, parsing_timeout=_timeout())
    return tuple(parsed) if parsed else None


def parse_gold(gold: Any) -> tuple[Any, ...] | None:
    """Parsed gold answer (after `normalize_gold`), or ``None`` if math-verify cannot read it.

    >>> parse_gold("\\\\frac{1}{2}") is not None, parse_gold("") is None
    (True, True)
    """
    return parse_text(normalize_gold(gold))


def gold_status(text: str) -> str:
    """How math-verify reads a normalised gold: ``"parsed"`` (a SymPy object), ``"text-only"`` (only
    the string fallback: compared as text) or ``"unparseable"`` (nothing: the reward is ``None``).

    >>> gold_status("\\\\frac{1}{2}"), gold_status("}{")
    ('parsed', 'unparseable')
    """
    parsed = parse_text(text)
    if not parsed:
        return "unparseable"
    return "text-only" if all(isinstance(p, str) for p in parsed) else "parsed"


def is_equivalent(answer: str, gold_parsed: tuple[Any, ...]) -> bool:
    """Whether the extracted ``answer`` equals the parsed gold (math-verify, rounding 6, strict).

    >>> is_equivalent("0.5", parse_gold("\\\\frac{1}{2}")), is_equivalent("2", parse_gold("3"))
    (True, False)
    """
    parsed = parse_text(answer)
    if not parsed:
        return False
    return bool(
        verify(list(gold_parsed), list(parsed), float_rounding=6, strict=True, timeout_seconds=_timeout())
    )


# -- the worker-side check --------------------------------------------------------------------------


def log2_bound(expr: Any, symbols: dict[Any, float] | None = None) -> float:
    """An upper bound on ``log2 |value|`` of a SymPy expression's numbers (``inf`` if astronomical).

    A free symbol counts as 1 (only numbers get computed); a bound variable of a sum or product as
    its largest limit. Used to refuse answers like ``10^{10^{10}}``, ``(10^{100})!`` or
    ``\\sum_{n=1}^{10^6} n^n`` before SymPy tries to compute them (Python's big-integer arithmetic
    cannot be interrupted).

    >>> import sympy
    >>> tower = sympy.Pow(10, sympy.Pow(10, 10, evaluate=False), evaluate=False)  # 10^(10^10)
    >>> log2_bound(sympy.Integer(1024)), round(log2_bound(tower) / 1e9, 1)
    (10.0, 33.2)
    """
    import sympy

    symbols = symbols or {}
    if isinstance(expr, sympy.Rational):  # integers included
        return _log2_int(max(abs(expr.p), expr.q))
    if isinstance(expr, sympy.Float):
        try:
            return math.log2(abs(float(expr)) + 2)
        except OverflowError:
            return math.inf
    if isinstance(expr, (sympy.Pow, sympy.exp)):
        base, exponent = (expr.base, expr.exp) if isinstance(expr, sympy.Pow) else (sympy.E, expr.args[0])
        exponent_bits = log2_bound(exponent, symbols)
        if exponent_bits > 62:
            return math.inf
        return log2_bound(base, symbols) * 2.0**exponent_bits
    if isinstance(expr, (sympy.factorial, sympy.gamma, sympy.binomial, sympy.factorial2)):
        n_bits = log2_bound(expr.args[0], symbols)  # n! < n^n, C(n, k) < 2^n
        return math.inf if n_bits > 62 else 2.0**n_bits * max(n_bits, 1.0)
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        inner = dict(symbols)
        for variable, *limits in expr.limits:
            inner[variable] = max((log2_bound(b, symbols) for b in limits), default=0.0)
        count_bits = max(inner[v] for v, *_ in expr.limits)
        term = log2_bound(expr.function, inner)
        if isinstance(expr, sympy.Sum):
            return term + count_bits
        return math.inf if count_bits > 62 else term * 2.0**count_bits
    if isinstance(expr, sympy.MatrixBase):
        return max((log2_bound(e, symbols) for e in expr), default=0.0)
    args = getattr(expr, "args", ())
    if not args:  # a constant (pi, e, i) is below 4; a free symbol or a string counts as 1
        if isinstance(expr, sympy.NumberSymbol) or expr is sympy.I:
            return 2.0
        return symbols.get(expr, 0.0) if isinstance(expr, sympy.Symbol) else 0.0
    bounds = [log2_bound(a, symbols) for a in args]
    if isinstance(expr, sympy.Mul):
        return sum(bounds)
    return max(bounds) + math.log2(len(bounds) + 1)


def _log2_int(n: int) -> float:
    return math.log2(n) if 2 <= n < 2**1000 else float(n.bit_length()) if n >= 2 else 0.0


def too_large(parsed: tuple[Any, ...]) -> bool:
    """Whether any parsed expression holds a number over ``MAX_INTEGER_BITS`` bits.

    >>> too_large(parse_text("2^{2^{2^{2^{2}}}}")), too_large(parse_text("2^{1000} + 1"))
    (False, False)
    >>> too_large(parse_text("\\\\begin{pmatrix}1\\\\\\\\2\\\\end{pmatrix}"))
    False
    >>> too_large(parse_text("10^{10^{10}}")), too_large(parse_text("9^{9^{9^{9}}}"))
    (True, True)
    >>> (too_large(parse_text("\\\\sum_{n=1}^{10^{6}} n^n")),
    ...  too_large(parse_text("\\\\sum_{n=1}^{10^{12}} n")))
    (True, False)
    >>> (too_large(parse_text("\\\\binom{10^{9}}{5 \\\\cdot 10^{8}}")),
    ...  too_large(parse_text("\\\\binom{10}{3}")))
    (True, False)
    """
    try:
        return any(log2_bound(p) > MAX_INTEGER_BITS for p in parsed if not isinstance(p, str))
    except (RecursionError, TypeError, ValueError, AttributeError):
        return True


def check(task: tuple[str, tuple[str, ...]]) -> tuple[bool, tuple[bool, ...], bool]:
    """Worker-side comparison of a normalised answer with normalised golds.

    Returns ``(correct, parseable, refused)``: whether the answer equals any parseable gold (by
    math-verify, less its rounding artefacts on tiny numbers: `tiny_mismatch`; never a gold in another
    temperature scale: `rewards.grading.extract.scales_differ`; a relation of one variable read as the
    set it defines where the gold is an interval: `relation_as_set`), which golds math-verify could parse,
    and whether the answer was refused as too large to evaluate. An empty answer only parses the golds.

    >>> check(("\\\\frac{1}{2}", ("0.5", "7")))
    (True, (True, True), False)
    >>> check(("10^{10^{10}}", ("5",)))
    (False, (True,), True)
    >>> check(("x > 2", ("(2, \\\\infty)",))), check(("x > 3", ("(2, \\\\infty)",)))
    ((True, (True,), False), (False, (True,), False))
    """
    answer, golds = task
    parsed_golds = [parse_text(g) for g in golds]
    parseable = tuple(p is not None for p in parsed_golds)
    if not answer or not any(parseable):
        return False, parseable, False
    parsed_answer = parse_text(answer)
    if not parsed_answer:
        return False, parseable, False
    if too_large(parsed_answer):
        return False, parseable, True
    correct = any(
        not scales_differ(answer, text)
        and verify(
            list(g),
            list(parsed_answer),
            float_rounding=6,
            strict=True,
            timeout_seconds=_timeout(),
            allow_set_relation_comp=relation_as_set(answer, text),
        )
        and not tiny_mismatch(g, parsed_answer)
        for g, text in zip(parsed_golds, golds)
        if g is not None
    )
    return bool(correct), parseable, False


_RELATION_SIGN = re.compile(r"<=|>=|!=|<|>")
_VARIABLE = re.compile(r"[A-Za-z]")
# A gold that is certainly a set of reals: an interval with an infinite or a closed end, or a union. Not
# `(1, 2)`, which may be a point of the plane.
_SET_OF_REALS = re.compile(r"\\infty|\\cup|^\s*\[|\]\s*$")


def relation_as_set(answer: str, gold: str) -> bool:
    """Whether math-verify should read a normalised ``answer`` that is a relation as the set of values that
    satisfy it (its ``allow_set_relation_comp``): ``x > 2`` for ``(2, \\infty)``. Only a relation between
    one letter and constants (``x > 2``, ``-1 <= t < 3``, ``x != 2``; the letter in the middle of a chain),
    against a gold that is certainly a set of reals (`_SET_OF_REALS`). Not an inequality in an expression
    (``x^2 > 4``, ``\\frac{x-1}{x+2} > 0``): that restates a question, and its set would be the answer.

    >>> relation_as_set("x > 2", "(2, \\\\infty)"), relation_as_set("-1 <= t < 3", "[-1, 3)")
    (True, True)
    >>> relation_as_set("x^2 > 4", "(-\\\\infty, -2) \\\\cup (2, \\\\infty)")
    False
    >>> relation_as_set("1 < x < 2", "(1, 2)"), relation_as_set("x + y > 2", "(2, \\\\infty)")
    (False, False)
    """
    if not _SET_OF_REALS.search(gold) or "," in answer or "=" in _RELATION_SIGN.sub("", answer):
        return False
    parts = [part.strip() for part in _RELATION_SIGN.split(answer)]
    if len(parts) not in (2, 3):
        return False
    letters = [i for i, part in enumerate(parts) if _VARIABLE.fullmatch(part)]
    if len(letters) != 1 or (len(parts) == 3 and letters != [1]):
        return False
    return all(part and free_letters(part) == 0 for i, part in enumerate(parts) if i != letters[0])


TINY = 1e-3  # below this, rounding to 6 decimal places keeps fewer than 4 significant digits


def _decimal_value(parsed: tuple[Any, ...]) -> Decimal | None:
    """The real value of a parsed constant, to 30 significant digits (no float underflow)."""
    import sympy

    expr = parsed[0]
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    value = sympy.N(expr, 30)
    if not value.is_real:
        return None
    return Decimal(str(value))


def tiny_mismatch(gold: tuple[Any, ...], answer: tuple[Any, ...]) -> bool:
    """Whether a match math-verify reported is only an artefact of its rounding to 6 decimal places,
    which is absolute: it takes ``10.224 \\times 10^{-19}`` for ``8.224 \\times 10^{-19}`` and ``0`` for
    ``\\frac{1}{2004!}`` (Minerva's physics answers are like that). Below ``TINY`` we apply the same
    rule scale-free: both values, scaled so that the gold lies in [1, 10), must round to the same 6
    decimal places, as ``8.224`` and ``8.22`` must at ordinary scale (and do not).

    >>> tiny_mismatch(parse_text("8.224 \\\\times 10^{-19}"), parse_text("10.224 \\\\times 10^{-19}"))
    True
    >>> tiny_mismatch(parse_text("1.325 \\\\times 10^{-27}"), parse_text("0.1325 \\\\times 10^{-26}"))
    False
    >>> (tiny_mismatch(parse_text("\\\\frac{1}{2004!}"), parse_text("0")),
    ...  tiny_mismatch(parse_text("\\\\frac{1}{3}"), parse_text("0.333333")))
    (True, False)
    """
    try:
        g, a = _decimal_value(gold), _decimal_value(answer)
    except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError):
        return False
    if g is None or a is None or max(abs(g), abs(a)) >= Decimal(TINY):
        return False
    if g == 0:
        return a != 0
    places = Decimal(1).scaleb(-6)
    scale = -g.adjusted()
    return g.scaleb(scale).quantize(places, ROUND_HALF_EVEN) != a.scaleb(scale).quantize(
        places, ROUND_HALF_EVEN
    )
