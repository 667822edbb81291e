"""Padding-free training passes, kept exact: length grouping within an optimizer step; trimming.

TRL 1.16 pads every row of a generation round to the round's longest prompt (on the left) and longest
completion (on the right), and runs the old-log-prob pass and every training micro-batch at that width.
Three things remove most of that padding without changing the update:

* `regroup`: within the micro-batches that accumulate into one optimizer step, rows are ordered by length
  before they are cut into micro-batches of the same size. No row moves to another optimizer step.
* `trim`: a micro-batch is cut to its own longest prompt and completion. Dropped columns are padding in
  every row, which the attention mask and the loss mask already ignore; the kept tokens keep their
  relative positions (RoPE is relative), so a row's log-probabilities agree to float rounding.
* `chunked_forward`: a forward pass (a micro-batch's, or the no-grad old-log-prob pass over a round) is run
  as chunks of rows of similar length (`plan_chunks`), each trimmed; the per-token outputs are put back at
  full width. Each row's values do not depend on the rows it runs with, so this is exact for every loss.

Pure torch, no TRL: `prompt_aug.trainer` and `bench/gpu_round.py` (which runs where TRL is not installed)
share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# Left-padded (B, P) tensors.
PROMPT_KEYS = ("prompt_ids", "prompt_mask")
# Right-padded (B, C) tensors over the completion; `importance_sampling_ratio` may also be (B, 1).
COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
    "tool_mask",
)
# One value per row.
ROW_KEYS = ("advantages", "template_index")
# Keys of a micro-batch that `trim` and `regroup` know how to handle; a batch with any other key (images,
# token type ids) is left as TRL built it.
KNOWN_KEYS = frozenset(PROMPT_KEYS + COMPLETION_KEYS + ROW_KEYS + ("num_items_in_batch",))


def can_trim(batch: dict) -> bool:
    """Whether every key of ``batch`` is one `trim` and `regroup` know (no images, no token type ids)."""
    return "prompt_mask" in batch and "completion_mask" in batch and set(batch) <= KNOWN_KEYS


def row_lengths(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row: prompt plus completion (a completion whose mask TRL zeroed counts 0)."""
    return prompt_mask.sum(dim=1) + completion_mask.sum(dim=1)


def trim(batch: dict) -> dict:
    """``batch`` cut to its own longest prompt (left) and completion (right); other values unchanged.

    Widths are read off ``prompt_mask`` (ones at the right of each row) and ``completion_mask`` (ones at the
    left). A completion never drops below one column, so ``logits_to_keep`` stays positive.
    """
    prompt_width = batch["prompt_mask"].size(1)
    completion_width = batch["completion_mask"].size(1)
    keep_prompt = int(batch["prompt_mask"].sum(dim=1).max().item()) if prompt_width else 0
    keep_completion = max(1, int(batch["completion_mask"].sum(dim=1).max().item()))
    keep_completion = min(keep_completion, completion_width)
    out = dict(batch)
    for key in PROMPT_KEYS:
        if out.get(key) is not None:
            out[key] = out[key][:, prompt_width - keep_prompt :]
    for key in COMPLETION_KEYS:
        value = out.get(key)
        if isinstance(value, torch.Tensor) and value.ndim == 2 and value.size(1) == completion_width:
            out[key] = value[:, :keep_completion]
    return out


def optimizer_step_segments(
    step: int, steps_per_generation: int, num_iterations: int, gradient_accumulation_steps: int
) -> list[list[int]]:
    """The buffered micro-batches of a round that always share an optimizer step, as runs of indices.

    TRL replays the round's ``steps_per_generation`` micro-batches ``num_iterations`` times from micro-step
    ``step`` on, and steps the optimizer every ``gradient_accumulation_steps`` micro-steps. Micro-batches
    ``i`` and ``j`` share a segment when they fall in the same optimizer step in every pass, so rows may
    move between them without moving to another optimizer step.
    """
    keys = [
        tuple(
            (step + it * steps_per_generation + j) // gradient_accumulation_steps
            for it in range(num_iterations)
        )
        for j in range(steps_per_generation)
    ]
    segments: list[list[int]] = []
    for j, key in enumerate(keys):
        if segments and keys[segments[-1][-1]] == key:
            segments[-1].append(j)
        else:
            segments.append([j])
    return segments


def _cat(batches: Sequence[dict]) -> dict:
    out = {}
    for key, value in batches[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            out[key] = torch.cat([b[key] for b in batches], dim=0)
        else:
            out[key] = value  # a scalar shared by the round (num_items_in_batch) or None
    return out


def _take(batch: dict, rows: torch.Tensor) -> dict:
    return {k: v[rows] if isinstance(v, torch.Tensor) and v.ndim > 0 else v for k, v in batch.items()}


def regroup(
    micro_batches: Sequence[dict], segments: Sequence[Sequence[int]], sort: bool = True
) -> list[dict]:
    """Micro-batches with rows ordered by length (longest first) inside each segment, each then trimmed.

    ``micro_batches`` are TRL's buffered micro-batches of one round (equal sizes, the round's widths);
    ``segments`` cover their indices (see `optimizer_step_segments`). Each micro-batch keeps its size, and
    each row stays in its segment. With ``sort=False`` rows stay where they are and each is only trimmed.
    """
    out: list[dict] = list(micro_batches)
    for segment in segments:
        if not sort or len(segment) == 1:
            for j in segment:
                out[j] = trim(micro_batches[j])
            continue
        sizes = [len(micro_batches[j]["completion_mask"]) for j in segment]
        joined = _cat([micro_batches[j] for j in segment])
        lengths = row_lengths(joined["prompt_mask"], joined["completion_mask"])
        order = torch.sort(lengths, descending=True, stable=True).indices
        start = 0
        for j, size in zip(segment, sizes, strict=True):
            out[j] = trim(_take(joined, order[start : start + size]))
            start += size
    return out


def plan_chunks(lengths: torch.Tensor, prompt: torch.Tensor, max_tokens: int, overhead: int = 0) -> list[int]:
    """Row counts of consecutive chunks of rows that run the fewest tokens, padding included.

    ``lengths`` are the rows' completion lengths and ``prompt`` their prompt lengths, both in the order the
    rows will be cut (longest first). A chunk of rows i..j-1 runs (j - i) x (its longest prompt + its longest
    completion) tokens, plus ``overhead`` (what one more forward call costs, in tokens); no chunk may run more
    than ``max_tokens`` (a chunk of one row always may).
    """
    c, p = lengths.tolist(), prompt.tolist()
    rows = len(c)
    best = [0.0] + [float("inf")] * rows
    cut = [0] * (rows + 1)
    for j in range(1, rows + 1):
        top_p = top_c = 0
        for i in range(j - 1, -1, -1):  # the chunk i..j-1, grown to the left
            top_p, top_c = max(top_p, p[i]), max(top_c, c[i])
            tokens = (j - i) * (top_p + top_c)
            if tokens > max_tokens and i < j - 1:
                break
            value = best[i] + tokens + overhead
            if value < best[j]:
                best[j], cut[j] = value, i
    sizes, j = [], rows
    while j > 0:
        sizes.append(j - cut[j])
        j = cut[j]
    return sizes[::-1]


def chunked_forward(
    score: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor | None, ...]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    max_tokens: int,
    overhead: int = 0,
    rows_per_chunk: int | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """Per-token outputs of the last ``logits_to_keep`` columns, run in trimmed chunks of similar length.

    ``score(ids, mask, keep)`` runs the model on a chunk and returns (rows, keep) tensors (log-probs,
    entropies; ``None`` for one not computed), 0 where the mask is 0 as TRL's fused head gives them.
    ``input_ids`` is ``cat(prompt, completion)``, prompts left-padded and completions right-padded. Rows
    are sorted by length and cut by `plan_chunks` (at most ``max_tokens`` per chunk, ``overhead`` tokens
    per call); each chunk is trimmed to its own widths, and the results are put back in the original row
    order at full width (0 beyond a chunk's width, where its rows are padding). Each row's values are
    those of the padded call, to float rounding; gradients flow back through them. With ``rows_per_chunk``,
    the sorted rows are cut into chunks of that many rows instead, so the number of calls is fixed by the
    row count (several processes must make the same number of calls when a model's forward communicates).
    """
    prompt_width = input_ids.size(1) - logits_to_keep
    prompt_mask, completion_mask = attention_mask[:, :prompt_width], attention_mask[:, prompt_width:]
    prompt_lengths, completion_lengths = prompt_mask.sum(dim=1), completion_mask.sum(dim=1)
    order = torch.sort(prompt_lengths + completion_lengths, descending=True, stable=True).indices
    if rows_per_chunk is not None:
        rows_total = input_ids.size(0)
        sizes = [min(rows_per_chunk, rows_total - s) for s in range(0, rows_total, rows_per_chunk)]
    else:
        sizes = plan_chunks(
            completion_lengths[order].cpu(), prompt_lengths[order].cpu(), max_tokens, overhead
        )
    outs: list[torch.Tensor | None] | None = None
    start = 0
    for size in sizes:
        rows = order[start : start + size]
        start += size
        keep_prompt = int(prompt_lengths[rows].max())
        keep_completion = min(logits_to_keep, max(1, int(completion_lengths[rows].max())))
        cols = slice(prompt_width - keep_prompt, prompt_width + keep_completion)
        results = score(input_ids[rows, cols], attention_mask[rows, cols], keep_completion)
        if outs is None:
            outs = [None if r is None else r.new_zeros(input_ids.size(0), logits_to_keep) for r in results]
        for out, result in zip(outs, results, strict=True):
            if out is not None:
                out[rows, :keep_completion] = result
    assert outs is not None, "chunked_forward needs at least one row"
    return tuple(outs)


def real_token_share(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Real tokens over processed tokens, for (prompt_mask, completion_mask) pairs of the batches run."""
    real = sum(int(p.sum() + c.sum()) for p, c in batches)
    processed = sum(p.numel() + c.numel() for p, c in batches)
    return real / processed if processed else 1.0


def long_tailed_lengths(rows: int, cap: int, generator: torch.Generator) -> list[int]:
    """Completion lengths like a paper round's, for benchmarks: one row in 16 (at random) at ``cap``, the
    rest exponential with mean ``cap / 5`` (clipped to 1 .. cap - 1), so the mean is about ``cap / 4``."""
    lengths = (torch.empty(rows).exponential_(generator=generator) * cap / 5).long().clamp(1, cap - 1)
    lengths[torch.randperm(rows, generator=generator)[: max(1, rows // 16)]] = cap
    return lengths.tolist()
