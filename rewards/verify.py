"""Answer equivalence: the one place that calls math-verify.

``parse_gold`` turns a gold answer into math-verify's parsed form once per distinct gold (cached);
``is_equivalent`` compares an extracted answer against it. Both answer and gold are wrapped in
``\\boxed{}`` and compared with float rounding 6 in strict mode, the paper's setting.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from math_verify import LatexExtractionConfig, parse, verify

_EXTRACTION = [LatexExtractionConfig(boxed_match_priority=0)]
_TIMEOUT_S = 5

# math-verify logs the whole input on failures; keep that out of training logs.
for _name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)


def _timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def parse_gold(gold: str) -> tuple[Any, ...] | None:
    """Parsed gold answer, or ``None`` if math-verify cannot read it.

    >>> parse_gold("\\\\frac{1}{2}") is not None, parse_gold("") is None
    (True, True)
    """
    text = str(gold).strip()
    if not text:
        return None
    parsed = parse(f"\\boxed{{{text}}}", extraction_config=_EXTRACTION, parsing_timeout=_timeout())
    return tuple(parsed) if parsed else None


def is_equivalent(answer: str, gold_parsed: tuple[Any, ...]) -> bool:
    """Whether the extracted ``answer`` equals the parsed gold (math-verify, rounding 6, strict)."""
    parsed = parse(f"\\boxed{{{answer}}}", extraction_config=_EXTRACTION, parsing_timeout=_timeout())
    if not parsed:
        return False
    return bool(verify(list(gold_parsed), parsed, float_rounding=6, strict=True, timeout_seconds=_timeout()))
