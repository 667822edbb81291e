"""Per-template metrics of a generation round.

`TemplateMetrics` gathers each row's template name, rewards, completion length, truncation and n-gram loop
from every process, and each template's token-weighted entropy over an optimizer step, and adds them to TRL's
metric buffer, which averages them at the next log. The functions below it are pure functions of the
gathered values.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from accelerate.utils import gather_object

from rewards.registry import CORRECTNESS_REWARDS, format_reward
from rewards.repetition import ends_in_loop

from .records import ACCURACY_KEY, GENERATED


class TemplateMetrics:
    """``templates/<name>/*``, ``completions/accuracy`` and ``completions/repetition_ratio`` of a trainer's
    rounds.

    Beside TRL's ``entropy``, ``reward`` and ``completions/*``, per template: ``templates/<name>/accuracy``,
    ``/format``, ``/mean_length``, ``/truncated_ratio``, ``/count``, ``/entropy`` and ``/repetition``, and
    ``templates/<name>/rewards/<reward function name>`` for every reward function (named as in TRL's
    ``rewards/<reward function name>/mean``, e.g. ``correctness_reward``); with dynamic sampling also
    ``templates/<name>/kept``. Overall: ``completions/accuracy`` (the share graded right) and
    ``completions/repetition_ratio`` (completions ending in an n-gram loop).

    Args:
        names: Every template a row may carry (the training bank and the evaluation template); a row's index
            into them travels with it, as ``template_index``, to the loss, where its entropy is summed. None
            (prompt augmentation off, rows without a template): the overall metrics only.
    """

    def __init__(self, names: list[str]) -> None:
        self.index = {name: i for i, name in enumerate(dict.fromkeys(names))}
        # Per-template [entropy sum, token count] over the optimizer step's micro-batches so far.
        self._entropy_window: torch.Tensor | None = None

    def row_index(self, rows: list[dict[str, Any]], device: Any) -> torch.Tensor:
        """Each row's template index (-1 for a template not in the bank)."""
        return torch.tensor([self.index.get(row["template"], -1) for row in rows], device=device)

    def log_round(
        self, trainer: Any, rows: list[dict[str, Any]], output: dict[str, Any], rewards: Any, mode: str
    ) -> None:
        """The metrics of one scored round (TRL's ``output``), gathered from every process; per template
        only where there are templates (``rows`` then carry theirs)."""
        accelerator = trainer.accelerator
        mask, ids = output["completion_mask"], output["completion_ids"]
        lengths = mask.sum(dim=1)
        # Last generated token; a row whose mask TRL zeroed (mask_truncated_completions) was truncated.
        last = ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ended = torch.isin(last, torch.tensor(ending_ids(trainer), device=ids.device)) & (lengths > 0)
        full = torch.where(lengths > 0, lengths, torch.full_like(lengths, trainer.max_completion_length))
        names = gather_object([row["template"] for row in rows]) if self.index else None
        rewards = rewards.cpu() if rewards is not None else None
        gathered = accelerator.gather(full.float()).cpu(), accelerator.gather((~ended).float()).cpu()
        self.append(trainer, names, rewards, *gathered, mode)
        # Over each completion's own tokens (``full``): a loop cut at the length limit is the common collapse,
        # and mask_truncated_completions zeroes its mask.
        self.append_repetition(trainer, names, accelerator.gather(loop_flags(ids, full)).cpu(), mode)

    def append_repetition(
        self, trainer: Any, names: list[str] | None, looping: torch.Tensor, mode: str
    ) -> None:
        """The collapse watch's ``completions/repetition_ratio`` and ``templates/<name>/repetition``: the
        share of gathered rows (``looping``, 1.0 per row ending in an n-gram loop) that loop, overall and per
        template (``names``, per row; None: overall only)."""
        metrics = trainer.metric_buffer(mode)
        metrics["completions/repetition_ratio"].append(looping.mean().item())
        for name, where in template_rows(names or []).items():
            metrics[f"templates/{name}/repetition"].append(looping[where].mean().item())

    def append(
        self, trainer: Any, names: list[str] | None, rewards: torch.Tensor | None, lengths: torch.Tensor,
        truncated: torch.Tensor, mode: str, kept: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """Per-template metrics of gathered rows (`per_template_metrics`): ``accuracy`` (the share right, also
        under a correctness reward mapped to other scores), ``format``, each reward function's mean as
        ``rewards/<function>``, and with ``kept`` (bool per row) ``templates/<name>/kept``; and the round's
        share right as `ACCURACY_KEY` (``kept`` given: over every generated row, under `GENERATED`). ``names``
        None: the round's share alone."""
        funcs, buffer = trainer.reward_funcs, trainer.metric_buffer(mode)
        columns = {
            "accuracy": None,
            "format": reward_column(funcs, format_reward),
            # under rewards/, so that a function named like a metric of ours (count, format) is not mixed in
            **{f"rewards/{name}": column for column, name in enumerate(trainer.reward_func_names)},
        }
        scores = correctness_scores(funcs)
        if scores is not None and rewards is not None:
            column, right, wrong = scores
            # 1 right, 0 wrong, NaN ungraded: correctness_pm5's +5 / -5 read as the share right
            share = (rewards[:, column] - wrong) / (right - wrong)
            rewards = torch.cat([rewards, share.unsqueeze(1)], dim=1)
            columns["accuracy"] = rewards.shape[1] - 1
            if not share.isnan().all():  # the round's share; under dynamic sampling (``kept``) all generated
                key = (GENERATED if kept is not None else "") + ACCURACY_KEY
                buffer[key].append(torch.nanmean(share).item())
        if names is None:
            return
        for key, value in per_template_metrics(names, rewards, columns, lengths, truncated, kept).items():
            buffer[key].append(value)

    def add_entropy(self, trainer: Any, entropies: torch.Tensor, mask: torch.Tensor, inputs: dict) -> None:
        """Add a micro-batch's per-token entropies to its templates' sums; at the optimizer step's end (or in
        eval) log ``templates/<name>/entropy``. Summed over the step's micro-batches (token-weighted), so the
        value does not depend on how its rows were grouped into micro-batches."""
        if "template_index" not in inputs:
            return
        mode = "train" if trainer.model.training else "eval"
        sums = grouped_token_sums(entropies, mask, inputs["template_index"], len(self.index))
        self._entropy_window = sums if self._entropy_window is None else self._entropy_window + sums
        if mode == "eval" or trainer.accelerator.sync_gradients:
            sums = trainer.accelerator.reduce(self._entropy_window, reduction="sum").cpu()
            self._entropy_window = None
            for name, i in self.index.items():
                if sums[1, i] > 0:
                    trainer.metric_buffer(mode)[f"templates/{name}/entropy"].append(
                        (sums[0, i] / sums[1, i]).item()
                    )


def ending_ids(trainer: Any) -> list[int]:
    """The tokens a completion that was not cut at the length limit ends with: the stop tokens and the pad
    token, as TRL's ``completions/clipped_ratio`` counts them."""
    pad = trainer.text_tokenizer.pad_token_id
    return [*trainer.eos_token_ids, *([pad] if pad is not None else [])]


def reward_column(reward_funcs: list[Any], *funcs: Any) -> int | None:
    """The column of the first of ``funcs`` among ``reward_funcs``, or ``None``.

    >>> reward_column([len, max], max, min), reward_column([len], min)
    (1, None)
    """
    for index, func in enumerate(reward_funcs):
        if any(func is f for f in funcs):
            return index
    return None


def correctness_scores(reward_funcs: list[Any]) -> tuple[int, float, float] | None:
    """The column of the run's correctness reward (`CORRECTNESS_REWARDS`, or one of them mapped to other
    values by `rewards.mapped.mapped_correctness`) and the scores it gives a right and a wrong answer; None
    without one.

    >>> from rewards.registry import REGISTRY
    >>> correctness_scores([REGISTRY["format"], REGISTRY["correctness_pm5"]])
    (1, 5.0, -5.0)
    """
    column = reward_column(reward_funcs, *CORRECTNESS_REWARDS)
    if column is not None:
        return column, 1.0, 0.0
    for index, func in enumerate(reward_funcs):
        mapped = any(getattr(func, "base", None) is f for f in CORRECTNESS_REWARDS)
        if mapped and func.correct != func.incorrect:  # equal scores tell no right from wrong
            return index, float(func.correct), float(func.incorrect)
    return None


def loop_flags(completion_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """1.0 for each completion (a row of ``completion_ids``, its first ``lengths`` tokens) that ends in an
    n-gram loop (`rewards.repetition.ends_in_loop`), else 0.0."""
    rows, sizes = completion_ids.tolist(), lengths.tolist()
    flags = [float(ends_in_loop(row[: int(n)])) for row, n in zip(rows, sizes, strict=True)]
    return torch.tensor(flags, device=completion_ids.device)


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
    ``reward_columns`` maps a metric name (``accuracy``, ``format``, ``rewards/<function>``) to its
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


def grouped_token_sums(
    values: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor, num_groups: int
) -> torch.Tensor:
    """A (2, ``num_groups``) tensor: per group of rows, the sum of ``values`` over masked tokens and the
    count.

    >>> v, m = torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [1, 0]])
    >>> grouped_token_sums(v, m, torch.tensor([1, 1]), 2).tolist()
    [[0.0, 9.0], [0.0, 3.0]]
    """
    mask = mask.to(values.dtype)
    sums, counts = (values * mask).sum(dim=1).float(), mask.sum(dim=1).float()
    out = torch.zeros(2, num_groups, device=values.device)
    valid = groups >= 0
    out[0].index_add_(0, groups[valid], sums[valid])
    out[1].index_add_(0, groups[valid], counts[valid])
    return out
