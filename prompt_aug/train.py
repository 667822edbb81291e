"""Train with a recipe: ``python -m prompt_aug.train --config RECIPE.yaml [--key value ...]``.

Also ``accelerate launch --config_file accelerate_configs/ddp.yaml -m prompt_aug.train --config ...``,
``torchrun --nproc_per_node N -m prompt_aug.train --config ...`` or the ``prompt-aug-train`` script.

`train` reads top to bottom, as TRL's and open-r1's GRPO scripts do: parse → check → tokenizer → data →
model → trainer → train → save → card → push. Before anything heavy loads, the recipe, the output folder
(a folder holding a run needs ``--resume_from_checkpoint`` or ``--overwrite_output_dir true``), where the
model and data come from, and the reward, template and evaluation keys are checked; such errors end the
command with one line. The trainer sets up every training feature of the config itself (evaluation, the
collapse guard, stop tokens, ...): this script adds none. The learning demo is reached only through
`prompt_aug.demo.before_grpo`, so a run on a real model and dataset imports no demo module.
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import NamedTuple

import torch
from accelerate import PartialState
from trl import ModelConfig, get_peft_config

from rewards import get_reward_funcs

from . import demo
from .cli import (
    USER_ERRORS,
    RecipeParser,
    UsageError,
    checkpoint_step,
    interrupted_message,
    parse_recipe,
    prepare_output_dir,
    recipe_text,
)
from .collator import PromptAugmentationCollator
from .config import (
    DRY_RUN_OVERRIDES,
    PromptAugGRPOConfig,
    PromptAugScriptArguments,
    batch_arithmetic,
    wants_dry_run,
)
from .data import DataError, load_train_dataset
from .demo import DemoArguments
from .evaluation.benchmarks import EvalError
from .evaluation.callback import evaluator_from_args
from .extensions.dynamic_sampling import signal_column
from .faults import EXIT_PREEMPTED, PREEMPTED_FILE, disk_full_is_one_line
from .logging_utils import quiet_repeated_warnings, use_compact_log
from .model_card import model_card_info
from .models import ModelArgsError, check_model_args, load_model, load_tokenizer, resolve_model_path
from .stack import check_before_parse, check_stack, wait_for_vllm_server
from .templates import TemplateError, check_renders, resolve_eval_template, templates_for
from .trainer import PromptAugGRPOTrainer

__all__ = ["Recipe", "main", "parse_args", "resolve_eval_template", "train"]

logger = logging.getLogger("prompt_aug")


class Recipe(NamedTuple):
    """A parsed recipe: the script's keys, the trainer's config, TRL's `ModelConfig` and the demo's keys."""

    script_args: PromptAugScriptArguments
    training_args: PromptAugGRPOConfig
    model_args: ModelConfig
    demo_args: DemoArguments


def parse_args(argv: list[str] | None = None) -> Recipe:
    """Parse a recipe and command-line overrides; a bad key or value fails here in one line
    (`cli.UsageError`)."""
    parser = RecipeParser((PromptAugScriptArguments, PromptAugGRPOConfig, ModelConfig, DemoArguments))
    args = list(argv) if argv is not None else sys.argv[1:]
    if wants_dry_run(args):  # bf16 recipes must parse on a CPU-only machine; see config.DRY_RUN_OVERRIDES
        args += DRY_RUN_OVERRIDES
    return Recipe(*parse_recipe(parser, args))


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
    quiet_repeated_warnings()
    check_before_parse(argv)  # DeepSpeed, and torch's CUDA build against the driver (prompt_aug/stack.py)
    script_args, args, model_args, demo_args = parse_args(argv)  # __post_init__ has checked our keys
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    arithmetic = batch_arithmetic(args, script_args)
    try:  # every ModelConfig key is honoured or refused here (QLoRA: bitsandbytes and a GPU, unless dry)
        check_model_args(model_args, devices=not script_args.dry_run)
    except ModelArgsError as err:
        raise UsageError(str(err)) from None
    check_stack(args, dry_run=script_args.dry_run)  # vLLM, liger-kernel; logs torch's CUDA and the driver
    if script_args.dry_run:  # arithmetic only
        print(arithmetic.table())
        return 0
    state = PartialState()
    logger.setLevel(logging.INFO if state.is_main_process else logging.WARNING)
    resume = prepare_output_dir(script_args, args, model_args, state)

    # Rewards, templates and evaluation sets: a bad name or set fails now, before the model loads.
    try:
        reward_funcs = get_reward_funcs(script_args.reward_funcs)
        if args.dynamic_sampling:  # as the trainer looks it up (TRL names a reward function by __name__)
            signal_column(args.dynamic_sampling_signal, reward_funcs, [f.__name__ for f in reward_funcs])
        templates, weights, eval_template = templates_for(args)
        evaluator = evaluator_from_args(args)  # loads the question sets; handed to the trainer below
    except (ValueError, TemplateError, EvalError) as err:  # each message names the key and what there is
        raise UsageError(str(err)) from None

    # Tokenizer, data, model.
    model_path = resolve_model_path(model_args, args)
    try:
        tokenizer = load_tokenizer(model_path, model_args, args, script_args.chat_template)
        check_renders(templates, tokenizer)  # each template must render with this tokenizer's chat template
    except (ModelArgsError, TemplateError) as err:
        raise UsageError(str(err)) from None
    try:
        dataset, report = load_train_dataset(script_args, args, templates, eval_template, tokenizer)
    except DataError as err:
        raise UsageError(str(err)) from None
    logger.info("%s", report)  # main process only (logger level above)
    logger.info("batch arithmetic:\n%s", arithmetic.table())
    model = load_model(model_path, model_args, args)
    # Learning demo: held-out questions set aside, supervised warm start, "before" scores (off by default).
    dataset, before_after = demo.before_grpo(demo_args, model, tokenizer, dataset, templates, args)

    # Trainer: it sets up evaluation, the collapse guard, stop tokens and the rest from `args` itself.
    collator = None
    if args.prompt_augmentation:
        collator = PromptAugmentationCollator(
            templates, tokenizer, weights, seed=args.seed, eval_template=eval_template,
            chat_template_kwargs=args.chat_template_kwargs,
        )  # fmt: skip
    if args.model_init_kwargs:  # load_model applied them; TRL, given a loaded model, would call them ignored
        logging.getLogger("trl.trainer.grpo_trainer").addFilter(_not_the_model_init_kwargs_note)
    card = model_card_info(script_args, model_args, args, recipe_text(argv), templates, weights, len(dataset))
    wait_for_vllm_server(args, model_path)  # server mode: logs what it waits for; one line at the timeout
    trainer = PromptAugGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        prompt_collator=collator,
        model_card=card,
        callbacks=[evaluator] if evaluator is not None else None,
    )
    use_compact_log(trainer)

    # Train.
    if resume:
        logger.info("resuming from %s (step %d)", resume, checkpoint_step(resume))
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        if state.is_main_process:
            step, max_steps = trainer.state.global_step, trainer.state.max_steps
            print(interrupted_message(args.output_dir, step, max_steps, argv), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    if trainer.preempted:  # saved at a step end on every rank; not finished, so no final model, card or push
        state.wait_for_everyone()  # every rank has written its part of the checkpoint before any exits
        if state.is_main_process:
            step, max_steps = trainer.state.global_step, trainer.state.max_steps
            why = f"Preempted by {trainer.preempted} (exit status {EXIT_PREEMPTED}, {PREEMPTED_FILE} written)"
            print(
                interrupted_message(args.output_dir, step, max_steps, argv, why), file=sys.stderr, flush=True
            )
        return EXIT_PREEMPTED
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if before_after is not None:
        before_after.measure("after", trainer.model, tokenizer)
        if trainer.is_world_process_zero():
            print(before_after.table())
            logger.info("wrote %s", before_after.write(args.output_dir))

    # Save, card, push (a failed push leaves both on disk and says how to push later).
    with disk_full_is_one_line(args.output_dir):
        trainer.save_model(args.output_dir)
        trainer.create_model_card()
    if args.push_to_hub:
        # Every rank calls it, as accelerate expects; only the main process uploads.
        trainer.push_to_hub(commit_message=f"prompt-aug GRPO, {trainer.state.global_step} steps")
    return 0


if __name__ == "__main__":
    main()
