"""Token-balanced micro-batches: the rows of one optimizer step dealt out so each micro-batch costs about the
same, each keeping TRL's row count.

TRL cuts a shuffled round into micro-batches of ``per_device_train_batch_size`` rows, so one micro-batch may
hold the round's longest completions and the next only short ones: packed calls then range from a few hundred
to many thousand tokens, each length a new shape, the longest setting the peak memory. Within one optimizer
step the rows may be dealt out again (where the loss does not depend on which micro-batch a row is in; see
`prompt_aug.padding.regroup`). `balanced_groups` deals them by a cost of ``linear_weight * L + L**2`` per row
of L real tokens (the linear layers follow L, attention over a sequence L squared, as in verl's sequence
balancing), longest first, each to the cheapest micro-batch that still has room (LPT with a row count per
micro-batch). Where prompts are shared (`prompt_aug.packing`), rows with one prompt are dealt together, as
far as they fit. Deterministic, so every process of a run deals its rows the same way, and the row counts,
hence the number of calls, are TRL's.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

# Per-token weight of the linear layers against attention's L^2 (verl's seqlen_balancing uses 24576).
LINEAR_WEIGHT = 24576


def row_cost(length: int, linear_weight: float = LINEAR_WEIGHT) -> float:
    """The work of one row of ``length`` real tokens: ``linear_weight * length + length ** 2``."""
    return linear_weight * length + length * length


def shared_prefix(prompt: int) -> int:
    """How many tokens of a prompt of ``prompt`` tokens the rows sharing it run once (`prompt_aug.packing`'s
    shared prompts): all but the last, which each row runs as the start of its own sequence; none for a
    prompt of 1 token or none.

    >>> shared_prefix(5), shared_prefix(1)
    (4, 0)
    """
    return max(prompt - 1, 0)


def shared_cost(length: int, prompt: int, linear_weight: float = LINEAR_WEIGHT) -> float:
    """The work of a row of ``length`` real tokens whose prompt of ``prompt`` tokens another row of its call
    already runs: its own ``length - shared_prefix(prompt)`` tokens, each attending to up to ``length`` keys
    (`row_cost` when nothing is shared)."""
    own = length - shared_prefix(prompt)
    return linear_weight * own + own * length


def balanced_groups(
    lengths: Sequence[int],
    sizes: Sequence[int],
    linear_weight: float = LINEAR_WEIGHT,
    prompts: Sequence[tuple[Hashable, int]] | None = None,
) -> list[list[int]]:
    """Row indices for each of ``len(sizes)`` micro-batches, micro-batch b getting exactly ``sizes[b]`` rows,
    with the largest micro-batch cost (`row_cost` summed) kept low.

    Rows go in order of cost, highest first (ties: lower index first), each to the micro-batch with the lowest
    cost so far among those with room (ties: lower micro-batch first), and are listed in the order dealt.
    ``sum(sizes)`` must equal ``len(lengths)``.

    ``prompts`` (per row: a key naming its prompt, and the prompt's length) deals the rows that share a
    prompt as one bundle, since a call runs a shared prompt once: costed as its longest row in full and the
    others by `shared_cost`, placed whole where the micro-batch has room; where it has less, its longest rows
    go there and the rest is dealt again as a bundle of its own. Without ``prompts`` every row is a bundle.

    >>> balanced_groups([10, 1, 9, 2], [2, 2], linear_weight=0)
    [[0, 1], [2, 3]]
    >>> shared = [("a", 5), ("a", 5), ("b", 5), ("b", 5)]  # without them: [[0, 2], [1, 3]]
    >>> balanced_groups([9, 9, 9, 9], [2, 2], linear_weight=0, prompts=shared)
    [[0, 1], [2, 3]]
    """
    if sum(sizes) != len(lengths):
        raise ValueError(f"{len(lengths)} rows cannot fill micro-batches of {list(sizes)} rows")
    costs = [row_cost(int(length), linear_weight) for length in lengths]
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    bundles: dict[Hashable, list[int]] = {}
    for i in order:  # each bundle's rows highest cost first
        bundles.setdefault(prompts[i][0] if prompts is not None else i, []).append(i)

    def cost(rows: list[int]) -> float:
        if prompts is None:
            return sum(costs[i] for i in rows)
        shared = (shared_cost(int(lengths[i]), prompts[i][1], linear_weight) for i in rows[1:])
        return costs[rows[0]] + sum(shared)

    queue = [(-cost(rows), rows[0], rows) for rows in bundles.values()]
    heapq.heapify(queue)
    groups: list[list[int]] = [[] for _ in sizes]
    totals = [0.0] * len(sizes)
    while queue:
        _, _, rows = heapq.heappop(queue)
        open_groups = [b for b in range(len(sizes)) if len(groups[b]) < sizes[b]]
        b = min(open_groups, key=lambda g: (totals[g], g))
        placed, rest = rows[: sizes[b] - len(groups[b])], rows[sizes[b] - len(groups[b]) :]
        groups[b].extend(placed)
        totals[b] += cost(placed)
        if rest:
            heapq.heappush(queue, (-cost(rest), rest[0], rest))
    return groups


def spread(
    lengths: Sequence[int], groups: Sequence[Sequence[int]], linear_weight: float = LINEAR_WEIGHT
) -> float:
    """The largest group cost over the mean group cost (1.0: perfectly balanced, or no groups)."""
    totals = [sum(row_cost(int(lengths[i]), linear_weight) for i in group) for group in groups]
    mean = sum(totals) / len(totals) if totals else 0.0
    return max(totals) / mean if mean else 1.0
