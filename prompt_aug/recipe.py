"""A recipe's keys and their parser: `PromptAugScriptArguments` (what ``prompt-aug-train`` reads beside the
trainer's config, as TRL's `GRPOScriptArguments`), `make_parser` over the four key groups (these, the
trainer's `PromptAugGRPOConfig`, TRL's `ModelConfig` and the learning demo's keys) and `parse_args`, which
reads a recipe and its command-line overrides. Training (`prompt_aug.train`) and the data preview
(`prompt_aug.data`) read recipes through it, so both read a recipe alike.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from trl import ModelConfig

from .cli import DRY_RUN_OVERRIDES, RecipeParser, dry_run_processes, parse_recipe, wants_dry_run
from .config import PromptAugGRPOConfig, help_field, planned_processes
from .evaluation.callback import sharding_error
from .faults import launch_engine
from .mixture import dataset_mixture
from .models import check_model_args
from .sources import builtin_names, demo_stage

__all__ = [
    "NUM_SYNTHETIC",
    "PromptAugScriptArguments",
    "Recipe",
    "check_recipe",
    "make_parser",
    "parse_args",
    "parse_recipe_file",
]


NUM_SYNTHETIC = 256  # rows of the built-in `synthetic` set unless num_synthetic says otherwise
# TRL's overlong penalty by the name `trl grpo` gives it: the one reward soft_punish_cache sizes.
OVERLONG = "get_soft_overlong_punishment"


@dataclass
class PromptAugScriptArguments:
    """What ``prompt-aug-train`` reads beside the trainer's config, as TRL's `GRPOScriptArguments`: the data
    (``dataset_*``, the column mapping, ``num_synthetic``, the prompt-length and bad-row limits), the model's
    chat template, the reward functions by name, and how the run starts (``overwrite_output_dir``,
    ``dry_run``, ``num_processes``). The trainer never sees these: it is given a dataset and reward functions.
    """

    # > Data
    dataset_name: str | None = help_field(
        None,
        "A Hub id (e.g. hkust-nlp/SimpleRL-Zoo-Data), a local folder or file, or a built-in "
        "set of the demo (synthetic, synthetic-addition, synthetic-digit-sums). Required.",
    )
    dataset_config: str | None = help_field(
        None, "Hub subset or local sub-folder, e.g. simplelr_qwen_level3to5."
    )
    dataset_split: str = help_field("train", "Split to train on.")
    question_column: str | None = help_field(None, "Question column (guessed if unset).")
    answer_column: str | None = help_field(None, "Gold-answer column (guessed if unset).")
    dataset_levels: list[str] | None = help_field(
        None, "Keep only these `level` values (MATH), e.g. ['Level 3', 'Level 4']."
    )
    dataset_mixture: dict[str, Any] | str | None = help_field(
        None,
        "Several datasets mixed, instead of dataset_name: TRL's DatasetMixtureConfig, "
        "{datasets: [{path, name, data_dir, data_files, split, columns, fraction, question_column, "
        "answer_column, dataset_levels}, ...]}. Each source is mapped onto question/answer/uid as "
        "dataset_name is (its uids prefixed with its position); the top-level question_column, "
        "answer_column and dataset_levels apply to sources that do not set their own.",
    )
    dataset_num_rows: int | None = help_field(
        None, "Row count of the dataset; used only by --dry_run for rounds per epoch."
    )
    num_synthetic: int = help_field(NUM_SYNTHETIC, "Rows of the `synthetic` dataset.")
    max_prompt_length: int | None = help_field(
        1024, "Drop questions whose prompt under the longest template exceeds this (0 or null: no limit)."
    )
    max_bad_row_share: float = help_field(
        0.05,
        "Stop when more than this share of the rows read is unusable (empty question; missing, "
        "empty, NaN or oddly typed answer); below it such rows are dropped and reported. 1.0: never stop.",
    )

    # > Model
    chat_template: str | None = help_field(
        None,
        "The chat template prompts render through, set on the tokenizer when it loads (and "
        "saved with the model): `chatml`, a Jinja template, or the path of a .jinja file. Needed for a "
        "base model whose tokenizer has none; replaces the tokenizer's own otherwise.",
    )

    # > Rewards
    reward_funcs: list[str] = help_field(
        ["correctness", "format"],
        "Reward names from rewards.REGISTRY, or functions by import path "
        "(package.module:function). The paper: correctness + format.",
    )
    soft_punish_cache: int | None = help_field(
        None,
        "For the reward get_soft_overlong_punishment (DAPO's soft overlong penalty): completions within "
        "this many tokens of max_completion_length lose reward linearly, down to -1 at the limit (DAPO: "
        "4096 of 20480). Unset: 256, or a quarter of max_completion_length where that is less (trl grpo "
        "fixes 256 of 1280).",
    )
    # > The run
    overwrite_output_dir: bool = help_field(
        False,
        "Train into an output_dir that already holds a run: delete its checkpoints, model, logs and "
        "completions once every other check has passed and the trainer is built (without it such a "
        "folder is refused unless you resume).",
    )
    dry_run: bool = help_field(
        False,
        "Print the batch arithmetic and exit; loads neither model nor data. Pass it on the "
        "command line: it then parses with use_cpu on, so bf16 recipes parse on a machine without a GPU.",
    )
    num_processes: int | None = help_field(
        None, "Processes for --dry_run (default: WORLD_SIZE, else 1); a real run counts its launch's."
    )

    def __post_init__(self) -> None:
        # Counts the batch arithmetic and the data read take: below 1 a dry run showed negative rounds.
        for key in ("num_processes", "dataset_num_rows", "num_synthetic"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key}: must be at least 1, got {value}")
        if self.max_prompt_length is not None and self.max_prompt_length < 0:
            raise ValueError(
                f"max_prompt_length: a token count (0 or null: no limit), got {self.max_prompt_length}"
            )
        if not self.reward_funcs:  # TRL would refuse a trainer without them once the model has loaded
            raise ValueError(
                "reward_funcs: none given; name at least one, e.g. [correctness, format], or a function "
                "as package.module:function"
            )
        if not 0 <= self.max_bad_row_share <= 1:
            raise ValueError(
                f"max_bad_row_share: a share of the rows read, from 0 to 1 (1: never stop), got "
                f"{self.max_bad_row_share}"
            )
        if isinstance(self.dataset_mixture, str):  # from the command line, as JSON
            try:
                self.dataset_mixture = json.loads(self.dataset_mixture)
            except json.JSONDecodeError as err:
                raise ValueError(f"dataset_mixture: not a JSON mapping ({err})") from None
        if self.dataset_mixture is not None:
            self.dataset_mixture = dataset_mixture(self.dataset_mixture)
            clashes = [
                (key, default)
                for key, value, default in (
                    ("dataset_name", self.dataset_name, None),
                    ("dataset_config", self.dataset_config, None),
                    ("dataset_split", self.dataset_split, "train"),
                )
                if value != default
            ]
            if clashes:
                key, default = clashes[0]
                unset = f"--{key} {default or 'null'}"
                raise ValueError(
                    f"dataset_mixture and {key} are both set: a mixture names its sources itself (path, "
                    f"name, split per source); remove {key} (on the command line: {unset})"
                )
        if self.soft_punish_cache is not None and OVERLONG not in self.reward_funcs:
            warnings.warn(  # only the penalty made by that name reads it
                f"soft_punish_cache: no effect, since reward_funcs has no {OVERLONG} (the penalty it sizes); "
                f"add {OVERLONG} to reward_funcs, or remove soft_punish_cache",
                UserWarning,
                stacklevel=3,
            )
        if self.num_synthetic != NUM_SYNTHETIC and self.dataset_name != "synthetic":
            # The other built-in sets have rows of their own (`prompt_aug.sources.BUILTINS`).
            raise ValueError(
                f"num_synthetic sizes only the built-in set `synthetic`, and dataset_name is "
                f"{self.dataset_name!r}: remove num_synthetic"
            )


class Recipe(NamedTuple):
    """A parsed recipe: the script's keys, the trainer's config, TRL's `ModelConfig` and the demo's keys."""

    script_args: PromptAugScriptArguments
    training_args: PromptAugGRPOConfig
    model_args: ModelConfig
    demo_args: Any  # `prompt_aug.demo.DemoArguments`


def make_parser() -> RecipeParser:
    """The parser of a recipe: our script's keys, the trainer's config, TRL's `ModelConfig` and the learning
    demo's keys, each error one line naming the key and where it was set."""
    demo_args = demo_stage().DemoArguments
    return RecipeParser(
        (PromptAugScriptArguments, PromptAugGRPOConfig, ModelConfig, demo_args),
        usage="%(prog)s --config RECIPE.yaml [--key value ...]",
        description=(
            "Train with a recipe: --config RECIPE.yaml (recipes/ has examples). Every option below "
            "is a recipe key; given on the command line it overrides the recipe's value."
        ),
    )


def check_recipe(
    script_args: PromptAugScriptArguments,
    training_args: PromptAugGRPOConfig,
    model_args: ModelConfig,
    _: Any,
    machine: Callable[[Any], str | None] | None = None,
    named: Callable[[Any, Any], Any] | None = None,
) -> None:
    """What the parsed recipe needs beyond each key group's own checks (`ValueError`, one line naming the key;
    `parse_recipe` says where it was set): the model keys (`check_model_args`, devices aside), a model to
    train, under a launch that shards the model no evaluation during training, nor a reference model loaded
    by FSDP's CPU-RAM-efficient loading, no ``sync_ref_model`` under ``use_peft``, a vLLM
    context (``vllm_max_model_length``) that holds the longest prompt and completion, what
    ``named`` refuses among what the recipe names (given the script and training arguments; the entry point
    passes `prompt_aug.train.recipe_names`: reward functions, templates, the chat template file) and, outside
    a dry run (which checks a recipe on any machine), what ``machine`` finds missing here for the training
    arguments (the entry point passes `prompt_aug.stack.machine_problem`: the package ``optim`` needs, the
    W&B login ``report_to`` needs)."""
    check_model_args(model_args, devices=False)  # the keys alone, here where the file is known; devices later
    if not model_args.model_name_or_path:  # else the data is read before the model's path fails
        raise ValueError(
            "model_name_or_path is not set: give a Hub id, a local model folder, or a built-in model "
            f"({', '.join(builtin_names('model'))})"
        )
    engine = launch_engine(training_args)
    evaluates = training_args.eval_every_steps and training_args.eval_benchmarks
    if evaluates and engine in ("FSDP", "DeepSpeed ZeRO-3"):  # else refused once the model has loaded
        raise ValueError(sharding_error("FSDP" if engine == "FSDP" else "DEEPSPEED", zero3=engine != "FSDP"))
    ram_efficient = os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "").strip().lower() in ("true", "1")
    if engine == "FSDP" and ram_efficient and training_args.beta and not model_args.use_peft:
        raise ValueError(
            "beta > 0 under FSDP with fsdp_cpu_ram_efficient_loading: true (the accelerate config): TRL's "
            "reference model then holds zeros on every process but the first (accelerate fills in the "
            "policy's weights only), so the KL is wrong; set fsdp_cpu_ram_efficient_loading: false there, "
            "as accelerate_configs/fsdp.yaml does"
        )
    if training_args.sync_ref_model and model_args.use_peft:  # TRL refuses it once the model has loaded
        raise ValueError(
            "sync_ref_model: true with use_peft: true: under LoRA TRL's reference is the base model with the "
            "adapter off, so there is no reference model to sync; set sync_ref_model: false (and "
            "reset_optimizer_on_ref_sync: false), or train without use_peft"
        )
    limit, prompt = training_args.vllm_max_model_length, script_args.max_prompt_length
    needed = (prompt or 0) + (training_args.max_completion_length or 0)
    if training_args.use_vllm and limit and prompt and limit < needed:  # vLLM cuts or refuses mid-run
        raise ValueError(
            f"vllm_max_model_length: {limit} is less than max_prompt_length {prompt} + max_completion_length "
            f"{training_args.max_completion_length}: vLLM would end completions early at its context, or "
            f"refuse a long prompt in the middle of the run; raise it to {needed}, or lower the other two"
        )
    if named is not None:
        named(script_args, training_args)
    problem = machine(training_args) if machine is not None and not script_args.dry_run else None
    if problem:
        raise ValueError(problem)


def parse_args(
    argv: list[str] | None = None,
    machine: Callable[[Any], str | None] | None = None,
    named: Callable[[Any, Any], Any] | None = None,
) -> Recipe:
    """Parse a recipe and command-line overrides; a bad key or value fails here in one line
    (`cli.UsageError`), as does a recipe `check_recipe` refuses (``machine``, ``named``: as there)."""
    args = list(argv) if argv is not None else sys.argv[1:]
    return _parse(args, partial(check_recipe, machine=machine, named=named))


def parse_recipe_file(path: str) -> Recipe:
    """A recipe file's values as training parses them, for a tool that reads a recipe without training it
    (the data preview): parsed as a dry run, without `check_recipe` (no model needed); a bad file, key or
    value fails in one line (`cli.UsageError`)."""
    return _parse(["--config", path, "--dry_run"])


def _parse(args: list[str], check: Callable[..., None] | None = None) -> Recipe:
    parser = make_parser()
    if not wants_dry_run(args):
        return Recipe(*parse_recipe(parser, args, check))
    args = [*args, *DRY_RUN_OVERRIDES]  # bf16 recipes must parse on a CPU-only machine; see DRY_RUN_OVERRIDES
    with planned_processes(dry_run_processes(args)):  # TRL's batch checks as the launch will run them
        return Recipe(*parse_recipe(parser, args, check))
