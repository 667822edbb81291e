"""Train with a recipe: ``python -m prompt_aug.train --config RECIPE.yaml [--key value ...]``.

Also ``accelerate launch --config_file accelerate_configs/ddp.yaml -m prompt_aug.train --config ...``,
``torchrun --nproc_per_node N -m prompt_aug.train --config ...`` or the ``prompt-aug-train`` script.

As TRL's GRPO script: `prompt_aug.recipe.make_parser` builds the parser of a recipe's four key groups, and
`run` reads top to bottom, as TRL's and open-r1's ``main`` do: check → data as stored → rewards and features
→ tokenizer → rows → model → trainer → train → save → card → push. `main` is the command: parse, `run`, and
one line for bad input. Before anything heavy loads, the recipe, the output folder (a folder holding a run
needs ``--resume_from_checkpoint`` or ``--overwrite_output_dir true``), where the model and data come from,
the reward, template and evaluation keys, and a Hub token and repository id for ``push_to_hub`` are checked;
such errors end the command with one line. The mixed precision the accelerator trains in is logged, with a
warning where the launcher's (``accelerate launch``) and the recipe's differ. The features are built once, by
`prompt_aug.extensions.build_features`, and handed to the trainer. The learning demo is reached only through
`prompt_aug.sources`, so a run on a real model and dataset imports no demo module beyond its keys.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from trl import ModelConfig, get_peft_config
from trl.trainer.utils import get_callable_name

from rewards import get_reward_funcs

from .adapters import resumed_base_problem
from .batches import batch_arithmetic
from .cli import (
    USER_ERRORS,
    UsageError,
    check_reward_weights,
    clear_earlier_run,
    command_line_keys,
    dry_run_processes,
    interrupted_message,
    is_true,
    prepare_output_dir,
    recipe_text,
    setting,
)
from .collator import FORMAT_COLUMNS
from .config import PromptAugGRPOConfig
from .data import DataError, load_train_dataset
from .evaluation.benchmarks import EvalError
from .extensions import build_features, check_features
from .extensions.dynamic_sampling import signal_column
from .faults import (
    COLLAPSE_STOP_FILE,
    EXIT_PREEMPTED,
    PREEMPTED_FILE,
    Preempted,
    checkpoint_step,
    disk_full_is_one_line,
    one_line,
    saved_parts,
    signal_ignored,
)
from .logging_utils import quiet_deprecations, use_compact_log
from .model_card import model_card_info
from .models import ModelArgsError, check_model_args, load_model, load_tokenizer, resolve_model_path
from .recipe import PromptAugScriptArguments, Recipe, make_parser, parse_args
from .reward_checks import RewardFunctionError, check_reward_arguments, check_reward_names
from .sources import demo_stage, downloads_model, read_training_data
from .stack import check_before_parse, check_stack, machine_problem, wait_for_vllm_server
from .templates import (
    TemplateError,
    chat_template_text,
    check_renders,
    resolve_eval_template,
    templates_for,
)
from .trainer import PromptAugGRPOTrainer

__all__ = [
    "PromptAugScriptArguments",
    "Recipe",
    "main",
    "make_parser",
    "parse_args",
    "resolve_eval_template",
    "run",
    "train",
]

logger = logging.getLogger("prompt_aug")


# What a dry run planned for one process because nothing gave a count says, after its table.
ONE_PROCESS_HINT = (
    "no --num_processes, recipe num_processes or WORLD_SIZE gave a count; the batch keys are per process, so "
    "pass --num_processes N as the launch will run"
)


class RecipeNames(NamedTuple):
    """What a recipe names, looked up (`recipe_names`)."""

    reward_funcs: list[Any]
    reward_func_names: list[str]
    templates: list[Any]
    template_weights: list[float] | None
    eval_template: Any


def _lora_target_error(err: ValueError, model: Any, model_args: ModelConfig) -> UsageError | None:
    """The one-line error for PEFT's refusal of ``lora_target_modules``: names that match no module of
    ``model``, or none given for a model type PEFT has no default modules for; it names the model's linear
    layers. None for any other error."""
    from peft.utils.error import NoMatchingPeftModuleError

    # PEFT's words for a model type it has no default modules for (and LoRA's, with target_parameters)
    unset = (
        model_args.use_peft
        and model_args.lora_target_modules is None
        and str(err).startswith("Please specify `target_modules`")
    )
    if not isinstance(err, NoMatchingPeftModuleError) and not unset:
        return None
    linear = sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )
    if unset:
        return UsageError(
            f"lora_target_modules: not set, and PEFT has no default modules for model type "
            f"{getattr(model.config, 'model_type', None)!r}; set lora_target_modules: all-linear, or some of "
            f"its linear layers {linear}"
        )
    return UsageError(
        f"lora_target_modules {model_args.lora_target_modules}: no module of the model matches; its linear "
        f"layers are {linear} (or give all-linear)"
    )


def main(argv: list[str] | None = None) -> None:
    """Train with a recipe. Bad input (a recipe key, a path, a used output folder) exits with one line; so do
    a faulty reward function, a full disk and a failed Hub push. A preempted run exits with status 75."""
    try:
        status = train(argv)
    except USER_ERRORS as err:
        raise SystemExit(f"prompt-aug-train: error: {err}") from None
    close_process_group()
    if status:
        raise SystemExit(status)


def close_process_group() -> None:
    """After a run that ended normally, leave the process group on every rank and join gloo's worker threads
    before Python exits.

    A gloo worker thread can still hold the last reference to a collective's tensor (the collapse guard
    broadcasts a few milliseconds before the end of training) after Python has dropped its own. Releasing it
    takes the GIL; if Python has begun finalizing by then, the thread is ended with ``pthread_exit`` inside
    a ``noexcept`` destructor and the rank aborts ("terminate called without an active exception").
    ``destroy_process_group`` alone does not stop gloo's threads: the group lives on in the DDP wrapper
    until interpreter teardown. So: keep our own handle on the default group, leave it, collect the
    trainer's reference cycles (DDP wrapper, reducer), then drop the handle last. Its destructor releases the
    GIL while it waits for gloo's workers, so a worker that still has a tensor to release can finish.

    Only on success: after an error the other ranks may be inside a collective, and leaving then could hang
    them. No barrier first: with ``push_to_hub`` the other ranks finish while the main process is still
    uploading, which needs no collective.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    handle = dist.group.WORLD
    dist.destroy_process_group()
    gc.collect()  # the DDP reducer must not be the last holder: it would join gloo's workers holding the GIL
    del handle


def _not_the_model_init_kwargs_note(record: logging.LogRecord) -> bool:
    """A logging filter (one function, so adding it again is a no-op): drops TRL's warning that
    ``model_init_kwargs`` are ignored, which does not hold when `load_model` has applied them."""
    return "model_init_kwargs" not in record.getMessage()


def train(argv: list[str] | None = None) -> int:
    """Everything `main` does, with errors raised as exceptions. Returns the exit status: 0, or
    `EXIT_PREEMPTED` (75) when a preemption signal stopped the run at a checkpoint (`prompt_aug.faults`)."""
    quiet_deprecations()
    check_before_parse(argv)  # DeepSpeed, and torch's CUDA build against the driver (prompt_aug/stack.py)
    # __post_init__ has checked our keys; machine_problem what this machine lacks for them; what the recipe
    # names is looked up as it is parsed (a bad name then says where it was set) and handed to the run.
    looked_up: list[RecipeNames] = []
    script_args, args, model_args, demo_args = parse_args(
        argv, machine_problem, lambda script, training: looked_up.append(recipe_names(script, training))
    )
    return run(script_args, args, model_args, demo_args, argv, named=looked_up[-1])


def recipe_names(script_args: PromptAugScriptArguments, args: PromptAugGRPOConfig) -> RecipeNames:
    """What the recipe names, looked up before anything is read or deleted (in the dry run too): the Trainer's
    evaluation (refused), the reward functions, the templates, the chat template file, and the features' keys
    that read the reward functions (the collapse guard's thresholds, the dynamic-sampling signal).

    Raises:
        ValueError: one line naming the key (`parse_args` adds where it was set).
    """
    check_trainer_evaluation(args)
    reward_funcs, names = reward_functions(script_args, args)
    templates, weights, eval_template = templates_for(args)
    if script_args.chat_template:  # a missing file fails here, not after the model is fetched
        chat_template_text(script_args.chat_template)
    check_features(args, reward_funcs, names)
    return RecipeNames(reward_funcs, names, templates, weights, eval_template)


def check_trainer_evaluation(args: PromptAugGRPOConfig) -> None:
    """Refuse the Trainer's own evaluation (``eval_strategy``, and ``save_strategy: best``, which saves after
    it), which needs an ``eval_dataset`` that this script does not pass; it evaluates through
    ``eval_benchmarks`` (`ValueError`, one line naming the key).
    A trainer built in code may pass one, so the config itself takes the key."""
    if args.eval_strategy != "no":  # the Trainer refuses it only once the model has loaded
        raise ValueError(
            f"eval_strategy: {getattr(args.eval_strategy, 'value', args.eval_strategy)} evaluates an "
            "eval_dataset, which prompt-aug-train does not pass; set eval_strategy: no, and evaluate during "
            "training with eval_benchmarks and eval_every_steps"
        )
    if args.save_strategy == "best":  # it saves after such an evaluation only: never, here
        raise ValueError(
            "save_strategy: best saves when the Trainer's evaluation finds a better metric_for_best_model, "
            "and prompt-aug-train runs no such evaluation, so no checkpoint would be saved; use "
            "save_strategy: steps with save_steps"
        )


# What `accelerate launch` passes its config's (or --mixed_precision's) precision in.
LAUNCHER_PRECISION = "ACCELERATE_MIXED_PRECISION"
# The recipe's keys for each precision, for a message that says how to choose it there.
_RECIPE_PRECISION = {"bf16": "bf16: true", "fp16": "fp16: true and bf16: false"}


def mixed_precision(args: Any, environ: Mapping[str, str]) -> tuple[str, str, str | None]:
    """The mixed precision the trainer's accelerator takes, as transformers 5 decides it, under the
    environment ``environ``: ``(precision, why, warning)``. ``precision`` is no, bf16, fp16 or fp8; ``why``
    says where it comes from; ``warning`` is one line, or None, for a launcher whose precision
    (``ACCELERATE_MIXED_PRECISION``, which ``accelerate launch`` sets from its config or
    ``--mixed_precision``) differs from the recipe's.

    `TrainingArguments` takes fp16 if the recipe's ``fp16`` is true, else bf16 if ``bf16`` is true, else the
    launcher's precision: a recipe's ``bf16: false`` does not turn off a launcher's bf16. (TRL's ``bf16``
    defaults to true unless ``fp16`` is set.) A DeepSpeed config may still decide otherwise; the line logged
    once the trainer is built reads the accelerator itself.

    >>> from types import SimpleNamespace
    >>> mixed_precision(SimpleNamespace(bf16=True, fp16=False), {})
    ('bf16', "the recipe's bf16: true", None)
    """
    recipe = "fp16" if args.fp16 else "bf16" if args.bf16 else "no"
    launcher = (environ.get(LAUNCHER_PRECISION) or "").strip().lower() or None
    launched = f"the launcher's {LAUNCHER_PRECISION}={launcher}"
    where = f"{launched} (accelerate launch: its config or --mixed_precision)"
    if recipe != "no":  # TRL's bf16 is true unless the recipe sets it false or sets fp16
        why = f"the recipe's {recipe}: true"
    elif launcher not in (None, "no"):
        why = f"{launched}, which applies as the recipe's bf16 and fp16 are false"
    else:
        why = "fp32 compute: the recipe's bf16 and fp16 are false"
    precision = recipe if recipe != "no" else launcher or "no"
    # `accelerate launch` without a config or --mixed_precision passes "no": no choice against the recipe's.
    if launcher is None or launcher == recipe or launcher == "no":
        return precision, why, None
    fix = f"`accelerate launch --mixed_precision {recipe}`"
    if launcher in _RECIPE_PRECISION:
        fix += f", or set {_RECIPE_PRECISION[launcher]} in the recipe"
    if recipe == "no":
        warning = (
            f"mixed precision: the recipe has bf16: false and fp16: false (fp32), but {where} applies when "
            f"both are false, so this run trains in {launcher} mixed precision; to make them agree, launch "
            f"with {fix}"
        )
    else:
        warning = (
            f"mixed precision: the recipe's {recipe}: true overrides {where}, so this run trains in {recipe} "
            f"mixed precision; to make them agree, launch with {fix}"
        )
    return precision, why, warning


def precision_line(used: str, args: Any, environ: Mapping[str, str]) -> str:
    """The log line naming the mixed precision ``used`` (the trainer's accelerator's) and where it comes from
    (`mixed_precision`; a DeepSpeed config, when it decided otherwise)."""
    expected, why, _ = mixed_precision(args, environ)
    if used != expected:  # DeepSpeed reads its own config; accelerate falls back from fp8 on an older GPU
        why = "the accelerator's own choice: a DeepSpeed config's fp16 / bf16 sections, or no fp8 on this GPU"
    return f"mixed precision: {used} ({why})"


def hub_token_problem() -> str | None:
    """The one-line refusal of ``push_to_hub`` without a Hugging Face token (``HF_TOKEN``, or the token
    file `hf auth login` writes, as `huggingface_hub.get_token` finds them), which would fail only at the end
    of the run; None when there is one."""
    from huggingface_hub import get_token

    fix = "run `hf auth login` or set HF_TOKEN, or set push_to_hub false"
    try:
        token = get_token()
    except Exception as err:  # noqa: BLE001 (HF_OIDC_RESOURCE set, and its token exchange failed)
        return f"push_to_hub: no Hugging Face token ({one_line(err, 160)}): {fix}"
    return None if token else f"push_to_hub: no Hugging Face token: {fix}"


def hub_repo_problem(hub_model_id: str | None, output_dir: str) -> str | None:
    """The one-line refusal of a Hub repository id that ``push_to_hub`` could not create (as
    `huggingface_hub.utils.validate_repo_id` judges it): ``hub_model_id``, else the name of ``output_dir``,
    which transformers names the repository after; None when it is well formed. Transformers creates the
    repository only once the trainer is built, after the data and the model have loaded.

    >>> hub_repo_problem("me/run", "out"), hub_repo_problem(None, "outputs/run-1")
    (None, None)
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    name = hub_model_id if hub_model_id is not None else os.path.basename(os.path.abspath(output_dir))
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        why = one_line(err, 200)
        if hub_model_id is not None:
            return (
                f"hub_model_id: {name!r} is not a Hub repository id ({why}); fix it, or set push_to_hub false"
            )
        return (
            f"hub_model_id: not set, and output_dir's name {name!r} is not a Hub repository id ({why}); set "
            "hub_model_id (namespace/name), or set push_to_hub false"
        )
    return None


def reward_functions(
    script_args: PromptAugScriptArguments, args: PromptAugGRPOConfig
) -> tuple[list[Any], list[str]]:
    """The recipe's reward functions (``reward_funcs``; TRL's overlong penalty made for its
    ``max_completion_length`` and ``soft_punish_cache``) and their names, as TRL names them, none twice;
    checked against ``reward_weights`` and ``dynamic_sampling_signal``.

    Raises:
        ValueError: a name, an import path, a name twice, the penalty's lengths, the weights or the
            dynamic-sampling signal; the message names the key.
    """
    funcs = get_reward_funcs(
        script_args.reward_funcs,
        max_completion_length=args.max_completion_length,
        soft_punish_cache=script_args.soft_punish_cache,
    )
    names = [get_callable_name(f) for f in funcs]
    check_reward_names(names)  # TRL would log two of one name under one key
    check_reward_weights(args.reward_weights, names)
    if args.dynamic_sampling:
        signal_column(args.dynamic_sampling_signal, funcs, names)  # its reward function is among them
    return funcs, names


def run(
    script_args: PromptAugScriptArguments, args: PromptAugGRPOConfig, model_args: ModelConfig, demo_args: Any,
    argv: list[str] | None = None, named: RecipeNames | None = None,
) -> int:  # fmt: skip
    """Train a parsed recipe, as TRL's ``main(script_args, training_args, model_args)``; ``argv`` (the
    command line) goes into the model card and the resume hint; ``named``, what the recipe names, looked up
    (`recipe_names`; looked up here when not given). Returns the exit status, as `train`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    check_stack(args, dry_run=script_args.dry_run)  # vLLM, liger-kernel; logs torch's CUDA and the driver
    try:  # every ModelConfig key is honoured or refused here (QLoRA: bitsandbytes and a GPU, unless dry)
        check_model_args(model_args, devices=not script_args.dry_run)
    except ModelArgsError as err:
        raise UsageError(str(err)) from None
    if demo_args.warmstart_steps > 0 and model_args.use_peft:
        # The warm start trains the base in memory; the saved adapter records the base on disk, without it.
        raise UsageError(
            "warmstart_steps with use_peft: the warm start trains the whole base model in memory, and the "
            "saved LoRA adapter records the base as stored, so it would evaluate and merge without the warm "
            "start; set warmstart_steps: 0, or train without use_peft"
        )
    if named is None:  # a recipe parsed without the lookup (`parse_args` does it, saying where a key was set)
        try:
            named = recipe_names(script_args, args)
        except ValueError as err:  # each message names the key and what there is
            raise UsageError(str(err)) from None
    reward_funcs, names, templates, weights, eval_template = named
    given = list(argv) if argv is not None else sys.argv[1:]  # the command line
    if script_args.dry_run:  # arithmetic only, for the recipe's num_processes
        print(batch_arithmetic(args, script_args, held_out=demo_args.heldout_questions).table())
        # A CPU recipe runs one process; a GPU recipe's count comes from its launch.
        if dry_run_processes(given) is None and not is_true(setting(given, "use_cpu")):
            print(f"(one process: {ONE_PROCESS_HINT})")
        return 0
    state = PartialState()
    logger.setLevel(logging.INFO if state.is_main_process else logging.WARNING)
    overridden = command_line_keys(given)
    if overridden:  # what this run changes of the recipe it names (main process only, as above)
        logger.info("keys set on the command line, over the recipe's: %s", ", ".join(overridden))
    if args.hub_token:  # the Trainer pickles its arguments into each checkpoint (training_args.bin), which a
        # push uploads: the Hub clients read the token from the environment instead
        os.environ["HF_TOKEN"], args.hub_token = args.hub_token, None
    init_kwargs = args.model_init_kwargs if isinstance(args.model_init_kwargs, dict) else {}
    if isinstance(init_kwargs.get("token"), str):  # a gated model's token: pickled alike, read alike
        token = init_kwargs.pop("token")
        if os.environ.get("HF_TOKEN") not in (None, "", token):
            raise UsageError(
                "model_init_kwargs: its token is not the one in HF_TOKEN (or hub_token), and every "
                "checkpoint's training_args.bin would carry it; give the one token through HF_TOKEN"
            )
        os.environ["HF_TOKEN"] = token
    if args.push_to_hub and (bad_id := hub_repo_problem(args.hub_model_id, args.output_dir)):
        raise UsageError(bad_id)  # the same on every process: no token is read
    if args.push_to_hub:  # the main process pushes, with its token: it decides for all, each then stops alike
        (no_token,) = broadcast_object_list([hub_token_problem() if state.is_main_process else None])
        if no_token:
            raise UsageError(no_token)
    _, _, clash = mixed_precision(args, os.environ)
    if clash and state.is_main_process:  # the launcher's precision against the recipe's
        logger.warning("%s", clash)
    # A real run's round is this launch's; the recipe's num_processes plans dry runs only.
    arithmetic = batch_arithmetic(args, script_args, num_processes=state.num_processes)
    # Where model and data come from, and the output folder; an earlier run there that overwrite_output_dir
    # replaces is deleted only once the trainer is built (`clear_earlier_run`), so a bad value loses nothing.
    resume, stale = prepare_output_dir(script_args, args, model_args, state)
    recipe = recipe_text(argv, resume)  # for the model card, with a resumed run's earlier launches' overrides
    with state.main_process_first():  # the data as stored, downloaded once; mapped to rows below
        read = read_training_data(script_args, seed=args.seed)

    # Features: a bad evaluation set or dynamic-sampling signal fails now, before the model loads.
    try:
        features = build_features(args, reward_funcs, names)  # evaluation sets load; handed to the trainer
    except (ValueError, EvalError) as err:  # each message names the key and what there is
        raise UsageError(str(err)) from None

    # Tokenizer, data, model.
    try:
        model_path = resolve_model_path(model_args, args)
        if resume is not None and (problem := resumed_base_problem(resume, model_path)):
            raise ModelArgsError(problem)  # PEFT would load the adapter onto another model without a word
        # A Hub model not in the main process's cache yet is downloaded by the main process alone, then read
        # from the cache by the others, rather than fetched by every process at once into a shared cache.
        # Decided once, on the main process, for all: each process entering the barriers or none.
        (download_once,) = broadcast_object_list([state.is_main_process and downloads_model(model_path)])
        with state.main_process_first() if download_once else nullcontext():
            tokenizer = load_tokenizer(model_path, model_args, args, script_args.chat_template)
        # Each template must render with this tokenizer's chat template and the chat_template_kwargs; so must
        # the evaluation's (the built-in qwen-math beside one's own bank), or its first evaluation fails.
        evaluated = [features.evaluator.template] if features.evaluator is not None else []
        check_renders([*templates, *evaluated], tokenizer, args.chat_template_kwargs)
        dataset, report = load_train_dataset(read, script_args, args, templates, eval_template, tokenizer)
        check_reward_arguments(reward_funcs, names, [*dataset.column_names, *FORMAT_COLUMNS])
    except (ModelArgsError, TemplateError, DataError, RewardFunctionError) as err:
        raise UsageError(str(err)) from None
    logger.info("%s", report)  # main process only (logger level above)
    held_out = demo_args.heldout_questions  # the learning demo keeps these out of training
    if len(dataset) - held_out < arithmetic.questions_per_round:  # the sampler keeps whole rounds only
        found, fix = report.one_line(), "see why rows were dropped"
        if held_out:
            found, fix = f"{found}; heldout_questions holds {held_out} out", f"{fix}, lower heldout_questions"
        raise UsageError(
            f"{found}: fewer questions than one round's {arithmetic.questions_per_round}; {fix}, or shrink "
            "the round (--dry_run)"
        )
    arithmetic = batch_arithmetic(args, script_args, state.num_processes, rows=len(dataset) - held_out)
    logger.info("batch arithmetic:\n%s", arithmetic.table())
    with state.main_process_first() if download_once else nullcontext():
        model = load_model(model_path, model_args, args)
    # Learning demo: held-out questions set aside, supervised warm start, "before" scores (off by default).
    dataset, before_after = demo_stage().before_grpo(demo_args, model, tokenizer, dataset, templates, args)
    if held_out and len(dataset) < arithmetic.questions_per_round:  # every row of a held-out question went
        raise UsageError(
            f"heldout_questions={held_out} leaves {len(dataset)} rows to train on (each held-out question's "
            f"repeats are kept out too): fewer than one round's {arithmetic.questions_per_round}; lower "
            "heldout_questions, or shrink the round (--dry_run)"
        )

    # Trainer: it draws the templates and applies the features; this script adds none.
    if args.model_init_kwargs:  # load_model applied them; TRL, given a loaded model, would call them ignored
        logging.getLogger("trl.trainer.grpo_trainer").addFilter(_not_the_model_init_kwargs_note)
    card = model_card_info(
        script_args, model_args, args, recipe, templates, weights, len(dataset), eval_template, arithmetic
    )
    wait_for_vllm_server(args, model_path)  # server mode: logs what it waits for; one line at the timeout
    try:
        trainer = PromptAugGRPOTrainer(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
            features=features,
            model_card=card,
        )
    except ValueError as err:  # PEFT's, for target modules the model lacks: one line naming the key
        raise _lora_target_error(err, model, model_args) or err
    clear_earlier_run(stale, args.output_dir, state)  # everything is checked: overwrite_output_dir's delete
    use_compact_log(trainer)
    logger.info("%s", precision_line(trainer.accelerator.mixed_precision, args, os.environ))

    # Train.
    if resume:
        logger.info("resuming from %s (step %d)", resume, checkpoint_step(resume))
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        if state.is_main_process:
            step, max_steps = trainer.state.global_step, trainer.state.max_steps
            message = interrupted_message(
                args.output_dir, step, max_steps, argv, overwrite=script_args.overwrite_output_dir,
                processes=state.num_processes, **saved_parts(args),
            )  # fmt: skip
            print(message, file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except Preempted:  # saved at a step end on every rank (train() waits for all); not finished, so no
        # final model, card or push
        if state.is_main_process:
            step, max_steps = trainer.state.global_step, trainer.state.max_steps
            why = f"Preempted by {trainer.preempted} (exit status {EXIT_PREEMPTED}, {PREEMPTED_FILE} written)"
            message = interrupted_message(
                args.output_dir, step, max_steps, argv, why, overwrite=script_args.overwrite_output_dir,
                processes=state.num_processes, **saved_parts(args),
            )  # fmt: skip
            print(message, file=sys.stderr, flush=True)
        # No rank exits before the main process has said so: torchrun stops the other ranks as soon as one
        # exits, which could cut that message.
        state.wait_for_everyone()
        return EXIT_PREEMPTED
    # Trained: a late time-limit warning (SIGUSR1; train() catches it only while it trains) must not kill the
    # final save, card or push; the job script waits for the run to end and then does not requeue it.
    with signal_ignored("SIGUSR1"):
        trainer.log_metrics("train", result.metrics)
        # Results, state, model and card first: the learning demo's "after" scores generate, and a failure
        # there (memory, Ctrl-C) must not cost the trained model. Then push (a failed push leaves them on
        # disk and says how to push later). A full disk on any of these writes is one line saying what
        # holds the trained model (`prompt_aug.faults.disk_full_message`).
        full_disk = disk_full_is_one_line(
            args.output_dir, max_steps=trainer.state.max_steps, processes=state.num_processes,
            **saved_parts(args),
        )  # fmt: skip
        with full_disk:
            trainer.save_metrics("train", result.metrics)
            trainer.save_state()
            trainer.save_model_unpushed(args.output_dir)  # pushed below, once, with the card and the demo's
            trainer.create_model_card()
        if before_after is not None:
            before_after.measure("after", trainer.model, tokenizer)
            if trainer.is_world_process_zero():
                print(before_after.table())
                logger.info("wrote %s", before_after.write(args.output_dir))
        if args.push_to_hub:
            # Every rank calls it, as accelerate expects; only the main process uploads. The model saved above
            # is uploaded as it is, not saved again (a kill then would cut the finished model short).
            trainer.push_saved_model(commit_message=f"prompt-aug GRPO, {trainer.state.global_step} steps")
        guard = trainer.features.guard
        if guard is not None and guard.stop_reason and trainer.is_world_process_zero():  # the last word
            stop_file = os.path.join(args.output_dir, COLLAPSE_STOP_FILE)
            logger.warning("%s; exit status 0, recorded in %s", guard.stop_reason, stop_file)
        return 0


if __name__ == "__main__":
    main()
