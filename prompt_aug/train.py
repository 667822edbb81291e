"""Train with a recipe: ``python -m prompt_aug.train --config RECIPE.yaml [--key value ...]``.

Also ``accelerate launch --config_file accelerate_configs/ddp.yaml -m prompt_aug.train --config ...``,
``torchrun --nproc_per_node N -m prompt_aug.train --config ...`` or the ``prompt-aug-train`` script.

Reads top to bottom: parse → data → model → rewards → trainer → train → save → card → push. Before anything
heavy loads, `cli` and `sources` check the recipe, the output folder (a folder holding a run needs
``--resume_from_checkpoint`` or ``--overwrite_output_dir true``) and where the model and data come from;
such errors end the command with one line.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, ModelConfig, get_peft_config

from rewards import get_reward_funcs

from .cli import USER_ERRORS, RecipeParser, UsageError, check_output_dir, clear_run, parse_recipe
from .collapse import OptimizerResetCallback, check_stabiliser_keys, guard_from_args
from .collator import PromptAugmentationCollator, format_columns
from .config import DRY_RUN_OVERRIDES, PromptAugArguments, batch_arithmetic, wants_dry_run
from .data import DataError, filter_long_prompts, load_math_dataset
from .dynamic_sampling import from_args as dynamic_sampler_from_args
from .evaluate import EvalCallback, EvalError, stop_token_ids
from .logging_utils import quiet_repeated_warnings, use_compact_log
from .model_card import ModelCardInfo
from .smoke import BUILTIN_DATASETS, TINY_MODELS, build_tiny_model
from .sources import check_source
from .templates import Template, TemplateError, check_renders, load_templates, select_templates
from .trainer import PromptAugGRPOTrainer
from .warmstart import prepare as prepare_learning_demo

logger = logging.getLogger("prompt_aug")


def parse_args(argv: list[str] | None = None) -> tuple[PromptAugArguments, GRPOConfig, ModelConfig]:
    """Parse a recipe and command-line overrides; a bad key or value fails here in one line (`cli.UsageError`)."""
    parser = RecipeParser((PromptAugArguments, GRPOConfig, ModelConfig))
    args = list(argv) if argv is not None else sys.argv[1:]
    if wants_dry_run(args):  # bf16 recipes must parse on a CPU-only machine; see config.DRY_RUN_OVERRIDES
        args += DRY_RUN_OVERRIDES
    return parse_recipe(parser, args)


def resolve_model_path(model_args: ModelConfig, training_args: GRPOConfig) -> str:
    """The model to load; a built-in random model is built once, on the main process, in the output folder."""
    name = model_args.model_name_or_path
    if name not in TINY_MODELS:
        return name
    path = Path(training_args.output_dir) / name
    with PartialState().main_process_first():
        build_tiny_model(path, seed=training_args.seed, name=name)
    return str(path)


def resolve_resume(value: str | None, output_dir: str) -> str | bool | None:
    """``true`` means the last checkpoint in ``output_dir``; a path is used as is."""
    if value is None or str(value).lower() in ("", "false", "none"):
        return None
    if str(value).lower() == "true":
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if last is None:
            raise UsageError(
                f"resume_from_checkpoint: true, but there is no checkpoint-* folder in {output_dir}; "
                "check --output_dir, or start without --resume_from_checkpoint"
            )
        return last
    if not Path(value).is_dir():
        raise UsageError(f"resume_from_checkpoint: no such checkpoint folder {value}")
    return value


def resolve_eval_template(script_args: PromptAugArguments, bank: dict[str, Template]) -> Template:
    """The ``eval_template``: from the bank in use, else from the built-in bank (the paper evaluates with
    ``qwen-math`` whatever the training bank)."""
    name = script_args.eval_template
    builtin = load_templates() if script_args.templates_file else bank
    template = bank.get(name) or builtin.get(name)
    if template is None:
        where = f"{script_args.templates_file} or the built-in bank" if script_args.templates_file else "the bank"
        raise TemplateError(f"eval_template {name!r} is not in {where}; choose one of {list(bank)}")
    return template


def plain_prompts(dataset: Any, template: Template) -> Any:
    """Without augmentation: each question as ``template``'s messages, a TRL conversational ``prompt``,
    with the template's format rules in the row so that the rewards grade by them."""
    if template.prefill:
        raise TemplateError(
            f"prompt_augmentation is false, so questions are asked under eval_template {template.name!r} through "
            f"TRL's chat handling, which cannot prefill {template.prefill!r}; choose an eval_template without a prefill"
        )
    columns = format_columns(template)
    return dataset.map(lambda row: {"prompt": template.messages(row["question"]), **columns})


def main(argv: list[str] | None = None) -> None:
    """Train with a recipe. Bad input (a recipe key, a path, a used output folder) exits with one line."""
    try:
        train(argv)
    except USER_ERRORS as err:
        raise SystemExit(f"prompt-aug-train: error: {err}") from None
    close_process_group()


def close_process_group() -> None:
    """After a run that ended normally, leave the process group on every rank before Python exits.

    Without it, gloo's worker threads are still alive while the interpreter shuts down, and a rank can
    abort at exit ("terminate called without an active exception", pytorch/pytorch#190489): the run
    finished, but the launcher reports a failure. Only on success: after an error the other ranks may be
    inside a collective, and leaving then could hang them. No barrier first: with ``push_to_hub`` the
    other ranks finish while the main process is still uploading, which needs no collective.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(argv: list[str] | None = None) -> None:
    """Everything `main` does, with errors raised as exceptions."""
    quiet_repeated_warnings()
    script_args, training_args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    # Collapse guard, stabiliser and dynamic-sampling keys: checked in a dry run too.
    try:
        check_stabiliser_keys(script_args, training_args)
        steps_per_round = batch_arithmetic(script_args, training_args).optimizer_steps_per_round
        guard = guard_from_args(script_args, steps_per_round)  # None unless a collapse_* threshold is set
        dynamic_sampler = dynamic_sampler_from_args(script_args)  # None unless dynamic_sampling: true
    except ValueError as err:  # each message names its key and what to change
        raise UsageError(str(err)) from None

    # Dry run: arithmetic only.
    if script_args.dry_run:
        print(batch_arithmetic(script_args, training_args).table())
        return

    # Fail now on a missing local path, an unreachable Hub or an output folder that holds another run.
    state = PartialState()
    logger.setLevel(logging.INFO if state.is_main_process else logging.WARNING)
    check_source("model_name_or_path", model_args.model_name_or_path, builtin=tuple(TINY_MODELS))
    check_source("dataset_name", script_args.dataset_name, builtin=BUILTIN_DATASETS)
    if script_args.eval_data_dir:
        check_source("eval_data_dir", script_args.eval_data_dir)
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    stale = check_output_dir(training_args.output_dir, resume is not None, script_args.overwrite_output_dir)
    state.wait_for_everyone()  # every rank has looked before the main process deletes
    if stale and state.is_main_process:
        logger.info("overwrite_output_dir: deleting the earlier run in %s", training_args.output_dir)
        clear_run(stale)
    state.wait_for_everyone()

    # Fail on a bad reward or template name, or an evaluation set that does not load, before the model loads.
    try:
        reward_funcs = get_reward_funcs(script_args.reward_funcs)
    except ValueError as err:  # the message names reward_funcs and lists what is registered
        raise UsageError(str(err)) from None
    try:
        bank = load_templates(script_args.templates_file)
        eval_template = resolve_eval_template(script_args, bank)
        if script_args.prompt_augmentation:
            templates, weights = select_templates(bank, script_args.templates, script_args.template_weights)
        else:
            templates, weights = [eval_template], [1.0]
    except TemplateError as err:
        raise UsageError(str(err)) from None
    evaluator = None
    if script_args.eval_every_steps and script_args.eval_benchmarks:
        try:
            evaluator = EvalCallback(
                script_args.eval_benchmarks,
                script_args.eval_every_steps,
                data_dir=script_args.eval_data_dir,
                template=script_args.eval_template,
                max_tokens=script_args.eval_max_tokens,
                limit=script_args.eval_limit,
            )
            evaluator.problems()  # a missing file, column or Hub set fails now, not hours into training
        except EvalError as err:  # each message names the benchmark, question set or template
            raise UsageError(str(err)) from None

    # Model and tokenizer.
    model_path = resolve_model_path(model_args, training_args)
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    # Templates: each must render with this tokenizer's chat template.
    check_renders(templates, tokenizer)
    collator = None
    if script_args.prompt_augmentation:
        collator = PromptAugmentationCollator(
            templates, tokenizer, weights, seed=training_args.seed, eval_template=eval_template,
            chat_template_kwargs=training_args.chat_template_kwargs,
        )  # fmt: skip

    # Data.
    with PartialState().main_process_first():
        try:
            dataset, report = load_math_dataset(
                script_args.dataset_name,
                config=script_args.dataset_config,
                split=script_args.dataset_split,
                question_column=script_args.question_column,
                answer_column=script_args.answer_column,
                levels=script_args.dataset_levels,
                num_synthetic=script_args.num_synthetic,
                seed=training_args.seed,
            )
        except DataError as err:  # a missing column: the message lists the columns there are
            raise UsageError(f"dataset_name {script_args.dataset_name}: {err}") from None
        dataset, n_long = filter_long_prompts(dataset, templates, tokenizer, script_args.max_prompt_length)
        if not script_args.prompt_augmentation:
            dataset = plain_prompts(dataset, eval_template)
    report.rows = len(dataset)
    report.dropped[f"prompt longer than {script_args.max_prompt_length} tokens"] += n_long
    logger.info("%s", report)  # main process only (logger level above)
    logger.info("batch arithmetic:\n%s", batch_arithmetic(script_args, training_args).table())

    model = AutoModelForCausalLM.from_pretrained(
        model_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype),
        use_cache=not training_args.gradient_checkpointing,
    )
    # Stop at every listed stop token (Qwen2.5-Math's base config stops only at <|endoftext|>).
    model.generation_config.eos_token_id = stop_token_ids(
        tokenizer, model.generation_config.eos_token_id, script_args.stop_tokens
    )
    if training_args.use_vllm:
        training_args.generation_kwargs = {
            "stop_token_ids": model.generation_config.eos_token_id,
            **(training_args.generation_kwargs or {}),
        }

    # Learning demo: held-out questions set aside, supervised warm start, "before" scores (off by default).
    dataset, before_after = prepare_learning_demo(model, tokenizer, dataset, templates, script_args, training_args)

    # Trainer.
    recipe_text = _recipe_text(argv)
    trainer = PromptAugGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        prompt_collator=collator,
        prompt_augmentation=script_args.prompt_augmentation,
        dynamic_sampling=dynamic_sampler,
        model_card=ModelCardInfo(
            base_model=model_args.model_name_or_path,
            recipe=recipe_text,
            templates=templates,
            weights=weights,
            dataset=script_args.dataset_name
            + (f" ({script_args.dataset_config})" if script_args.dataset_config else ""),
            num_rows=len(dataset),
            eval_template=script_args.eval_template,
        ),
        skip_minibatch_ratio_above=script_args.skip_minibatch_ratio_above,
        trim_padding=script_args.trim_padding,
    )

    trainer.wandb_completions_rows = script_args.wandb_completions_rows

    if evaluator is not None:
        evaluator.attach(trainer)  # first in the callback list, so W&B sees the eval/* keys
    if guard is not None:
        guard.attach(trainer)  # after the eval callback (it watches eval/macro), before the loggers
    if script_args.reset_optimizer_on_ref_sync:
        trainer.add_callback(OptimizerResetCallback())  # ProRL: TRL resets the reference, this the optimizer

    use_compact_log(trainer)

    # Train.
    if resume:
        logger.info("resuming from %s (step %d)", resume, _checkpoint_step(resume))
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        if state.is_main_process:
            print(_interrupted_message(trainer, argv), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    if before_after is not None:
        before_after.measure("after", trainer.model, tokenizer)
        if trainer.is_world_process_zero():
            print(before_after.table())
            logger.info("wrote %s", before_after.write(training_args.output_dir))

    # Save, card, push.
    trainer.save_model(training_args.output_dir)
    trainer.create_model_card()
    if training_args.push_to_hub:
        # Every rank calls it, as accelerate expects; only the main process uploads.
        trainer.push_to_hub(commit_message=f"prompt-aug GRPO, {trainer.state.global_step} steps")


def _checkpoint_step(checkpoint: str) -> int:
    state = Path(checkpoint) / "trainer_state.json"
    if state.is_file():
        return int(json.loads(state.read_text()).get("global_step", 0))
    digits = Path(checkpoint).name.split("-")[-1]
    return int(digits) if digits.isdigit() else 0


def _interrupted_message(trainer: PromptAugGRPOTrainer, argv: list[str] | None) -> str:
    """Where training stopped and the command that continues it."""
    args = list(argv) if argv is not None else sys.argv[1:]
    kept, skip = [], False
    for arg in args:  # drop the flags that the resume command replaces
        if skip:
            skip = False
        elif arg.split("=")[0] in ("--resume_from_checkpoint", "--overwrite_output_dir"):
            skip = "=" not in arg
        else:
            kept.append(arg)
    output_dir = trainer.args.output_dir
    last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    lines = [f"Interrupted at step {trainer.state.global_step}/{trainer.state.max_steps}."]
    if last is None:
        lines.append(f"No checkpoint was saved in {output_dir} yet; start over with --overwrite_output_dir true.")
    else:
        lines += [
            f"Last checkpoint: {last}. Resume with the same launch command plus --resume_from_checkpoint true:",
            "  python -m prompt_aug.train " + " ".join([*kept, "--resume_from_checkpoint", "true"]),
        ]
    return "\n".join(lines)


def _recipe_text(argv: list[str] | None) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    text = ""
    if "--config" in args:
        text = Path(args[args.index("--config") + 1]).read_text()
    overrides = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
    if overrides:
        text += "\n# command-line overrides: " + " ".join(overrides) + "\n"
    return text


if __name__ == "__main__":
    main()
