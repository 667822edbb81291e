"""In-process fast path and guards: settle easy answer/gold pairs without math-verify.

Most MATH golds are integers and most extracted answers are plain numbers, so most pairs can be
decided exactly here, in microseconds, with no parsing into SymPy. The fast path answers ``True``,
``False`` or ``None`` ("don't know: ask math-verify"). It only answers where it provably agrees with
math-verify as we call it (``float_rounding=6``, ``strict=True``, both sides normalised the same way):

* identical normalised strings are equal (math-verify parses both the same way; the caller must know
  the gold itself is parseable);
* two exact numbers (integers with optional leading zeros or well-formed thousands separators, not
  both: ``058,500`` is left to math-verify; ``\\frac{p}{q}``, ``p/q``) are compared exactly, as
  math-verify compares SymPy rationals;
* when a decimal is involved, equal values with at most 6 decimals are equal, and values more than
  ``1e-5`` apart are different (math-verify rounds to 6 places); anything in between is left to
  math-verify. Magnitudes are capped so that float precision never matters;
* two closed-form constants (``9\\pi``, ``\\frac{2\\sqrt{2}}{3}``, ``2^{10}``: numbers, ``\\frac``,
  ``\\sqrt``, ``\\pi``, powers, ``+ - \\cdot \\times``) whose values differ clearly are different.
  The evaluator refuses anything math-verify might read differently (``/``, ``2 3``, ``(2)(3)``,
  ``2^10``, ``2^3^2``, ``e``, ``i``), and is never used to say "equal";
* tuples, intervals and sets of such constants are different when some value of one is far from
  every value of the other; unions of intervals when their boundary points differ;
* expressions in lowercase variables (``2x^2+3x``) are different when their values clearly differ at
  one of two fixed points: their difference is then not identically zero.
* a constant, or a tuple, interval or set of constants, is different from an expression in variables
  whose value clearly changes between the two points (it is not constant); but a number followed by
  letters (``5 cm``, ``6 days``) against the same number is left to math-verify, which drops the units
  it knows, and so is any pair that may be equal once trailing words are dropped (``2k cm``, ``2k``);
* ``A + Bi`` is different from a real constant (``B`` not 0) and from ``C + Di`` with other parts,
  whether math-verify reads ``i`` as the imaginary unit or as a variable;
* an equation is compared with a gold that is no relation by its right side (as math-verify does);
  two assignments of the same variable, ``y = f`` and ``y = g``, are different when ``f`` and ``g``
  clearly differ as functions (different graphs);
* a gold equation against a constant or an expression: an assignment (``AB=...``, letters on the
  left) by its right side, an equation whose left side holds an integer of its own (``2x + z - 5 = 0``)
  as different; other left sides (``f^{-1}(x)``, ``a_1 + a_2``) are left to math-verify;
* matrices of constants of other shapes or with an entry clearly different are different, and a
  matrix of two or more entries differs from a constant;
* a percent (read by math-verify as ``X`` and as ``X/100``) or a mixed number (``3 \\frac{3}{8}``: read
  as a sum or a product) is different from a constant far from every reading;
* an interval (``[3, \\infty)``) is different from a constant;
* a bare list or set of constants (finitely many points) is different from a union of intervals;
* an inequality is different from a constant; unions of intervals, one with a degenerate piece
  (``(4, 4)``), are different when what they cover differs by more than finitely many points;
* a multiple-choice letter (``(A)``, not E or I) is different from a number or an expression (a letter
  in lower case, ``(a)``, is left to math-verify, which ignores the case);
* sums of plain integers (``0-14``) are exact numbers;
* an answer with a decimal comma (``3,14``) equals the gold with a point (`decimal_comma_verdict`), where
  math-verify reads a set of two numbers; a numeral in a base with decimal digits is, where no
  bare numeral is on the other side, compared by its digits only to say "different".

Each rule has a test that math-verify agrees wherever it answers (tests/test_grading.py).

`base_verdict` is not part of the fast path but a correction of math-verify, which drops base
subscripts (it takes ``20412_6`` for ``20412_5``); so is `scientific_verdict`, which says "equal" for
a decimal in scientific notation and the number of exactly its value (math-verify's float misses some:
``6.02 \\times 10^{23}`` and ``602000000000000000000000``), and `percent_verdict`, which says "equal" for
``12.5\\%`` and ``12.5`` as math-verify does for ``50\\%`` and ``50``. `surely_parseable` tells which golds
math-verify certainly reads, so that no worker is needed to learn it.

The guards refuse answers without evaluating them. `answer_too_costly`: far longer or more deeply
nested than any gold (math-verify's parser is super-linear in nesting depth: 12 nested parentheses
already cost about a second). `reads_as_prose`: many more free letters than the gold (math-verify
reads ``I could not finish the computation`` as a product of 29 symbols, and SymPy took 6.6 s to
compare that with ``\\cot x``); such an answer is wrong, not a timeout.
"""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

from .extract import BASE_NUMERAL_DIGITS, split_temperature

# Integers: plain digits (leading zeros are fine: AIME's `025`) or groups of three after a comma, led
# by no zero (math-verify reads `058,500` as 58.5 and `0,500` as 0.5).
_INT = r"(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)"
_INTEGER = re.compile(rf"[+-]?{_INT}")
_DECIMAL = re.compile(rf"[+-]?(?:{_INT})?\.\d+")
_FRAC = re.compile(r"([+-]?)\\frac\{\s*([+-]?\d+)\s*\}\{\s*([+-]?\d+)\s*\}")
_SLASH = re.compile(r"([+-]?\d+)\s*/\s*(\d+)")

MAX_DIGITS = 60  # longer numbers are left to math-verify (and `int()` refuses > 4300 digits anyway)
DECIMAL_PLACES = 6  # math-verify's float_rounding, as we call it
DECIMAL_MAGNITUDE = 10**8  # below this, a float's error (~1e-8 absolute) cannot move a 6-place rounding
DECIMAL_GAP = Fraction(1, 10**5)  # values further apart round to different 6-place values

MAX_ANSWER_CHARS = 512  # the longest gold in MATH / the evaluation suite has 204 characters
MAX_NESTING = 10  # the deepest gold nests brackets 4 levels deep


def as_number(text: str) -> tuple[Fraction, bool] | None:
    """The exact value of a plain number and whether it was written as a decimal, or ``None``.

    >>> as_number("025"), as_number("-1,000")
    ((Fraction(25, 1), False), (Fraction(-1000, 1), False))
    >>> as_number("\\\\frac{-3}{6}"), as_number(".5")
    ((Fraction(-1, 2), False), (Fraction(1, 2), True))
    >>> as_number("1,5") is None, as_number("1e3") is None, as_number("\\\\frac{1}{0}") is None
    (True, True, True)
    >>> as_number("058,500") is None, as_number("0,500") is None  # math-verify: 58.5 and 0.5
    (True, True)
    """
    text = text.strip()
    if not text or len(text) > 2 * MAX_DIGITS:
        return None
    if _INTEGER.fullmatch(text):
        return Fraction(int(text.replace(",", ""))), False
    if _DECIMAL.fullmatch(text):
        return Fraction(text.replace(",", "")), True
    match = _FRAC.fullmatch(text) or _SLASH.fullmatch(text)
    if match is None:
        return None
    groups = match.groups()
    sign = -1 if len(groups) == 3 and groups[0] == "-" else 1
    numerator, denominator = int(groups[-2]), int(groups[-1])
    if denominator == 0:
        return None
    return sign * Fraction(numerator, denominator), False


_INTEGER_SUM = re.compile(r"[+-]?\d+(?:\s*[+-]\s*\d+)+")


def integer_sum(text: str) -> tuple[Fraction, bool] | None:
    """The exact value of a sum or difference of plain integers (``0-136``), as `as_number` gives it.

    >>> (integer_sum("0-136"), integer_sum("2 + 3 - 1"), integer_sum("2 3") is None,
    ...  integer_sum("1,000+1") is None)
    ((Fraction(-136, 1), False), (Fraction(4, 1), False), True, True)
    """
    text = text.strip()
    if len(text) > 2 * MAX_DIGITS or not _INTEGER_SUM.fullmatch(text):
        return None
    return Fraction(sum(int(term.replace(" ", "")) for term in re.findall(r"[+-]?\s*\d+", text))), False


def fast_verdict(answer: str, gold: str) -> bool | None:
    """Whether normalised ``answer`` equals normalised ``gold``, where that is easy; else ``None``.

    Precondition for a ``True`` from string equality: math-verify can parse ``gold``.

    >>> fast_verdict("025", "25"), fast_verdict("\\\\frac{2}{4}", "0.5"), fast_verdict("7", "8")
    (True, True, False)
    >>> fast_verdict("0.3333333", "\\\\frac{1}{3}") is None  # math-verify rounds: leave it to it
    True
    >>> fast_verdict("\\\\sqrt{8}", "2\\\\sqrt{2}") is None, fast_verdict("9\\\\pi", "9")
    (True, False)
    """
    if answer == gold and answer:
        return True
    a, g = as_number(answer) or integer_sum(answer), as_number(gold) or integer_sum(gold)
    if a is None or g is None:
        return _clearly_different(answer, gold)
    (a_value, a_decimal), (g_value, g_decimal) = a, g
    if not (a_decimal or g_decimal):
        return a_value == g_value  # exact rationals: math-verify compares them exactly too
    if abs(a_value) >= DECIMAL_MAGNITUDE or abs(g_value) >= DECIMAL_MAGNITUDE:
        return None
    if a_value == g_value:
        places = max(_decimal_places(answer), _decimal_places(gold))
        return True if places <= DECIMAL_PLACES else None
    return False if abs(a_value - g_value) > DECIMAL_GAP else None


EVAL_MAGNITUDE = 1e12  # beyond this, values are left to math-verify (floats lose exactness)
_TOKEN = re.compile(r"\s*(\d+\.\d+|\.\d+|\d+|\\frac|\\sqrt|\\pi|\\cdot|\\times|[-+*^(){}\[\]]|[a-z])")
# Letters read as variables: lowercase, but not e, i, o (Euler's number, the imaginary unit, big-O).
VARIABLES = frozenset("abcdfghjklmnpqrstuvwxyz")


# `and`, `or` as words: math-verify reads `2 and -5` as the list `2, -5`, not as the product of a, n, d.
_CONJUNCTION = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])")


class _Refuse(Exception):
    """The evaluator will not vouch for how math-verify reads this text."""


def _tokens(text: str) -> list[str] | None:
    """The evaluator's tokens of ``text``; ``None`` for anything else, and for ``and``, ``or`` as words.

    >>> _tokens("2x+y"), _tokens("2 and -5"), _tokens("x or y"), _tokens("2band + 1")
    (['2', 'x', '+', 'y'], None, None, ['2', 'b', 'a', 'n', 'd', '+', '1'])
    """
    if _CONJUNCTION.search(text):
        return None
    tokens, position, text = [], 0, text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            return None
        tokens.append(match.group(1))
        position = match.end()
    return tokens


def evaluate(text: str, variables: dict[str, float] | None = None) -> float | None:
    """The value of a closed-form expression, or ``None`` if it is anything else or ambiguous.

    Reads numbers, ``\\frac{}{}``, ``\\sqrt{}``, ``\\sqrt[3]{}``, ``\\pi``, ``+ - * \\cdot \\times``,
    ``^{...}`` or ``^d``, brackets, and the implicit products ``2\\sqrt{3}``, ``3\\pi``, ``2x``, ``xy``;
    letters only when ``variables`` gives their values. Refuses what math-verify may read another way.

    >>> round(evaluate("\\\\frac{2\\\\sqrt{2}}{3}"), 6), evaluate("-3^2"), evaluate("2^{10}")
    (0.942809, -9.0, 1024.0)
    >>> evaluate("2x^2+3x", {"x": 2.0}), evaluate("x + 1") is None
    (14.0, True)
    >>> [evaluate(t, {"x": 1.0})
    ...  for t in ("2^10", "1/2", "2 3", "(2)(3)", "2^3^2", "x2", "2\\\\frac{1}{2}", "50\\\\%")]
    [None, None, None, None, None, None, None, None]
    """
    tokens = _tokens(text)
    if not tokens:
        return None
    reader = _Reader(tokens, variables or {})
    try:
        value = reader.sum()
    except (_Refuse, IndexError, ZeroDivisionError, OverflowError, ValueError, TypeError):
        return None
    return value if reader.i == len(tokens) else None


def constant_value(text: str) -> float | None:
    """`evaluate` without variables: the value of a closed-form constant, or ``None``.

    >>> constant_value("3\\\\pi") == 3 * 3.141592653589793, constant_value("x+1") is None
    (True, True)
    """
    return evaluate(text)


def _check(value: float) -> float:
    if isinstance(value, complex) or not abs(value) < EVAL_MAGNITUDE:  # also catches nan
        raise _Refuse
    return value


class _Reader:
    """Recursive descent over tokens: sum > product > signed > power > atom."""

    def __init__(self, tokens: list[str], variables: dict[str, float]):
        self.tokens, self.variables, self.i = tokens, variables, 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.i]
        if expected is not None and token != expected:
            raise _Refuse
        self.i += 1
        return token

    def sum(self) -> float:
        value = self.product()
        while self.peek() in ("+", "-"):
            sign = self.take()
            right = self.product()
            value = _check(value + right if sign == "+" else value - right)
        return value

    def product(self) -> float:
        value = self.signed()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times"):
                self.take()
                right = self.signed()
            elif token in ("\\pi", "\\sqrt") or (token is not None and token in VARIABLES):
                right = self.power()  # `2\sqrt{3}`, `3\pi`, `2x`, `xy`: the only implicit products read
            else:
                return value
            value = _check(value * right)

    def signed(self) -> float:
        if self.peek() in ("+", "-"):
            sign = self.take()
            value = self.signed()
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            if self.peek() == "{":
                exponent = self.group("{", "}")
            elif len(self.peek() or "") == 1 and self.peek().isdigit():  # `2^3`; `2^10` is ambiguous
                exponent = float(self.take())
            else:
                raise _Refuse
            if abs(exponent) > 64 or self.peek() == "^":
                raise _Refuse
            base = _check(base**exponent)
        after = self.peek()
        if after is not None and (after[0].isdigit() or after in ("(", "{", ".")):
            # `2 3`, `(2)(3)`, `x2`, `2\frac{1}{2}`... math-verify reads these in surprising ways
            raise _Refuse
        return base

    def atom(self) -> float:
        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return _check(float(token))
        if token == "\\pi":
            return 3.141592653589793
        if token in VARIABLES and token in self.variables:
            return self.variables[token]
        if token == "\\frac":
            numerator = self.group("{", "}")
            return _check(numerator / self.group("{", "}"))
        if token == "\\sqrt":
            index = self.group("[", "]") if self.peek() == "[" else 2.0
            radicand = self.group("{", "}")
            if index != int(index) or not 2 <= index <= 9 or radicand < 0:
                raise _Refuse
            return radicand ** (1 / index)
        if token in ("(", "{"):
            self.i -= 1
            return self.group(token, ")" if token == "(" else "}")
        raise _Refuse

    def group(self, opening: str, closing: str) -> float:
        self.take(opening)
        value = self.sum()
        self.take(closing)
        return value


def _value(text: str) -> float | None:
    number = as_number(text)
    return float(number[0]) if number is not None else constant_value(text)


_BRACKETS = (("\\{", "\\}"), ("(", ")"), ("[", "]"), ("(", "]"), ("[", ")"))
_THOUSANDS_LIKE = re.compile(r"\d,\d{3}(?!\d)")  # `1,000` inside a list: a number or two elements?


def _split_top_level(text: str) -> list[str] | None:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return parts + [text[start:]] if depth == 0 else None


def constant_values(text: str) -> list[float] | None:
    """The values of a closed-form constant (one) or of a tuple, interval or set of them (several).

    >>> constant_values("(1, \\\\frac{1}{2}]"), constant_values("\\\\{3, 4\\\\}"), constant_values("5, 15")
    ([1.0, 0.5], [3.0, 4.0], [5.0, 15.0])
    >>> constant_values("(1,000, 2)") is None, constant_values("(1, x)") is None
    (True, True)
    """
    value = _value(text)
    if value is not None:
        return [value]
    inner = text.strip()
    if _THOUSANDS_LIKE.search(inner):
        return None
    for opening, closing in _BRACKETS:
        if inner.startswith(opening) and inner.endswith(closing):
            inner = inner[len(opening) : -len(closing)]
            break
    parts = _split_top_level(inner)
    if parts is None or len(parts) < 2:
        return None
    values = [_value(part) for part in parts]
    return None if any(v is None for v in values) else values  # type: ignore[return-value]


_INFINITIES = {"\\infty": math.inf, "+\\infty": math.inf, "-\\infty": -math.inf}
_CUP = re.compile(r"\\cup")


def _endpoint(text: str) -> float | None:
    text = text.strip()
    return _INFINITIES[text] if text in _INFINITIES else _value(text)


def _interval_pieces(text: str) -> list[tuple[float, float, bool, bool]] | None:
    """``(low, high, low closed, high closed)`` of each ``\\cup``-separated piece with constant
    endpoints, in order, or ``None`` if a piece is anything else."""
    pieces = []
    for part in _CUP.split(text):
        part = part.strip()
        if len(part) < 5 or part[0] not in "([" or part[-1] not in ")]":
            return None
        inner = _split_top_level(part[1:-1])
        if inner is None or len(inner) != 2:
            return None
        low, high = _endpoint(inner[0]), _endpoint(inner[1])
        if low is None or high is None:
            return None
        pieces.append((low, high, part[0] == "[", part[-1] == "]"))
    return pieces


def interval_boundaries(text: str) -> list[float] | None:
    """The boundary points of a union of intervals with constant endpoints (``\\cup``-separated),
    after merging overlapping pieces; ``None`` if the text is anything else or a piece is empty.
    Two such unions with different boundaries are different sets.

    >>> (interval_boundaries("(-\\\\infty, -2) \\\\cup (0, 1) \\\\cup [1, 4)"),
    ...  interval_boundaries("(0, 2) \\\\cup (1, 3)"))
    ([-inf, -2.0, 0.0, 4.0], [0.0, 3.0])
    >>> interval_boundaries("(0, 1) \\\\cup (1, 2)"), interval_boundaries("(2, 1)") is None
    ([0.0, 1.0, 1.0, 2.0], True)
    """
    pieces = _interval_pieces(text)
    if pieces is None:
        return None
    for low, high, low_closed, high_closed in pieces:
        if not low < high or (low == -math.inf and low_closed) or (high == math.inf and high_closed):
            return None
    ends = sorted(v for piece in pieces for v in piece[:2] if abs(v) != math.inf)
    if any(0 < b - a <= 1e-5 for a, b in itertools.pairwise(ends)):
        return None  # endpoints too close to tell apart: leave it to math-verify
    pieces.sort()
    merged = [list(pieces[0])]
    for low, high, low_closed, high_closed in pieces[1:]:
        last = merged[-1]
        if low < last[1] or (low == last[1] and (last[3] or low_closed)):
            if high > last[1] or (high == last[1] and high_closed):
                last[1], last[3] = high, high_closed
        else:
            merged.append([low, high, low_closed, high_closed])
    return [v for piece in merged for v in piece[:2]]


def open_cover(text: str) -> tuple[list[float], bool] | None:
    r"""The boundary points of what a union of intervals covers up to finitely many points, and whether
    a piece was degenerate (``(4, 4)``, ``(2, 1)``: empty, a point, or a pair of points, however it is
    read); pieces that touch are merged. ``None`` if a piece is anything else.

    >>> open_cover("(-\\infty, -2) \\cup (2, 1) \\cup (2, 4)"), open_cover("(0, 1) \\cup [1, 2)")
    (([-inf, -2.0, 2.0, 4.0], True), ([0.0, 2.0], False))
    """
    parsed = _interval_pieces(text)
    if parsed is None:
        return None
    pieces, degenerate = [], False
    for low, high, _, _ in parsed:
        if low < high:
            pieces.append((low, high))
        elif abs(low) != math.inf and abs(high) != math.inf:
            degenerate = True
        else:
            return None
    ends = sorted(v for piece in pieces for v in piece if abs(v) != math.inf)
    if not pieces or any(0 < b - a <= 1e-5 for a, b in itertools.pairwise(ends)):
        return None
    pieces.sort()
    merged = [list(pieces[0])]
    for low, high in pieces[1:]:
        if low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [v for piece in merged for v in piece], degenerate


def _different_covers(answer: str, gold: str) -> bool | None:
    r"""``False`` for unions of intervals, one with a degenerate piece (``(4, 4)``), whose covers
    differ by more than finitely many points: ``(-\infty,2) \cup (4,4)`` against ``(-\infty,2) \cup (2,4)``
    (no reading of ``(4, 4)`` covers ``(2, 4)``).

    >>> (_different_covers("(-\\infty,2) \\cup (4,4)", "(-\\infty,2) \\cup (2,4)"),
    ...  _different_covers("(0,1) \\cup (1,1) \\cup (1,2)", "(0,2)"))
    (False, None)
    """
    a, g = open_cover(answer), open_cover(gold)
    if a is None or g is None or not (a[1] or g[1]):
        return None
    if len(a[0]) != len(g[0]) or not all(x == y or _close(x, y) for x, y in zip(a[0], g[0])):
        return False
    return None


_INEQUALITY = re.compile(r"<=?|>=?")


def _inequality_against_value(answer: str, gold: str) -> bool | None:
    r"""``False`` for an inequality (``-80 <= g(x) <= 82``) against a constant: math-verify finds a
    relation equal to no number.

    >>> (_inequality_against_value("-80 <= g(x) <= 82", "80"), _inequality_against_value("5", "x > 3"),
    ...  _inequality_against_value("x > 3", "(3, \\infty)"))
    (False, False, None)
    """
    for one, other in ((answer, gold), (gold, answer)):
        if (
            _INEQUALITY.search(one)
            and "=" not in one.replace("<=", "").replace(">=", "")
            and _value(other) is not None
        ):
            return False
    return None


def _close(x: float, y: float) -> bool:
    gap = abs(x - y)
    return gap <= 1e-5 or gap <= 1e-6 * max(abs(x), abs(y))


def _clearly_different(answer: str, gold: str) -> bool | None:
    """``False`` when both are constants (or tuples, intervals, sets of constants) and some value of
    one is far from every value of the other: different as numbers, tuples, intervals and sets alike."""
    if "\\cup" in answer or "\\cup" in gold:
        verdict = _different_unions(answer, gold)
        return verdict if verdict is not None else _different_covers(answer, gold)
    a, g = constant_values(answer), constant_values(gold)
    if a is None or g is None:
        if _same_number_before_a_unit(answer, gold) or _may_be_equal_without_units(answer, gold):
            return None
        for rule in (
            _different_functions,
            _constants_against_function,
            _different_complex,
            _equation_against_constant,
            _gold_equation_against_value,
            _different_assignments,
            _choice_against_number,
            _different_matrices,
            _several_readings,
            _interval_against_value,
            _inequality_against_value,
        ):
            verdict = rule(answer, gold)
            if verdict is not None:
                return verdict
        return None
    if any(not any(_close(x, y) for y in g) for x in a) or any(not any(_close(x, y) for x in a) for y in g):
        return False
    return None


# A number followed by letters (`5 cm`, `6days`, `5 m^2`), not by the imaginary unit or e alone (`5i`).
_QUANTITY = re.compile(r"([+-]?(?:\d[\d,]*(?:\.\d+)?|\.\d+))\s*(?![eEiI](?:\^|$))[A-Za-z]+(?:\^\{?\d\}?)?")


def _same_number_before_a_unit(answer: str, gold: str) -> bool:
    """Whether one side is a number followed by letters (``5 cm``, ``6 days``, a unit written without
    ``\\text``) and the other is the same number, alone or so followed. math-verify drops the units it
    knows (``5 cm`` is 5), so here the letters may not be read as variables: math-verify decides. With
    another number, no reading makes the two equal.

    >>> (_same_number_before_a_unit("5 cm", "5"), _same_number_before_a_unit("6days", "6.0"),
    ...  _same_number_before_a_unit("5 m", "5 cm"))
    (True, True, True)
    >>> (_same_number_before_a_unit("7 cm", "5"), _same_number_before_a_unit("2x + 1", "2"),
    ...  _same_number_before_a_unit("5i", "5"))
    (False, False, False)
    """
    quantities = _QUANTITY.fullmatch(answer), _QUANTITY.fullmatch(gold)
    if not any(quantities):
        return False
    values = [_value(q.group(1) if q else side) for q, side in zip(quantities, (answer, gold))]
    return None not in values and _close(*values)  # type: ignore[arg-type]


# math-verify drops a unit of its list after a digit, `}` or a space (twice), and a trailing `\text{...}`
# (after `\mathbf`, `\textit`... became `\text`). Its one-letter units are these; words are all taken
# for units here, so that what is dropped here is a superset of what it drops.
_ONE_LETTER_UNITS = frozenset("cdghlmost")
_TRAILING_WORD = re.compile(r"(?<=[\d}\s])\s*([A-Za-z][A-Za-z.]*)\s*(?:\^\{?\d\}?)?\s*$")
_TEXT_COMMAND = re.compile(r"\\(?:text[a-z]*|math[a-z]+|mbox|emph|operatorname)\s*\{")
_ENDS_A_GROUP = re.compile(r"\}\s*(?:\^\{?\d\}?|\{\^\d\})?\s*$")


def _without_units(text: str) -> set[str]:
    r"""``text`` and what it may be once math-verify has dropped trailing units (up to three words).

    >>> [sorted(_without_units(text)) for text in ("2k cm", "2\\pi r m", "2x + 3y")]
    [['2k', '2k cm'], ['2\\pi r', '2\\pi r m'], ['2x + 3y']]
    >>> sorted(_without_units("\\frac{1}{m}t")), sorted(_without_units("n \\textit{ways}^2"))
    (['\\frac{1}{m}', '\\frac{1}{m}t'], ['n', 'n \\textit{ways}^2'])
    """
    found, frontier = {text.strip()}, [text.strip()]
    for _ in range(3):
        shorter = []
        for one in frontier:
            word = _TRAILING_WORD.search(one)
            if word and (len(word.group(1)) > 1 or word.group(1) in _ONE_LETTER_UNITS):
                shorter.append(one[: word.start()].strip())
            if _ENDS_A_GROUP.search(one):
                shorter += [one[: command.start()].strip() for command in _TEXT_COMMAND.finditer(one)]
        frontier = [one for one in shorter if one and one not in found]
        found.update(frontier)
    return found


def _may_be_equal_without_units(answer: str, gold: str) -> bool:
    r"""Whether the two may be equal once math-verify has dropped trailing units from either: ``2k cm``
    and ``2k``, ``x m`` and ``x``, ``\frac{1}{\sqrt{2}}c`` and ``\frac{1}{\sqrt{2}}`` (it takes ``c``
    for a unit). Then letters may not be read as variables here: math-verify decides.

    >>> (_may_be_equal_without_units("2k cm", "2k"), _may_be_equal_without_units("2k cm", "3k"),
    ...  _may_be_equal_without_units("2k", "3k"))
    (True, False, False)
    """
    answers, golds = _without_units(answer), _without_units(gold)
    if len(answers) == len(golds) == 1:
        return False
    pairs = [(a, g) for a in answers for g in golds if (a, g) != (answer.strip(), gold.strip())]
    if any(a.replace(" ", "") == g.replace(" ", "") for a, g in pairs):
        return True
    return any(fast_verdict(a, g) is not False for a, g in pairs)


def _different_unions(answer: str, gold: str) -> bool | None:
    """``False`` when one side is a union of intervals and the other a union or interval with other
    boundary points, or a single number (a point is not a union of intervals); else ``None``."""
    a, g = interval_boundaries(answer), interval_boundaries(gold)
    if a is not None and g is not None:
        if len(a) != len(g) or not all(x == y or _close(x, y) for x, y in zip(a, g)):
            return False
        return None
    if (a is not None and _points(gold) is not None) or (g is not None and _points(answer) is not None):
        return False
    return None


def _points(text: str) -> list[float] | None:
    """The values of a constant, a bare list of constants (``0, 3, -1, 4``) or a set of them
    (``\\{1, 2\\}``): finitely many points, never a union of intervals. Not a bracketed pair, which
    may be read as an interval."""
    if (value := _value(text)) is not None:
        return [value]
    stripped = text.strip()
    if stripped[:1] in "([" or stripped.startswith("\\left"):
        return None
    return constant_values(text)


_POINTS = (1.3731, 2.2117)  # where expressions in variables are compared; nothing special about them


def _different_functions(answer: str, gold: str) -> bool | None:
    """``False`` when both are expressions in lowercase variables whose values clearly differ at some
    point: then their difference is not identically zero, and math-verify (strict) says different.

    >>> _different_functions("2x^2+4x", "2x^2+3x"), _different_functions("x y + 1", "yx+1")
    (False, None)
    """
    tokens = (_tokens(answer) or []) + (_tokens(gold) or [])
    letters = {t for t in tokens if t.isalpha()}
    if not letters or not letters <= VARIABLES:
        return None
    for k, base in enumerate(_POINTS):
        point = {c: base + 0.173 * (ord(c) - 97) + 0.05 * k for c in letters}
        a, g = evaluate(answer, point), evaluate(gold, point)
        if a is None or g is None:
            return None
        if not _close(a, g):
            return False
    return None


def _non_constant(text: str) -> bool:
    """Whether ``text`` is an expression in lowercase variables whose value clearly changes between
    two points: it is then no constant, and no tuple, interval or set of constants."""
    letters = {t for t in _tokens(text) or [] if t.isalpha()}
    if not letters or not letters <= VARIABLES:
        return False
    values = [evaluate(text, {c: base + 0.173 * (ord(c) - 97) for c in letters}) for base in _POINTS]
    return None not in values and not _close(*values)  # type: ignore[arg-type]


def _constants_against_function(answer: str, gold: str) -> bool | None:
    r"""``False`` for a constant, or a tuple, interval or set of constants, against an expression that
    is not constant (``5x-3`` against ``(-1, \frac{35}{12})``): math-verify compares a single
    expression with a set as the set of it, and a non-constant expression equals no constant.

    >>> (_constants_against_function("5x-3", "( -1, \\frac{35}{12} )"),
    ...  _constants_against_function("\\frac{8t}{3}", "[2,5)"))
    (False, False)
    >>> _constants_against_function("x - x + 1", "1"), _constants_against_function("x + 1", "(1, y)")
    (None, None)
    """
    for one, other in ((answer, gold), (gold, answer)):
        if (constant_values(other) is not None or complex_value(other) is not None) and _non_constant(one):
            return False
    return None


_TRAILING_I = re.compile(r"(?:^|(?<=[\d\s}+\-]))i$")


def complex_value(text: str) -> tuple[float, float] | None:
    r"""``(real, imaginary)`` of ``A + Bi``, ``A - Bi`` or ``Bi`` with constant ``A`` and ``B``
    (``\frac{1}{5} + \frac{3}{5}i``, ``-128 - 128 \sqrt{3} i``, ``292i``), or ``None``.

    >>> (complex_value("-3 + 6i"), complex_value("\\frac{1}{5} - \\frac{3}{5}i"), complex_value("i"),
    ...  complex_value("-i"))
    ((-3.0, 6.0), (0.2, -0.6), (0.0, 1.0), (0.0, -1.0))
    >>> complex_value("3\\pi") is None, complex_value("x + i") is None, complex_value("7") is None
    (True, True, True)
    """
    text = text.strip()
    if not _TRAILING_I.search(text):
        return None
    body, depth, split = text[:-1].rstrip(), 0, -1
    for index, char in enumerate(body):
        depth += char in "({[" and 1 or (-1 if char in ")}]" else 0)
        if char in "+-" and depth == 0 and index > 0 and body[:index].strip():
            split = index
    real_text, imag_text = (body[:split], body[split:]) if split != -1 else ("0", body)
    imag_text = imag_text.replace(" ", "")
    coefficient = {"": 1.0, "+": 1.0, "-": -1.0}.get(imag_text)
    if coefficient is None:
        sign = -1.0 if imag_text.startswith("-") else 1.0
        magnitude = _value(imag_text.lstrip("+-"))
        coefficient = None if magnitude is None else sign * magnitude
    real = _value(real_text)
    return None if real is None or coefficient is None else (real, coefficient)


def _different_complex(answer: str, gold: str) -> bool | None:
    """``False`` for ``A + Bi`` against a real constant (``B`` not 0) or against ``C + Di`` with other
    parts. Sound whether ``i`` is read as the imaginary unit or as a variable: either way, two such
    forms are equal only if both parts are.

    >>> (_different_complex("1", "-3 + 6i"), _different_complex("-5 + 6i", "-3 + 6i"),
    ...  _different_complex("6i", "0 + 6i"))
    (False, False, None)
    """
    a, g = complex_value(answer), complex_value(gold)
    if a is None and g is None:
        return None
    if a is None:
        a = (value, 0.0) if (value := _value(answer)) is not None else None
    if g is None:
        g = (value, 0.0) if (value := _value(gold)) is not None else None
    if a is None or g is None:
        return None
    return None if _close(a[0], g[0]) and _close(a[1], g[1]) else False


_RELATION_SIGNS = re.compile(r"[<>!]|\\(?:[gl]eq?|[gl]t|neq?|approx|sim|equiv)(?![A-Za-z])")


def _equation_against_constant(answer: str, gold: str) -> bool | None:
    r"""``False`` for an equation against a gold that is no relation, when the equation's right side
    clearly differs from the gold: math-verify compares such a gold with the right side of the last
    ``=`` (``y = -\frac{5}{2}x - \frac{29}{4}`` against ``-\frac{9}{2}``).

    >>> _equation_against_constant("2x - y + 2z - 18 = 0", "181"), _equation_against_constant("y = 2x", "4")
    (False, False)
    >>> _equation_against_constant("y = 2x", "2x"), _equation_against_constant("x < 2", "5")
    (None, None)
    >>> _equation_against_constant("a = 3, b = 4", "(3, 4)") is None
    True
    """
    if answer.count("=") != 1 or "=" in gold:  # several (`a = 3, b = 4`) are read as a list: ask
        return None
    if _RELATION_SIGNS.search(answer) or _RELATION_SIGNS.search(gold):
        return None
    right = answer.rsplit("=", 1)[1].strip()
    return False if right and fast_verdict(right, gold) is False else None


_ASSIGNED = re.compile(r"\s*([a-z])\s*=([^=]+)")


def _different_assignments(answer: str, gold: str) -> bool | None:
    r"""``False`` for two equations ``v = f`` and ``v = g`` giving the same variable (not in ``f`` or
    ``g``) as functions that clearly differ: their graphs differ, so math-verify (which compares the
    two equations, then their solutions) says different. ``y = 2x + 4`` against ``y = 2x + 3``; but
    ``x = \frac{y - 3}{2}`` against ``y = 2x + 3`` is the same line, left to math-verify.

    >>> (_different_assignments("y = 2x + 4", "y = 2x + 3"),
    ...  _different_assignments("x = \\frac{y - 3}{2}", "y = 2x + 3"))
    (False, None)
    >>> _different_assignments("y = 2y + 1", "y = 3"), _different_assignments("y = x^2", "y = x \\cdot x")
    (None, None)
    """
    a, g = _ASSIGNED.fullmatch(answer), _ASSIGNED.fullmatch(gold)
    if a is None or g is None or a.group(1) != g.group(1):
        return None
    variable, f, h = a.group(1), a.group(2), g.group(2)
    if any(variable in {t for t in _tokens(side) or [] if t.isalpha()} for side in (f, h)):
        return None
    return _different_functions(f, h)


_CHOICE = re.compile(r"\(?([A-DF-HJ-Z])\)?")  # a multiple-choice letter (not E or I: constants to some)


def _choice_against_number(answer: str, gold: str) -> bool | None:
    """``False`` for a multiple-choice letter (``(A)``) against a number, either way round.

    >>> (_choice_against_number("(A)", "39"), _choice_against_number("7", "C"),
    ...  _choice_against_number("(E)", "3"), _choice_against_number("(b)", "B"))
    (False, False, None, None)
    """
    for one, other in ((answer, gold), (gold, answer)):
        same_letter = _CHOICE.fullmatch(other.upper()) and other.strip("()").upper() == one.strip("()")
        if _CHOICE.fullmatch(one) and other != one and same_letter:
            return None  # the letter in lower case (`(b)`): math-verify ignores the case, left to it
        if _CHOICE.fullmatch(one) and (_value(other) is not None or _non_constant(other) or _readings(other)):
            return False
    return None


_GOLD_EQUATION = re.compile(r"([^=<>!]+)=([^=<>!]+)")
# A left side that math-verify reads as no assignment: letters and integers added or multiplied, powers
# with digits (``2x + z - 5``, ``x^2 + 1``), holding an integer of its own (a coefficient, a term or an
# exponent: SymPy keeps it, unevaluated). Symbols alone, subscripts and functions are an assignment to
# math-verify (``a_1 + a_2``, ``f^{-1}(x)``, ``x + y``); such left sides are not matched here.
_NO_ASSIGNMENT_LEFT = re.compile(r"(?=.*[A-Za-z])(?=(?:.*[\s+\-^])?\d)(?:[A-Za-z\d\s+\-]|\^\d)+")


def _gold_equation_against_value(answer: str, gold: str) -> bool | None:
    r"""``False`` for a gold equation against an answer that is a constant or an expression: math-verify
    compares an assignment (``AB=12+12\sqrt{3}``: letters on the left) by its right side, and finds
    any other equation (``2x + z - 5 = 0``) equal to no number or expression. Any other left side
    (``f^{-1}(x)``, ``a_1 + a_2``: math-verify may read an assignment) is left to math-verify.

    >>> (_gold_equation_against_value("2", "AB=12+12\\sqrt{3}"),
    ...  _gold_equation_against_value("13", "2x + z - 5 = 0"))
    (False, False)
    >>> (_gold_equation_against_value("12+12\\sqrt{3}", "AB=12+12\\sqrt{3}"),
    ...  _gold_equation_against_value("x", "2x = 2"))
    (None, False)
    >>> (_gold_equation_against_value("7", "a_1 + a_2 = 7"),
    ...  _gold_equation_against_value("x+1", "g^{-1}(x)=x+1"), _gold_equation_against_value("3", "x + y = 3"))
    (None, None, None)
    """
    match = _GOLD_EQUATION.fullmatch(gold)
    if (
        match is None
        or not (_value(answer) is not None or _evaluable(answer))
        or _RELATION_SIGNS.search(answer)
        or "=" in answer
    ):
        return None
    left, right = match.group(1).strip(), match.group(2).strip()
    if left.isalpha():
        return False if fast_verdict(answer, right) is False else None
    return False if _NO_ASSIGNMENT_LEFT.fullmatch(left) else None


_MATRIX = re.compile(r"\\begin\{([pbBvV]?matrix)\}(.*)\\end\{\1\}")


def matrix_values(text: str) -> list[list[float]] | None:
    r"""The rows of a matrix of constants (``\begin{pmatrix} 1 & -1 \\ 1 & 1 \end{pmatrix}``), or ``None``.

    >>> (matrix_values("\\begin{pmatrix} 1 & -1 \\\\ 1 & \\frac{1}{2} \\end{pmatrix}"),
    ...  matrix_values("\\begin{pmatrix} x \\end{pmatrix}"))
    ([[1.0, -1.0], [1.0, 0.5]], None)
    """
    match = _MATRIX.fullmatch(text.strip())
    if match is None:
        return None
    rows = [
        [_value(entry) for entry in row.split("&")] for row in match.group(2).split("\\\\") if row.strip()
    ]
    if not rows or any(v is None for row in rows for v in row) or len({len(row) for row in rows}) != 1:
        return None
    return rows  # type: ignore[return-value]


def _different_matrices(answer: str, gold: str) -> bool | None:
    r"""``False`` for matrices of constants of other shapes or with an entry clearly different, and
    for a matrix of two or more entries against a constant.

    >>> one = "\\begin{pmatrix} 1 & -1 \\\\ 1 & 1 \\end{pmatrix}"
    >>> (_different_matrices(one.replace("-1", "-0"), one), _different_matrices("108", one),
    ...  _different_matrices(one, one))
    (False, False, None)
    """
    a, g = matrix_values(answer), matrix_values(gold)
    if a is not None and g is not None:
        if len(a) != len(g) or len(a[0]) != len(g[0]):
            return False
        return False if any(not _close(x, y) for ra, rg in zip(a, g) for x, y in zip(ra, rg)) else None
    for matrix, other in ((a, gold), (g, answer)):
        if matrix is not None and len(matrix) * len(matrix[0]) >= 2 and _value(other) is not None:
            return False
    return None


_PERCENT = re.compile(r"(.+?)\s*\\%")
_MIXED_NUMBER = re.compile(r"(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}")


def _readings(text: str) -> list[float] | None:
    r"""The values math-verify may give a percent or a mixed number: ``20\%`` is 20 and 0.2 (it takes
    ``20\%`` for ``20``); ``3 \frac{3}{8}`` is 3 + 3/8 or 3 * 3/8. ``None`` for anything else.

    >>> _readings("20\\%"), _readings("3 \\frac{3}{8}"), _readings("3") is None
    ([20.0, 0.2], [3.375, 1.125], True)
    """
    text = text.strip()
    if (match := _PERCENT.fullmatch(text)) and (value := _value(match.group(1))) is not None:
        return [value, value / 100]
    if match := _MIXED_NUMBER.fullmatch(text):
        sign = -1.0 if match.group(1) else 1.0
        whole, fraction = (
            int(match.group(2)),
            int(match.group(3)) / int(match.group(4)) if int(match.group(4)) else None,
        )
        if fraction is None:
            return None
        return [sign * (whole + fraction), sign * whole * fraction] + (
            [sign * whole + fraction] if sign < 0 else []
        )
    return None


def _several_readings(answer: str, gold: str) -> bool | None:
    r"""``False`` for a percent or mixed number against a constant (or another of them) far from
    every reading of it.

    >>> (_several_readings("1023", "20\\%"), _several_readings("20", "20\\%"),
    ...  _several_readings("0.2", "20\\%"))
    (False, None, None)
    >>> _several_readings("3 \\frac{3}{8}", "15"), _several_readings("-15\\frac{3}{5}", "8")
    (False, False)
    """
    a, g = _readings(answer), _readings(gold)
    if a is None and g is None:
        return None
    a = a if a is not None else ([v] if (v := _value(answer)) is not None else None)
    g = g if g is not None else ([v] if (v := _value(gold)) is not None else None)
    if a is None or g is None:
        return None
    return None if any(_close(x, y) for x in a for y in g) else False


def _interval_against_value(answer: str, gold: str) -> bool | None:
    r"""``False`` for an interval (``[3,\infty)``, ``[-36,104]``) against a constant: a point is no interval.

    >>> (_interval_against_value("[3,\\infty)", "32"), _interval_against_value("5", "[-36,104]"),
    ...  _interval_against_value("5", "(1, 2)"))
    (False, False, None)
    """
    for one, other in ((answer, gold), (gold, answer)):
        if interval_boundaries(one) is not None and _value(other) is not None:
            if one.strip()[0] == "(" and one.strip()[-1] == ")" and "\\infty" not in one:
                return None  # `(1, 2)` may be a point of the plane: left to the tuple rules
            return False
    return None


def surely_parseable(text: str) -> bool:
    """Whether math-verify certainly reads this (normalised, gold) text: a number, a numeral in a base,
    or an expression, tuple, interval, union of intervals or set that our evaluator reads. math-verify's
    parse returns its string fallback whenever its normalisation leaves text, and that normalisation keeps
    numbers, letters and these commands; so such a gold never needs a worker to say it is parseable.
    A temperature scale that ends the text is no part of what math-verify reads
    (`rewards.grading.extract.split_temperature`).

    >>> (surely_parseable("( -1, \\\\frac{35}{12} )"), surely_parseable("2x^2+3x"),
    ...  surely_parseable("\\\\text{odd}"), surely_parseable("1950^{\\\\circ}\\\\mathrm{C}"))
    (True, True, False, True)
    """
    text = split_temperature(text)[0]
    if as_number(text) is not None or base_numeral(text) is not None or constant_values(text) is not None:
        return True
    if (
        interval_boundaries(text) is not None
        or complex_value(text) is not None
        or matrix_values(text) is not None
    ):
        return True
    if _CHOICE.fullmatch(text):
        return True
    if (equation := _GOLD_EQUATION.fullmatch(text)) and all(_evaluable(side) for side in equation.groups()):
        return True
    tokens = _tokens(text) or []
    letters = {t for t in tokens if t.isalpha()}
    return bool(letters) and letters <= VARIABLES and evaluate(text, dict.fromkeys(letters, 1.5)) is not None


def _evaluable(text: str) -> bool:
    """Whether our evaluator reads ``text`` as a constant or an expression in lowercase variables."""
    letters = {t for t in _tokens(text) or [] if t.isalpha()}
    return letters <= VARIABLES and evaluate(text, dict.fromkeys(letters, 1.5)) is not None


def _decimal_places(text: str) -> int:
    return len(text) - text.index(".") - 1 if "." in text else 0


_BASE_NUMERAL = re.compile(rf"({BASE_NUMERAL_DIGITS})_\{{(\d{{1,2}})\}}")  # as `normalize` writes it
_BARE_NUMERAL = re.compile(r"-?[0-9A-Fa-f]+")


def base_numeral(text: str) -> tuple[str, int] | None:
    """``(digits, base)`` of a numeral written in a base (``20412_{5}``), or ``None``.

    >>> base_numeral("20412_{5}"), base_numeral("0.01_{2}"), base_numeral("20412")
    (('20412', 5), ('0.01', 2), None)
    """
    match = _BASE_NUMERAL.fullmatch(text)
    return (match.group(1), int(match.group(2))) if match else None


def _numeral_value(digits: str, base: int) -> Fraction:
    """The value of ``digits`` (with an optional sign and fractional part) in ``base``; ``ValueError``
    for a digit not valid in it.

    >>> _numeral_value("-10.1", 2)
    Fraction(-5, 2)
    """
    if not 2 <= base <= 36:
        raise ValueError(f"no numerals in base {base}")
    whole, _, fraction = digits.lstrip("-").partition(".")
    value = Fraction(int(whole + fraction, base), base ** len(fraction))
    return -value if digits.startswith("-") else value


# A word: four letters or more, lower case after the first (`Evelyn`, `Sunday`, `empty`, `None`); not a
# product (`xy`, `abc`) nor capital letters, which may name options or points in any order (`ACF`, `CBAD`).
_WORD = re.compile(r"[A-Za-z][a-z]{3,}")


def word_verdict(answer: str, gold: str) -> bool | None:
    """A gold that is a word (a name, a weekday) is text, as math-verify reads ``\\text{Evelyn}``; once
    normalised, it would read a product of letters, equal to an anagram or to the word times one
    (``Evelyn1``). The answer must be the word, case and spaces aside. Else ``None``.

    >>> word_verdict("evelyn", "Evelyn"), word_verdict("Evelyn1", "Evelyn"), word_verdict("Evelny", "Evelyn")
    (True, False, False)
    >>> word_verdict("2", "4") is None, word_verdict("yx", "xy") is None, word_verdict("ABCD", "CBAD") is None
    (True, True, True)

    The word in a wrapper, after ``name =`` or before a unit is left to math-verify, which reads it as
    the word:

    >>> [word_verdict(a, "Evelyn") for a in ("\\\\textit{Evelyn}", "x = Evelyn", "Evelyn cm")]
    [None, None, None]
    >>> word_verdict("\\\\textit{Emily}", "Evelyn"), word_verdict("x = Emily", "Evelyn")
    (False, False)
    """
    if not _WORD.fullmatch(gold):
        return None
    if answer.replace(" ", "").lower() == gold.lower():
        return True
    readings = {_unwrapped(stem) for stem in _without_units(answer)}
    return None if any(r.replace(" ", "").lower() == gold.lower() for r in readings) else False


_WRAPPER = re.compile(r"\\(?:text[a-z]*|math[a-z]+|mbox|emph|operatorname|boldsymbol)\s*\{(.*)\}")
_NAMED = re.compile(r"[A-Za-z][A-Za-z0-9_]*\s*=(.*)")


def _unwrapped(text: str) -> str:
    r"""``text`` without wrappers (``\textit{...}``, ``\mathbf{...}``) and a leading ``name =``.

    >>> _unwrapped("x = \\textbf{\\text{Evelyn}}")
    'Evelyn'
    """
    while match := _WRAPPER.fullmatch(text := text.strip()) or _NAMED.fullmatch(text):
        text = match.group(1)
    return text


def base_verdict(answer: str, gold: str) -> bool | None:
    """Numerals in a base, where math-verify is wrong: it drops the subscript, so it accepts
    ``20412_6`` for ``20412_5``. Two based numerals are equal iff their values are; a based numeral
    and a bare one iff the digits are (the bare one is read in the question's base). Else ``None``.

    >>> (base_verdict("20412_{6}", "20412_{5}"), base_verdict("20412", "20412_{5}"),
    ...  base_verdict("10_{2}", "2_{10}"))
    (False, True, True)
    >>> base_verdict("1357", "20412_{5}"), base_verdict("7", "8") is None, base_verdict("1200_{7}", "0.20")
    (False, True, False)
    >>> base_verdict("0.0011_{3}", "0.0011_{2}"), base_verdict("0.1_{2}", "0.5_{10}")
    (False, True)
    >>> base_verdict("1.1_{0}", "1011_{2}")  # no base 0: the texts differ
    False
    """
    a, g = base_numeral(answer), base_numeral(gold)
    if a is None and g is None:
        return None
    if a is not None and g is not None:
        try:
            return _numeral_value(*a) == _numeral_value(*g)
        except ValueError:  # a digit not valid in its base
            return a == g
    based, other = (a, gold) if a is not None else (g, answer)
    if not _BARE_NUMERAL.fullmatch(other):
        # math-verify reads a numeral in a base with decimal digits as those digits (`1200_{7}` is
        # 1200); where even that reading clearly differs from the other side, they are different.
        if based[0].lstrip("-").isdigit() and fast_verdict(based[0], other) is False:
            return False
        return None
    return based[0].lower() == other.lower()


_COMMA_DECIMAL = re.compile(r"-?\d+,(?:\d{1,2}|\d{4,})")  # `3,14`, `0,5`: not a thousands mark


def decimal_comma_verdict(answer: str, gold: str) -> bool | None:
    """``True`` for an answer written with a decimal comma against the same number written with a
    point: ``3,14`` for ``3.14`` (math-verify reads ``3,14`` as the set {3, 14}, which no single
    number equals). Else ``None``. Only the answer is read so: a gold such as ``8,12`` or ``0,1`` is a
    list in every dataset we know ("enter all the values, separated by commas").

    >>> decimal_comma_verdict("3,14", "3.14"), decimal_comma_verdict("0,50", "0.5")
    (True, True)
    >>> (decimal_comma_verdict("3,15", "3.14"), decimal_comma_verdict("1,000", "1.0"),
    ...  decimal_comma_verdict("3.4", "3,4"))
    (None, None, None)
    """
    if _COMMA_DECIMAL.fullmatch(answer) and "." in gold and _DECIMAL.fullmatch(gold):
        return True if fast_verdict(answer.replace(",", "."), gold) else None
    return None


_NUMBER_PERCENT = re.compile(r"(.+?)\s*\\?%")


def percent_verdict(answer: str, gold: str) -> bool | None:
    """``True`` for a percent and a plain number that is its value or its number of percent, exactly:
    ``7.2\\%`` and ``7.2`` or ``0.072`` (the gold of a question that asks for a percent may be written
    either way). math-verify reads ``X\\%`` as ``X/100`` and accepts ``X`` for it only when ``X`` is an
    integer: ``50\\%`` is ``50``, but ``12.5\\%`` is not ``12.5``. Else ``None``.

    >>> percent_verdict("12.5\\%", "12.5"), percent_verdict("7.2", "7.2\\%"), percent_verdict("1.5%", "0.015")
    (True, True, True)
    >>> percent_verdict("12.5\\%", "12.6") is None, percent_verdict("12.5", "12.5") is None
    (True, True)
    """
    for one, other in ((answer, gold), (gold, answer)):
        match = _NUMBER_PERCENT.fullmatch(one.strip())
        if match is None or _NUMBER_PERCENT.fullmatch(other.strip()):
            continue
        value, number = as_number(match.group(1)), as_number(other)
        if value is not None and number is not None and number[0] in (value[0], value[0] / 100):
            return True
    return None


# A decimal times a power of ten: `6.02 \times 10^{23}`, `2.75 \cdot 10^{11}`, `1.3\times10^{-5}`.
_SCIENTIFIC = re.compile(
    r"([+-]?(?:\d+\.\d*|\.\d+|\d+))\s*(?:\\times|\\cdot)\s*10\s*\^\s*(?:\{\s*([+-]?\d{1,3})\s*\}|(\d))"
)


def _scientific_value(text: str) -> Fraction | None:
    """The exact value of ``text`` written in scientific notation with a decimal point, else ``None``."""
    match = _SCIENTIFIC.fullmatch(text.strip())
    if match is None or "." not in match.group(1):
        return None
    return Fraction(match.group(1)) * Fraction(10) ** int(match.group(2) or match.group(3))


def scientific_verdict(answer: str, gold: str) -> bool | None:
    """``True`` for a decimal in scientific notation and a plain number (or another such decimal) of
    exactly the same value: ``6.02 \\times 10^{23}`` and ``602000000000000000000000``. math-verify reads
    the decimal as a float, whose binary error at that scale is far above its rounding to 6 places: it
    took 10 such pairs in 48 for different (mantissas 1.3 to 9.11, powers 10 to 30). Else ``None``: any
    other pair is left to the rules after this one, so that no tolerance is added.

    >>> (scientific_verdict("60200000000", "6.02 \\\\times 10^{10}"),
    ...  scientific_verdict("60.2 \\\\cdot 10^{9}", "6.02 \\\\times 10^{10}"))
    (True, True)
    >>> scientific_verdict("60200000001", "6.02 \\\\times 10^{10}"), scientific_verdict("602", "602")
    (None, None)
    """
    a, g = _scientific_value(answer), _scientific_value(gold)
    if a is None and g is None:
        return None
    if a is None:
        a = (as_number(answer) or (None, False))[0]
    if g is None:
        g = (as_number(gold) or (None, False))[0]
    return True if a is not None and a == g else None


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``(``, ``[`` and ``{`` in ``text``.

    >>> nesting_depth("\\\\left(\\\\frac{1}{2}, 3\\\\right)"), nesting_depth("((((1))))")
    (2, 4)
    """
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest


_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTER = re.compile(r"[A-Za-z]")
MAX_FREE_LETTERS = 12


def free_letters(text: str) -> int:
    """Letters outside LaTeX command names: what math-verify turns into symbols.

    >>> free_letters("\\\\frac{\\\\pi}{2} + x"), free_letters("I could not finish the computation")
    (1, 29)
    """
    return len(_LETTER.findall(_COMMAND.sub("", text)))


def reads_as_prose(answer: str, golds: tuple[str, ...] = ()) -> bool:
    """Whether ``answer`` has more than ``MAX_FREE_LETTERS`` free letters and more than twice as many
    as every gold: words, not mathematics. Such answers are wrong without evaluation.

    >>> (reads_as_prose("I could not finish the computation", ("\\\\cot x",)),
    ...  reads_as_prose("x^2 + 2xy + y^2"))
    (True, False)
    >>> reads_as_prose("\\\\text{Tuesday and Wednesday}", ("\\\\text{Monday and Wednesday}",))
    False
    """
    letters = free_letters(_TEXT_WRAPPER.sub(r"\1", answer))
    most = max((free_letters(_TEXT_WRAPPER.sub(r"\1", g)) for g in golds), default=0)
    return letters > max(MAX_FREE_LETTERS, 2 * most)


_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")


def answer_too_costly(answer: str, golds: tuple[str, ...] = ()) -> bool:
    """Whether ``answer`` is refused without evaluation: longer than ``MAX_ANSWER_CHARS`` (or 4 times
    the longest gold, if longer) or nested deeper than ``MAX_NESTING`` (or the deepest gold).

    >>> answer_too_costly("\\\\frac{1}{2}"), answer_too_costly("(" * 30 + "1" + ")" * 30)
    (False, True)
    >>> answer_too_costly("1+" * 400 + "1")
    True
    """
    longest = max((len(g) for g in golds), default=0)
    if len(answer) > max(MAX_ANSWER_CHARS, 4 * longest):
        return True
    deepest = max((nesting_depth(g) for g in golds), default=0)
    return nesting_depth(answer) > max(MAX_NESTING, deepest)
