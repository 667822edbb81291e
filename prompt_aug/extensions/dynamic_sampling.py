"""DAPO dynamic sampling on TRL's `GRPOTrainer`: every trained group has a reward spread.

A GRPO group whose rollouts all get the same reward has zero advantage: it teaches nothing and, under a
token-mean loss, shrinks the step of the other groups. With dynamic sampling a generation round is built
from passes:

1. Pass 0 generates and scores the round TRL's sampler handed over, as usual.
2. Each group's signal (the total reward, or one named reward function) is checked for spread: its std,
   NaNs ignored, must exceed ``std_tol`` (not 0: float noise would let constant groups through; far below
   the 1e-4 TRL adds to a group's std, so a group judged flat gets advantages near 0 there too). Under
   ``multi_objective_aggregation: normalize_then_sum`` the ``total`` has spread where any weighted reward
   function varies, as TRL scales each one within the group before it sums them, unless the scaled
   functions cancel in that sum (TRL's reward then is flat, and so are the advantages).
3. While the round has fewer spread groups than it holds, another pass generates as many new questions as
   the round has, drawn from the training set by a hash of (seed, round, pass), never from the sampler,
   so a resumed run draws the same ones. Each new row goes through the same augmenting collator as the
   sampler's rows (one template per group).
4. The round is the first spread groups in generation order. If the cap of ``max_passes`` is hit first,
   the remaining places are filled with zero-spread groups, in generation order, spaced evenly through the
   round so that every process trains about as many. They are flat on the signal
   (with ``total``, zero advantage: with ``beta: 0`` no policy gradient; with one reward function as the
   signal, another may still differ in them), so the round keeps TRL's shapes (per-process slices,
   gradient accumulation, the token count of the loss) without repeating a kept group, which would
   double its weight.
5. TRL's own scoring then runs on exactly those rows: the trainer's ``_generate`` and ``_calculate_rewards``
   replay the stored completions and rewards, so the old/reference log-probs, the advantages (group or batch
   scaling), the loss token count and TRL's metrics are computed as for an ordinary round.

Every decision is taken from gathered tensors, identically on every process; groups stay whole (a group
straddling two processes is moved as a unit); each process gets back as many rows as it generated.
Unsupported: tools, environments, ``rollout_func``, images, iterable datasets (a clear error at start).

Logged per round: ``dynamic_sampling/groups_generated``, ``groups_kept`` (trained, with spread),
``groups_filled`` (trained, zero spread, cap hit), ``groups_surplus`` (spread, beyond the round),
``dropped_all_right`` / ``dropped_all_wrong`` (every rollout right / wrong by the correctness reward,
``correctness_pm5``'s +5 / -5 included, or scored 1 / 0 on the signal without one), ``dropped_no_spread``
(other flat groups), ``generation_passes``, ``cap_hit`` and ``kept_share``; per-template metrics and
``completions/repetition_ratio`` over everything generated, plus ``templates/<name>/kept``; and
``dynamic_sampling/generated/reward``, ``.../rewards/<function>/mean`` and ``.../completions/clipped_ratio``:
TRL's metrics of those names over everything generated (what the collapse guard reads with dynamic sampling
on). TRL's reward metrics cover the trained rows only; its length and truncation metrics (``completions/*``,
``num_tokens``) are taken in each generation pass, so they cover everything generated: TRL appends one value
per pass, which the round rewrites as its value over every pass together, repeated once per pass (a mean of
per-pass minima, or of per-pass terminated lengths that TRL puts at 0 for a pass with none, is no round's
value; repeated, a log of several rounds still weighs each by its completions). So
``.../completions/clipped_ratio`` equals TRL's; it is logged so that every ``generated/`` metric a reader
needs is under one prefix. The completion records hold every generated completion (trained rows first, in
training order) with ``kept``, ``group_status`` and ``generation_pass``;
rows not trained have a NaN ``advantage``.
"""

from __future__ import annotations

import logging
import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import nanstd

from rewards.registry import REGISTRY
from rewards.repetition import ends_in_loop

from .. import trl_seam as seam
from ..collator import given_uid, row_question, row_uid, stable_uniform
from ..metrics import correctness_scores, ending_ids
from ..records import GENERATED, TRAINED_CLIPPED, rounds_generated
from ..trl_seam import Generation, SamplingTrainer

SIGNAL_TOTAL = "total"
KEPT, FILLED, SURPLUS = "kept", "filled", "surplus"
# The completion-record columns a training round adds beside the trainer's own (template, uid, ...).
RECORD_COLUMNS = ("kept", "group_status", "generation_pass")
ALL_RIGHT, ALL_WRONG, OTHER = "all_right", "all_wrong", "no_spread"
METRIC = "dynamic_sampling/"
# What TRL's `_generate` appends to its metric buffer each time it generates: once per generation pass here.
PASS_LENGTH_KEYS = tuple(
    f"completions/{name}"
    for name in (
        "mean_length", "min_length", "max_length", "clipped_ratio",
        "mean_terminated_length", "min_terminated_length", "max_terminated_length",
    )
)  # fmt: skip

logger = logging.getLogger("prompt_aug.dynamic_sampling")


def group_spread(signal: torch.Tensor, num_generations: int, std_tol: float) -> list[bool]:
    """Whether each consecutive group of ``num_generations`` values has a std above ``std_tol`` (NaNs
    ignored).

    >>> group_spread(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3, 0.3 + 1e-9]), 2, 1e-4)
    [False, True, False]
    """
    std = nanstd(signal.float().view(-1, num_generations), dim=1)
    return [bool(s > std_tol) for s in torch.nan_to_num(std, nan=0.0)]


def group_outcome(
    correct: torch.Tensor | None, num_generations: int, std_tol: float, right: float = 1.0, wrong: float = 0.0
) -> list[str]:
    """``all_right`` / ``all_wrong`` when every rollout of a group scored ``right`` / ``wrong``, else
    ``no_spread``.

    The round passes the correctness reward's column and its scores when the recipe has one (`+5 / -5` for
    ``correctness_pm5``), else the spread signal, judged against 1 / 0.

    >>> group_outcome(torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2, 1e-4)
    ['all_right', 'all_wrong', 'no_spread']
    >>> group_outcome(torch.tensor([5.0, 5.0, -5.0, -5.0]), 2, 1e-4, right=5.0, wrong=-5.0)
    ['all_right', 'all_wrong']
    """
    if correct is None:
        return []
    out = []
    for group in correct.float().view(-1, num_generations):
        if bool(torch.all((group - right).abs() <= std_tol)):
            out.append(ALL_RIGHT)
        elif bool(torch.all((group - wrong).abs() <= std_tol)):
            out.append(ALL_WRONG)
        else:
            out.append(OTHER)
    return out


def extra_question_indices(
    seed: int, round_index: int, pass_index: int, uids: list[str], count: int, exclude: set[str]
) -> list[int]:
    """``count`` dataset indices for an extra pass, a function of (seed, round, pass) only.

    Questions whose uid is in ``exclude`` (already in the round) are skipped while others remain; then
    those, before any question is drawn twice in the pass (only a training set smaller than ``count``).

    >>> uids = [f"q{i}" for i in range(10)]
    >>> a = extra_question_indices(0, 3, 1, uids, 4, {"q0"})
    >>> a == extra_question_indices(0, 3, 1, uids, 4, {"q0"}), len(set(a)), 0 in a
    (True, 4, False)
    >>> len(set(extra_question_indices(0, 3, 1, uids[:6], 4, {"q0", "q1", "q2", "q3"})))
    4
    """
    rng = random.Random(int(stable_uniform(seed, round_index, f"dynamic-sampling-pass-{pass_index}") * 2**53))
    order = rng.sample(range(len(uids)), len(uids))
    fresh = [i for i in order if uids[i] not in exclude]
    picked = fresh[:count]
    if len(picked) < count:  # questions already in the round next, each once
        picked += [i for i in order if uids[i] in exclude][: count - len(picked)]
    if len(picked) < count:  # a training set smaller than the pass: repeat questions rather than stall
        picked += [order[j % len(order)] for j in range(count - len(picked))]
    return picked


def dataset_uids(dataset: Any) -> list[str]:
    """Each row's id as the collator gives it: its ``uid`` cell, else (no column, or a missing or empty id)
    one derived from its question (`collator.row_uid`), so that a dataset without ids draws extra questions
    as one with them does."""
    columns = getattr(dataset, "column_names", None) or ()
    question = next((name for name in ("question", "prompt") if name in columns), None)
    if question is None:
        rows = (dataset[i] for i in range(len(dataset)))
        return [row_uid(row, row_question(row)) for row in rows]
    # Columns read whole rather than row by row; the questions only if an id is missing.
    ids = [given_uid(u) for u in dataset["uid"]] if "uid" in columns else [None] * len(dataset)
    questions = dataset[question] if None in ids else []
    return [
        uid if uid is not None else row_uid({}, row_question({question: questions[i]}))
        for i, uid in enumerate(ids)
    ]


@dataclass
class RoundPlan:
    """Which (pass, group) pairs a round trains, in order, and the status of every generated group."""

    trained: list[tuple[int, int]]
    status: dict[tuple[int, int], str]

    def counts(self) -> dict[str, int]:
        counts = defaultdict(int)
        for status in self.status.values():
            counts[status] += 1
        return counts


def plan_round(spread: list[list[bool]], outcome: list[list[str]], groups_needed: int) -> RoundPlan:
    """Keep the first ``groups_needed`` spread groups in generation order; fill any shortfall with
    zero-spread ones, spaced evenly among them (`_spread`).

    ``spread[k][g]`` / ``outcome[k][g]`` describe group ``g`` of pass ``k`` (``outcome`` may hold empty
    lists).

    >>> plan = plan_round([[True, False], [False, True]], [[], []], 2)
    >>> plan.trained, plan.status[(1, 0)]
    ([(0, 0), (1, 1)], 'no_spread')
    >>> plan_round([[False, True]], [["all_wrong", "no_spread"]], 2).trained  # the filler (0, 0) first
    [(0, 0), (0, 1)]
    """
    status: dict[tuple[int, int], str] = {}
    kept, flat = [], []
    for k, groups in enumerate(spread):
        for g, has_spread in enumerate(groups):
            key = (k, g)
            if has_spread and len(kept) < groups_needed:
                kept.append(key)
                status[key] = KEPT
            elif has_spread:
                status[key] = SURPLUS
            else:
                flat.append(key)
                status[key] = outcome[k][g] if outcome[k] else OTHER
    fillers = flat[: groups_needed - len(kept)]
    for key in fillers:
        status[key] = FILLED
    return RoundPlan(trained=_spread(kept, fillers), status=status)


def cap_message(round_number: int, counts: dict[str, int], groups_needed: int, passes: int) -> str | None:
    """The warning for a round that hit the cap of ``passes`` generation passes with fewer spread groups
    than the ``groups_needed`` it trains (``counts``: `RoundPlan.counts`), or ``None`` when it did not.

    >>> cap_message(7, {"kept": 1, "filled": 3, "all_wrong": 9}, 4, 4)[:67]
    'dynamic sampling: round 7 found 1 of 4 groups with reward spread in'
    >>> cap_message(7, {"kept": 4}, 4, 1) is None
    True
    """
    kept = counts.get(KEPT, 0)
    if kept >= groups_needed:
        return None
    return (
        f"dynamic sampling: round {round_number} found {kept} of {groups_needed} groups with reward spread "
        f"in {passes} generation passes (dynamic_sampling_max_passes: {passes}), so {counts.get(FILLED, 0)} "
        f"groups with no spread in the signal fill it (left out: {counts.get(ALL_RIGHT, 0)} all right, "
        f"{counts.get(ALL_WRONG, 0)} all wrong, {counts.get(OTHER, 0)} other flat groups). Training goes on; "
        "dynamic_sampling/cap_hit is 1 on each such round, and this warning comes again only after a round "
        "that fills up. Raise dynamic_sampling_max_passes, or check the data and rewards (too easy, too "
        "hard, a reward that does not vary)"
    )


def _spread(kept: list, fillers: list) -> list:
    """``kept`` and ``fillers`` in one order, each in its own order, the fillers evenly spaced: the round's
    slots are cut into the processes' shares in order, so fillers placed last would all land on the last
    processes, whose losses a per-micro-batch normalisation (``bnpo``) would then scale down.

    >>> _spread(["a", "b"], [1, 2])
    [1, 'a', 2, 'b']
    >>> _spread(["a", "b", "c"], [1])
    ['a', 1, 'b', 'c']
    """
    total, left, filling = len(kept) + len(fillers), iter(kept), iter(fillers)

    def due(slot: int) -> int:  # the fillers due by the middle of ``slot``, rounded
        return (2 * slot * len(fillers) + total) // (2 * total)

    return [next(filling) if due(slot + 1) > due(slot) else next(left) for slot in range(total)]


@dataclass
class _Pass:
    rows: list[dict[str, Any]]  # this process's rows
    generation: Generation  # TRL's `_generate` output for them
    rewards: torch.Tensor  # gathered (all processes' rows, reward functions), on CPU
    uids: list[str]  # gathered
    templates: list[str]  # gathered
    lengths: torch.Tensor  # gathered
    truncated: torch.Tensor  # gathered
    looping: torch.Tensor  # gathered: 1.0 where a completion ends in an n-gram loop
    # Completion-record columns logged (by reward functions) for this process's rows.
    extras: dict[str, list] = field(default_factory=dict)


@dataclass
class _Replay:
    prompts: list[Any]
    generation: Generation
    rewards: torch.Tensor


class DynamicSampler:
    """Builds each training round from groups whose rewards differ (see the module docstring).

    Args:
        signal_index: Column of the reward function that decides spread; ``None`` for the weighted total.
        max_passes: Most generation passes per round (pass 0 included).
        std_tol: A group's signal must have a std above this to count as spread.
    """

    def __init__(self, signal_index: int | None = None, max_passes: int = 4, std_tol: float = 1e-6) -> None:
        if max_passes < 1:
            raise ValueError(f"dynamic_sampling_max_passes must be at least 1, got {max_passes}")
        if not 0 <= std_tol < math.inf:  # inf would call every group flat
            raise ValueError(f"dynamic_sampling_std_tol must be a finite number >= 0, got {std_tol}")
        self.signal_index = signal_index
        self.max_passes = max_passes
        self.std_tol = std_tol
        self._replay: _Replay | None = None
        self._uids: list[str] | None = None
        self._capped = False  # the latest round hit the cap: its warning is said once per run of such rounds

    def check(self, trainer: SamplingTrainer) -> None:
        """Fail at start on what a round cannot replay."""
        unsupported = [
            name
            for name, value in (
                ("rollout_func", trainer.rollout_func),
                ("tools", trainer.tools),
                ("environment_factory", trainer.environment_factories),
            )
            if value
        ]
        if unsupported:
            raise ValueError(
                f"dynamic_sampling cannot be combined with {unsupported}; set dynamic_sampling: false"
            )
        if not hasattr(trainer.train_dataset, "__getitem__") or isinstance(
            trainer.train_dataset, torch.utils.data.IterableDataset
        ):
            raise ValueError(
                "dynamic_sampling draws extra questions by index: it needs a map-style train_dataset"
            )
        if self.signal_index is not None and not 0 <= self.signal_index < len(trainer.reward_funcs):
            raise ValueError(
                f"dynamic sampling signal column {self.signal_index} "
                f"but {len(trainer.reward_funcs)} reward functions"
            )

    # -- the trainer's replay hooks --------------------------------------------------------------------

    def replayed_generation(self, prompts: list[Any]) -> Generation | None:
        """The stored `_generate` output for the round being scored, or ``None`` outside of it."""
        if self._replay is None:
            return None
        if prompts != self._replay.prompts:
            raise RuntimeError(
                "dynamic sampling: TRL asked to generate for other prompts than the round it replays"
            )
        return self._replay.generation

    def replayed_rewards(self) -> torch.Tensor | None:
        """The stored gathered rewards of the round being scored, or ``None`` outside of it."""
        return None if self._replay is None else self._replay.rewards

    # -- one round -------------------------------------------------------------------------------------

    def run_round(
        self,
        trainer: SamplingTrainer,
        rows: list[dict[str, Any]],
        augment: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
        score: Callable[[list[dict[str, Any]]], dict[str, Any]],
    ) -> dict[str, Any]:
        """Generate passes until the round is full of spread groups (or the cap), then ``score`` the round.

        ``rows`` are this process's augmented rows from TRL's sampler; ``augment`` renders new rows;
        ``score`` is TRL's `_generate_and_score_completions`. Returns its output for the trained rows.
        """
        acc = trainer.accelerator
        num_gen, per_process, processes = trainer.num_generations, len(rows), acc.num_processes
        groups_needed = per_process * processes // num_gen
        round_index = rounds_generated(trainer.micro_step, trainer.args)

        # Columns logged for the sampler's rows before this point belong to pass 0.
        early = seam.take_pending_columns(trainer)
        buffer = trainer.metric_buffer("train")
        marks = {key: len(buffer.get(key, ())) for key in PASS_LENGTH_KEYS}  # TRL's values before pass 0
        passes: list[_Pass] = []
        spread: list[list[bool]] = []
        outcome: list[list[str]] = []
        column, right, wrong = correctness_scores(trainer.reward_funcs) or (None, 1.0, 0.0)
        seen: set[str] = set()
        for k in range(self.max_passes):
            if k > 0:
                rows = augment(self._extra_rows(trainer, round_index, k, seen, per_process))
            step = self._generate_pass(trainer, rows)
            if k == 0:
                step.extras = {**early, **step.extras}
            passes.append(step)
            seen.update(step.uids)
            signal = self._signal(trainer, step.rewards)
            spread.append(self._spread(trainer, step.rewards, signal))
            correct = step.rewards[:, column] if column is not None else signal
            outcome.append(group_outcome(correct, num_gen, self.std_tol, right, wrong))
            if sum(sum(s) for s in spread) >= groups_needed:
                break
        plan = plan_round(spread, outcome, groups_needed)
        warning = cap_message(round_index + 1, plan.counts(), groups_needed, len(passes))
        if warning is not None and not self._capped and acc.is_main_process:
            logger.warning("%s", warning)
        self._capped = warning is not None

        final_rows, replay, dropped = self._assemble(trainer, passes, plan)
        self._reset_completion_logs(trainer)
        for column in sorted({c for row in final_rows for c in row["_extras"]}):
            trainer.log_completion_column(column, [row["_extras"].get(column) for row in final_rows])
        final_rows = [{k: v for k, v in row.items() if k != "_extras"} for row in final_rows]
        self._replay = replay
        try:
            output = score(final_rows)
        finally:
            self._replay = None
        self._log_dropped_records(trainer, dropped)
        self._log_metrics(trainer, passes, plan, groups_needed)
        rewrite_pass_lengths(buffer, marks, passes)
        return output

    def log_blank_columns(self, trainer: SamplingTrainer, rows: int) -> None:
        """Give a round it does not build (an evaluation round) empty `RECORD_COLUMNS`: TRL's completions
        table needs every column as long as the others when training and evaluation rounds share it."""
        for column in RECORD_COLUMNS:
            trainer.log_completion_column(column, [None] * rows)

    def _spread(self, trainer: SamplingTrainer, rewards: torch.Tensor, signal: torch.Tensor) -> list[bool]:
        """Each group's spread on ``signal``. On the ``total`` under TRL's ``normalize_then_sum``, which
        scales each reward function within its group before the weighted sum, a group has spread where some
        reward function of non-zero weight varies (its total may be flat while its advantages are not) and
        the weighted sum of the scaled functions, TRL's reward there, varies too (functions that vary in
        opposite directions can cancel: every advantage of the group is then 0)."""
        num_gen = trainer.num_generations
        aggregation = getattr(trainer.args, "multi_objective_aggregation", "sum_then_normalize")
        if self.signal_index is not None or aggregation != "normalize_then_sum":
            return group_spread(signal, num_gen, self.std_tol)
        weights = trainer.reward_weights.cpu()
        columns = [
            group_spread(rewards[:, i], num_gen, self.std_tol) for i, w in enumerate(weights.tolist()) if w
        ]
        if not columns:
            return [False] * (len(signal) // num_gen)
        scaled = group_spread(scaled_total(rewards, weights, num_gen), num_gen, self.std_tol)
        return [any(flags) and summed for *flags, summed in zip(*columns, scaled, strict=True)]

    def _signal(self, trainer: SamplingTrainer, rewards: torch.Tensor) -> torch.Tensor:
        if self.signal_index is not None:
            return rewards[:, self.signal_index]
        return total_reward(rewards, trainer.reward_weights.cpu())

    def _extra_rows(
        self, trainer: SamplingTrainer, round_index: int, k: int, seen: set[str], per_process: int
    ) -> list[dict]:
        dataset = trainer.train_dataset
        if self._uids is None:
            self._uids = dataset_uids(dataset)
        num_gen, process = trainer.num_generations, trainer.accelerator.process_index
        questions = per_process * trainer.accelerator.num_processes // num_gen
        indices = extra_question_indices(trainer.args.seed, round_index, k, self._uids, questions, seen)
        # Global rows are each question repeated num_generations times (as TRL's RepeatSampler lays them out);
        # this process takes its contiguous slice.
        first = process * per_process
        positions = range(first, first + per_process)
        fetched = {q: dataset[indices[q]] for q in {p // num_gen for p in positions}}
        return [dict(fetched[p // num_gen]) for p in positions]

    def _generate_pass(self, trainer: SamplingTrainer, rows: list[dict[str, Any]]) -> _Pass:
        acc = trainer.accelerator
        prompts = [row["prompt"] for row in rows]
        generation = trainer.generate_round(prompts)
        completion_ids, completions = generation.completion_ids, generation.completions
        if generation.extra_fields or generation.images is not None:
            raise ValueError(
                "dynamic_sampling cannot replay rollout extra fields or images; set dynamic_sampling: false"
            )
        rewards = trainer.compute_rewards(rows, prompts, completions, completion_ids)
        extras = seam.take_pending_columns(trainer)  # what reward functions logged
        eos = set(ending_ids(trainer))
        lengths = torch.tensor(
            [len(ids) or trainer.max_completion_length for ids in completion_ids], device=acc.device
        )
        truncated = torch.tensor([not ids or ids[-1] not in eos for ids in completion_ids], device=acc.device)
        looping = torch.tensor([float(ends_in_loop(ids)) for ids in completion_ids], device=acc.device)
        names = gather_object([(str(row["uid"]), row["template"]) for row in rows])
        return _Pass(
            rows=rows,
            generation=generation,
            rewards=rewards.cpu(),
            uids=[uid for uid, _ in names],
            templates=[template for _, template in names],
            lengths=acc.gather(lengths.float()).cpu(),
            truncated=acc.gather(truncated.float()).cpu(),
            looping=acc.gather(looping).cpu(),
            extras=extras,
        )

    def _assemble(self, trainer: SamplingTrainer, passes: list[_Pass], plan: RoundPlan):
        """Move the trained rows to the processes that train them; collect the dropped rows' records."""
        acc = trainer.accelerator
        num_gen, process = trainer.num_generations, acc.process_index
        per_process = len(passes[0].rows)
        final_position = {}  # (pass, global row) -> position in the round
        for slot, (k, g) in enumerate(plan.trained):
            for j in range(num_gen):
                final_position[(k, g * num_gen + j)] = slot * num_gen + j
        want_records = bool(trainer.log_completions)
        outgoing = []
        for k, step in enumerate(passes):
            prompt_ids, completion_ids, tool_mask, completions, logprobs = step.generation[:5]
            for i, row in enumerate(step.rows):
                position = process * per_process + i
                status = plan.status[(k, position // num_gen)]
                extras = {
                    **{c: v[i] for c, v in step.extras.items() if len(v) == len(step.rows)},
                    "template": row["template"],
                    "uid": row["uid"],
                    "process": process,
                    "round": trainer.round_number(),
                    "kept": status in (KEPT, FILLED),
                    "group_status": status,
                    "generation_pass": k,
                }
                if (k, position) in final_position:
                    item = {
                        "row": {**row, "_extras": extras},
                        "prompt_ids": prompt_ids[i],
                        "completion_ids": completion_ids[i],
                        "tool_mask": None if tool_mask is None else tool_mask[i],
                        "completion": completions[i],
                        "logprobs": None if logprobs is None else logprobs[i],
                    }
                    outgoing.append(("train", final_position[(k, position)], item))
                elif want_records:
                    record = {"prompt": row["prompt"], "completion": completions[i], "extras": extras}
                    outgoing.append(("record", (k, position), record))
        everything = gather_object(outgoing)

        mine = sorted(
            (pos, item)
            for kind, pos, item in everything
            if kind == "train" and process * per_process <= pos < (process + 1) * per_process
        )
        items = [item for _, item in mine]
        has_mask, has_logprobs = items[0]["tool_mask"] is not None, items[0]["logprobs"] is not None
        generation = seam.Generation(
            prompt_ids=[it["prompt_ids"] for it in items],
            completion_ids=[it["completion_ids"] for it in items],
            tool_mask=[it["tool_mask"] for it in items] if has_mask else None,
            completions=[it["completion"] for it in items],
            logprobs=[it["logprobs"] for it in items] if has_logprobs else None,
            extra_fields={},
            images=None,
            tool_images=[],
        )
        rewards = torch.cat([passes[k].rewards[g * num_gen : (g + 1) * num_gen] for k, g in plan.trained])
        final_rows = [it["row"] for it in items]
        replay = _Replay([row["prompt"] for row in final_rows], generation, rewards.to(acc.device))
        dropped = sorted(
            ((pos, item) for kind, pos, item in everything if kind == "record"), key=lambda x: x[0]
        )
        for (k, position), record in dropped:
            record["rewards"] = passes[k].rewards[position]
        return final_rows, replay, [record for _, record in dropped]

    def _reset_completion_logs(self, trainer: SamplingTrainer) -> None:
        # TRL keeps the last `generation_batch_size` completions; a round here logs up to `max_passes` times
        # that, so each round starts from empty buffers sized for everything it may generate.
        seam.reset_completion_logs(trainer, trainer.args.generation_batch_size * self.max_passes)

    def _log_dropped_records(self, trainer: SamplingTrainer, dropped: list[dict[str, Any]]) -> None:
        """Append the untrained rows to TRL's completion records (advantage NaN: they are not trained)."""
        logs = seam.completion_logs(trainer)
        trained = len(logs["prompt"])
        for column in {c for record in dropped for c in record["extras"]} - set(logs["extra"]):
            logs["extra"][column].extend([None] * trained)
        for record in dropped:
            logs["prompt"].append(record["prompt"])
            logs["completion"].append(record["completion"])
            for i, name in enumerate(trainer.reward_func_names):
                logs["rewards"][name].append(float(record["rewards"][i]))
            logs["advantages"].append(math.nan)
            for column, values in logs["extra"].items():
                values.append(record["extras"].get(column))

    def _log_metrics(
        self, trainer: SamplingTrainer, passes: list[_Pass], plan: RoundPlan, groups_needed: int
    ) -> None:
        counts = plan.counts()
        generated = len(plan.status)
        metrics = trainer.metric_buffer("train")
        values = {
            "groups_generated": generated,
            "groups_kept": counts[KEPT],
            "groups_filled": counts[FILLED],
            "groups_surplus": counts[SURPLUS],
            "dropped_all_right": counts[ALL_RIGHT],
            "dropped_all_wrong": counts[ALL_WRONG],
            "dropped_no_spread": counts[OTHER],
            "generation_passes": len(passes),
            "cap_hit": float(counts[KEPT] < groups_needed),
            # The truncated share of the rows trained: TRL's entropy is theirs (the collapse guard reads it).
            TRAINED_CLIPPED.removeprefix(METRIC): torch.cat(
                [
                    passes[k].truncated[g * trainer.num_generations : (g + 1) * trainer.num_generations]
                    for k, g in plan.trained
                ]
            )
            .float()
            .mean()
            .item(),
        }
        for name, value in values.items():
            metrics[METRIC + name].append(float(value))
        # Once per group generated: a log line over several rounds then shows the share of all their groups
        # (TRL averages what the buffer holds), not the mean of the rounds' shares.
        metrics[METRIC + "kept_share"].extend([counts[KEPT] / generated] * generated)
        # Per-template metrics over everything generated, plus how many of each template's completions
        # trained.
        num_gen = trainer.num_generations
        kept = torch.tensor(
            [
                plan.status[(k, q // num_gen)] in (KEPT, FILLED)
                for k, p in enumerate(passes)
                for q in range(len(p.uids))
            ]
        )
        names = [name for p in passes for name in p.templates]
        rewards, truncated = torch.cat([p.rewards for p in passes]), torch.cat([p.truncated for p in passes])
        lengths = torch.cat([p.lengths for p in passes])
        trainer.template_metrics.append(trainer, names, rewards, lengths, truncated, "train", kept=kept)
        looping = torch.cat([p.looping for p in passes])
        trainer.template_metrics.append_repetition(trainer, names, looping, "train")
        # TRL's reward metrics cover the trained rows only, which leave out the groups every rollout got right
        # or wrong: the same metrics over everything generated, for the collapse guard. (TRL's truncation
        # metric, taken in each generation pass, already covers them; it is repeated under the same prefix.)
        # One value per pass, as TRL appends its own: passes are of one size, so a log of several rounds
        # averages over every completion generated in it.
        weights = trainer.reward_weights.cpu()
        for p in passes:
            generated = {
                "reward": torch.nanmean(total_reward(p.rewards, weights)).item(),
                **{
                    f"rewards/{name}/mean": torch.nanmean(p.rewards[:, i]).item()
                    for i, name in enumerate(trainer.reward_func_names)
                },
                "completions/clipped_ratio": p.truncated.float().mean().item(),
            }
            for name, value in generated.items():
                metrics[GENERATED + name].append(value)


def round_lengths(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """TRL's `PASS_LENGTH_KEYS` over one round's gathered completion ``lengths`` and ``truncated`` flags, as
    TRL's ``_generate`` computes them (terminated lengths 0 when every completion was cut).

    >>> out = round_lengths(torch.tensor([4.0, 8.0, 2.0, 8.0]), torch.tensor([0.0, 1.0, 0.0, 1.0]))
    >>> [out[f"completions/{k}"] for k in ("mean_terminated_length", "min_length", "clipped_ratio")]
    [3.0, 2.0, 0.5]
    """
    lengths, cut = lengths.float(), truncated.bool()
    ended = lengths[~cut] if (~cut).any() else torch.zeros(1)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": cut.float().mean().item(),
        "completions/mean_terminated_length": ended.mean().item(),
        "completions/min_terminated_length": ended.min().item(),
        "completions/max_terminated_length": ended.max().item(),
    }


def rewrite_pass_lengths(buffer: dict[str, list[float]], marks: dict[str, int], passes: list[_Pass]) -> None:
    """Replace the values TRL's ``_generate`` appended to ``buffer`` for each pass of a round (those after
    ``marks``, the keys' lengths before pass 0) by the round's value over every pass, once per pass. A key
    that did not get exactly one value per pass is left as it is."""
    values = round_lengths(torch.cat([p.lengths for p in passes]), torch.cat([p.truncated for p in passes]))
    for key, mark in marks.items():
        logged = buffer.get(key)
        if logged is not None and len(logged) - mark == len(passes):
            logged[mark:] = [values[key]] * len(passes)


def scaled_total(rewards: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Each row's reward as TRL's ``normalize_then_sum`` makes it: every reward function scaled within the
    group (minus its mean, over its std + 1e-4, NaNs ignored), then the weighted sum; NaN where no function
    scored the row.

    >>> scaled_total(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([1.0, 1.0]), 2)  # they cancel
    tensor([0., 0.])
    """
    grouped = rewards.float().view(-1, num_generations, rewards.shape[1])
    mean, std = torch.nanmean(grouped, dim=1, keepdim=True), nanstd(grouped, dim=1, keepdim=True)
    total = ((grouped - mean) / (std + 1e-4) * weights.float().view(1, 1, -1)).nansum(dim=2).view(-1)
    total[torch.isnan(rewards).all(dim=1)] = torch.nan
    return total


def total_reward(rewards: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each row's weighted sum of its reward functions' scores (``rewards``: rows x functions), NaN where
    no function scored it, as TRL sums them.

    >>> nan = float("nan")
    >>> total_reward(torch.tensor([[1.0, 0.5], [nan, 1.0], [nan, nan]]), torch.tensor([1.0, 2.0]))
    tensor([2., 2., nan])
    """
    total = (rewards * weights.unsqueeze(0)).nansum(dim=1)
    total[torch.isnan(rewards).all(dim=1)] = torch.nan
    return total


def signal_column(signal: str, reward_funcs: list[Any], reward_func_names: list[str]) -> int | None:
    """The reward column of a ``dynamic_sampling_signal``: ``None`` for ``total``; else the first reward
    function whose TRL name (``reward_func_names``) is ``signal``, or that `rewards.REGISTRY` registers as
    ``signal``.

    Raises a ValueError naming the key when no reward function matches.

    >>> from rewards import REGISTRY
    >>> signal_column("correctness", [REGISTRY["format"], REGISTRY["correctness"]], ["format_reward", "x"])
    1
    """
    if signal == SIGNAL_TOTAL:
        return None
    registered = REGISTRY.get(signal)
    for index, (func, name) in enumerate(zip(reward_funcs, reward_func_names, strict=True)):
        if name == signal or (registered is not None and func is registered):
            return index
    raise ValueError(
        f"dynamic_sampling_signal: {signal!r} is neither 'total' nor one of the trainer's reward functions "
        f"{list(reward_func_names)}; fix the key in the recipe or on the command line"
    )


def from_args(args: Any, reward_funcs: list[Any], reward_func_names: list[str]) -> DynamicSampler | None:
    """The sampler ``args``' ``dynamic_sampling*`` keys ask for, over these reward functions (or ``None``)."""
    if not args.dynamic_sampling:
        return None
    index = signal_column(args.dynamic_sampling_signal, reward_funcs, reward_func_names)
    return DynamicSampler(index, args.dynamic_sampling_max_passes, args.dynamic_sampling_std_tol)
