"""Per-template metrics of a generation round.

`TemplateMetrics` gathers each row's template name, rewards, completion length, truncation and n-gram loop
from every process, and each template's per-token entropy, and adds them to TRL's metric buffer through
`WindowMeans`, so that a log line spanning several rounds (or an evaluation of several batches) averages over
their completions (tokens, for entropy), not over the rounds. The functions below them are pure functions of
the gathered values.
"""

from __future__ import annotations

import math
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

    Each is a mean over every completion since the last log (entropy: over every token), whatever the rounds
    or batches they came in; ``count`` and ``kept`` are completions per round, a round without the template
    counting 0 (`WindowMeans`). A template drawn in no round since the last log logs no key.

    Args:
        names: Every template a row may carry (the training bank and the evaluation template); a row's index
            into them travels with it, as ``template_index``, to the loss, where its entropy is summed. None
            (prompt augmentation off, rows without a template): the overall metrics only.
    """

    def __init__(self, names: list[str]) -> None:
        self.index = {name: i for i, name in enumerate(dict.fromkeys(names))}
        # Per-template [entropy sum, token count] over the optimizer step's micro-batches so far.
        self._entropy_window: torch.Tensor | None = None
        self.means = WindowMeans()

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
        buffer = trainer.metric_buffer(mode)
        self.means.add(buffer, mode, "completions/repetition_ratio", looping.sum().item(), len(looping))
        for name, where in template_rows(names or []).items():
            self.means.add(
                buffer, mode, f"templates/{name}/repetition", looping[where].sum().item(), len(where)
            )

    def append(
        self, trainer: Any, names: list[str] | None, rewards: torch.Tensor | None, lengths: torch.Tensor,
        truncated: torch.Tensor, mode: str, kept: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """Per-template metrics of one round's gathered rows (`per_template_sums`): ``accuracy`` (the share
        right, also under a correctness reward mapped to other scores), ``format``, each reward function's
        mean as ``rewards/<function>``, and with ``kept`` (bool per row) ``templates/<name>/kept``; and the
        share right as `ACCURACY_KEY` (``kept`` given: over every generated row, under `GENERATED`).
        ``names`` None: the share right alone. Called once per round (in evaluation, once per batch)."""
        funcs, buffer = trainer.reward_funcs, trainer.metric_buffer(mode)
        self.means.new_round(buffer, mode)
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
            graded = ~share.isnan()
            if graded.any():  # the share right; under dynamic sampling (``kept``) of all generated
                key = (GENERATED if kept is not None else "") + ACCURACY_KEY
                self.means.add(buffer, mode, key, share[graded].sum().item(), graded.sum().item())
        if names is None:
            return
        for key, (total, weight) in per_template_sums(
            names, rewards, columns, lengths, truncated, kept
        ).items():
            if weight is None:
                self.means.add_per_round(buffer, mode, key, total)
            else:
                self.means.add(buffer, mode, key, total, weight)

    def add_entropy(self, trainer: Any, entropies: torch.Tensor, mask: torch.Tensor, inputs: dict) -> None:
        """Add a micro-batch's per-token entropies to its templates' sums, reduced over processes at the
        optimizer step's end (in eval, at each batch) into ``templates/<name>/entropy``: the mean over every
        token since the last log, so the value does not depend on how rows were grouped into micro-batches,
        optimizer steps or log lines."""
        if "template_index" not in inputs:
            return
        mode = "train" if trainer.model.training else "eval"
        sums = grouped_token_sums(entropies, mask, inputs["template_index"], len(self.index))
        self._entropy_window = sums if self._entropy_window is None else self._entropy_window + sums
        if mode == "eval" or trainer.accelerator.sync_gradients:
            sums = trainer.accelerator.reduce(self._entropy_window, reduction="sum").cpu()
            self._entropy_window = None
            buffer = trainer.metric_buffer(mode)
            for name, i in self.index.items():
                if sums[1, i] > 0:
                    self.means.add(
                        buffer, mode, f"templates/{name}/entropy", sums[0, i].item(), sums[1, i].item()
                    )


class WindowMeans:
    """Means over every row since TRL's last log, kept in TRL's metric buffer as one value per key.

    TRL logs each key of its buffer as the plain mean of the values appended since its last log, then empties
    the buffer. A template's rows differ from round to round (and an evaluation's batches in size), so one
    value per round would weigh a round's 4 rows like another's 40. Here a key holds one value, its total
    over its weight (rows, graded rows, tokens) since the buffer was last emptied; a per-round key holds its
    total over the rounds counted since then (`new_round`), a round that added nothing to it counting 0. The
    buffer was emptied when a key written here no longer holds the list written to it.

    >>> from collections import defaultdict
    >>> buffer, means = defaultdict(list), WindowMeans()
    >>> means.new_round(buffer, "train"); means.add(buffer, "train", "acc", 1.0, 1)  # 1 of 1 right
    >>> means.add_per_round(buffer, "train", "count", 1)
    >>> means.new_round(buffer, "train"); means.add(buffer, "train", "acc", 0.0, 3)  # 0 of 3
    >>> dict(buffer)
    {'acc': [0.25], 'count': [0.5]}
    >>> buffer.clear()  # TRL's log
    >>> means.new_round(buffer, "train"); means.add(buffer, "train", "acc", 3.0, 4); dict(buffer)
    {'acc': [0.75]}
    """

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def _window(self, buffer: dict[str, list[float]], mode: str) -> _Window:
        window = self._windows.get(mode)
        if window is None or window.emptied(buffer):
            window = self._windows[mode] = _Window()
        return window

    def new_round(self, buffer: dict[str, list[float]], mode: str) -> None:
        """Count a round (in evaluation, a batch): every per-round key now averages over one more."""
        window = self._window(buffer, mode)
        window.rounds += 1
        for key in window.per_round:
            window.write(buffer, key)

    def add(self, buffer: dict[str, list[float]], mode: str, key: str, total: float, weight: float) -> None:
        """Add ``total`` over ``weight`` to ``key``'s mean (no weight yet: NaN, which TRL logs as None)."""
        window = self._window(buffer, mode)
        sums = window.sums.setdefault(key, [0.0, 0.0])
        sums[0] += total
        sums[1] += weight
        window.write(buffer, key)

    def add_per_round(self, buffer: dict[str, list[float]], mode: str, key: str, total: float) -> None:
        """Add ``total`` to ``key``'s sum over the rounds counted since the last log."""
        window = self._window(buffer, mode)
        window.per_round.add(key)
        window.sums.setdefault(key, [0.0, 0.0])[0] += total
        window.write(buffer, key)


class _Window:
    """One mode's sums since TRL's last log, and the lists holding their means in its buffer."""

    def __init__(self) -> None:
        self.rounds = 0
        self.sums: dict[str, list[float]] = {}  # key -> [total, weight]
        self.per_round: set[str] = set()  # keys whose weight is the rounds
        self.cells: dict[str, list[float]] = {}

    def emptied(self, buffer: dict[str, list[float]]) -> bool:
        """Whether TRL has logged (and emptied ``buffer``) since the first key was written here."""
        key = next(iter(self.cells), None)
        return key is not None and buffer.get(key) is not self.cells[key]

    def write(self, buffer: dict[str, list[float]], key: str) -> None:
        total, weight = self.sums[key]
        if key in self.per_round:
            weight = self.rounds
        cell = self.cells.setdefault(key, [])
        cell[:] = [total / weight if weight else math.nan]
        buffer[key] = cell


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


def per_template_sums(
    names: list[str],
    rewards: torch.Tensor | None,
    reward_columns: dict[str, int | None],
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    kept: torch.Tensor | None = None,
) -> dict[str, tuple[float, float | None]]:
    """``templates/<name>/<metric>`` of one round's gathered rows, each as (total, weight): the metric is
    total / weight, and weight None marks a count per round (`WindowMeans.add_per_round`).

    ``rewards`` is the (rows x reward functions) matrix TRL trains on (NaN where a function gave None, left
    out of total and weight); ``reward_columns`` maps a metric name (``accuracy``, ``format``,
    ``rewards/<function>``) to its column, or ``None`` when no reward function gives it. Besides those:
    ``mean_length``, ``truncated_ratio``, ``count`` and, with ``kept`` (bool per row), ``kept``.

    >>> rewards = torch.tensor([[1.0], [0.0], [float("nan")]])
    >>> lengths, cut = torch.tensor([4.0, 6, 2]), torch.zeros(3)
    >>> m = per_template_sums(["a", "a", "b"], rewards, {"accuracy": 0}, lengths, cut)
    >>> m["templates/a/accuracy"], m["templates/a/mean_length"], m["templates/b/count"]
    ((1.0, 2), (10.0, 2), (1.0, None))
    >>> m["templates/b/accuracy"]  # its one row ungraded
    (0.0, 0)
    """
    out: dict[str, tuple[float, float | None]] = {}
    for name, rows in template_rows(names).items():
        prefix = f"templates/{name}"
        for metric, column in reward_columns.items():
            if column is not None and rewards is not None:
                values = rewards[rows, column]
                given = ~values.isnan()
                out[f"{prefix}/{metric}"] = (values[given].sum().item(), int(given.sum()))
        out[f"{prefix}/mean_length"] = (lengths[rows].sum().item(), len(rows))
        out[f"{prefix}/truncated_ratio"] = (truncated[rows].sum().item(), len(rows))
        out[f"{prefix}/count"] = (float(len(rows)), None)
        if kept is not None:
            out[f"{prefix}/kept"] = (float(kept[rows].sum()), None)
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
    # In float32: a bf16 model's entropies are bf16, which holds no whole number above 256 exactly (a row of
    # 3,001 tokens would count 3,008).
    values, mask = values.float(), mask.float()
    sums, counts = (values * mask).sum(dim=1), mask.sum(dim=1)
    out = torch.zeros(2, num_groups, device=values.device)
    valid = groups >= 0
    out[0].index_add_(0, groups[valid], sums[valid])
    out[1].index_add_(0, groups[valid], counts[valid])
    return out
