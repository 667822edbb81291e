"""Format-aware rewards for prompt-augmented GRPO: pure functions of text.

>>> from rewards import grade
>>> grade("... so the answer is \\\\boxed{12}.", "12").correct
True
"""

from .formats import BUILTIN_FORMATS, FormatRules
from .grading.extract import extract_lenient, extract_strict, normalize
from .grading.grade import Grade, format_score, grade, grade_batch
from .registry import REGISTRY, correctness_reward, format_reward, get_reward_funcs, strict_correctness_reward

__all__ = [
    "BUILTIN_FORMATS",
    "REGISTRY",
    "FormatRules",
    "Grade",
    "correctness_reward",
    "extract_lenient",
    "extract_strict",
    "format_reward",
    "format_score",
    "get_reward_funcs",
    "grade",
    "grade_batch",
    "normalize",
    "strict_correctness_reward",
]
