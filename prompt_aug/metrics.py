"""Per-template metrics of a generation round: pure functions of the round's gathered values.

The trainer gathers each row's template name, rewards, completion length and truncation from every process
and adds what these functions return to TRL's metric buffer, which averages them at the next log.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def template_rows(names: list[str]) -> dict[str, torch.Tensor]:
    """Row indices of each template, in sorted template order.

    >>> {k: v.tolist() for k, v in template_rows(["b", "a", "b"]).items()}
    {'a': [1], 'b': [0, 2]}
    """
    rows: dict[str, list[int]] = defaultdict(list)
    for index, name in enumerate(names):
        rows[name].append(index)
    return {name: torch.tensor(indices) for name, indices in sorted(rows.items())}


def per_template_metrics(
    names: list[str],
    rewards: torch.Tensor | None,
    reward_columns: dict[str, int | None],
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    kept: torch.Tensor | None = None,
) -> dict[str, float]:
    """``templates/<name>/<metric>`` of gathered rows.

    ``rewards`` is the (rows x reward functions) matrix TRL trains on (NaN where a function gave None);
    ``reward_columns`` maps a metric name (``accuracy``, ``format``, each reward function's name) to its
    column, or ``None`` when no reward function gives it. Besides those: ``mean_length``,
    ``truncated_ratio``, ``count`` and, with ``kept`` (bool per row), ``kept``.

    >>> rewards, lengths, cut = torch.tensor([[1.0], [0.0], [1.0]]), torch.tensor([4.0, 6, 2]), torch.zeros(3)
    >>> m = per_template_metrics(["a", "a", "b"], rewards, {"accuracy": 0}, lengths, cut)
    >>> m["templates/a/accuracy"], m["templates/a/mean_length"], m["templates/b/count"]
    (0.5, 5.0, 1.0)
    """
    out: dict[str, float] = {}
    for name, rows in template_rows(names).items():
        prefix = f"templates/{name}"
        for metric, column in reward_columns.items():
            if column is not None and rewards is not None:
                out[f"{prefix}/{metric}"] = torch.nanmean(rewards[rows, column]).item()
        out[f"{prefix}/mean_length"] = lengths[rows].mean().item()
        out[f"{prefix}/truncated_ratio"] = truncated[rows].mean().item()
        out[f"{prefix}/count"] = float(len(rows))
        if kept is not None:
            out[f"{prefix}/kept"] = float(kept[rows].sum())
    return out
