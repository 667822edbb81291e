"""Grading one completion: correctness and format score, following its template's rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .extract import extract_lenient, extract_strict
from .verify import is_equivalent, parse_gold


@dataclass(frozen=True)
class Grade:
    """The verdict on one completion.

    Attributes:
        correct: The extracted answer equals the gold.
        format_score: The template's format score in [0, 1].
        extracted: The normalised answer read from the completion, or ``None``.
        gold_ok: ``False`` when the gold itself cannot be parsed (then ``correct`` is ``False`` and a
            reward function should return ``None`` rather than a score).
    """

    correct: bool
    format_score: float
    extracted: str | None
    gold_ok: bool = True


def _resolve(template: Any) -> Any:
    if template is None or not isinstance(template, str):
        return template
    from prompt_aug.templates import get_template  # the bank lives with the templates

    return get_template(template)


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


def grade(completion: str, gold: str | list[str], template: Any = None, *, strict: bool = False) -> Grade:
    """Grade ``completion`` against ``gold`` under ``template`` (a name, a `Template`, or ``None``).

    ``gold`` may be a list of acceptable answers (Minerva, OlympiadBench): any match counts.

    Lenient mode (default) is the paper's training rule; strict mode requires the template's format
    (a boxed answer, inside ``<answer>`` for tag templates). With no template, the last boxed answer is
    read.

    >>> grade("so \\\\boxed{\\\\dfrac{1}{2}}", "\\\\frac12").correct
    True
    >>> g = grade("<think>\\nx\\n</think>\\n<answer>\\n7\\n</answer>", "7", "open-r1", strict=True)
    >>> g.correct, g.format_score
    (False, 1.0)
    """
    template = _resolve(template)
    if strict:
        extracted = extract_strict(completion, template.answer if template is not None else "boxed")
    else:
        extracted = extract_lenient(completion)
    score = format_score(completion, template)
    golds = [parse_gold(str(g)) for g in (gold if isinstance(gold, (list, tuple)) else [gold])]
    golds = [g for g in golds if g is not None]
    if not golds:
        return Grade(correct=False, format_score=score, extracted=extracted, gold_ok=False)
    correct = extracted is not None and any(is_equivalent(extracted, g) for g in golds)
    return Grade(correct=correct, format_score=score, extracted=extracted)
