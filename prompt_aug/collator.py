"""The augmenting collator: rewrite each row of a generation round under a drawn template.

GRPO scores every completion against the other completions of its group, so all rollouts of a
question must see the same template, including when the group is split across processes. TRL's
`RepeatSampler` hands each row to the collator `num_generations` times, possibly on different ranks,
so the draw cannot be random per sample (nor use Python's per-process salted ``hash()``). We draw
from a stable hash of ``(seed, epoch, uid)``: the same on every rank, new each epoch, and
reproduced exactly on resume.
"""

from __future__ import annotations

import bisect
import hashlib
from itertools import accumulate
from typing import Any

from .templates import DEFAULT_EVAL_TEMPLATE, Template

REQUIRED_COLUMNS = ("question", "uid")


def stable_uniform(seed: int, epoch: int, uid: str) -> float:
    """A number in [0, 1) that depends only on ``(seed, epoch, uid)``, identical across processes.

    >>> stable_uniform(0, 0, "q1") == stable_uniform(0, 0, "q1")
    True
    """
    digest = hashlib.blake2b(f"{seed}\x1f{epoch}\x1f{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class PromptAugmentationCollator:
    """Rewrites rows' ``prompt`` under a template drawn per (seed, epoch, uid) and sets ``template``.

    Args:
        templates: The templates to draw from.
        tokenizer: Renders prompts through its chat template.
        weights: Sampling weights (normalised or not); uniform if ``None``.
        seed: The draw seed (use the training seed).
        eval_template: The one template used in eval mode (``training=False``).

    Rows must carry ``question`` and ``uid``; other columns pass through unchanged.
    """

    def __init__(
        self,
        templates: list[Template],
        tokenizer: Any,
        weights: list[float] | None = None,
        seed: int = 0,
        eval_template: Template | None = None,
    ) -> None:
        if not templates:
            raise ValueError("PromptAugmentationCollator needs at least one template")
        weights = list(weights) if weights is not None else [1.0] * len(templates)
        if len(weights) != len(templates):
            raise ValueError(f"{len(weights)} weights for {len(templates)} templates")
        self.templates = list(templates)
        self.tokenizer = tokenizer
        self.seed = seed
        total = float(sum(weights))
        self._cumulative = [w / total for w in accumulate(weights)]
        if eval_template is None:
            by_name = {t.name: t for t in templates}
            eval_template = by_name.get(DEFAULT_EVAL_TEMPLATE, templates[0])
        self.eval_template = eval_template

    def draw(self, uid: str, epoch: int = 0) -> Template:
        """The template for row ``uid`` in ``epoch``."""
        u = stable_uniform(self.seed, epoch, str(uid))
        index = min(bisect.bisect_right(self._cumulative, u), len(self.templates) - 1)
        return self.templates[index]

    def __call__(self, rows: list[dict[str, Any]], epoch: int = 0, training: bool = True) -> list[dict[str, Any]]:
        """Return new rows with ``prompt`` (rendered text) and ``template`` (its name) set."""
        out = []
        for row in rows:
            missing = [c for c in REQUIRED_COLUMNS if c not in row]
            if missing:
                raise KeyError(f"row is missing column(s) {missing}; it has {sorted(row)}")
            template = self.draw(row["uid"], epoch) if training else self.eval_template
            out.append({**row, "prompt": template.render(row["question"], self.tokenizer), "template": template.name})
        return out
