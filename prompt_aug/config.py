"""`PromptAugGRPOConfig`: TRL's `GRPOConfig` plus the trainer's keys, grouped as TRL groups its own and
checked in `__post_init__`, each failure one line naming the key. (What only the training script reads is
`prompt_aug.recipe.PromptAugScriptArguments`, as TRL's `GRPOScriptArguments` lives beside its GRPO script.)

`KEYS` is the one table of our trainer's keys: each field gives the default and help, and its `KeyInfo` the
feature that reads it, its checks and, where it differs from our default, its value under a plain `GRPOConfig`
(TRL's behaviour). `check_config`, `inert_keys` and `trainer_settings` all read it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple

from trl import GRPOConfig

from .padding import max_tokens_refusal, padding_mode
from .templates import STOP_TOKENS, renderer_keys_refusal  # there so that evaluation need not import TRL

ACTIONS = ("log", "checkpoint", "stop")  # what the collapse guard does when a signal fires
# TRL's batch keys and their smallest values: TRL divides by them (a traceback at 0), a negative one gives
# a negative batch, and GRPO compares the completions of a question (TRL refuses 1 itself); the optional
# ones may be unset.
BATCH_LOW = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "num_generations": 2}
BATCH_LOW_IF_SET = {"steps_per_generation": 1, "generation_batch_size": 1}
# What TRL 1.16's GRPOTrainer accepts; it checks them only inside the first training step.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
SCALE_REWARDS = ("group", "batch", "none")  # and true / false, TRL's group / none


class Range(NamedTuple):
    """The values a number key takes: from ``low`` to ``high`` (``None``: no bound), each end refused itself
    when open; ``None`` itself only where ``optional``; ``hint`` ends the refusal (what to give instead)."""

    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    optional: bool = False
    hint: str = ""


# TRL's sampling, length and loss keys, and the optimizer's numbers: generation refuses other values only once
# it starts, the loss at its first step (or trains a KL bonus, clip bounds beyond 1), torch's optimizers only
# when the trainer builds them, all after the model has loaded. An unset max_completion_length fails in the
# round's metrics.
NUMBER_RANGES = {
    "top_p": Range(0, 1, open_low=True, optional=True),
    "min_p": Range(0, 1, optional=True),
    "top_k": Range(0, hint="0 keeps every token, as -1 does in vLLM and verl"),
    "repetition_penalty": Range(0, open_low=True),
    "max_completion_length": Range(1),
    "beta": Range(0),
    "epsilon": Range(0),
    "epsilon_high": Range(0, optional=True),
    "top_entropy_quantile": Range(0, 1),
    "learning_rate": Range(0),
    "adam_epsilon": Range(0),
    "weight_decay": Range(0),
    "adam_beta1": Range(0, 1, open_high=True),
    "adam_beta2": Range(0, 1, open_high=True),
}
# GRPOConfig's keys that take a mapping or its JSON text (TrainingArguments parses a string starting with
# "{"); the others of `_VALID_DICT_FIELDS` take a file path too. Any other value fails only once read.
MAPPING_KEYS = tuple(
    k for k in GRPOConfig._VALID_DICT_FIELDS if k not in ("accelerator_config", "fsdp_config", "deepspeed")
)
SIGNALS = {  # the collapse guard's signals: the key whose value turns each on, and its window key
    "entropy": ("collapse_entropy_floor", "collapse_entropy_rounds"),
    "accuracy": ("collapse_accuracy_drop", "collapse_accuracy_rounds"),
    "truncation": ("collapse_truncation_ceiling", "collapse_truncation_rounds"),
    "repetition": ("collapse_repetition_ceiling", "collapse_repetition_rounds"),
    "eval": ("collapse_eval_drop", "collapse_eval_evaluations"),
}


def _on(key: str) -> Callable[[Any], bool]:
    return lambda args: getattr(args, key) is not None


# Feature -> (what turns it on, whether it is on). A key whose field names a feature is read only while that
# feature is on; keys without one are always read.
FEATURES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "prompt augmentation": ("prompt_augmentation: true", lambda a: a.prompt_augmentation),
    "dynamic sampling": ("dynamic_sampling: true", lambda a: a.dynamic_sampling),
    "evaluation during training": (
        "eval_every_steps > 0 with eval_benchmarks", lambda a: bool(a.eval_every_steps and a.eval_benchmarks)
    ),
    "packing": ("trim_padding: packed or auto", lambda a: a.trim_padding in ("packed", "auto")),
    "the W&B completions table": (
        "log_completions: true with report_to wandb",
        lambda a: bool(a.log_completions) and "wandb" in (a.report_to or []),
    ),
    **{f"the collapse guard's {name} signal": (on, _on(on)) for name, (on, _) in SIGNALS.items()},
}  # fmt: skip


class KeyInfo(NamedTuple):
    """What the table says of one of our trainer's keys beside its default and help."""

    feature: str | None  # the `FEATURES` entry that reads it; None: always read
    trl: Any  # its value under a plain `GRPOConfig` (TRL's behaviour); `MISSING`: our default
    low: float | None  # its smallest allowed value
    choices: tuple[str, ...] | None  # its allowed values
    high: float | None = None  # its largest allowed value


_PENDING: dict[int, KeyInfo] = {}  # filled while the class body runs; read into `KEYS` below it


def help_field(default: Any, help: str) -> Any:
    """A dataclass field with its default (a list is copied per instance) and help."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _key(
    default: Any, help: str, feature: str | None = None, trl: Any = MISSING, low: float | None = None,
    choices: tuple[str, ...] | None = None, high: float | None = None,
) -> Any:  # fmt: skip
    """A field of ours: its default (a list is copied per instance) and help, as TRL declares its own; the
    rest goes to `KEYS` (dataclass metadata reaches argparse, which takes only its own words)."""
    made = help_field(default, help)
    _PENDING[id(made)] = KeyInfo(feature, trl, low, choices, high)
    return made


def _guard(name: str) -> str:
    return f"the collapse guard's {name} signal"


def _window(default: int, help: str, signal: str) -> Any:
    """A ``collapse_<signal>_rounds`` (or ``_evaluations``) field: the signal's window, at least 1."""
    return _key(default, help, _guard(signal), low=1)


def _action(signal: str) -> Any:
    """The ``collapse_<signal>_action`` field: what the guard does when that signal fires."""
    return _key("checkpoint", "log | checkpoint | stop.", _guard(signal), choices=ACTIONS)


@dataclass
class PromptAugGRPOConfig(GRPOConfig):
    """`GRPOConfig` with the settings of `PromptAugGRPOTrainer` (every `GRPOConfig` field keeps its meaning),
    grouped as below: prompt augmentation; rewards and stopping; evaluation during training; dynamic sampling
    (DAPO, `prompt_aug.extensions.dynamic_sampling`); stability: the collapse guard (``collapse_<signal>_*``
    for entropy, accuracy, truncation, repetition and eval; `prompt_aug.extensions.collapse`) and the ProRL /
    RLinf stabilisers; efficiency (``trim_padding``, packing); logging; preemption. Each field's ``help``
    says what it does (``prompt-aug-train --help`` prints them); `KEYS` says which feature reads it.
    """

    # > Prompt augmentation
    prompt_augmentation: bool = _key(
        True,
        "false: no augmentation. prompt-aug-train asks every question under `eval_template` (with "
        "`system_prompt`) through TRL's own chat handling (its messages as a conversational prompt), as "
        "plain GRPO would; a trainer built in code trains on the dataset's own `prompt`, as GRPOTrainer "
        "does (prompt_aug.data.plain_prompts(dataset, prompt_aug.templates.templates_for(config)[2]) "
        "gives it the former).",
    )
    templates: list[str] | None = _key(
        None, "Template names to draw from (default: the whole bank).", "prompt augmentation"
    )
    template_weights: list[float] | None = _key(
        None, "Sampling weights, one per entry of `templates` (default: uniform).", "prompt augmentation"
    )
    templates_file: str | None = _key(None, "A YAML file of templates replacing the built-in bank.")
    eval_template: str = _key(
        "qwen-math", "The fixed template in eval mode: from `templates_file` if it has it, else built-in."
    )
    system_prompt: str | None = _key(
        None,
        "Text put before every template's system turn (a blank line between; the system turn of a template "
        "that has none), e.g. a persona your model was tuned with. The template's own text stays: it asks "
        "for the layout its format reward checks. Benchmark evaluation (eval_benchmarks, prompt-aug-eval) "
        "asks as the paper does, without it.",
    )

    # > Rewards and stopping
    stop_tokens: list[str] = _key(
        list(STOP_TOKENS),
        "Tokens that end a completion, beside the model's EOS; each must be one token of the vocabulary "
        "(one that is not is skipped, with a warning unless it is the default). The paper's run: "
        "[<|endoftext|>], the EOS of Qwen2.5-Math-1.5B only.",
        trl=[],
    )
    reward_cut_tokens: list[str] = _key(
        list(STOP_TOKENS),
        "The rewards grade each completion's text up to the first of these tokens; generation may run past "
        "them (stop_tokens) and the whole completion is trained. The paper's run: [<|im_end|>], as verl's "
        "reward cut the text there.",
        trl=[],
    )

    # > Evaluation during training
    eval_benchmarks: list[str] | None = _key(
        None,
        "Benchmarks evaluated during training, e.g. [math500], or question sets of one's own (a "
        ".jsonl/.json/.parquet/.csv file, a save_to_disk folder or a Hub id; off if unset).",
        "evaluation during training",
    )
    eval_every_steps: int = _key(
        0, "Evaluate every N optimizer steps (0: off).", "evaluation during training", low=0
    )
    eval_data_dir: str | None = _key(
        None,
        "Local evaluation suite folder (default: the Hub's lkevinzc/math-eval).",
        "evaluation during training",
    )
    eval_limit: int | None = _key(
        None, "First N questions per benchmark only.", "evaluation during training", low=1
    )
    eval_question_column: str | None = _key(
        None,
        "Question column of eval_benchmarks' own question sets (default: the first of question, problem, "
        "query, input), as prompt-aug-eval's --question_column; the suite's benchmarks keep theirs.",
        "evaluation during training",
    )
    eval_answer_column: str | None = _key(
        None,
        "Gold column of eval_benchmarks' own question sets (default: the first of answer, ground_truth, "
        "final_answer, target, solution; a solution column gives its boxed answer), as prompt-aug-eval's "
        "--answer_column.",
        "evaluation during training",
    )
    eval_max_tokens: int = _key(
        1024, "New tokens per evaluation completion.", "evaluation during training", low=1
    )

    # > Dynamic sampling (DAPO): train each round only on groups whose rewards differ
    dynamic_sampling: bool = _key(
        False, "Replace zero-spread groups by groups of newly drawn questions (off: the paper's run)."
    )
    dynamic_sampling_signal: str = _key(
        "total",
        "What must differ within a group: `total` (weighted reward) or one reward_funcs name. DAPO "
        "filters on accuracy: `correctness`; `total` also keeps groups that differ in format only.",
        "dynamic sampling",
    )
    dynamic_sampling_max_passes: int = _key(
        4,
        "Most generation passes per round; at the cap, zero-spread groups fill the round.",
        "dynamic sampling",
        low=1,
    )
    dynamic_sampling_std_tol: float = _key(
        1e-6,
        "A group has spread when its signal's std exceeds this (not exactly 0, for float noise; well below "
        "the 1e-4 TRL adds to a group's std, so a flat group's advantages are near 0).",
        "dynamic sampling",
        low=0,
    )

    # > Stability. The collapse guard's signals: first each signal's threshold (a signal is on when its
    # threshold is set; all unset: no guard), then its window (generation rounds; the eval signal's counts
    # evaluations), then its action (log | checkpoint | stop).
    collapse_accuracy_drop: float | None = _key(
        None,
        "Fire when the mean accuracy of the last collapse_accuracy_rounds rounds falls more than this below "
        "its best such mean.",
        low=0,
    )
    collapse_accuracy_metric: str | None = _key(
        None,
        "Log key of the accuracy signal (default: `completions/accuracy`, the share graded right; with "
        "dynamic sampling, read over everything generated).",
        _guard("accuracy"),
    )
    collapse_entropy_floor: float | None = _key(
        None, "Fire when `entropy` stays below this for collapse_entropy_rounds rounds.", low=0
    )
    collapse_truncation_ceiling: float | None = _key(
        None,
        "Fire when completions/clipped_ratio (a share, 0 to 1) stays above this for "
        "collapse_truncation_rounds.",
        low=0,
        high=1,
    )
    collapse_repetition_ceiling: float | None = _key(
        None,
        "Fire when the share of completions ending in an n-gram loop (0 to 1) stays above this for "
        "collapse_repetition_rounds rounds.",
        low=0,
        high=1,
    )
    collapse_eval_drop: float | None = _key(
        None,
        "Fire when eval/macro, averaged over collapse_eval_evaluations evaluations, falls more than this "
        "below its best (needs eval_benchmarks and eval_every_steps).",
        low=0,
    )
    collapse_entropy_rounds: int = _window(20, "Rounds in a row below the floor.", "entropy")
    collapse_accuracy_rounds: int = _window(20, "Rounds averaged for the accuracy signal.", "accuracy")
    collapse_truncation_rounds: int = _window(10, "Rounds in a row above the ceiling.", "truncation")
    collapse_repetition_rounds: int = _window(10, "Rounds in a row above the ceiling.", "repetition")
    collapse_eval_evaluations: int = _window(3, "Evaluations averaged for the eval signal.", "eval")
    collapse_entropy_action: str = _action("entropy")
    collapse_accuracy_action: str = _action("accuracy")
    collapse_truncation_action: str = _action("truncation")
    collapse_repetition_action: str = _action("repetition")
    collapse_eval_action: str = _action("eval")
    reset_optimizer_on_ref_sync: bool = _key(
        False, "ProRL: zero the optimizer state at each reference sync (needs sync_ref_model: true)."
    )
    skip_minibatch_ratio_above: float | None = _key(
        None,
        "RLinf: skip the optimizer update of a mini-batch whose mean max(r, 1/r) over its tokens (r the "
        "policy ratio) is at least this; counted in stability/skipped_minibatches. Not under DeepSpeed or "
        "fp16.",
    )

    # > Efficiency
    trim_padding: str = _key(
        "auto",
        "How training passes skip TRL's padding: `auto` (packed on CUDA and CPU, trim elsewhere; logged "
        "once; on CUDA, trim from the first call where a packed call would compute a dense mask: no varlen "
        "kernel, a GPU older than Ampere, heads over 256 wide, not fp16 / bf16, attention dropout, eager "
        "attention, varlen attention failing its live check), `packed` (each call's real tokens in "
        "one row, position ids restarting per sequence; varlen attention on CUDA where torch has it, SDPA a "
        "sequence on CPU), `trim` (each call cut to its own longest prompt and completion; the fallback "
        "when packing cannot serve the model), `off` (TRL's "
        "padded calls). The update is the same on every path (prompt_aug/padding.py): a model that numbers "
        "positions from the row's start (a learned table, as GPT-2's) keeps the round's left padding "
        "(trim of completions only, logged). The old true / false mean packed / off.",
    )
    packing_max_tokens: int | None = _key(
        None,
        "Real tokens per packed call (default: the tokens of TRL's padded call, so memory never exceeds "
        "TRL's); a call above it is split. One process only: refused with several while packing is on.",
        "packing",
        low=1,
    )
    packing_pad_to_multiple_of: int | None = _key(
        None,
        "Round each packed call's length up to a multiple of this (default: no rounding).",
        "packing",
        low=1,
    )
    packing_share_prompts: bool = _key(
        False,
        "Run a prompt once for the completions of its group that share a packed call (the old-log-prob "
        "pass holds whole groups; the token balancer deals a training step's rows of one prompt together), "
        "through prompt_aug.varlen's attention (a model on sdpa; checked live once; a reference model runs "
        "unshared). Exact; not yet timed on a GPU, so off by default.",
        "packing",
    )

    # > Logging
    wandb_completions_rows: int | None = _key(
        None,
        "Rows of the W&B `completions` table per log step, with log_completions and report_to wandb: unset "
        "uploads every completion (TRL), 0 none, N a random sample of N. The parquet records under "
        "output_dir/completions/ keep every row either way.",
        "the W&B completions table",
        low=0,
    )

    # > Preemption
    save_on_preemption: bool = _key(
        True,
        "On SIGTERM or SIGUSR1 (what a cluster sends before it stops a job), finish the optimizer step, save "
        "a checkpoint on every process (an evaluation due at that step is skipped) and stop; "
        "prompt-aug-train then writes output_dir/preempted.json and exits with status 75 (docs/reproduce.md, "
        "'Preemption and requeue'), and train() in a script of your own raises prompt_aug.faults.Preempted, "
        "a SystemExit with status 75. false (and a plain GRPOConfig, as in TRL): the signals keep their "
        "default action (the process ends at once).",
        trl=False,
    )

    # Why: `--dry_run --num_processes N` runs in one process but must check TRL's batch arithmetic (its
    # divisibility checks, generation_batch_size and steps_per_generation) as N processes will; only
    # `planned_processes`, around a dry run's parse, sets the number.
    @property
    def world_size(self) -> int:
        return _PLANNED_PROCESSES.get() or super().world_size

    def __post_init__(self) -> None:
        check_trl_keys(self)  # before TRL's own checks, which fail on some with a traceback
        super().__post_init__()
        mode = padding_mode(self.trim_padding)
        if mode != str(self.trim_padding).strip().lower():  # one of the old booleans' spellings
            warnings.warn(
                f"trim_padding: {self.trim_padding} is deprecated; write {mode} instead",
                FutureWarning,
                stacklevel=3,
            )
        self.trim_padding = mode
        check_config(self)


_PLANNED_PROCESSES: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "planned_processes", default=None
)


@contextlib.contextmanager
def planned_processes(count: int | None) -> Iterator[None]:
    """Within it, a `PromptAugGRPOConfig` is built as a launch of ``count`` processes would build it (its
    ``world_size``); None leaves the real process count."""
    token = _PLANNED_PROCESSES.set(count)
    try:
        yield
    finally:
        _PLANNED_PROCESSES.reset(token)


# Every key of ours (`PromptAugGRPOConfig`'s fields beyond `GRPOConfig`'s) -> its `KeyInfo`.
KEYS: dict[str, KeyInfo] = {
    f.name: _PENDING.pop(id(f)) for f in fields(PromptAugGRPOConfig) if id(f) in _PENDING
}


# The mini-batch skip under DeepSpeed, refused by the config (the deepspeed key, accelerate's DeepSpeed
# launch) and by the trainer (`prompt_aug.extensions.stabilisers.MinibatchSkip.check`) in the same words.
SKIP_UNDER_DEEPSPEED = (
    "skip_minibatch_ratio_above is not supported under DeepSpeed (the deepspeed key, or an accelerate "
    "config with DeepSpeed): its optimizer steps inside backward, before a mini-batch can be judged; launch "
    "with DDP or FSDP (accelerate_configs/ddp.yaml, fsdp.yaml), or unset it"
)


def check_config(args: Any) -> None:
    """Fail on a key that cannot work with the rest of the recipe (`ValueError`, one line naming the key):
    each key's ``low`` and ``choices`` (`check_keys`), ``report_to``'s names, the stabilisers (fp16 too),
    ``save_strategy: best``, vLLM (`vllm_refusal`) and the collapse guard's eval signal; then warn on keys
    that do nothing (`inert_keys`). The dynamic-sampling signal is checked against the reward functions the
    trainer is given."""
    check_keys(args)
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    for alone in ("none", "all"):
        if alone in args.report_to and len(args.report_to) > 1:  # else named unknown below
            raise ValueError(
                f"report_to: {alone} cannot be combined with other integrations; give {alone} alone, or "
                "list only the integrations to report to"
            )
    unknown = [name for name in args.report_to if name not in INTEGRATION_TO_CALLBACK]
    if unknown:  # the Trainer would refuse it only once the model has loaded
        raise ValueError(
            f"report_to: {unknown[0]!r} is not one of {', '.join(INTEGRATION_TO_CALLBACK)}, all or none"
        )
    if args.remove_unused_columns:  # the Trainer would refuse the dataset only once the model has loaded
        raise ValueError(
            "remove_unused_columns: true would drop every column but prompt, and the rewards read the "
            "answer, the template and your extra columns; remove the key (GRPO's default is false)"
        )
    if args.sync_ref_model and args.ref_model_sync_steps < 1:  # TRL's callback divides by it at every step
        raise ValueError(
            f"ref_model_sync_steps: must be at least 1 with sync_ref_model, got {args.ref_model_sync_steps}"
        )
    if args.sync_ref_model and not args.beta:  # TRL refuses it only once the trainer is built
        raise ValueError(
            "sync_ref_model: true needs beta > 0 (with beta 0 there is no reference model to sync); "
            "set beta, or sync_ref_model: false"
        )
    if args.reset_optimizer_on_ref_sync and not args.sync_ref_model:
        raise ValueError(
            "reset_optimizer_on_ref_sync: true needs sync_ref_model: true (TRL then syncs the "
            "reference every ref_model_sync_steps steps; it also needs beta > 0)"
        )
    optim = str(getattr(args.optim, "value", args.optim))
    if args.reset_optimizer_on_ref_sync and optim.startswith("schedule_free"):
        raise ValueError(  # its state is an iterate of the weights, not moments a fresh optimizer starts at 0
            f"reset_optimizer_on_ref_sync: true zeroes the optimizer's state, and optim {optim} keeps an "
            "iterate of the weights there (its z), which zeroed pulls them to 0; use an Adam-like optim "
            "(adamw_torch), or reset_optimizer_on_ref_sync: false"
        )
    threshold = args.skip_minibatch_ratio_above
    if threshold is not None and not threshold >= 1.0:  # NaN too
        raise ValueError(
            f"skip_minibatch_ratio_above: {threshold} is below 1, the smallest value the mean of "
            "max(r, 1/r) can take; use 1.0 to skip every mini-batch, or leave it unset"
        )
    # DeepSpeed, the recipe's deepspeed key or accelerate's DeepSpeed launch (transformers builds its plugin
    # from either): the trainer refuses it too, but only once the model has loaded.
    if threshold is not None and (args.deepspeed or getattr(args, "deepspeed_plugin", None) is not None):
        raise ValueError(SKIP_UNDER_DEEPSPEED)
    # fp16, the recipe's or (where bf16 and fp16 are false) the launcher's, as transformers took it (spelled
    # as it was given): its gradient scaler asserts at the optimizer step.
    launched = not args.fp16 and str(getattr(args, "mixed_precision", "no")).lower() == "fp16"
    if threshold is not None and (args.fp16 or launched):
        which, fix = "fp16", "train with bf16: true, or unset it"
        if launched:
            which = (
                "fp16, which the launcher's ACCELERATE_MIXED_PRECISION=fp16 sets as the recipe's bf16 and "
                "fp16 are false"
            )
            fix = "set bf16: true, launch with `accelerate launch --mixed_precision no`, or unset it"
        raise ValueError(
            f"skip_minibatch_ratio_above is not supported with {which} (its gradient scaler cannot step "
            f"over a skipped mini-batch's dropped gradients); {fix}"
        )
    if (
        args.save_strategy == "best" and args.metric_for_best_model is None
    ):  # the Trainer refuses it once built
        raise ValueError(
            "save_strategy: best needs metric_for_best_model, a metric of the Trainer's evaluation on an "
            "eval_dataset; set it, or use save_strategy: steps"
        )
    refused = vllm_refusal(args)
    if refused is not None:  # TRL would refuse it only once the model has loaded
        raise ValueError(refused)
    if args.dynamic_sampling and not args.prompt_augmentation:
        raise ValueError(  # the trainer would refuse it only once the model has loaded
            "dynamic_sampling: true needs prompt_augmentation: true (it builds each round's groups from the "
            "augmented rows); set prompt_augmentation to true or drop dynamic_sampling"
        )
    refused = max_tokens_refusal(args.packing_max_tokens, args.world_size, args.trim_padding)
    if refused is not None:  # the trainer would refuse it only once the model has loaded
        raise ValueError(refused)
    if args.collapse_eval_drop is not None and not (args.eval_benchmarks and args.eval_every_steps):
        raise ValueError(
            "collapse_eval_drop is set but evaluation during training is off: set eval_benchmarks "
            "and eval_every_steps, or unset collapse_eval_drop"
        )
    evaluating = bool(args.eval_benchmarks and args.eval_every_steps)  # each evaluation logs a line
    if args.logging_strategy == "no" and not evaluating:  # the guard reads log lines: it would never act
        for name, (threshold_key, _) in SIGNALS.items():
            action = getattr(args, f"collapse_{name}_action")
            if getattr(args, threshold_key) is None:
                continue
            if action != "log":
                raise ValueError(
                    f"collapse_{name}_action: {action} with {threshold_key} set, but logging_strategy is no: "
                    "the collapse guard reads the log lines and would never fire; set logging_strategy: "
                    f"steps, or unset {threshold_key}"
                )
            warnings.warn(  # only a log line to lose, but the author set a watch that cannot see anything
                f"{threshold_key}: no effect, since logging_strategy is no (the collapse guard reads the log "
                f"lines); set logging_strategy: steps, or unset {threshold_key}",
                UserWarning,
                stacklevel=2,
            )
    for line in inert_keys(args):
        warnings.warn(line, UserWarning, stacklevel=2)


def vllm_refusal(args: Any) -> str | None:
    """The line for what TRL's vLLM generation refuses only once the trainer is built, under TRL's own
    conditions: VESPO's importance-sampling mode, colocated vLLM groups that do not split the processes
    (``world_size``), and a server's base URL ending in ``/`` (TRL's client then waits forever on a path the
    server does not serve). None when none applies."""
    if not args.use_vllm:
        return None
    mode = args.vllm_importance_sampling_mode
    vespo = args.loss_type == "vespo" and args.vllm_importance_sampling_correction
    if vespo and mode not in ("token_truncate", "token_mask"):
        return (
            f"loss_type: vespo with use_vllm needs vllm_importance_sampling_mode token_truncate or "
            f"token_mask, got {mode}; set one of them, or vllm_importance_sampling_correction: false"
        )
    url = args.vllm_server_base_url
    if args.vllm_mode == "server" and url and url.endswith("/"):  # TRL's client asks for `//health` forever
        return (
            f"vllm_server_base_url: {url} ends in '/', and TRL's client appends its paths to it "
            f"({url}/health, which the server does not serve, so it waits forever); set it to "
            f"{url.rstrip('/')}"
        )
    size, processes = args.vllm_tensor_parallel_size, args.world_size
    if args.vllm_mode == "colocate" and not (size >= 1 and processes % size == 0):
        return (
            f"vllm_tensor_parallel_size: {size} must divide the {processes} processes with vllm_mode "
            f"colocate (each vLLM instance spans that many); set it to a divisor of {processes}"
        )
    return None


def mapping_value(name: str, value: Any) -> dict[str, Any] | None:
    """The mapping a `MAPPING_KEYS` key's ``value`` gives: itself, None, or a JSON object's text parsed (as
    TRL's config takes it from a command line); anything else is refused (`ValueError`, one line naming the
    key).

    >>> mapping_value("chat_template_kwargs", '{"enable_thinking": false}')
    {'enable_thinking': False}
    """
    if value is None or isinstance(value, dict):
        return value
    example = "give key: value lines under it, or JSON text such as '{\"key\": 1}'"
    if isinstance(value, str) and value.startswith("{"):
        try:
            return json.loads(value)  # text starting with "{" that parses is an object
        except json.JSONDecodeError as err:
            raise ValueError(f"{name}: not a JSON object ({err.msg}); {example}") from None
    raise ValueError(f"{name}: {value!r} is not a mapping; {example}")


def range_refusal(name: str, value: Any, bounds: Range) -> str | None:
    """Why ``value`` of the key ``name`` falls outside ``bounds``, or ``None``.

    >>> range_refusal("top_p", 1.5, NUMBER_RANGES["top_p"])
    'top_p: must be above 0 and at most 1, got 1.5'
    >>> range_refusal("adam_beta2", None, NUMBER_RANGES["adam_beta2"])
    'adam_beta2: no value; give a number, or remove the line'
    """
    if value is None:
        return None if bounds.optional else f"{name}: no value; give a number, or remove the line"
    low, high = bounds.low, bounds.high
    try:
        inside = (value > low if bounds.open_low else value >= low) and (  # NaN fails both
            high is None or (value < high if bounds.open_high else value <= high)
        )
    except TypeError:  # text
        inside = False
    if inside:
        return None
    top = "" if high is None else f" and {'below' if bounds.open_high else 'at most'} {high}"
    hint = f" ({bounds.hint})" if bounds.hint else ""
    return f"{name}: must be {'above' if bounds.open_low else 'at least'} {low}{top}, got {value!r}{hint}"


def check_trl_keys(args: Any) -> None:
    """TRL's batch keys (`BATCH_LOW`), ``loss_type``, ``scale_rewards``, the sampling temperature, the
    sampling, length, loss and optimizer numbers (`NUMBER_RANGES`), the mapping keys (`MAPPING_KEYS`) and
    the length of training, which TRL checks late or not at all (`ValueError`, one line naming the key)."""
    for name, low in {**BATCH_LOW, **BATCH_LOW_IF_SET}.items():
        value = getattr(args, name)
        if value is None and name in BATCH_LOW:  # ``num_generations:`` with nothing after it
            raise ValueError(f"{name}: no value; give a whole number of at least {low}, or remove the line")
        if value is not None and not (isinstance(value, int) and value >= low):
            raise ValueError(f"{name}: must be at least {low}, got {value}")
    if args.loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type: {args.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    if not isinstance(args.scale_rewards, bool) and args.scale_rewards not in SCALE_REWARDS:
        raise ValueError(
            f"scale_rewards: {args.scale_rewards!r} is not one of {', '.join(SCALE_REWARDS)} (or, in a "
            "recipe file, true for group and false for none)"
        )
    if not args.temperature > 0:  # TRL divides the logits by it (NaN too)
        raise ValueError(
            "temperature: must be above 0 (GRPO samples its completions; 1.0 samples as the model does), "
            f"got {args.temperature}"
        )
    for name, bounds in NUMBER_RANGES.items():
        if problem := range_refusal(name, getattr(args, name), bounds):
            raise ValueError(problem)
    mappings = {name: mapping_value(name, getattr(args, name)) for name in MAPPING_KEYS}
    if problem := renderer_keys_refusal(mappings["chat_template_kwargs"]):
        raise ValueError(problem)
    if not args.num_iterations >= 1:
        raise ValueError(f"num_iterations: must be at least 1, got {args.num_iterations}")
    if args.max_steps == 0:  # the Trainer reads epochs only when max_steps is negative
        raise ValueError(
            "max_steps: 0 trains no optimizer step; set the steps to train, or -1 to train num_train_epochs"
        )
    if args.max_steps < 0 and not args.num_train_epochs > 0:
        raise ValueError(
            f"num_train_epochs: {args.num_train_epochs} with max_steps {args.max_steps} trains no optimizer "
            "step; set num_train_epochs above 0, or max_steps to the steps to train"
        )


def check_keys(args: Any, prefix: str = "") -> None:
    """Each key of ours (those starting with ``prefix``) against its `KeyInfo`'s ``low`` and ``choices``
    (`ValueError`, one line naming the key)."""
    for name, info in KEYS.items():
        if not name.startswith(prefix):
            continue
        value = getattr(args, name)
        if info.choices is not None and value is not None and value not in info.choices:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(info.choices)}")
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{name}: is NaN; give a number, or leave it unset")
        if isinstance(value, float) and math.isinf(value):
            raise ValueError(f"{name}: is infinite; give a finite number, or leave it unset")
        if info.low is not None and value is not None and value < info.low:
            raise ValueError(f"{name}: must be at least {info.low}, got {value}")
        if info.high is not None and value is not None and value > info.high:
            raise ValueError(f"{name}: must be at most {info.high}, got {value}")


def _default(name: str) -> Any:
    f = PromptAugGRPOConfig.__dataclass_fields__[name]
    return f.default if f.default is not MISSING else f.default_factory()


def inert_keys(args: Any) -> list[str]:
    """One line per feature that is off while keys only it reads are set away from their defaults, and one
    for a mini-batch skip above 1 whose ratio TRL holds at 1: such keys do nothing, which a recipe's author
    rarely means (`check_config` warns with these lines)."""
    set_by_feature: dict[str, list[str]] = {}
    for name, info in KEYS.items():
        if info.feature is not None and getattr(args, name) != _default(name):
            set_by_feature.setdefault(info.feature, []).append(name)
    lines = []
    for feature, keys in set_by_feature.items():
        turned_on_by, on = FEATURES[feature]
        if not on(args):
            them = "it" if len(keys) == 1 else "them"
            lines.append(
                f"{', '.join(keys)}: no effect, since {feature} is off ({turned_on_by} turns it on); "
                f"turn it on or remove {them}"
            )
    # TRL computes no old log-probs when gradient_accumulation_steps is a multiple of steps_per_generation x
    # num_iterations (every mini-batch trains on the policy that generated it): the ratio is exactly 1. vLLM's
    # importance-sampling correction computes them anyway, from the same weights: 1 up to rounding.
    threshold, every = args.skip_minibatch_ratio_above, args.steps_per_generation * args.num_iterations
    if threshold is not None and threshold > 1.0 and args.gradient_accumulation_steps % every == 0:
        lines.append(
            f"skip_minibatch_ratio_above: no effect, since gradient_accumulation_steps "
            f"({args.gradient_accumulation_steps}) is a multiple of steps_per_generation x num_iterations "
            f"({every}): TRL trains each mini-batch on the policy that generated it, so the ratio is 1 "
            "(with vLLM's importance-sampling correction, up to rounding); change steps_per_generation or "
            "num_iterations so that gradient_accumulation_steps is no multiple of their product, or "
            "remove it"
        )
    return lines


class _PlainConfig:
    """A plain `GRPOConfig` read as a `PromptAugGRPOConfig`: TRL's fields as they are, ours at their value
    under TRL (a field's ``trl`` metadata, else its default)."""

    def __init__(self, args: GRPOConfig) -> None:
        self._args = args
        for name, info in KEYS.items():
            setattr(self, name, _default(name) if info.trl is MISSING else info.trl)

    def __getattr__(self, name: str) -> Any:  # only for names not set above: TRL's fields
        return getattr(self._args, name)


def trainer_settings(args: GRPOConfig) -> PromptAugGRPOConfig:
    """``args`` with every key of ours: a `PromptAugGRPOConfig` as it is; a plain `GRPOConfig` with ours set
    to TRL's behaviour (no stop tokens beyond the model's, no reward cut, no guard, no evaluation) and our
    defaults where TRL has no equivalent (augmentation on, the built-in bank, padding-free passes)."""
    return args if isinstance(args, PromptAugGRPOConfig) else _PlainConfig(args)  # type: ignore[return-value]
