"""The config pair, as TRL's: `PromptAugGRPOConfig` (TRL's `GRPOConfig` plus the trainer's keys) and
`PromptAugScriptArguments` (what the training script reads: data, reward names, how the run starts); and a
recipe's batch arithmetic.

A recipe is one flat YAML file of keys from these two, TRL's `ModelConfig` and the learning demo's
`prompt_aug.demo.DemoArguments`; the parser rejects any other key. Our keys are grouped as TRL groups its
own and checked in `__post_init__`, each failure one line naming the key.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from trl import DatasetMixtureConfig, GRPOConfig
from trl.scripts.utils import DatasetConfig

from .demo import BUILTIN_DATASETS
from .padding import padding_mode
from .records import generation_round, optimizer_steps_per_round
from .templates import STOP_TOKENS  # defined there so that evaluation need not import TRL

NUM_SYNTHETIC = 256  # rows of the built-in `synthetic` set unless num_synthetic says otherwise


@dataclass
class PromptAugGRPOConfig(GRPOConfig):
    r"""`GRPOConfig` with the settings of `PromptAugGRPOTrainer` (every `GRPOConfig` field keeps its meaning).

    > Prompt augmentation

    prompt_augmentation, templates, template_weights, templates_file, eval_template, system_prompt

    > Rewards and stopping

    stop_tokens, reward_cut_tokens

    > Evaluation during training

    eval_benchmarks, eval_every_steps, eval_data_dir, eval_limit, eval_max_tokens

    > Dynamic sampling (DAPO; `prompt_aug.extensions.dynamic_sampling`)

    dynamic_sampling, dynamic_sampling_signal, dynamic_sampling_max_passes, dynamic_sampling_std_tol

    > Stability: the collapse guard (`prompt_aug.extensions.collapse`) and the ProRL / RLinf stabilisers

    collapse_<signal>_<threshold>, collapse_<signal>_rounds / _evaluations, collapse_<signal>_action for the
    signals entropy, accuracy, truncation, repetition and eval; reset_optimizer_on_ref_sync,
    skip_minibatch_ratio_above

    > Efficiency

    trim_padding (packed | trim | off), packing_max_tokens, packing_pad_to_multiple_of

    > Logging

    wandb_completions_rows

    > Preemption

    save_on_preemption

    Each field's ``help`` says what it does; ``prompt-aug-train --help`` prints them.
    """

    # > Prompt augmentation
    prompt_augmentation: bool = field(
        default=True,
        metadata={
            "help": "false: no augmentation; every question is asked under `eval_template` through TRL's own "
            "chat handling (its messages as a conversational prompt), as plain GRPO would."
        },
    )
    templates: list[str] | None = field(
        default=None, metadata={"help": "Template names to draw from (default: the whole bank)."}
    )
    template_weights: list[float] | None = field(
        default=None, metadata={"help": "Sampling weights, one per entry of `templates` (default: uniform)."}
    )
    templates_file: str | None = field(
        default=None, metadata={"help": "A YAML file of templates replacing the built-in bank."}
    )
    eval_template: str = field(
        default="qwen-math",
        metadata={
            "help": "The fixed template in eval mode: from `templates_file` if it has it, else built-in."
        },
    )
    system_prompt: str | None = field(
        default=None,
        metadata={
            "help": "Text put before every template's system turn (a blank line between; the system turn of "
            "a template that has none), e.g. a persona your model was tuned with. The template's own text "
            "stays: it asks for the layout its format reward checks. Benchmark evaluation "
            "(eval_benchmarks, prompt-aug-eval) asks as the paper does, without it."
        },
    )

    # > Rewards and stopping
    stop_tokens: list[str] = field(
        default_factory=lambda: list(STOP_TOKENS),
        metadata={
            "help": "Tokens that end a completion, beside the model's EOS (those missing from the vocabulary "
            "are skipped). The paper's run: [<|endoftext|>], the EOS of Qwen2.5-Math-1.5B only."
        },
    )
    reward_cut_tokens: list[str] = field(
        default_factory=lambda: list(STOP_TOKENS),
        metadata={
            "help": "The rewards grade each completion's text up to the first of these tokens; generation "
            "may run past them (stop_tokens) and the whole completion is trained. The paper's run: "
            "[<|im_end|>], as verl's reward cut the text there."
        },
    )

    # > Evaluation during training
    eval_benchmarks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Benchmarks evaluated during training, e.g. [math500], or question sets of one's own (a "
            ".jsonl/.json/.parquet/.csv file, a save_to_disk folder or a Hub id; off if unset)."
        },
    )
    eval_every_steps: int = field(default=0, metadata={"help": "Evaluate every N optimizer steps (0: off)."})
    eval_data_dir: str | None = field(
        default=None,
        metadata={"help": "Local evaluation suite folder (default: the Hub's lkevinzc/math-eval)."},
    )
    eval_limit: int | None = field(default=None, metadata={"help": "First N questions per benchmark only."})
    eval_max_tokens: int = field(default=1024, metadata={"help": "New tokens per evaluation completion."})

    # > Dynamic sampling (DAPO): train each round only on groups whose rewards differ
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Replace zero-spread groups by groups of newly drawn questions (off: the paper's run)."
        },
    )
    dynamic_sampling_signal: str = field(
        default="total",
        metadata={
            "help": "What must differ within a group: `total` (weighted reward) or one reward_funcs name."
        },
    )
    dynamic_sampling_max_passes: int = field(
        default=4,
        metadata={"help": "Most generation passes per round; at the cap, zero-spread groups fill the round."},
    )
    dynamic_sampling_std_tol: float = field(
        default=1e-4,
        metadata={"help": "A group has spread when its signal's std exceeds this (not exactly 0)."},
    )

    # > Stability. A collapse-guard signal is on when its threshold is set (all unset: no guard).
    # Windows count generation rounds; actions: log | checkpoint | stop.
    collapse_entropy_floor: float | None = field(
        default=None,
        metadata={"help": "Fire when `entropy` stays below this for collapse_entropy_rounds rounds."},
    )
    collapse_entropy_rounds: int = field(default=20, metadata={"help": "Rounds in a row below the floor."})
    collapse_entropy_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_accuracy_drop: float | None = field(
        default=None,
        metadata={
            "help": "Fire when the mean accuracy of the last collapse_accuracy_rounds rounds falls more than "
            "this below its best such mean."
        },
    )
    collapse_accuracy_rounds: int = field(
        default=20, metadata={"help": "Rounds averaged for the accuracy signal."}
    )
    collapse_accuracy_metric: str | None = field(
        default=None,
        metadata={
            "help": "Log key of the accuracy signal (default: the correctness reward's mean, else `reward`)."
        },
    )
    collapse_accuracy_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_truncation_ceiling: float | None = field(
        default=None,
        metadata={
            "help": "Fire when completions/clipped_ratio stays above this for collapse_truncation_rounds."
        },
    )
    collapse_truncation_rounds: int = field(
        default=10, metadata={"help": "Rounds in a row above the ceiling."}
    )
    collapse_truncation_action: str = field(
        default="checkpoint", metadata={"help": "log | checkpoint | stop."}
    )
    collapse_repetition_ceiling: float | None = field(
        default=None,
        metadata={
            "help": "Fire when the share of completions ending in an n-gram loop stays above this for "
            "collapse_repetition_rounds rounds."
        },
    )
    collapse_repetition_rounds: int = field(
        default=10, metadata={"help": "Rounds in a row above the ceiling."}
    )
    collapse_repetition_action: str = field(
        default="checkpoint", metadata={"help": "log | checkpoint | stop."}
    )
    collapse_eval_drop: float | None = field(
        default=None,
        metadata={
            "help": "Fire when eval/macro, averaged over collapse_eval_evaluations evaluations, falls more "
            "than this below its best (needs eval_benchmarks and eval_every_steps)."
        },
    )
    collapse_eval_evaluations: int = field(
        default=3, metadata={"help": "Evaluations averaged for the eval signal."}
    )
    collapse_eval_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    reset_optimizer_on_ref_sync: bool = field(
        default=False,
        metadata={
            "help": "ProRL: zero the optimizer state at each reference sync (needs sync_ref_model: true)."
        },
    )
    skip_minibatch_ratio_above: float | None = field(
        default=None,
        metadata={
            "help": "RLinf: skip the optimizer update of a mini-batch whose mean max(r, 1/r) over its tokens "
            "(r the policy ratio) is at least this; counted in stability/skipped_minibatches. Not under "
            "DeepSpeed."
        },
    )

    # > Efficiency
    trim_padding: str = field(
        default="auto",
        metadata={
            "help": "How training passes skip TRL's padding: `auto` (packed on CUDA, trim elsewhere; logged "
            "once), `packed` (each call's real tokens in one row, position ids restarting per sequence; "
            "varlen attention on CUDA where torch has it), `trim` (each call cut to its own longest prompt "
            "and completion; the fallback when packing cannot serve the model), `off` (TRL's padded calls). "
            "true means packed, false off. The update is the same on every path (prompt_aug/padding.py)."
        },
    )
    packing_max_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Real tokens per packed call (default: the tokens of TRL's padded call, so memory never "
            "exceeds TRL's); a call above it is split. One process only."
        },
    )
    packing_pad_to_multiple_of: int | None = field(
        default=None,
        metadata={"help": "Round each packed call's length up to a multiple of this (default: no rounding)."},
    )

    # > Logging
    wandb_completions_rows: int | None = field(
        default=None,
        metadata={
            "help": "Rows of the W&B `completions` table per log step, with log_completions and "
            "report_to wandb: unset uploads every completion (TRL), 0 none, N a random sample of N. "
            "The parquet records under output_dir/completions/ keep every row either way."
        },
    )

    # > Preemption
    save_on_preemption: bool = field(
        default=True,
        metadata={
            "help": "On SIGTERM or SIGUSR1 (what a cluster sends before it stops a job), finish the "
            "optimizer step, save a checkpoint on every process and stop; prompt-aug-train then writes "
            "output_dir/preempted.json and exits with status 75 (docs/reproduce.md, 'Preemption and "
            "requeue'). false: the signals keep their default action (the process ends at once)."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.trim_padding = padding_mode(self.trim_padding)
        check_config(self)


@dataclass
class PromptAugScriptArguments:
    """What ``prompt-aug-train`` reads beside the trainer's config, as TRL's `GRPOScriptArguments`: the data,
    the reward functions by name, and how the run starts. The trainer never sees these: it is given a
    dataset and reward functions.

    > Data

    dataset_name, dataset_config, dataset_split, question_column, answer_column, dataset_levels,
    dataset_mixture, dataset_num_rows, num_synthetic, max_prompt_length, max_bad_row_share

    > Model

    chat_template

    > Rewards

    reward_funcs

    > The run

    overwrite_output_dir, dry_run, num_processes
    """

    # > Data
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A Hub id (e.g. hkust-nlp/SimpleRL-Zoo-Data), a local folder or file, or a built-in "
            "set of the demo (synthetic, synthetic-addition, synthetic-digit-sums). Required."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub subset or local sub-folder, e.g. simplelr_qwen_level3to5."}
    )
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    question_column: str | None = field(
        default=None, metadata={"help": "Question column (guessed if unset)."}
    )
    answer_column: str | None = field(
        default=None, metadata={"help": "Gold-answer column (guessed if unset)."}
    )
    dataset_levels: list[str] | None = field(
        default=None,
        metadata={"help": "Keep only these `level` values (MATH), e.g. ['Level 3', 'Level 4']."},
    )
    dataset_mixture: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Several datasets mixed, instead of dataset_name: TRL's DatasetMixtureConfig, "
            "{datasets: [{path, name, data_dir, data_files, split, columns, fraction, question_column, "
            "answer_column, dataset_levels}, ...]}. Each source is mapped onto question/answer/uid as "
            "dataset_name is (its uids prefixed with its position); the top-level question_column, "
            "answer_column and dataset_levels apply to sources that do not set their own."
        },
    )
    dataset_num_rows: int | None = field(
        default=None,
        metadata={"help": "Row count of the dataset; used only by --dry_run for rounds per epoch."},
    )
    num_synthetic: int = field(default=NUM_SYNTHETIC, metadata={"help": "Rows of the `synthetic` dataset."})
    max_prompt_length: int | None = field(
        default=1024,
        metadata={"help": "Drop questions whose prompt under the longest template exceeds this."},
    )
    max_bad_row_share: float = field(
        default=0.05,
        metadata={
            "help": "Stop when more than this share of the rows read is unusable (empty question; missing, "
            "empty, NaN or oddly typed answer); below it such rows are dropped and reported. 1.0: never stop."
        },
    )

    # > Model
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "The chat template prompts render through, set on the tokenizer when it loads (and "
            "saved with the model): `chatml`, a Jinja template, or the path of a .jinja file. Needed for a "
            "base model whose tokenizer has none; replaces the tokenizer's own otherwise."
        },
    )

    # > Rewards
    reward_funcs: list[str] = field(
        default_factory=lambda: ["correctness", "format"],
        metadata={
            "help": "Reward names from rewards.REGISTRY, or functions by import path "
            "(package.module:function). The paper: correctness + format."
        },
    )
    # > The run
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into an output_dir that already holds a run: first delete its checkpoints, model, "
            "logs and completions (without it such a folder is refused unless you resume)."
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Print the batch arithmetic and exit; loads neither model nor data. Pass it on the "
            "command line: it then parses with use_cpu on, so bf16 recipes parse on a machine without a GPU."
        },
    )
    num_processes: int | None = field(
        default=None, metadata={"help": "Processes for --dry_run (default: WORLD_SIZE, else 1)."}
    )

    def __post_init__(self) -> None:
        if isinstance(self.dataset_mixture, str):  # from the command line, as JSON
            try:
                self.dataset_mixture = json.loads(self.dataset_mixture)
            except json.JSONDecodeError as err:
                raise ValueError(f"dataset_mixture: not a JSON mapping ({err})") from None
        if self.dataset_mixture is not None:
            self.dataset_mixture = dataset_mixture(self.dataset_mixture)
            clashes = [
                key
                for key, value, default in (
                    ("dataset_name", self.dataset_name, None),
                    ("dataset_config", self.dataset_config, None),
                    ("dataset_split", self.dataset_split, "train"),
                )
                if value != default
            ]
            if clashes:
                raise ValueError(
                    f"dataset_mixture and {clashes[0]} are both set: a mixture names its sources itself "
                    "(path, name, split per source); remove " + clashes[0]
                )
        if self.num_synthetic != NUM_SYNTHETIC and self.dataset_name not in BUILTIN_DATASETS:
            raise ValueError(
                f"num_synthetic sizes only the built-in sets ({', '.join(BUILTIN_DATASETS)}), and "
                f"dataset_name is {self.dataset_name!r}: remove num_synthetic"
            )


@dataclass
class MixtureSource(DatasetConfig):
    """One source of a ``dataset_mixture``: TRL's `DatasetConfig` (``path``, ``name``, ``data_dir``,
    ``data_files``, ``split``, ``columns``, ``fraction``) and the column mapping of ``dataset_name``
    (``None``: the top-level key's value, else guessed)."""

    question_column: str | None = None
    answer_column: str | None = None
    dataset_levels: list[str] | None = None


def dataset_mixture(value: Any) -> DatasetMixtureConfig:
    """The recipe's ``dataset_mixture`` mapping as TRL's `DatasetMixtureConfig` of `MixtureSource`; a key
    neither has, or what the package cannot train on (streaming, a test split), fails in one line."""
    if isinstance(value, DatasetMixtureConfig):
        return value
    where = "dataset_mixture"
    if not isinstance(value, dict):  # a recipe value: a ValueError, reported in one line by the parser
        raise ValueError(f"{where}: a mapping with `datasets: [...]`, got {type(value).__name__}")  # noqa: TRY004
    known = {f.name for f in fields(DatasetMixtureConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; it takes {sorted(known)}")
    if value.get("streaming"):
        raise ValueError(
            f"{where}.streaming: not supported (the trainer's sampler needs the row count); remove it"
        )
    if value.get("test_split_size") is not None:
        raise ValueError(
            f"{where}.test_split_size: prompt-aug-train has no held-out split; remove it and give held-out "
            "questions to eval_benchmarks as a file"
        )
    entries = value.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}.datasets: a non-empty list of sources, each with a `path`")
    keys = {f.name for f in fields(MixtureSource)}
    sources = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "path" not in entry:
            raise ValueError(
                f"{where}.datasets[{i}]: a mapping with a `path` ({sorted(keys)}), got {entry!r}"
            )
        unknown = sorted(set(entry) - keys)
        if unknown:
            raise ValueError(
                f"{where}.datasets[{i}]: unknown key(s) {unknown}; a source takes {sorted(keys)}"
            )
        levels = entry.get("dataset_levels")
        if levels is not None:
            entry = {**entry, "dataset_levels": [str(level) for level in levels]}
        sources.append(MixtureSource(**entry))
    fractions = [s.fraction for s in sources]
    if None in fractions and any(f is not None for f in fractions):
        raise ValueError(f"{where}: `fraction` must be set for every source or for none")
    return DatasetMixtureConfig(datasets=sources)


def check_config(args: Any) -> None:
    """Fail on a key that cannot work with the rest of the recipe (`ValueError`, one line naming the key):
    the stabilisers, the collapse guard's actions, windows and thresholds, and dynamic sampling's numbers.
    (The dynamic-sampling signal is checked against the reward functions the trainer is given.)"""
    from .extensions.collapse import check_stabiliser_keys, guard_from_args
    from .extensions.dynamic_sampling import DynamicSampler

    check_stabiliser_keys(args, args)
    guard_from_args(args, 1.0)
    if args.dynamic_sampling:
        DynamicSampler(None, args.dynamic_sampling_max_passes, args.dynamic_sampling_std_tol)
    for line in inert_keys(args):
        warnings.warn(line, UserWarning, stacklevel=2)


# Keys read only while a feature is on: (the feature, what turns it on, whether it is on, its keys).
def _features(args: Any) -> list[tuple[str, str, bool, tuple[str, ...]]]:
    evaluation = bool(args.eval_every_steps and args.eval_benchmarks)
    return [
        ("prompt augmentation", "prompt_augmentation: true", args.prompt_augmentation,
         ("templates", "template_weights")),
        ("dynamic sampling", "dynamic_sampling: true", args.dynamic_sampling,
         ("dynamic_sampling_signal", "dynamic_sampling_max_passes", "dynamic_sampling_std_tol")),
        ("evaluation during training", "eval_every_steps > 0 with eval_benchmarks", evaluation,
         ("eval_every_steps", "eval_benchmarks", "eval_data_dir", "eval_limit", "eval_max_tokens")),
        ("packing", "trim_padding: packed", args.trim_padding == "packed",
         ("packing_max_tokens", "packing_pad_to_multiple_of")),
    ]  # fmt: skip


def inert_keys(args: Any) -> list[str]:
    """One line per feature that is off while keys only it reads are set away from their defaults: such keys
    do nothing, which a recipe's author rarely means (`check_config` warns with these lines)."""
    features = _features(args)
    read = {key for *_, keys in features for key in keys}
    defaults = {
        f.name: f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        for f in fields(args)
        if f.name in read
    }
    lines = []
    for feature, turned_on_by, on, keys in features:
        set_keys = [k for k in keys if getattr(args, k) != defaults[k]]
        if set_keys and not on:
            them = "it" if len(set_keys) == 1 else "them"
            lines.append(
                f"{', '.join(set_keys)}: no effect, since {feature} is off ({turned_on_by} turns it on); "
                f"turn it on or remove {them}"
            )
    return lines


# A dry run only prints arithmetic, so it parses as if on CPU: `TrainingArguments` rejects `bf16: true` at
# parse time on a machine without a bf16 GPU unless `use_cpu` is set. The real run never gets this override.
DRY_RUN_OVERRIDES = ("--use_cpu", "true")
_TRUE = ("", "1", "true", "yes", "y", "t", "on")


def wants_dry_run(argv: list[str]) -> bool:
    """Whether the command line asks for ``--dry_run`` (``--dry_run``, ``--dry_run true`` or
    ``--dry_run=true``).

    >>> wants_dry_run(["--config", "r.yaml", "--dry_run"]), wants_dry_run(["--dry_run", "false"])
    (True, False)
    """
    for i, arg in enumerate(argv):
        if arg.startswith("--dry_run="):
            return arg.split("=", 1)[1].lower() in _TRUE
        if arg == "--dry_run":
            following = argv[i + 1] if i + 1 < len(argv) else ""
            return following.startswith("--") or following.lower() in _TRUE
    return False


@dataclass
class BatchArithmetic:
    """How a recipe's batch keys combine into generation rounds and optimizer steps."""

    processes: int
    questions_per_round: int
    completions_per_round: int
    completions_per_optimizer_step: int
    optimizer_steps_per_round: float
    rounds_per_epoch: int | None
    total_rounds: int | None

    def table(self) -> str:
        rows = [
            ("processes", self.processes),
            ("questions per round", self.questions_per_round),
            ("completions per round", self.completions_per_round),
            ("completions per optimizer step", self.completions_per_optimizer_step),
            ("optimizer steps per round", _fmt(self.optimizer_steps_per_round)),
            (
                "rounds per epoch",
                self.rounds_per_epoch if self.rounds_per_epoch is not None else "? (set dataset_num_rows)",
            ),
            ("total rounds", self.total_rounds if self.total_rounds is not None else "?"),
        ]
        return "\n".join(f"{name:<32}{value}" for name, value in rows)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def batch_arithmetic(
    args: PromptAugGRPOConfig,
    script_args: PromptAugScriptArguments | None = None,
    num_processes: int | None = None,
) -> BatchArithmetic:
    """The effective batch arithmetic of a parsed recipe (no model, no data).

    Mirrors TRL 1.16: a round generates ``generation_batch_size`` completions (``per_device_train_batch_size
    × processes × steps_per_generation`` unless set), its questions are ``/ num_generations``, and the
    `RepeatSampler` drops the last incomplete round of an epoch. Rounds per epoch need the dataset's row
    count (``script_args.dataset_num_rows``, or a built-in set's size).
    """
    processes = num_processes or (script_args.num_processes if script_args else None)
    processes = processes or int(os.environ.get("WORLD_SIZE", "1"))
    per_step = args.per_device_train_batch_size * processes
    steps_per_generation = args.steps_per_generation or args.gradient_accumulation_steps
    # GRPOConfig fills generation_batch_size from its own process count; recompute for `processes`.
    completions = per_step * steps_per_generation
    questions = completions // args.num_generations
    optimizer_steps = optimizer_steps_per_round(args)
    rows = script_args.dataset_num_rows if script_args else None
    if rows is None and script_args is not None and script_args.dataset_name == "synthetic":
        rows = script_args.num_synthetic
    rounds_per_epoch = rows // questions if rows is not None and questions else None
    total = None
    if rounds_per_epoch is not None:
        if args.max_steps and args.max_steps > 0:
            total = generation_round(args.max_steps, optimizer_steps)
        else:
            total = int(rounds_per_epoch * args.num_train_epochs)
    return BatchArithmetic(
        processes=processes,
        questions_per_round=questions,
        completions_per_round=completions,
        completions_per_optimizer_step=per_step * args.gradient_accumulation_steps,
        optimizer_steps_per_round=optimizer_steps,
        rounds_per_epoch=rounds_per_epoch,
        total_rounds=total,
    )
