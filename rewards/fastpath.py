"""In-process fast path and guards: settle easy answer/gold pairs without math-verify.

Most MATH golds are integers and most extracted answers are plain numbers, so most pairs can be
decided exactly here, in microseconds, with no parsing into SymPy. The fast path answers ``True``,
``False`` or ``None`` ("don't know: ask math-verify"). It only answers where it provably agrees with
math-verify as we call it (``float_rounding=6``, ``strict=True``, both sides normalised the same way):

* identical normalised strings are equal (math-verify parses both the same way; the caller must know
  the gold itself is parseable);
* two exact numbers (integers with optional leading zeros or well-formed thousands separators,
  ``\\frac{p}{q}``, ``p/q``) are compared exactly, as math-verify compares SymPy rationals;
* when a decimal is involved, equal values with at most 6 decimals are equal, and values more than
  ``1e-5`` apart are different (math-verify rounds to 6 places); anything in between is left to
  math-verify. Magnitudes are capped so that float precision never matters.

The guards (`answer_too_costly`) refuse answers that are far longer or more deeply nested than any
gold: math-verify's parser is super-linear in nesting depth (12 nested parentheses already cost about
a second), and no real answer needs it.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Integers: plain digits (leading zeros are fine: AIME's `025`) or groups of three after a comma.
_INT = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
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


def fast_verdict(answer: str, gold: str) -> bool | None:
    """Whether normalised ``answer`` equals normalised ``gold``, where that is easy; else ``None``.

    Precondition for a ``True`` from string equality: math-verify can parse ``gold``.

    >>> fast_verdict("025", "25"), fast_verdict("\\\\frac{2}{4}", "0.5"), fast_verdict("7", "8")
    (True, True, False)
    >>> fast_verdict("0.3333333", "\\\\frac{1}{3}") is None  # math-verify rounds: leave it to it
    True
    >>> fast_verdict("\\\\sqrt{8}", "2\\\\sqrt{2}") is None
    True
    """
    if answer == gold and answer:
        return True
    a, g = as_number(answer), as_number(gold)
    if a is None or g is None:
        return None
    (a_value, a_decimal), (g_value, g_decimal) = a, g
    if not (a_decimal or g_decimal):
        return a_value == g_value  # exact rationals: math-verify compares them exactly too
    if abs(a_value) >= DECIMAL_MAGNITUDE or abs(g_value) >= DECIMAL_MAGNITUDE:
        return None
    if a_value == g_value:
        places = max(_decimal_places(answer), _decimal_places(gold))
        return True if places <= DECIMAL_PLACES else None
    return False if abs(a_value - g_value) > DECIMAL_GAP else None


def _decimal_places(text: str) -> int:
    return len(text) - text.index(".") - 1 if "." in text else 0


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
