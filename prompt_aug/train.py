"""Train with a recipe: ``python -m prompt_aug.train --config RECIPE.yaml [--key value ...]``.

Also ``accelerate launch --config_file accelerate_configs/ddp.yaml -m prompt_aug.train --config ...``,
``torchrun --nproc_per_node N -m prompt_aug.train --config ...`` or the ``prompt-aug-train`` script.

`train` reads top to bottom: parse → checks → rewards and templates → data → model → trainer →
train → save → card → push. Before anything heavy loads, `cli` and `sources` check the recipe, the output
folder (a folder holding a run needs ``--resume_from_checkpoint`` or ``--overwrite_output_dir true``) and
where the model and data come from, and the reward, template and evaluation keys are resolved; such errors
end the command with one line. The learning demo (built-in models and datasets, warm start, before/after
table) is reached only through `prompt_aug.demo`'s hook, so a run on a real model and dataset imports no
demo module.
"""

from __future__ import annotations

import gc
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import ModelConfig, get_peft_config

from rewards import get_reward_funcs

from . import demo
from .cli import USER_ERRORS, RecipeParser, UsageError, check_output_dir, clear_run, parse_recipe
from .collator import PromptAugmentationCollator, format_columns
from .config import DRY_RUN_OVERRIDES, PromptAugGRPOConfig, batch_arithmetic, wants_dry_run
from .data import DataError, filter_long_prompts, load_math_dataset
from .demo import DemoArguments
from .evaluation.benchmarks import EvalError
from .evaluation.callback import evaluator_from_args
from .extensions.dynamic_sampling import signal_column
from .logging_utils import quiet_repeated_warnings, use_compact_log
from .model_card import ModelCardInfo
from .models import LOCAL_MODELS
from .models import resolve as resolve_local_model
from .sources import check_source
from .templates import Template, TemplateError, check_renders, resolve_eval_template, templates_for
from .trainer import PromptAugGRPOTrainer

__all__ = ["main", "parse_args", "resolve_eval_template", "resolve_model_path", "resolve_resume", "train"]

logger = logging.getLogger("prompt_aug")


def parse_args(argv: list[str] | None = None) -> tuple[PromptAugGRPOConfig, ModelConfig, DemoArguments]:
    """Parse a recipe and command-line overrides into the config, TRL's `ModelConfig` and the demo's keys;
    a bad key or value fails here in one line (`cli.UsageError`)."""
    parser = RecipeParser((PromptAugGRPOConfig, ModelConfig, DemoArguments))
    args = list(argv) if argv is not None else sys.argv[1:]
    if wants_dry_run(args):  # bf16 recipes must parse on a CPU-only machine; see config.DRY_RUN_OVERRIDES
        args += DRY_RUN_OVERRIDES
    return parse_recipe(parser, args)


def resolve_model_path(model_args: ModelConfig, args: PromptAugGRPOConfig) -> str:
    """The model to load; a built-in random model is built once, on the main process, in the output folder;
    a known local model's name (`prompt_aug.models.LOCAL_MODELS`) becomes its fetched folder."""
    name = model_args.model_name_or_path
    if name not in demo.TINY_MODEL_NAMES:
        return resolve_local_model(name)
    with PartialState().main_process_first():
        return demo.build_model(name, args.output_dir, args.seed)


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


def plain_prompts(dataset: Any, template: Template) -> Any:
    """Without augmentation: each question as ``template``'s messages, a TRL conversational ``prompt``,
    with the template's format rules in the row so that the rewards grade by them."""
    if template.prefill:
        raise TemplateError(
            f"prompt_augmentation is false, so questions are asked under eval_template {template.name!r} "
            f"through TRL's chat handling, which cannot prefill {template.prefill!r}; "
            "choose an eval_template without a prefill"
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
    """After a run that ended normally, leave the process group on every rank and join gloo's worker threads
    before Python exits.

    A gloo worker thread can still hold the last reference to a collective's tensor (the collapse guard
    broadcasts a few milliseconds before the end of training) after Python has dropped its own. Releasing it
    takes the GIL; if Python has begun finalizing by then, the thread is ended with ``pthread_exit`` inside
    a ``noexcept`` destructor and the rank aborts ("terminate called without an active exception").
    ``destroy_process_group`` alone does not stop gloo's threads: the group lives on in the DDP wrapper
    until interpreter teardown. So: keep our own handles on the groups, leave them, collect the trainer's
    reference cycles (DDP wrapper, reducer), then drop the handles last. Their destructor releases the GIL
    while it waits for gloo's workers, so a worker that still has a tensor to release can finish.

    Only on success: after an error the other ranks may be inside a collective, and leaving then could hang
    them. No barrier first: with ``push_to_hub`` the other ranks finish while the main process is still
    uploading, which needs no collective.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    handles = list(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()
    gc.collect()  # the DDP reducer must not be the last holder: it would join gloo's workers holding the GIL
    del handles


def train(argv: list[str] | None = None) -> None:
    """Everything `main` does, with errors raised as exceptions."""
    quiet_repeated_warnings()
    args, model_args, demo_args = parse_args(argv)  # __post_init__ has checked our keys
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.dry_run:  # arithmetic only
        print(batch_arithmetic(args).table())
        return
    state = PartialState()
    logger.setLevel(logging.INFO if state.is_main_process else logging.WARNING)
    resume = prepare_output_dir(args, model_args, state)

    # Rewards, templates and evaluation sets: a bad name or set fails now, before the model loads.
    try:
        reward_funcs = get_reward_funcs(args.reward_funcs)
        if args.dynamic_sampling:  # as the trainer looks it up (TRL names a reward function by __name__)
            signal_column(args.dynamic_sampling_signal, reward_funcs, [f.__name__ for f in reward_funcs])
    except ValueError as err:  # the message names the key and lists what there is
        raise UsageError(str(err)) from None
    try:
        templates, weights, eval_template = templates_for(args)
    except TemplateError as err:
        raise UsageError(str(err)) from None
    check_evaluation_sets(args)

    # Tokenizer, prompt collator, data, model.
    model_path = resolve_model_path(model_args, args)
    tokenizer = load_tokenizer(model_path, model_args, args)
    check_renders(templates, tokenizer)  # each template must render with this tokenizer's chat template
    collator = None
    if args.prompt_augmentation:
        collator = PromptAugmentationCollator(
            templates, tokenizer, weights, seed=args.seed, eval_template=eval_template,
            chat_template_kwargs=args.chat_template_kwargs,
        )  # fmt: skip
    dataset = load_train_dataset(args, templates, eval_template, tokenizer)
    model = load_model(model_path, model_args, args)
    # Learning demo: held-out questions set aside, supervised warm start, "before" scores (off by default).
    dataset, before_after = demo.before_grpo(demo_args, model, tokenizer, dataset, templates, args)

    # Trainer: it sets up evaluation, the collapse guard, stop tokens and the rest from `args` itself.
    trainer = PromptAugGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        prompt_collator=collator,
        model_card=model_card_info(args, model_args, argv, templates, weights, len(dataset)),
    )
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
            logger.info("wrote %s", before_after.write(args.output_dir))

    # Save, card, push.
    trainer.save_model(args.output_dir)
    trainer.create_model_card()
    if args.push_to_hub:
        # Every rank calls it, as accelerate expects; only the main process uploads.
        trainer.push_to_hub(commit_message=f"prompt-aug GRPO, {trainer.state.global_step} steps")


# -- The steps of `train` ---------------------------------------------------------------------------------


def prepare_output_dir(args: PromptAugGRPOConfig, model_args: ModelConfig, state: PartialState) -> str | None:
    """Fail on a missing local path, an unreachable Hub or an output folder that holds another run; delete
    the earlier run with ``overwrite_output_dir``. Returns the checkpoint to resume from, if any."""
    resolve_local_model(
        model_args.model_name_or_path
    )  # a known local model not fetched yet: its fetch command
    builtin = (*demo.TINY_MODEL_NAMES, *LOCAL_MODELS)
    check_source("model_name_or_path", model_args.model_name_or_path, builtin=builtin)
    check_source("dataset_name", args.dataset_name, builtin=demo.BUILTIN_DATASETS)
    if args.eval_data_dir:
        check_source("eval_data_dir", args.eval_data_dir)
    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir)
    stale = check_output_dir(args.output_dir, resume is not None, args.overwrite_output_dir)
    state.wait_for_everyone()  # every rank has looked before the main process deletes
    if stale and state.is_main_process:
        logger.info("overwrite_output_dir: deleting the earlier run in %s", args.output_dir)
        clear_run(stale)
    state.wait_for_everyone()
    return resume


def check_evaluation_sets(args: PromptAugGRPOConfig) -> None:
    """Load the question sets of ``eval_benchmarks`` (when evaluation is on), so a missing file, column or Hub
    set fails now, in one line, not after the model has loaded (the trainer builds its evaluator itself)."""
    try:
        evaluator_from_args(args)
    except EvalError as err:  # each message names the benchmark, question set or template
        raise UsageError(str(err)) from None


def load_tokenizer(model_path: str, model_args: ModelConfig, args: PromptAugGRPOConfig) -> Any:
    """The model's tokenizer, padding on the left (pad token: EOS when it has none)."""
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, revision=model_args.model_revision, trust_remote_code=args.trust_remote_code
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_train_dataset(
    args: PromptAugGRPOConfig, templates: list[Template], eval_template: Template, tokenizer: Any
) -> Any:
    """The training questions: loaded (main process first), too-long prompts dropped, and without augmentation
    asked under ``eval_template`` as TRL conversational prompts. Logs what was kept and dropped."""
    with PartialState().main_process_first():
        try:
            dataset, report = load_math_dataset(
                args.dataset_name,
                config=args.dataset_config,
                split=args.dataset_split,
                question_column=args.question_column,
                answer_column=args.answer_column,
                levels=args.dataset_levels,
                num_synthetic=args.num_synthetic,
                seed=args.seed,
            )
        except DataError as err:  # a missing column: the message lists the columns there are
            raise UsageError(f"dataset_name {args.dataset_name}: {err}") from None
        dataset, n_long = filter_long_prompts(dataset, templates, tokenizer, args.max_prompt_length)
        if not args.prompt_augmentation:
            dataset = plain_prompts(dataset, eval_template)
    report.rows = len(dataset)
    report.dropped[f"prompt longer than {args.max_prompt_length} tokens"] += n_long
    logger.info("%s", report)  # main process only (logger level above)
    logger.info("batch arithmetic:\n%s", batch_arithmetic(args).table())
    return dataset


def load_model(model_path: str, model_args: ModelConfig, args: PromptAugGRPOConfig) -> Any:
    """The policy (the trainer adds ``stop_tokens`` to its generation config)."""
    return AutoModelForCausalLM.from_pretrained(
        model_path,
        revision=model_args.model_revision,
        trust_remote_code=args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype),
        use_cache=not args.gradient_checkpointing,
    )


def model_card_info(
    args: PromptAugGRPOConfig,
    model_args: ModelConfig,
    argv: list[str] | None,
    templates: list[Template],
    weights: list[float],
    num_rows: int,
) -> ModelCardInfo:
    """What the model card says about this run: base model, recipe, template bank, dataset."""
    return ModelCardInfo(
        base_model=model_args.model_name_or_path,
        recipe=_recipe_text(argv),
        templates=templates,
        weights=weights,
        dataset=args.dataset_name + (f" ({args.dataset_config})" if args.dataset_config else ""),
        num_rows=num_rows,
        eval_template=args.eval_template,
    )


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
        lines.append(
            f"No checkpoint was saved in {output_dir} yet; start over with --overwrite_output_dir true."
        )
    else:
        lines += [
            (
                f"Last checkpoint: {last}. "
                "Resume with the same launch command plus --resume_from_checkpoint true:"
            ),
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
