"""Our recipe keys, beside TRL's `GRPOConfig` and `ModelConfig`, and the batch arithmetic of a recipe.

A recipe is one flat YAML file of keys from the three dataclasses; `TrlParser` rejects any other key.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

# Tokens that end a completion, in training (the `stop_tokens` recipe key) and in evaluation.
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass
class PromptAugArguments:
    """Data, template and reward keys of a recipe (the rest are TRL's `GRPOConfig` / `ModelConfig`)."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": "`synthetic`, a Hub id (e.g. hkust-nlp/SimpleRL-Zoo-Data) or a local path."},
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Hub subset or local sub-folder, e.g. simplelr_qwen_level3to5."}
    )
    dataset_split: str = field(default="train", metadata={"help": "Split to train on."})
    question_column: str | None = field(default=None, metadata={"help": "Question column (guessed if unset)."})
    answer_column: str | None = field(default=None, metadata={"help": "Gold-answer column (guessed if unset)."})
    dataset_levels: list[str] | None = field(
        default=None, metadata={"help": "Keep only these `level` values (MATH), e.g. ['Level 3', 'Level 4']."}
    )
    dataset_num_rows: int | None = field(
        default=None, metadata={"help": "Row count of the dataset; used only by --dry_run for rounds per epoch."}
    )
    num_synthetic: int = field(default=256, metadata={"help": "Rows of the `synthetic` dataset."})
    max_prompt_length: int | None = field(
        default=1024, metadata={"help": "Drop questions whose prompt under the longest template exceeds this."}
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
        metadata={"help": "The fixed template in eval mode: from `templates_file` if it has it, else built-in."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["correctness", "format"],
        metadata={"help": "Reward names from rewards.REGISTRY, or functions by import path (package.module:function). "
                  "The paper: correctness + format."},
    )
    stop_tokens: list[str] = field(
        default_factory=lambda: list(STOP_TOKENS),
        metadata={"help": "Tokens that end a completion (those missing from the vocabulary are skipped)."},
    )
    eval_benchmarks: list[str] | None = field(
        default=None,
        metadata={"help": "Benchmarks evaluated during training, e.g. [math500], or question sets of one's own (a "
                  ".jsonl/.json/.parquet/.csv file, a save_to_disk folder or a Hub id; off if unset)."},
    )
    eval_every_steps: int = field(default=0, metadata={"help": "Evaluate every N optimizer steps (0: off)."})
    eval_data_dir: str | None = field(
        default=None, metadata={"help": "Local evaluation suite folder (default: the Hub's lkevinzc/math-eval)."}
    )
    eval_limit: int | None = field(default=None, metadata={"help": "First N questions per benchmark only."})
    eval_max_tokens: int = field(default=1024, metadata={"help": "New tokens per evaluation completion."})
    # -- drop-in GRPOTrainer (issue 11) --
    prompt_augmentation: bool = field(
        default=True,
        metadata={
            "help": "false: no augmentation; every question is asked under `eval_template` through TRL's own "
            "chat handling (its messages as a conversational prompt), as plain GRPO would."
        },
    )
    # Fidelity (the paper run): bound the W&B completions table; the parquet records keep every row.
    wandb_completions_rows: int | None = field(
        default=None,
        metadata={
            "help": "Rows of the W&B `completions` table per log step, with log_completions and report_to wandb: "
            "unset uploads every completion (TRL), 0 none, N a random sample of N. The parquet records under "
            "output_dir/completions/ keep every row either way."
        },
    )
    # --- Collapse guard and stabilisers (issue 13; prompt_aug/collapse.py). A guard signal is on when its
    # threshold is set (all unset: no guard). Windows count generation rounds; actions: log | checkpoint | stop.
    collapse_entropy_floor: float | None = field(
        default=None, metadata={"help": "Fire when `entropy` stays below this for collapse_entropy_rounds rounds."}
    )
    collapse_entropy_rounds: int = field(default=20, metadata={"help": "Rounds in a row below the floor."})
    collapse_entropy_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_accuracy_drop: float | None = field(
        default=None,
        metadata={"help": "Fire when the mean accuracy of the last collapse_accuracy_rounds rounds falls more than "
                  "this below its best such mean."},
    )
    collapse_accuracy_rounds: int = field(default=20, metadata={"help": "Rounds averaged for the accuracy signal."})
    collapse_accuracy_metric: str | None = field(
        default=None,
        metadata={"help": "Log key of the accuracy signal (default: the correctness reward's mean, else `reward`)."},
    )
    collapse_accuracy_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_truncation_ceiling: float | None = field(
        default=None,
        metadata={"help": "Fire when completions/clipped_ratio stays above this for collapse_truncation_rounds."},
    )
    collapse_truncation_rounds: int = field(default=10, metadata={"help": "Rounds in a row above the ceiling."})
    collapse_truncation_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_repetition_ceiling: float | None = field(
        default=None,
        metadata={"help": "Fire when the share of completions ending in an n-gram loop stays above this for "
                  "collapse_repetition_rounds rounds."},
    )
    collapse_repetition_rounds: int = field(default=10, metadata={"help": "Rounds in a row above the ceiling."})
    collapse_repetition_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    collapse_eval_drop: float | None = field(
        default=None,
        metadata={"help": "Fire when eval/macro, averaged over collapse_eval_evaluations evaluations, falls more "
                  "than this below its best (needs eval_benchmarks and eval_every_steps)."},
    )
    collapse_eval_evaluations: int = field(default=3, metadata={"help": "Evaluations averaged for the eval signal."})
    collapse_eval_action: str = field(default="checkpoint", metadata={"help": "log | checkpoint | stop."})
    reset_optimizer_on_ref_sync: bool = field(
        default=False,
        metadata={"help": "ProRL: zero the optimizer state at each reference sync (needs sync_ref_model: true)."},
    )
    skip_minibatch_ratio_above: float | None = field(
        default=None,
        metadata={"help": "RLinf: skip the optimizer update of a mini-batch whose mean max(r, 1/r) over its tokens "
                  "(r the policy ratio) is at least this; counted in stability/skipped_minibatches. Not under "
                  "DeepSpeed."},
    )
    trim_padding: bool = field(
        default=True,
        metadata={"help": "Train without most of TRL's padding: rows ordered by length within each optimizer "
                  "step, each micro-batch and old-log-prob chunk cut to its own longest prompt and "
                  "completion; the update is unchanged (prompt_aug/padding.py). false: TRL's padded passes."},
    )
    # --- Run-folder safety (newcomer) ---
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into an output_dir that already holds a run: first delete its checkpoints, model, "
            "logs and completions (without it such a folder is refused unless you resume)."
        },
    )
    # Dynamic sampling (DAPO): train each round only on groups whose rewards differ (prompt_aug/dynamic_sampling.py)
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "Replace zero-spread groups by groups of newly drawn questions (off: the paper's run)."},
    )
    dynamic_sampling_signal: str = field(
        default="total",
        metadata={"help": "What must differ within a group: `total` (weighted reward) or one reward_funcs name."},
    )
    dynamic_sampling_max_passes: int = field(
        default=4,
        metadata={"help": "Most generation passes per round; at the cap, zero-spread groups fill the round."},
    )
    dynamic_sampling_std_tol: float = field(
        default=1e-4, metadata={"help": "A group has spread when its signal's std exceeds this (not exactly 0)."}
    )
    # Learning demo (issue 10): a supervised warm start before GRPO, and a before/after table.
    warmstart_steps: int = field(
        default=0, metadata={"help": "Supervised steps on the training questions before GRPO (0: none)."}
    )
    warmstart_batch_size: int = field(default=32, metadata={"help": "Examples per warm-start step."})
    warmstart_learning_rate: float = field(
        default=1e-2, metadata={"help": "Warm-start AdamW learning rate (cosine decay to 0)."}
    )
    warmstart_wellformed: float = field(
        default=0.5, metadata={"help": "Share of warm-start targets written in their template's layout."}
    )
    warmstart_answer_correct: float = field(
        default=1.0,
        metadata={"help": "Share of warm-start targets whose boxed answer is right (the rest box another answer)."},
    )
    heldout_questions: int = field(
        default=0, metadata={"help": "Questions kept out of warm start and GRPO, scored by before_after."}
    )
    before_after: bool = field(
        default=False,
        metadata={"help": "Score every template before and after GRPO; print and write before_after.md."},
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "Print the batch arithmetic and exit; loads neither model nor data. Pass it on the command "
            "line: it then parses with use_cpu on, so bf16 recipes parse on a machine without a GPU."
        },
    )
    num_processes: int | None = field(
        default=None, metadata={"help": "Processes for --dry_run (default: WORLD_SIZE, else 1)."}
    )


# A dry run only prints arithmetic, so it parses as if on CPU: `TrainingArguments` rejects `bf16: true` at parse
# time on a machine without a bf16 GPU unless `use_cpu` is set. The real run never gets this override.
DRY_RUN_OVERRIDES = ("--use_cpu", "true")
_TRUE = ("", "1", "true", "yes", "y", "t", "on")


def wants_dry_run(argv: list[str]) -> bool:
    """Whether the command line asks for ``--dry_run`` (``--dry_run``, ``--dry_run true`` or ``--dry_run=true``).

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
            ("rounds per epoch", self.rounds_per_epoch if self.rounds_per_epoch is not None else "? (set dataset_num_rows)"),
            ("total rounds", self.total_rounds if self.total_rounds is not None else "?"),
        ]
        return "\n".join(f"{name:<32}{value}" for name, value in rows)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def batch_arithmetic(script_args: PromptAugArguments, training_args, num_processes: int | None = None) -> BatchArithmetic:
    """The effective batch arithmetic of a parsed recipe (no model, no data).

    Mirrors TRL 1.16: a round generates ``generation_batch_size`` completions (``per_device_train_batch_size
    × processes × steps_per_generation`` unless set), its questions are ``/ num_generations``, and the
    `RepeatSampler` drops the last incomplete round of an epoch.
    """
    processes = num_processes or script_args.num_processes or int(os.environ.get("WORLD_SIZE", "1"))
    per_step = training_args.per_device_train_batch_size * processes
    steps_per_generation = training_args.steps_per_generation or training_args.gradient_accumulation_steps
    # GRPOConfig fills generation_batch_size from its own process count; recompute for `processes`.
    completions = per_step * steps_per_generation
    questions = completions // training_args.num_generations
    optimizer_steps = steps_per_generation * training_args.num_iterations / training_args.gradient_accumulation_steps
    rows = script_args.dataset_num_rows
    if rows is None and script_args.dataset_name == "synthetic":
        rows = script_args.num_synthetic
    rounds_per_epoch = rows // questions if rows is not None and questions else None
    total = None
    if rounds_per_epoch is not None:
        if training_args.max_steps and training_args.max_steps > 0:
            total = math.ceil(training_args.max_steps / optimizer_steps)
        else:
            total = int(rounds_per_epoch * training_args.num_train_epochs)
    return BatchArithmetic(
        processes=processes,
        questions_per_round=questions,
        completions_per_round=completions,
        completions_per_optimizer_step=per_step * training_args.gradient_accumulation_steps,
        optimizer_steps_per_round=optimizer_steps,
        rounds_per_epoch=rounds_per_epoch,
        total_rounds=total,
    )
