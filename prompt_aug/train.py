"""Train with a recipe: ``python -m prompt_aug.train --config RECIPE.yaml [--key value ...]``.

Also ``accelerate launch --config_file accelerate_configs/ddp.yaml -m prompt_aug.train --config ...``,
``torchrun --nproc_per_node N -m prompt_aug.train --config ...`` or the ``prompt-aug-train`` script.

Reads top to bottom: parse → data → model → rewards → trainer → train → save → card → push.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, ModelConfig, TrlParser, get_peft_config

from rewards import get_reward_funcs

from .collator import PromptAugmentationCollator
from .config import DRY_RUN_OVERRIDES, PromptAugArguments, batch_arithmetic, wants_dry_run
from .data import filter_long_prompts, load_math_dataset
from .evaluate import EvalCallback, stop_token_ids
from .model_card import ModelCardInfo
from .smoke import TINY_MODEL_NAME, build_tiny_model
from .templates import check_renders, get_template, load_templates, select_templates
from .trainer import PromptAugGRPOTrainer
from .warmstart import prepare as prepare_learning_demo

logger = logging.getLogger("prompt_aug")


def parse_args(argv: list[str] | None = None) -> tuple[PromptAugArguments, GRPOConfig, ModelConfig]:
    """Parse a recipe and command-line overrides. An unknown key fails here, naming the key."""
    parser = TrlParser((PromptAugArguments, GRPOConfig, ModelConfig))
    args = list(argv) if argv is not None else sys.argv[1:]
    if wants_dry_run(args):  # bf16 recipes must parse on a CPU-only machine; see config.DRY_RUN_OVERRIDES
        args += DRY_RUN_OVERRIDES
    return parser.parse_args_and_config(args)


def resolve_model_path(model_args: ModelConfig, training_args: GRPOConfig) -> str:
    """The model to load; the built-in tiny model is built once, on the main process, in the output folder."""
    if model_args.model_name_or_path != TINY_MODEL_NAME:
        return model_args.model_name_or_path
    path = Path(training_args.output_dir) / TINY_MODEL_NAME
    with PartialState().main_process_first():
        build_tiny_model(path, seed=training_args.seed)
    return str(path)


def resolve_resume(value: str | None, output_dir: str) -> str | bool | None:
    """``true`` means the last checkpoint in ``output_dir``; a path is used as is."""
    if value is None or str(value).lower() in ("", "false", "none"):
        return None
    if str(value).lower() == "true":
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if last is None:
            raise FileNotFoundError(f"resume_from_checkpoint=true but no checkpoint-* folder in {output_dir}")
        return last
    if not Path(value).is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint: no such checkpoint folder {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    script_args, training_args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    # Dry run: arithmetic only.
    if script_args.dry_run:
        print(batch_arithmetic(script_args, training_args).table())
        return

    # Fail on a bad reward or template name now, before anything heavy loads.
    reward_funcs = get_reward_funcs(script_args.reward_funcs)
    bank = load_templates(script_args.templates_file)
    templates, weights = select_templates(bank, script_args.templates, script_args.template_weights)

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
    collator = PromptAugmentationCollator(
        templates, tokenizer, weights, seed=training_args.seed, eval_template=get_template(script_args.eval_template)
    )

    # Data.
    with PartialState().main_process_first():
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
        dataset, n_long = filter_long_prompts(dataset, templates, tokenizer, script_args.max_prompt_length)
    report.rows = len(dataset)
    report.dropped[f"prompt longer than {script_args.max_prompt_length} tokens"] += n_long
    logger.info("%s", report)
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
    )

    if script_args.eval_every_steps and script_args.eval_benchmarks:
        EvalCallback(
            script_args.eval_benchmarks,
            script_args.eval_every_steps,
            data_dir=script_args.eval_data_dir,
            template=script_args.eval_template,
            max_tokens=script_args.eval_max_tokens,
            limit=script_args.eval_limit,
        ).attach(trainer)  # first in the callback list, so W&B sees the eval/* keys

    # Train.
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    result = trainer.train(resume_from_checkpoint=resume)
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
