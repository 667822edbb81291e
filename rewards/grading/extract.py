"""Answer extraction and normalisation: pure functions of text.

Two rules read an answer out of a completion:

* **lenient** (the paper's training rule): cut at the first stop string, then take the Minerva
  form ``final answer is $X$. I hope`` (the content of a box in ``X``), else the last ``\\boxed{}``, else
  the rest of the sentence after the last "the answer is" / "final answer is" (up to a justification:
  ``7 because ...``, ``12, as required``; the next line if the phrase ends its line), else the last
  number (commas join only thousands groups: ``1,250``).
* **strict** (the evaluation rule): the last ``\\boxed{}`` (or ``\\fbox{}``); for tag templates it
  must sit inside the ``<answer>...</answer>`` block. No boxed answer means no answer.
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal
from typing import Any

STOP_STRINGS = ("</answer>", "<|im_end|>", "<|endoftext|>", "</s>", "[END]")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
# One `$...$` (an escaped `\$` inside is a dollar sign), so that a match never spans an earlier sentence.
_MINERVA = re.compile(r"final answer is \$((?:[^$\\]|\\.)+)\$\. I hope", re.DOTALL)
_ANSWER_IS = re.compile(r"(?:[Tt]he answer is|[Ff]inal answer is)")
_SENTENCE_END = re.compile(r"\.(?=\s|$)")  # a full stop, not a decimal point
# A full stop that ends an abbreviation, not the sentence (`St. Louis`, `e.g. 5`).
_ABBREVIATION = re.compile(r"\b(?:St|Mt|Ft|Dr|Mr|Mrs|Ms|Jr|Sr|No|Fig|vs|ca|approx|etc|e\.g|i\.e)$")
_ABBREVIATION_WINDOW = 16  # characters before a full stop that `_ABBREVIATION` reads (its longest is 6)
_NUMBER = re.compile(r"[-\u2212]?\d[\d,]*(?:\.\d+)?|[-\u2212]?\.\d+")  # U+2212 is the Unicode minus
_THOUSANDS_GROUPS = re.compile(r"\d{1,3}(?:,\d{3})+")
# Where a sentence after "the answer is" goes on to justify the answer (`7 because 2+3=5`, `12, as required`):
# a semicolon before a word that goes on (`; so`), not between parts (`x=1; y=2`), a word that gives a reason,
# or a comma before words in lower case (`, rounded to`), not before a name or a term (`AB=9, CD=4`).
_JUSTIFICATION = re.compile(
    r"(?<!\\);(?=\s*(?:so|therefore|thus|hence|then|the|this|that|it|we|here|note|since|because|as|which)\b)"
    r"|,?\s(?:because|since|as|which)\b|,\s+([a-z]{2,})(?=\s+[A-Za-z]|[\s.,;:!?*]*$)"
)
_LIST_WORDS = frozenset({"and", "or"})  # `1, 2, and 3` is one answer
_BRACKETS = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}
# Display delimiters around a line: `\[ 42 \]`, `\( x \)`, `$$`.
_LINE_DELIMITERS = re.compile(r"^\s*(?:\\\[|\\\(|\$+)|(?:\\\]|\\\)|(?<!\\)\$+)\s*$")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def cut_at_stop(text: str, stops: tuple[str, ...] = STOP_STRINGS) -> str:
    """Everything before the first stop string.

    >>> cut_at_stop("x \\\\boxed{1}</answer> \\\\boxed{2}")
    'x \\\\boxed{1}'
    """
    cut = len(text)
    for stop in stops:
        index = text.find(stop)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (brace-matched), or ``None``.

    >>> last_boxed(r"\\boxed{1} then \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    >>> last_boxed(r"\\boxed 7.") is None, last_boxed("no box") is None
    (False, True)
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start == -1:
        return None
    command = next(cmd for cmd in _BOX_COMMANDS if text.startswith(cmd, start))
    rest = text[start + len(command) :]
    if rest.startswith(" ") and not rest.lstrip().startswith("{"):
        # `\boxed 7` form: the argument is the next word
        word = rest.strip().split()
        return word[0].rstrip(".$") if word else None
    rest = rest.lstrip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:index]
    return None  # unbalanced: the box never closes


# A unit after a number, a closing brace or bracket or `\pi` (`9\pi \text{ cm}^2`, `\frac{\pi}{3}\text{rad}`,
# `12\text{ m/s}.`, `6.4 \times 10^{16} \text{ cm}^{-3}`, `(3, 4) \mathrm{~cm}`), at the end or before the
# comma or bracket that ends an element of a tuple, list or set (`(3\text{ cm}, 4\text{ cm})`), but not a
# time (`9\text{ a.m.}`), a constant (`3\mathrm{i}`, `2\pi\mathrm{e}`) or words that deny
# (`\sqrt{2}\text{ is not possible}`).
_DENIAL = r"(?![^{}]*\b(?:[Nn]o|[Nn]ot|[Nn]ever|[Nn]one|[Cc]annot|[Cc]an't)\b)"
_SPACE = r"(?:\s|~|\\ )*"  # spaces, ties (`5\mathrm{~cm}`) and `\ `
_UNIT = re.compile(
    r"(\d|\}|\\pi|(?<!\\)[)\]])"
    + _SPACE
    + r"\\(?:text|mbox|mathrm)\{"
    + _DENIAL
    + _SPACE
    + r"(?![ap]\.?\s*m\.?\s*\}|[ie]\s*\})[A-Za-z][A-Za-z. /]*\}(?:\^\{?-?\d\}?)?"
    + r"(?:[\s.]*$|(?=\s*(?:,|\)|\]|\\\})))"
)
# A note in parentheses after a value with digits, in words that say how it is given:
# `12.25 \text{(approx.)}`, `\frac{1}{2} \text{ (exact)}`; not one that says more (`7 \text{ (not exact)}`,
# `3 \text{ (or more)}`), nor one after a choice (`\textbf{(B)} \text{(approx.)}`: math-verify reads text).
_NOTE = re.compile(
    r"(\d|\}|\)|\]|\\pi|\\%)"
    + _SPACE
    + r"\\(?:text|mbox|mathrm)\{"
    + _SPACE
    + r"\(([A-Za-z .]*)\)\s*\}[\s.]*$"
)
_NOTE_WORDS = frozenset({
    "approx", "approximately", "approximate", "approximated", "about", "roughly", "exact", "exactly",
    "rounded", "simplified", "simplest", "form", "in", "to", "the", "a", "nearest", "whole", "number",
    "integer", "tenth", "hundredth", "thousandth", "decimal", "decimals", "place", "places", "one", "two",
    "three", "four", "significant", "figures", "digits", "final", "answer", "value",
})  # fmt: skip
# A reason in parentheses after a value (`12 \text{ (since the sum is even)}`, `\frac{1}{2} (because ...)`,
# written after the text wrappers go): it gives no other value. Not a condition or another value
# (`12 (if x > 0)`, `12 (or 13)`, `12 (as well as 13)`), and not one with brackets inside.
_REASON = re.compile(
    r"(\d|\}|\)|\]|\\pi|\\%)"
    + _SPACE
    + r"\(\s*(?:since|because|as(?!\s+well\b)|by|using|via)\b[^()\[\]]*\)[\s.]*$"
)
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
# Bare unit words after a value that math-verify's unit list misses (it joins `"integer" "point"` into one
# word) and Minerva's answer normalisation drops: `5 dollars`, `12 points`.
_BARE_UNIT = re.compile(r"(\d|\})\s*(?:dollars?|integers?|points?)\.?\s*$")
# Scale words multiply the number before them; they are not units. `3 \text{ million}` may answer a question
# that wants the full count (gold `3000000`) or one that counts in millions (`How many million tons...?`,
# gold `2.2`), so `normalize` keeps the word after the value, written as `SCALE_SUFFIX` writes it, and
# `scale_readings` gives both values. The word and any unit words after it (`3 \text{ million tons}`,
# `20 million dollars`) end the answer; words that deny (`\text{ million or not}`) keep it as it was.
SCALES = {"hundred": 2, "thousand": 3, "million": 6, "billion": 9, "trillion": 12}
SCALE_SUFFIX = "\\text{{ {}}}"  # filled with the word: `3\text{ million}`
_SCALE = re.compile(
    r"(?<=\d)"
    + _SPACE
    + r"(?:(\\(?:text|mbox|mathrm)\{)"
    + _SPACE
    + r")?(?i:("
    + "|".join(SCALES)
    + r"))s?(?![A-Za-z])"
    + r"[A-Za-z ./~]*+(?=(?:\}|\\ |\s|~|\.|\\(?:text|mbox|mathrm)\{[A-Za-z ./~]*+\}|\^\{?-?\d\}?)*+$)"
)
_SCALE_DENIAL = re.compile(r"\b(?:[Nn]o|[Nn]ot|[Nn]ever|[Nn]one|[Cc]annot|[Cc]an't)\b")
# What may come before a scale word: a number, alone or assigned (`x = 3`, `a_1 = 2.5`), in a wrapper
# that holds the word too or not (`\text{3 million}`).
_PLAIN_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_SCALED_VALUE = re.compile(
    r"(?:\\(?:text|mbox|mathrm)\{\s*)?(?:[A-Za-z](?:_\{[^{}]*\}|_[A-Za-z0-9])?\s*=\s*)?"
    + _PLAIN_NUMBER.pattern
)
_SCALED_NUMBER = re.compile(r"(" + _PLAIN_NUMBER.pattern + r")\\text\{ (" + "|".join(SCALES) + r")\}")
# Degrees Celsius or Fahrenheit (`1950^\circ C`, `{ }^{\circ} \mathrm{C}`, `25°F`, `100~^{\circ}\mathrm{C}`)
# where a value ends: a unit, not the constant C. The braces of `\text{ }^\circ` are the command's, not an
# empty group's. Group 1 or 2 names the scale. The scale that ends the whole answer is kept, written as
# `TEMPERATURE_SUFFIXES` writes it, and compared (`split_temperature`); one inside a tuple is dropped. A match
# starts only where a run of spaces starts and reads the run in one loop, so that a long run costs linear time
# (tried from each of its spaces, with the run split between two loops, it costs cubic time).
_TEMPERATURE = re.compile(
    r"(?<![\s~\\])(?:\s|~|\\ )*+(?:(?<![A-Za-z])\{\s*\}\s*)?(?:\^\s*\{?\s*\\circ\s*\}?|°)\s*"
    r"(?:\\(?:text|mathrm|mbox)\s*\{\s*([CF]|Celsius|Fahrenheit)\s*\}"
    r"|([CF]|Celsius|Fahrenheit)(?![A-Za-z]))"
    r"(?=\s*(?:[,;)\]]|\\\}|$))"
)
# How `normalize` writes the scale of an answer that ends in one: after the value, as `100^{\circ}\mathrm{C}`.
# `normalize` drops every other degree sign, so no other normalised text ends so.
TEMPERATURE_SUFFIXES = {"C": "^{\\circ}\\mathrm{C}", "F": "^{\\circ}\\mathrm{F}"}
# `\degree` (gensymb's degree sign), with a `^` before it or not (`90^\degree`, `90^{\degree}`), written
# as `^{\circ}` is, so that every rule for that sign reads it.
_DEGREE_COMMAND = re.compile(r"(?:\^\s*\{\s*\\degree\s*\}|\^\s*\\degree|\\degree)(?![A-Za-z])")
# Thousands groups set apart by a space, `\ ` or a tie (`1 000 000`, `12\ 345`; `\,` and `\;` between
# digits are read before, by `_thin_spaced`): a run of digit groups so separated, read by `_spaced_thousands`.
_SPACED_DIGITS = re.compile(r"(?<!\d)\d+(?:(?:\s|\\ |~)\d+)+")
_DIGIT_SPACE = re.compile(r"\s|\\ |~")
_COMMA_DIGIT = re.compile(r",\d")  # after a run of groups: the run is part of a longer number or list
# Thousands groups after commas (`1,000`, `2,050,300`), read by `_zero_led_thousands`.
_COMMA_GROUPS = re.compile(r"(?<![\d.,])[1-9]\d{0,2}(?:,\d{3})+(?!\d|,\d)")
# A number whose digits may be set apart by thin or medium spaces (`1\,000\,000`, `12\;345`, `1\,2\,3`,
# `3.141\,592\,65`): its whole part, then its decimals; read by `_thin_spaced`.
_THIN_SPACED_DIGITS = re.compile(r"(?<![\d.])(\d+(?:\\[,;]\s*\d+)*)(\.\d+(?:\\[,;]\s*\d+)*)?")
_THIN_SPACE = re.compile(r"\\[,;]\s*")
# `29,\!322`, `12,\! 345` and `1{,}000` are thousands marks.
_THOUSANDS_MARK = re.compile(r"(\d)(?:,\\!|\{,\})\s*(?=\d{3}(?!\d))")
# `x > 1,000`: after a relation, `1,000` is one number (math-verify reads `x > 1, 000` as a set).
_RELATION_THOUSANDS = re.compile(r"((?:[<>=]|\\[gl]eq?|\\[gl]t|\\neq?)\s*-?)(\d{1,3}(?:,\d{3})+)(?![\d,])")
# Relation commands, written as math-verify writes them back (`\geq` -> `>=`): the same relation is
# then the same text, even where math-verify reads it only as text (`x \neq \pm 1`).
_RELATION_COMMAND = re.compile(r"\\(geqslant|leqslant|geq|leq|neq|ge|le|ne|gt|lt)(?![A-Za-z])")
_RELATION_TEXT = {
    "geqslant": ">=",
    "leqslant": "<=",
    "geq": ">=",
    "leq": "<=",
    "ge": ">=",
    "le": "<=",
    "neq": "!=",
    "ne": "!=",
    "gt": ">",
    "lt": "<",
}
# A sentence that opens the box and introduces the answer: `\text{The vector is } M`, `\text{so } 3`,
# `\text{Final answer: } 3`, `\text{all } x \geq 3` (read by `_introduces_answer`). Any other words stay, so
# that the answer is compared with them: `\text{not } 3`, `\text{half of } 3`, `\text{up to } 3` are not 3.
# Words followed by a relation are a label, kept with its value: `\text{Area } = 25` reads as `Area = 25`.
_LEADING_SENTENCE = re.compile(
    r"^\\(?:text|textbf|mbox|mathrm)\{\s*([A-Za-z][A-Za-z ,.:]*[\s:])\}\s*(?=.*[\d\\=<>])"
    r"(?!\s*(?:[=<>]|\\(?:[gl]eq?|[gl]t|neq?)(?![A-Za-z])))"
)
# Words that deny or doubt what follows, wherever they stand in the sentence (`\text{not } 3`, `NO 3`).
_DENIAL_WORDS = frozenset({
    "no", "not", "never", "none", "nothing", "or", "nor", "neither", "either", "cannot", "false", "wrong",
    "incorrect", "impossible", "undefined", "invalid", "except", "excluding", "but", "without", "unless",
    "if", "suppose", "assuming", "whether",
})  # fmt: skip
# Words that bound, change or tie to something else the number after them when they end the sentence
# (`half of 3`, `up to 3`, `at least 3`, `twice 3`, `divisible by 3`, `in base 3`); not inside it (`The number
# of primes less than fifty is 15`).
_TIED_ENDINGS = frozenset({
    "of", "to", "by", "from", "per", "over", "under", "above", "below", "beyond", "after", "before", "until",
    "since", "base", "mod", "modulo", "each", "every", "power", "degree", "degrees", "order", "than", "least",
    "most", "between", "within", "half", "twice", "double", "triple", "thrice", "plus", "minus", "times",
    "negative", "multiple", "multiples", "square", "cube", "root", "roots", "reciprocal", "inverse", "factor",
    "factors", "divisor", "divisors",
})  # fmt: skip


def _introduces_answer(words: str) -> bool:
    """Whether ``words`` (opening the box) only introduce the answer (``so``, ``Final answer:``, ``The
    greater root is``, ``Approximately``, ``He can buy``): no word that denies it, and no last word that
    bounds or changes the number after it or ties it to something else.

    >>> [_introduces_answer(w) for w in ("so ", "Final answer: ", "The area is approximately ", "She has ")]
    [True, True, True, True]
    >>> [_introduces_answer(w) for w in ("not ", "half of ", "less than or equal to ", "NO ", "at least ")]
    [False, False, False, False, False]
    """
    tokens = re.findall(r"[a-z]+", words.lower())
    if not tokens or any(t in _DENIAL_WORDS for t in tokens):
        return False
    return tokens[-1] not in _TIED_ENDINGS


# Words (an introduction, as `_introduces_answer` reads it) and `\mathbf{v} =` before a matrix or vector:
# the matrix is the answer.
_MATRIX_START = re.compile(r"\\begin\{[pbBvV]?matrix\}")
_MATRIX_PREAMBLE = re.compile(
    r"([A-Za-z ,.:]*?)\s*(?:(?:\\mathbf|\\vec|\\boldsymbol)?\s*\{?\s*[A-Za-z]\s*\}?\s*=)?\s*"
)
# `x \approx 2.24`, `so x \approx 2.24`: a variable on the left, so the value is on the right.
_VARIABLE_BEFORE_APPROX = re.compile(r"(?:.*\s)?[A-Za-z](?:_\{[^{}]*\}|_[A-Za-z0-9])?\s*")
_COMMAND_NAME = re.compile(r"\\[A-Za-z]+")
# `\left(`, `\right.` (the `.` is the null delimiter), but not `\leftarrow` or `\rightarrow`.
_SIZED_DELIMITER = re.compile(r"\\(?:left|right)(?![A-Za-z])\.?")
_PHANTOM = re.compile(r"\\phantom\s*(?:\{[^{}]*\}|\\[A-Za-z]+|[^\s{}])")
_ARG = r"(\{[^{}]*\}|\\[A-Za-z]+|[0-9A-Za-z])"
_FRAC_SHORTHAND = re.compile(r"\\frac\s*" + _ARG + r"\s*" + _ARG)
_SQRT_SHORTHAND = re.compile(r"\\sqrt\s*(?=[^\s{\[])(\\[A-Za-z]+|[0-9A-Za-z])")
_ASSIGNMENT = re.compile(r"[A-Za-z](?:_\{[^{}=]*\}|_[A-Za-z0-9])?\s*=\s*([^=]+)")
# The digits of a numeral in a base (`20412`, `-0.0011`); `normalize` writes the base braced, `20412_{5}`,
# which is how `rewards.grading.fastpath.base_numeral` reads it back.
BASE_NUMERAL_DIGITS = r"-?[0-9A-Fa-f]+(?:\.[0-9A-Fa-f]+)?"
_BASE_NUMERAL = re.compile(rf"({BASE_NUMERAL_DIGITS})_\{{?(\d{{1,2}})\}}?")


def _strip_text_wrappers(answer: str) -> str:
    # Units after a number (`5\text{ cm}`, `34\text{ sq. units}`) go, but not times (`9\text{ a.m.}`), and
    # so does a note on how the value is given (`\text{ (approx.)}`); other \text{X} keep X.
    note = _NOTE.search(answer)
    if note and _is_note(note.group(2)) and any(c.isdigit() for c in answer[: note.start(1) + 1]):
        answer = answer[: note.end(1)]
    for _ in range(3):  # a compound unit: `15000 \text{ kcal m}^{-2} \text{yr}^{-1}`
        answer, units = _UNIT.subn(r"\1", answer)
        if not units:
            break
    answer = _TEXT.sub(r"\1", answer)
    return _BARE_UNIT.sub(r"\1", _REASON.sub(r"\1", answer))


def _without_scale(answer: str) -> tuple[str, str | None]:
    """``answer`` without the scale word that ends it after a number (`_SCALE`), and the word, in lower
    case; ``(answer, None)`` where no scale word follows a number alone or assigned (`_SCALED_VALUE`)."""
    match = _SCALE.search(answer)
    if (
        match is None
        or _SCALE_DENIAL.search(answer, match.start())
        or not _SCALED_VALUE.fullmatch(answer[: match.start()].strip())
    ):
        return answer, None
    wrapper = match.group(1) or ""  # `3 \text{ million tons}` -> `3\text{}`: its closing brace stays
    return answer[: match.start()] + wrapper + answer[match.end() :], match.group(2).lower()


def scale_readings(answer: str | None) -> list[str] | None:
    """The two readings of a normalised number with a scale word (``3\\text{ million}``, as `normalize`
    writes ``3 \\text{ million}``): its value, then the number as written (the count in that scale, as a
    question may ask it). ``None`` for any other answer.

    >>> scale_readings(normalize(r"3 \\text{ million}")), scale_readings(normalize("2.5 thousand tons"))
    (['3000000', '3'], ['2500', '2.5'])
    >>> scale_readings("3000000") is None, scale_readings(None) is None
    (True, True)
    """
    match = _SCALED_NUMBER.fullmatch(answer) if answer else None
    if match is None:
        return None
    value = Decimal(match.group(1).replace(",", "")).scaleb(SCALES[match.group(2)])
    return [format(value.normalize(), "f"), match.group(1)]


def _is_note(words: str) -> bool:
    found = set(words.lower().replace(".", " ").split())
    return bool(found) and found <= _NOTE_WORDS


def _free_letters(text: str) -> bool:
    return any(c.isalpha() for c in _COMMAND_NAME.sub("", text))


def _braced(argument: str) -> str:
    return argument if argument.startswith("{") else "{" + argument + "}"


def _spaced_thousands(text: str) -> str:
    """``text`` with each number written in thousands groups set apart by a space, ``\\ `` or a tie read as
    one number: a first group of one to three digits, led by no zero, then groups of exactly three
    (``1 000 000``, ``12\\ 345``). A run with any other group is a list and stays (``1 2 3``, ``10 20``,
    ``1 234 5``), and so does a run after a letter, digit, point, comma or ``^`` (``x1 000``, ``0.5 100``).

    >>> _spaced_thousands("1 000 000"), _spaced_thousands("12\\\\ 345.5"), _spaced_thousands("1~000 cm")
    ('1000000', '12345.5', '1000 cm')
    >>> _spaced_thousands("1 2 3"), _spaced_thousands("10 20"), _spaced_thousands("x1 000")
    ('1 2 3', '10 20', 'x1 000')
    """

    def join(run: re.Match[str]) -> str:
        groups = _DIGIT_SPACE.split(run.group())
        before = text[run.start() - 1 : run.start()]
        if (
            groups[0][0] == "0"
            or len(groups[0]) > 3
            or any(len(group) != 3 for group in groups[1:])
            or (before and (before.isalnum() or before in "_.,^"))
            or _COMMA_DIGIT.match(text, run.end())
        ):
            return run.group()
        return "".join(groups)

    return _SPACED_DIGITS.sub(join, text)


def _thin_spaced(text: str) -> str:
    """``text`` with each number's digits set apart by ``\\,`` or ``\\;`` read as `_spaced_thousands` reads
    digits set apart by spaces: a whole part in thousands groups (a first group led by no zero, then groups
    of exactly three; the first may be longer where a thousands mark was read before, ``1{,}000\\,000``) is
    one number, and any other is a list, its thin spaces plain spaces; the decimals after a point
    (``3.141\\,592\\,65``) are one run of digits.

    >>> _thin_spaced("1\\,000\\,000"), _thin_spaced("12\\; 345.5"), _thin_spaced("1\\,2\\,3")
    ('1000000', '12345.5', '1 2 3')
    >>> _thin_spaced("3.141\\,592\\,65"), _thin_spaced("1000\\,000"), _thin_spaced("x\\,dx")
    ('3.14159265', '1000000', 'x\\\\,dx')
    """

    def read(number: re.Match[str]) -> str:
        groups = _THIN_SPACE.split(number.group(1))
        thousands = len(groups) == 1 or (groups[0][0] != "0" and all(len(group) == 3 for group in groups[1:]))
        whole = "".join(groups) if thousands else " ".join(groups)
        return whole + _THIN_SPACE.sub("", number.group(2) or "")

    return _THIN_SPACED_DIGITS.sub(read, text)


def _zero_led_thousands(text: str) -> str:
    """``text`` with each number written in thousands groups after commas, one of them led by a zero
    (``1,000``, ``2,050,300``), written without its commas. A tuple's element is not written ``000`` or
    ``050``, so such a run is one number inside brackets too, where math-verify reads ``(1,000)`` as the
    pair (1, 0). A run with no such group stays: ``(4,112)`` and ``(1,500)`` may be pairs (MATH's golds
    write pairs so).

    >>> _zero_led_thousands("(1,000)"), _zero_led_thousands("[2,050,300, 7)"), _zero_led_thousands("(4,112)")
    ('(1000)', '[2050300, 7)', '(4,112)')
    """
    return _COMMA_GROUPS.sub(
        lambda run: run.group().replace(",", "") if ",0" in run.group() else run.group(), text
    )


def _without_temperatures(answer: str) -> tuple[str, str | None]:
    """``answer`` without its temperature scales (`_TEMPERATURE`), and the scale (``"C"`` or ``"F"``) of
    the one that ends it, if one does (what follows it is at most ``,``, ``;``, ``.`` and spaces)."""
    end = len(answer.rstrip(" ,;."))
    ending: list[str] = []

    def drop(match: re.Match[str]) -> str:
        if match.end() >= end:
            ending.append((match.group(1) or match.group(2))[0])
        return ""

    return _TEMPERATURE.sub(drop, answer), (ending[-1] if ending else None)


def split_temperature(text: str) -> tuple[str, str | None]:
    """A normalised answer's value and the temperature scale it ends in (``"C"`` or ``"F"``, as
    `normalize` writes it), else ``None``.

    >>> split_temperature(normalize("100^\\\\circ C")), split_temperature(normalize("25°F"))
    (('100', 'C'), ('25', 'F'))
    >>> split_temperature("90")
    ('90', None)
    """
    for scale, suffix in TEMPERATURE_SUFFIXES.items():
        if text.endswith(suffix) and len(text) > len(suffix):
            return text[: -len(suffix)], scale
    return text, None


def scales_differ(answer: str, gold: str) -> bool:
    """Whether two normalised answers both end in a temperature scale and the scales differ:
    ``100^\\circ C`` is not ``100^\\circ F``. A value written without a scale is compared by its value
    alone (a gold's unit need not be written, nor need an answer's).

    >>> scales_differ(normalize("100^\\\\circ C"), normalize("100^\\\\circ F"))
    True
    >>> scales_differ(normalize("100^\\\\circ C"), normalize("100°C")), scales_differ("9", normalize("9°F"))
    (False, False)
    """
    scale, other = split_temperature(answer)[1], split_temperature(gold)[1]
    return scale is not None and other is not None and scale != other


def normalize(answer: str) -> str:
    """Canonical text for an extracted answer: no ``$``, ``\\text{}`` wrappers, units, degree signs
    (``^\\circ``, ``°``, ``\\degree``), ``\\left``/``\\right``, ``\\phantom``, thousands marks
    (``29,\\!322``, ``1 000``, ``1\\,000``, and ``1,000`` where a group is led by a zero), ``\\approx`` and
    what follows it, trailing period or comma; a temperature scale that ends the answer is kept after the
    value, as ``100^{\\circ}\\mathrm{C}`` (`split_temperature`), and so is a scale word after a number, as
    ``3\\text{ million}`` (`scale_readings`); ``\\dfrac``/``\\tfrac`` become ``\\frac``;
    shorthand ``\\frac12``, ``\\sqrt2`` get braces; ``x = 5`` and ``a_1 = 5`` become ``5`` (but
    ``y = 2x + 3`` stays an equation); a numeral in a base is written ``N_{b}``; relation commands are
    written as math-verify writes them (``\\geq`` -> ``>=``, ``\\neq`` -> ``!=``); a sentence opening the
    box (``\\text{The vector is }``) and words before a matrix go; ``x \\approx 2.24`` (a variable on the
    left) becomes ``2.24``.

    >>> normalize(r"$\\dfrac{1}{2}$.")
    '\\\\frac{1}{2}'
    >>> normalize(r"12\\text{ cm}"), normalize(r"x = 5"), normalize(r"90^\\circ")
    ('12', '5', '90')
    >>> (normalize(r"\\frac \\pi4 + \\sqrt2"), normalize(r"\\frac{1}{29,\\!322}"),
    ...  normalize(r"m_{\\max} = n^2"))
    ('\\\\frac{\\\\pi}{4} + \\\\sqrt{2}', '\\\\frac{1}{29322}', 'n^2')
    >>> (normalize(r"34\\text{ sq. units}"), normalize(r"9\\text{ a.m.}"), normalize(r"\\text{(E)},"),
    ...  normalize("-37_8"))
    ('34', '9 a.m', '(E)', '-37_{8}')
    >>> normalize(r"\\$\\dfrac23 \\approx \\$0.67")
    '\\\\frac{2}{3}'
    >>> (normalize(r"y = 2x + 3"), normalize(r"x \\geq 3"), normalize(r"12,\\! 345"),
    ...  normalize(r"\\text{so } x \\approx 2.24"))
    ('y = 2x + 3', 'x >= 3', '12345', '2.24')
    >>> normalize(r"T = 1950 { }^{\\circ} \\mathrm{C}"), normalize("1 000 000"), normalize("(1,000)")
    ('1950^{\\\\circ}\\\\mathrm{C}', '1000000', '(1000)')
    >>> normalize(r"\\$3 \\text{ million tons}"), normalize("5 thousand"), normalize(r"12\\text{ m}")
    ('3\\\\text{ million}', '5\\\\text{ thousand}', '12')
    """
    answer = answer.strip().replace("\n", " ")
    answer = answer.replace("\\$", "").replace("$", "")
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = _DEGREE_COMMAND.sub(r"^{\\circ}", answer)
    answer = _SIZED_DELIMITER.sub("", answer)
    answer = _thin_spaced(_THOUSANDS_MARK.sub(r"\1", answer))
    answer = answer.replace("\\!", "").replace("\\,", "").replace("\\;", "")
    answer = _spaced_thousands(_zero_led_thousands(answer))
    answer = _PHANTOM.sub("", answer)
    answer, scale = _without_temperatures(answer)
    answer = re.sub(r"\^\s*\{?\\circ\}?", "", answer).replace("°", "")
    answer = answer.strip()
    lead = _LEADING_SENTENCE.match(answer)
    if lead and _introduces_answer(lead.group(1)):
        answer = answer[lead.end() :]
    answer, scale_word = _without_scale(answer)
    answer = _strip_text_wrappers(answer)
    answer = _FRAC_SHORTHAND.sub(lambda m: "\\frac" + _braced(m.group(1)) + _braced(m.group(2)), answer)
    answer = _SQRT_SHORTHAND.sub(lambda m: "\\sqrt{" + m.group(1) + "}", answer)
    answer = _RELATION_COMMAND.sub(lambda m: " " + _RELATION_TEXT[m.group(1)] + " ", answer)
    answer = _RELATION_THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), answer)
    answer = re.sub(r"\s+", " ", answer).strip() if "  " in answer else answer.strip()
    matrix = _MATRIX_START.search(answer)
    if matrix and matrix.start() > 0:
        preamble = _MATRIX_PREAMBLE.fullmatch(answer[: matrix.start()])
        if preamble and (not preamble.group(1).strip() or _introduces_answer(preamble.group(1) + " ")):
            answer = answer[matrix.start() :]
    if answer.startswith("\\approx"):
        answer = answer[len("\\approx") :].strip()
    elif "\\approx" in answer:
        left, _, right = answer.partition("\\approx")
        # `x \approx 2.24`: the value; `\frac{2}{3} \approx 0.67`: the exact value is the answer.
        answer = right.strip() if _VARIABLE_BEFORE_APPROX.fullmatch(left) and right.strip() else left.strip()
    # A single-variable assignment (possibly subscripted): the value is the answer. But an equation
    # whose right side has variables (`y = 2x + 3`) stays an equation: it is a line, which another
    # form of it (`2x - y + 3 = 0`) equals; math-verify compares it with a bare `2x + 3` by its right side.
    match = _ASSIGNMENT.fullmatch(answer)
    if match and ("_" in answer.split("=")[0] or not _free_letters(match.group(1))):
        answer = match.group(1).strip()
    answer = answer.rstrip(". ,").strip()
    match = _BASE_NUMERAL.fullmatch(answer)
    if match:
        answer = f"{match.group(1)}_{{{match.group(2)}}}"
    answer = number_text(answer)  # 5e-05 in positional digits, as a gold written so is (math-verify reads e)
    if scale_word and not scale and _PLAIN_NUMBER.fullmatch(answer):
        return answer + SCALE_SUFFIX.format(scale_word)
    return answer + TEMPERATURE_SUFFIXES[scale] if scale and answer else answer


def _sentence_end(line: str) -> int:
    """Where the first sentence of ``line`` ends: its first full stop that ends no abbreviation, else the
    end of the line. Only the few characters before each full stop are read (the longest abbreviation
    and the character before it), so that a line of many abbreviations costs linear time.

    >>> _sentence_end("7. Then 8."), _sentence_end("St. Louis, e.g. here. No"), _sentence_end("No. " * 3)
    (1, 20, 12)
    """
    for stop in _SENTENCE_END.finditer(line):
        if not _ABBREVIATION.search(line, max(0, stop.start() - _ABBREVIATION_WINDOW), stop.start()):
            return stop.start()
    return len(line)


def _without_justification(sentence: str) -> str:
    """``sentence`` up to its first justification (`_JUSTIFICATION`) that follows a complete answer: some
    text, every bracket closed and every ``$`` paired. A comma before a word that gives no reason cuts only
    after an answer with a digit or a command (`Monday, Tuesday` may be the answer), and never before
    ``and``/``or`` (`1, 2, and 3`).

    >>> (_without_justification("7 because 2+3=5"), _without_justification("12, as required"),
    ...  _without_justification("(1, 2) since x > 0"), _without_justification("1, 2, and 3"))
    ('7', '12', '(1, 2)', '1, 2, and 3')
    >>> _without_justification(r"\\{1, 2\\}; so"), _without_justification("Monday, Tuesday")
    ('\\\\{1, 2\\\\}', 'Monday, Tuesday')
    >>> _without_justification("AB=9, CD=4"), _without_justification("0.33, rounded to 2 places")
    ('AB=9, CD=4', '0.33')
    """
    depth, dollars, scanned = 0, 0, 0
    text = numeric = False  # what comes before the cut holds a letter, digit or command; a digit or command
    for cut in _JUSTIFICATION.finditer(sentence):
        for index in range(scanned, cut.start()):  # each character is read once: linear in the sentence
            char = sentence[index]
            depth += _BRACKETS.get(char, 0)
            dollars += char == "$" and (index == 0 or sentence[index - 1] != "\\")
            numeric = numeric or char.isdigit() or char == "\\"
            text = text or numeric or char.isalpha()
        scanned = cut.start()
        if depth != 0 or dollars % 2 or not text:
            continue
        word = cut.group(1)
        if word is None or (numeric and word.lower() not in _LIST_WORDS):
            return sentence[:scanned]
    return sentence


def _after_answer_is(text: str) -> str | None:
    """The answer written after "the answer is" / "final answer is" (at the start of ``text``): the rest of
    its sentence, or, where the phrase ends its line, the first sentence of the next line with more than
    display delimiters; up to a justification (`_without_justification`), without delimiters and markdown
    emphasis (``**7**``). ``None`` where nothing follows.

    >>> _after_answer_is(": 7 because 2+3=5."), _after_answer_is(":\\n\\n42"), _after_answer_is(" **7**.")
    ('7', '42', '7')
    >>> _after_answer_is("\\n\\\\[ 42 \\\\]"), _after_answer_is(":\\n$$\\n\\n") is None
    ('42', True)
    """
    for line in text.lstrip(" :").split("\n"):
        answer = _without_justification(line[: _sentence_end(line)])
        answer = _LINE_DELIMITERS.sub("", answer).strip().strip("*").strip()
        if answer:
            return answer
    return None


def _last_number(text: str) -> str | None:
    """The last number in ``text``; commas join its digits only as well-formed thousands groups
    (``1,250``), else the digits after the last comma are the number (``(3,4)``: 4).

    >>> _last_number("we get 3 apples and 1,250 pears"), _last_number("the point (3,4)"), _last_number("12,5")
    ('1250', '4', '5')
    >>> _last_number("so \\u22121,000.5, done"), _last_number("none") is None
    ('-1000.5', True)
    """
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    whole, point, fraction = numbers[-1].replace("\u2212", "-").rstrip(",").partition(".")
    sign, digits = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    if "," in digits and not _THOUSANDS_GROUPS.fullmatch(digits):
        sign, digits = "", digits.rsplit(",", 1)[1]  # a minus belongs to the first number of the list
    return sign + digits.replace(",", "") + point + fraction


def extract_lenient(completion: str) -> str | None:
    """The paper's lenient training-time extraction (see module docstring), normalised.

    >>> extract_lenient("so the final answer is $42$. I hope it is correct.")
    '42'
    >>> extract_lenient("The answer is 7.<|im_end|>The answer is 8.")
    '7'
    >>> extract_lenient("we get 3 apples and 1,250 pears")
    '1250'
    >>> extract_lenient("The final answer is 5. I hope it is correct.")
    '5'
    >>> extract_lenient(r"The final answer is $\\boxed{20412_6}$. I hope it is correct.")
    '20412_{6}'
    """
    text = cut_at_stop(completion)
    answer = None
    found = _MINERVA.findall(text)
    if found:
        boxed = last_boxed(found[-1])
        answer = found[-1] if boxed is None else boxed
    elif (boxed := last_boxed(text)) is not None:
        answer = boxed
    elif matches := list(_ANSWER_IS.finditer(text)):
        answer = _after_answer_is(text[matches[-1].end() :])
    if answer is None:
        answer = _last_number(text)
        if answer is None:
            return None
    answer = normalize(answer)
    return answer or None


def extract_strict(completion: str, answer_rule: str = "boxed") -> str | None:
    """The strict extraction: the last boxed answer; for ``answer_rule="tag"``, inside ``<answer>``.

    >>> extract_strict(r"<answer> \\boxed{3} </answer>", "tag")
    '3'
    >>> extract_strict(r"\\boxed{3} <answer> 3 </answer>", "tag") is None
    True
    """
    text = cut_at_stop(completion, tuple(s for s in STOP_STRINGS if s != "</answer>"))
    if answer_rule == "tag":
        blocks = _ANSWER_BLOCK.findall(text)
        if not blocks:
            return None
        text = blocks[-1]
    boxed = last_boxed(text)
    if boxed is None:
        return None
    return normalize(boxed) or None


MAX_JOINED_BOXES = 8


def final_boxes(completion: str, strict: bool = False, answer_rule: str = "boxed") -> list[str]:
    """The normalised contents of the boxes in the paragraph of the last box, in order: the reading of
    ``\\boxed{1} and \\boxed{2}`` as one answer (an option of `rewards.grading.grade.grade`, off by default:
    the paper reads the last box only). Where the rule reads no box, or the paragraph holds more than
    ``MAX_JOINED_BOXES`` boxes, the list is empty.

    >>> final_boxes("First \\\\boxed{9}.\\n\\nThe roots are \\\\boxed{1} and \\\\boxed{-2}.")
    ['1', '-2']
    >>> final_boxes("<answer> \\\\boxed{3} </answer> \\\\boxed{4}", strict=True, answer_rule="tag")
    ['3']
    """
    if strict:
        text = cut_at_stop(completion, tuple(s for s in STOP_STRINGS if s != "</answer>"))
        if answer_rule == "tag":
            blocks = _ANSWER_BLOCK.findall(text)
            text = blocks[-1] if blocks else ""
    else:
        text = cut_at_stop(completion)
        if _MINERVA.search(text):
            return []  # the lenient rule reads the Minerva sentence, not a box
    last = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if last == -1:
        return []
    text = text[text.rfind("\n\n", 0, last) + 1 :]
    if sum(text.count(cmd) for cmd in _BOX_COMMANDS) > MAX_JOINED_BOXES:
        return []
    starts = sorted(i for cmd in _BOX_COMMANDS for i in _occurrences(text, cmd))
    contents = []
    for start, end in zip(starts, starts[1:] + [len(text)]):
        boxed = last_boxed(text[start:end])  # the text from one box to the next holds that box alone
        if boxed is not None and (answer := normalize(boxed)):
            contents.append(answer)
    return contents


def _occurrences(text: str, needle: str) -> list[int]:
    found, index = [], text.find(needle)
    while index != -1:
        found.append(index)
        index = text.find(needle, index + 1)
    return found


# One way to split the digits (`\d+(?:\.\d*)?`, not `\d+\.?\d*`): a long run of digits with no exponent
# then fails in linear time, not quadratic.
_EXPONENT = re.compile(r"[+-]?(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)")


def number_text(value: Any) -> str:
    """A gold given as a number, as text in positional notation; anything else as ``str`` gives it. Python
    writes ``5e-05`` and ``1e+16``, which a grader reads with Euler's e; a whole float loses its ``.0``.
    Text in that exponent form (as a column of mixed numbers and text becomes) is rewritten the same way.

    >>> number_text(5e-05), number_text(1e16), number_text(142.0), number_text(0.1), number_text("2e-3")
    ('0.00005', '10000000000000000', '142', '0.1', '0.002')
    >>> number_text(7), number_text("e-7"), number_text("x^2"), len(number_text(10**400))
    ('7', 'e-7', 'x^2', 401)
    """
    if isinstance(value, str):
        found = _EXPONENT.fullmatch(value.strip())
        if not found or abs(int(found.group(2))) > 100:
            return value
        return format(Decimal(value.strip()).normalize(), "f")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return str(value)
    if float(value).is_integer():
        return str(int(value))
    return format(Decimal(str(value)), "f")  # str: the shortest digits that round-trip (float32's too)
