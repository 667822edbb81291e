"""Building the tests' micro-batches: masks in TRL's layout for rows of given lengths."""

from __future__ import annotations

import torch


def padded_masks(
    prompt_lengths: list[int], completion_lengths: list[int], width_p: int, width_c: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's masks for rows of these lengths: prompts padded on the left to ``width_p``, completions on the
    right to ``width_c``."""
    rows = len(prompt_lengths)
    prompt_mask = torch.zeros(rows, width_p, dtype=torch.long)
    completion_mask = torch.zeros(rows, width_c, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lengths, completion_lengths, strict=True)):
        prompt_mask[i, width_p - p :] = 1
        completion_mask[i, :c] = 1
    return prompt_mask, completion_mask
