"""Format rules: where a strict grader reads the answer, and which markers the format score counts.

A row's rules reach the rewards in one of three ways, in this order:

1. Explicitly, in the row columns ``answer_rule`` and ``format_markers`` (what prompt augmentation
   writes for every row, from the template it drew, whatever bank it came from).
2. As an object with ``answer`` and ``markers`` attributes (a `FormatRules`, or a template object).
3. As the name of a built-in template, looked up in `BUILTIN_FORMATS` (a fixed table, the same in
   every process; a custom template bank never changes it).

``None`` means the default rules: the last ``\\boxed{}``, no markers.

>>> resolve_rules("open-r1").answer, len(resolve_rules("open-r1").markers)
('tag', 4)
>>> resolve_rules(None) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ANSWER_RULES = ("boxed", "tag")


@dataclass(frozen=True)
class FormatRules:
    """The grading rules of one template.

    Attributes:
        answer: ``"boxed"`` (the last ``\\boxed{}``) or ``"tag"`` (the last ``\\boxed{}`` inside
            ``<answer>``).
        markers: Format markers, each expected exactly once in a completion (none: free-form, score 1).
    """

    answer: str = "boxed"
    markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.answer not in ANSWER_RULES:
            raise ValueError(f"answer rule must be one of {ANSWER_RULES}, got {self.answer!r}")
        object.__setattr__(self, "markers", tuple(self.markers))


_THINK_ANSWER = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
_THINK_ANSWER_BARE = ("<think>", "</think>", "<answer>", "</answer>")
_SOLUTION_CHECK = ("<solution>\n", "\n</solution>\n", "\n<check>\nLet's verify step by step", "\n</check>")
_FINAL_LINE = ("The final answer is:",)

# The rules of the built-in templates (prompt_aug/templates.yaml); tests/test_dropin.py checks that the
# two agree. Teacher variants drop the markers their prefill already holds.
BUILTIN_FORMATS: dict[str, FormatRules] = {
    "abel": FormatRules(),
    "simplerl": FormatRules(),
    "qwen-math": FormatRules(),
    "open-r1": FormatRules("tag", _THINK_ANSWER),
    "open-r1-teacher": FormatRules("tag", _THINK_ANSWER[1:]),
    "deepseek-r1": FormatRules("tag", _THINK_ANSWER_BARE),
    "deepseek-r1-teacher": FormatRules("tag", _THINK_ANSWER_BARE[1:]),
    "formal": FormatRules(),
    "lm_eval_prompt1": FormatRules("boxed", _FINAL_LINE),
    "lm_eval_prompt4": FormatRules("boxed", _FINAL_LINE),
    "lm_eval_prompt8": FormatRules(),
    "reflective": FormatRules("boxed", _SOLUTION_CHECK),
    "reflective-teacher": FormatRules("boxed", _SOLUTION_CHECK[1:]),
}


def resolve_rules(template: Any) -> Any:
    """The rules for ``template``: a built-in name, an object with ``answer``/``markers``, or ``None``.

    Raises:
        KeyError: For a name that is not built-in; the message says how to pass a custom template's rules.
    """
    if template is None or not isinstance(template, str):
        return template
    try:
        return BUILTIN_FORMATS[template]
    except KeyError:
        raise KeyError(
            f"template {template!r} is not a built-in template ({', '.join(BUILTIN_FORMATS)}); "
            "for a custom template pass its rules: the `answer_rule` and `format_markers` columns "
            "that prompt augmentation writes, or a FormatRules / template object"
        ) from None


def row_rules(
    n: int,
    template: list[Any] | None = None,
    answer_rule: list[str | None] | None = None,
    format_markers: list[Any] | None = None,
) -> list[Any]:
    """The rules of each of ``n`` rows from TRL's reward-function columns (see the module docstring).

    >>> row_rules(2, ["my-own", "my-own"], ["tag", "tag"], [["<answer>"], ["<answer>"]])[0]
    FormatRules(answer='tag', markers=('<answer>',))
    >>> row_rules(1, ["qwen-math"])
    ['qwen-math']
    >>> row_rules(1, ["open-r1"], answer_rule=["boxed"])[0].markers  # the template's markers fill the gap
    ('<think>\\n', '\\n</think>\\n', '\\n<answer>\\n', '\\n</answer>')
    """
    if answer_rule is None and format_markers is None:
        return list(template) if template is not None else [None] * n
    # One column without the other: a built-in template's rules fill the missing one, else the defaults.
    given = [BUILTIN_FORMATS.get(t) if isinstance(t, str) else None for t in template or [None] * n]
    rules = answer_rule if answer_rule is not None else [g.answer if g else None for g in given]
    markers = format_markers if format_markers is not None else [g.markers if g else None for g in given]
    for row, m in enumerate(markers):
        if isinstance(m, str):
            raise TypeError(
                f"format_markers: row {row} holds the text {m!r}, not a list of markers; give each row a "
                f"list, e.g. [{m!r}]"
            )
    return [
        FormatRules(r or "boxed", () if m is None else tuple(m)) for r, m in zip(rules, markers, strict=True)
    ]
