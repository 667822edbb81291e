"""What a training run logs beside TRL's keys (the generation round, a bounded W&B completions table), and
reading back what it leaves in its output folder: ``logs.jsonl`` and the ``checkpoint-N`` folders.

**Round.** The paper (verl) counts one step per generation round: a batch of questions, all their
rollouts, and every optimizer step trained on them. TRL, checkpoint names and ``state.global_step``
count optimizer steps. With the paper recipes a round is 4 optimizer steps, so paper step N is our
``checkpoint-4N``. Every log entry carries ``round``: the 1-based number of the round whose
completions the latest optimizer step trained on, i.e. the count of rounds generated so far::

    round = ceil(global_step × gradient_accumulation_steps / (steps_per_generation × num_iterations))

(0 before the first optimizer step); `generation_round` and its helpers here are the only place this is
computed. ``num_iterations`` passes over one round do not start a new round. The Trainer restarts gradient
accumulation at each epoch, so where ``gradient_accumulation_steps`` does not divide an epoch's micro-steps
(`micro_steps_per_epoch`), each epoch ends on a short optimizer step and ``global_step ×
gradient_accumulation_steps`` overcounts: `micro_steps_done` counts them then, and `optimizer_step_of` maps
back.

**W&B table.** With ``log_completions``, TRL 1.16 writes every completion of the round to
``output_dir/completions/completions_<step>.parquet`` and uploads the same rows as a W&B table at each
log step (1,024 completions of up to 3,072 tokens per round in the paper recipes). TRL's only knob is
``log_unique_prompts`` (one row per prompt). `wandb_completions_rows` bounds the upload while the parquet
records stay complete. An evaluation's records (the trainer's ``evaluate``) have files and a table of their
own (`records_file`), where TRL would write them over the training step's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("prompt_aug")

# Dynamic sampling (`prompt_aug.extensions.dynamic_sampling`) logs TRL's reward and truncation metrics again
# under this prefix, over every generated completion (TRL's reward metrics cover the trained groups only).
GENERATED = "dynamic_sampling/generated/"
# ... and, once a round, the share of the rows it trained that were cut at max_completion_length: TRL's
# entropy is theirs.
TRAINED_CLIPPED = "dynamic_sampling/trained/completions/clipped_ratio"


# The share of a round's completions graded right (1 right, 0 wrong, whatever scores the correctness reward is
# mapped to: correctness_pm5's +5 / -5 read as 1 / 0), logged by `prompt_aug.metrics.TemplateMetrics`.
ACCURACY_KEY = "completions/accuracy"


def is_number(value: Any) -> bool:
    """Whether a logged value is a number (NaN and infinity too: a diverged run logs them), not a bool.

    >>> is_number(0.5), is_number(float("nan")), is_number(True), is_number("0.5")
    (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def generated_first(keys: Iterable[str]) -> tuple[str, ...]:
    """Each key preceded by its dynamic-sampling variant over every generated completion.

    >>> generated_first(["reward"])
    ('dynamic_sampling/generated/reward', 'reward')
    """
    return tuple(k for key in keys for k in (GENERATED + key, key))


def micro_steps_per_round(args: Any) -> int:
    """Micro-batches trained on one generation round, the one fact every round count derives from.

    TRL 1.16 generates a round for ``steps_per_generation`` micro-batches (unset:
    ``gradient_accumulation_steps``) and trains ``num_iterations`` passes over it. ``args`` is a `GRPOConfig`
    or anything with those fields.
    """
    per_generation = getattr(args, "steps_per_generation", None) or args.gradient_accumulation_steps
    return per_generation * (getattr(args, "num_iterations", None) or 1)


def optimizer_steps_per_round(args: Any) -> float:
    """Optimizer steps trained on one generation round (``gradient_accumulation_steps`` micro-batches each).

    >>> from types import SimpleNamespace as NS
    >>> optimizer_steps_per_round(
    ...     NS(gradient_accumulation_steps=4, steps_per_generation=16, num_iterations=1)
    ... )
    4.0
    """
    return micro_steps_per_round(args) / args.gradient_accumulation_steps


def generation_round(global_step: int, steps_per_round: float | Any, per_epoch: int | None = None) -> int:
    """The 1-based generation round that optimizer step ``global_step`` belongs to (0 before any step).

    ``steps_per_round`` is the optimizer steps per round, or a `GRPOConfig` to read it from; with the latter,
    ``per_epoch`` (`micro_steps_per_epoch`) counts the short optimizer step that ends an epoch whose
    micro-steps ``gradient_accumulation_steps`` does not divide.

    >>> from types import SimpleNamespace as NS
    >>> paper = NS(gradient_accumulation_steps=4, steps_per_generation=16, num_iterations=1)
    >>> [generation_round(s, paper) for s in (0, 1, 4, 5, 8, 10880)]  # the paper recipes: 4 steps per round
    [0, 1, 1, 2, 2, 2720]
    >>> two_passes = NS(gradient_accumulation_steps=1, steps_per_generation=2, num_iterations=2)
    >>> [generation_round(s, two_passes) for s in (1, 2, 4, 5)]  # two passes over each round
    [1, 1, 1, 2]
    >>> odd = NS(gradient_accumulation_steps=2, steps_per_generation=3, num_iterations=1)
    >>> [generation_round(s, odd, per_epoch=3) for s in (1, 2, 3, 4)]  # a round an epoch, steps of 2 and 1
    [1, 1, 2, 2]
    """
    if isinstance(steps_per_round, (int, float)):
        return math.ceil(global_step / steps_per_round - 1e-9)
    args = steps_per_round
    done = micro_steps_done(global_step, args.gradient_accumulation_steps, per_epoch)
    return math.ceil(done / micro_steps_per_round(args))


def micro_steps_per_epoch(num_rows: int | None, args: Any) -> int | None:
    """Micro-steps in one epoch over ``num_rows`` questions on each process (the length of TRL's training
    dataloader), or None for a dataset without a length. TRL's `RepeatSampler` keeps whole rounds of
    ``generation_batch_size / num_generations`` questions and replays each for `micro_steps_per_round`.

    >>> from types import SimpleNamespace as NS
    >>> args = NS(generation_batch_size=8, num_generations=4, gradient_accumulation_steps=2,
    ...           steps_per_generation=3, num_iterations=1)
    >>> micro_steps_per_epoch(5, args)  # 2 rounds of 2 questions (the fifth is dropped), 3 micro-steps each
    6
    """
    if num_rows is None:
        return None
    return num_rows // (args.generation_batch_size // args.num_generations) * micro_steps_per_round(args)


def optimizer_step_of(micro_step: int, accumulation: int, per_epoch: int | None = None) -> int:
    """The 0-based optimizer step that micro-step ``micro_step`` (TRL's ``_step``) trains in, with
    ``accumulation`` micro-steps a step. The Trainer restarts accumulation at each epoch of ``per_epoch``
    micro-steps, so an epoch that ``accumulation`` does not divide ends on a short step.

    >>> [optimizer_step_of(m, 2) for m in range(6)]
    [0, 0, 1, 1, 2, 2]
    >>> [optimizer_step_of(m, 2, per_epoch=3) for m in range(6)]  # epochs of 3: steps of 2, then 1
    [0, 0, 1, 2, 2, 3]
    """
    if not per_epoch:
        return micro_step // accumulation
    epochs, within = divmod(micro_step, per_epoch)
    return epochs * math.ceil(per_epoch / accumulation) + within // accumulation


def micro_steps_done(global_step: int, accumulation: int, per_epoch: int | None = None) -> int:
    """Micro-steps trained in the first ``global_step`` optimizer steps (`optimizer_step_of` turned around).

    >>> micro_steps_done(3, 2), micro_steps_done(3, 2, per_epoch=3)  # the second: steps of 2, 1, then 2
    (6, 5)
    """
    if not per_epoch:
        return global_step * accumulation
    epochs, within = divmod(global_step, math.ceil(per_epoch / accumulation))
    return epochs * per_epoch + within * accumulation


def rounds_generated(micro_step: int, args: Any) -> int:
    """Generation rounds started before micro-step ``micro_step`` (TRL's ``_step``): a round is generated when
    ``micro_step`` is a multiple of `micro_steps_per_round`, so the round generated then is this plus 1."""
    return micro_step // micro_steps_per_round(args)


@contextlib.contextmanager
def without_wandb_table(args: Any, rows: int | None) -> Iterator[None]:
    """Inside the block, TRL does not upload its completions table to W&B (unless ``rows`` is ``None``).

    TRL uploads the table when ``"wandb" in args.report_to``, checked inside ``GRPOTrainer.log`` after the
    scalar metrics have gone to the W&B callback (which does not read ``report_to`` again); the parquet
    records do not depend on it. So ``report_to`` loses ``wandb`` for the duration of the block only.
    """
    report_to = args.report_to
    if rows is None or not report_to or "wandb" not in report_to:
        yield
        return
    args.report_to = [r for r in report_to if r != "wandb"]
    try:
        yield
    finally:
        args.report_to = report_to


def sample_records(path: Path, rows: int | None, seed: int) -> Any:
    """Up to ``rows`` rows (``None``: all) of a completions parquet file, drawn reproducibly (pandas
    DataFrame)."""
    import pandas as pd

    frame = pd.read_parquet(path)
    if rows is None or len(frame) <= rows:
        return frame
    return frame.sample(n=rows, random_state=seed).sort_index()


def upload_records(path: Path, key: str, rows: int | None, seed: int) -> int:
    """Upload up to ``rows`` rows of the completions parquet file ``path`` (every row for ``None``, none for
    0; a sample drawn with ``seed``) to the active W&B run as the table ``key``.

    Returns the number of rows uploaded (0 when no W&B run is active or there is no file: a step that wrote
    no records).
    """
    if rows == 0:
        return 0
    import wandb

    if wandb.run is None or not path.is_file():
        return 0
    frame = sample_records(path, rows, seed)
    wandb.log({key: wandb.Table(dataframe=frame)})
    return len(frame)


def records_file(output_dir: str, step: int, prefix: str | None = None) -> Path:
    """Where a log step's completion records are: TRL's ``completions/completions_<step>.parquet``, or an
    evaluation's, ``completions/<prefix>_completions_<step>.parquet`` (``prefix``: its metric prefix)."""
    name = f"{prefix}_completions" if prefix else "completions"
    return Path(output_dir) / "completions" / f"{name}_{step:05d}.parquet"


def free_path(path: Path) -> Path:
    """``path`` where no file is, else the first free ``<stem>-2<suffix>``, ``<stem>-3<suffix>``...: a second
    evaluation at one step keeps the first one's records.

    >>> free_path(Path("/nowhere/eval_completions_00002.parquet")).name
    'eval_completions_00002.parquet'
    """
    found, n = path, 1
    while found.exists():
        n += 1
        found = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return found


def write_records(logs: dict[str, Any], path: Path, step: int) -> None:
    """Write TRL's completion-record buffers ``logs`` to ``path`` as `completion_frame` lays them out."""
    path.parent.mkdir(parents=True, exist_ok=True)
    completion_frame(logs, step).to_parquet(path)


def print_records(logs: dict[str, Any], step: int, count: int | None) -> None:
    """Print ``count`` of TRL's completion records (``None``: all) to the console, as TRL's log prints a
    training step's; nothing without ``rich``."""
    from transformers.utils import is_rich_available

    if is_rich_available():
        from trl.trainer.utils import print_prompt_completions_sample

        rewards, extra = dict(logs["rewards"]), dict(logs["extra"])
        print_prompt_completions_sample(
            logs["prompt"], logs["completion"], rewards, logs["advantages"], step, count, extra=extra
        )


def completion_frame(logs: dict[str, Any], step: int) -> Any:
    """TRL's completion-record buffers (`prompt_aug.trl_seam.completion_logs`) as the table TRL writes each
    log step (pandas DataFrame): ``step``, ``prompt``, ``completion``, one column per reward function, the
    extra columns (``template``, ``uid``, ...) and ``advantage``. Images are left out, as TRL leaves them out
    of its parquet files."""
    import pandas as pd
    from trl.trainer.utils import strip_images_from_messages

    return pd.DataFrame({
        "step": [step] * len(logs["prompt"]),
        "prompt": [strip_images_from_messages(p) for p in logs["prompt"]],
        "completion": [strip_images_from_messages(c) for c in logs["completion"]],
        **{name: list(values) for name, values in logs["rewards"].items()},
        **{name: list(values) for name, values in logs["extra"].items()},
        "advantage": list(logs["advantages"]),
    })  # fmt: skip


# The file `prompt_aug.logging_utils.JsonlLogCallback` writes in a run's output folder: every log entry, one
# JSON object per line.
LOG_FILE = "logs.jsonl"


class LogFileError(RuntimeError):
    """``logs.jsonl`` holds a line that is no log entry; the message names the file and the line."""


def read_log_entries(path: Path, warn: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """Each line of the ``logs.jsonl`` at ``path`` with its entry; a last line that does not parse (a crash
    cut it short) is left out, with a warning naming the file (``warn``).

    Raises:
        LogFileError: another line is not a JSON object with a ``step``; names the file and the line.
    """
    lines = path.read_text().splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError as err:
            if number == len(lines):
                if warn:
                    logger.warning(
                        "%s: its last line (%d) is cut short, a crash mid-write; left out", path, number
                    )
                break
            raise LogFileError(
                f"{path}, line {number}: not JSON ({err}); delete that line (or the file) and resume again"
            ) from None
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            raise LogFileError(
                f"{path}, line {number}: not a log entry (a JSON object with an integer step); delete that "
                "line (or the file) and resume again"
            )
        entries.append((line, entry))
    return entries


def checkpoint_number(path: Path) -> int:
    """N of a ``checkpoint-N`` folder; -1 for any other name."""
    found = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(found.group(1)) if found else -1


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``output_dir``, newest (highest N) first."""
    found = (p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and checkpoint_number(p) >= 0)
    return sorted(found, key=checkpoint_number, reverse=True)
