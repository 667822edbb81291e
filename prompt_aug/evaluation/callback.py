"""Evaluation during training: `EvalCallback` (greedy, strict, hf backend, a share of the questions per
process) and the check that the model is not sharded across processes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ..templates import (
    DEFAULT_EVAL_TEMPLATE,
    Template,
    TemplateError,
    load_templates,
    resolve_eval_template,
    with_opened_markers,
)
from .backends import HFBackend, stop_rule_tokens
from .benchmarks import EvalError, Problem, load_benchmark, metric_name, parse_benchmarks, parse_templates
from .report import summarize
from .runner import score_completions

# One logger for all of evaluation, under the name it had before the split.
logger = logging.getLogger("prompt_aug.evaluate")


class EvalCallback(TrainerCallback):
    """Evaluates the live model every ``every_n_steps`` steps (hf backend, greedy, strict grading).

    Logs ``eval/<benchmark>/accuracy`` (see `metric_name`), ``eval/macro``, ``eval/micro`` and
    ``eval/questions`` (answers graded, all processes together) with the trainer's next log line (it asks
    for one on evaluation steps), so they land in ``state.log_history``. Call
    `attach` (not ``add_callback``) so that the reporting callbacks (wandb, ...) see them too.

    Every process evaluates its own share of the questions (every world_size-th one) with its whole copy
    of the model, then the verdicts are gathered: no process idles at a collective while another
    generates, so an evaluation cannot outlast ``ddp_timeout`` on the other ranks, and it takes
    1/world_size of the time. Models sharded across processes (DeepSpeed ZeRO-3, FSDP) cannot generate
    that way; training refuses to start with them (see `check_unsharded`).

    Args:
        benchmarks: Benchmark names (or a comma list), e.g. ``"math500"``.
        every_n_steps: Evaluation interval in optimizer steps; 0 turns it off.
        data_dir: A local suite folder; ``None`` loads from the Hub.
        template: The evaluation template, or its name in the built-in bank.
        max_tokens: New tokens per completion.
        limit: Only the first ``limit`` questions of each benchmark.
        batch_size: Prompts per ``generate`` call.
        columns: The question and gold columns of question sets of one's own (``None``: the defaults of
            `load_benchmark`).
        stop: The stop rule, as ``prompt-aug-eval --stop``: ``turn`` also stops at `STOP_TOKENS`, ``eos``
            only at the model's EOS (tokenizer and generation config). During training the model's generation
            config holds the recipe's ``stop_tokens`` (the trainer puts them there), so ``eos``, which
            `evaluator_from_args` passes, stops where the training rollouts stop, and where
            ``prompt-aug-eval --stop eos`` stops on the saved model.
        chat_template_kwargs: Extra arguments for ``apply_chat_template``, as the training prompts render
            with them. ``None``: the training arguments' ``chat_template_kwargs`` at each evaluation.
    """

    def __init__(
        self,
        benchmarks: str | list[str] = "math500",
        every_n_steps: int = 100,
        data_dir: str | Path | None = None,
        template: str | Template = DEFAULT_EVAL_TEMPLATE,
        max_tokens: int = 1024,
        limit: int | None = None,
        batch_size: int = 16,
        columns: tuple[str | None, str | None] = (None, None),
        stop: str = "turn",
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        for key, value in (("max_tokens", max_tokens), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EvalError(f"{key}: {value!r} is not a whole number of at least 1")
        self.benchmarks = parse_benchmarks(benchmarks)
        stop_rule_tokens(stop)  # an unknown rule fails here, not at the first evaluation
        self.stop = stop
        self.columns = columns
        names = [metric_name(b) for b in self.benchmarks]
        clashes = sorted({b for b, n in zip(self.benchmarks, names) if names.count(n) > 1})
        if clashes:
            raise EvalError(
                f"benchmarks {clashes} would log under one name; rename a file to tell them apart"
            )
        self.every_n_steps, self.data_dir, self.limit = every_n_steps, data_dir, limit
        self.template = template if isinstance(template, Template) else parse_templates(template)[0]
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.chat_template_kwargs = None if chat_template_kwargs is None else dict(chat_template_kwargs)
        self._problems: list[Problem] | None = None
        self._pending: dict[str, float] = {}

    def attach(self, trainer: Any) -> EvalCallback:
        """Add this callback ahead of the trainer's loggers; returns ``self``."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    def problems(self) -> list[Problem]:
        """The questions of every chosen benchmark, loaded on first use."""
        if self._problems is None:
            keys = ("eval_question_column", "eval_answer_column")  # the recipe keys that name them
            loaded = (
                load_benchmark(b, self.data_dir, self.limit, *self.columns, column_keys=keys)
                for b in self.benchmarks
            )
            self._problems = [p for problems in loaded for p in problems]
        return self._problems

    def prompt(
        self, question: str, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
    ) -> str:
        """``question`` rendered under the evaluation template, with this callback's ``chat_template_kwargs``
        (else ``chat_template_kwargs``, the training arguments')."""
        kwargs = self.chat_template_kwargs if self.chat_template_kwargs is not None else chat_template_kwargs
        return self.template.render(question, tokenizer, **(kwargs or {}))

    def evaluate_model(
        self,
        model: Any,
        tokenizer: Any,
        process_index: int = 0,
        num_processes: int = 1,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, float]:
        """Greedy strict accuracy of ``model`` on the chosen benchmarks, as ``eval/*`` metrics; prompts as
        `prompt` renders them.

        With ``num_processes > 1`` every process must call it: each generates for its share of the
        questions, and the verdicts of all processes are gathered before the accuracy is computed.
        """
        mine = self.problems()[process_index::num_processes]
        backend = HFBackend(model, tokenizer, self.stop)
        kwargs = self.chat_template_kwargs if self.chat_template_kwargs is not None else chat_template_kwargs
        template = with_opened_markers(self.template, tokenizer, **(kwargs or {}))  # training's markers
        records = []
        for start in range(0, len(mine), self.batch_size):
            batch = mine[start : start + self.batch_size]
            prompts = [self.prompt(p.question, tokenizer, chat_template_kwargs) for p in batch]
            outputs = backend.generate(
                prompts, [0] * len(batch), max_tokens=self.max_tokens, temperature=0.0, top_p=1.0, n=1
            )
            completions = [samples[0][0] for samples in outputs]
            verdicts = score_completions(completions, [p.gold for p in batch], [template] * len(batch))
            for problem, verdict in zip(batch, verdicts):
                records.append(
                    {
                        "benchmark": problem.benchmark,
                        "template": self.template.name,
                        "run": 0,
                        "index": problem.index,
                        "correct": verdict["correct"],
                    }
                )
        shares = [len(mine)]
        if num_processes > 1:
            from accelerate.utils import gather_object

            records = gather_object(records)
            shares = gather_object(shares)
        summary = summarize(records, self.benchmarks, [self.template.name])["results"][self.template.name]
        metrics = {f"eval/{metric_name(b)}/accuracy": e["accuracy"] for b, e in summary["benchmarks"].items()}
        metrics.update({"eval/macro": summary["macro"], "eval/micro": summary["micro"]})
        metrics["eval/questions"] = float(len(records))
        logger.info(  # main process only under `prompt-aug-train`, so the shares are gathered
            "evaluated %d questions on %d processes (%s)",
            len(records),
            num_processes,
            " + ".join(map(str, shares)),
        )
        return metrics

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.every_n_steps > 0:
            check_unsharded()
            self.problems()  # a missing file or column fails now, not at the first evaluation
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.every_n_steps <= 0 or state.global_step % self.every_n_steps:
            return control
        if control.should_training_stop and state.global_step < state.max_steps:
            return control  # stopping early at this step (a preemption signal): save, do not evaluate first
        tokenizer = kwargs.get("processing_class") or kwargs.get("tokenizer")
        self._pending = self.evaluate_model(
            kwargs["model"], tokenizer, getattr(args, "process_index", 0), getattr(args, "world_size", 1),
            getattr(args, "chat_template_kwargs", None),  # the rollouts' prompts render with them
        )  # fmt: skip
        logger.info("step %d: %s", state.global_step, {k: round(v, 4) for k, v in self._pending.items()})
        control.should_log = True
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        if self._pending:
            if logs is not None:
                logs.update(self._pending)
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(self._pending)
            self._pending = {}
        return control


def evaluator_from_args(args: Any) -> EvalCallback | None:
    """The evaluation callback of ``args``' ``eval_benchmarks`` / ``eval_every_steps`` (``None``: off), its
    question sets loaded now: a missing file, column or Hub set fails here (`EvalError`), not hours into
    training."""
    if not (args.eval_every_steps and args.eval_benchmarks):
        return None
    try:  # from the recipe's templates_file when it has it (without system_prompt: benchmarks ask plainly)
        template = resolve_eval_template(args, load_templates(args.templates_file))
    except TemplateError as err:
        raise EvalError(str(err)) from None
    evaluator = EvalCallback(
        args.eval_benchmarks,
        args.eval_every_steps,
        data_dir=args.eval_data_dir,
        template=template,
        max_tokens=args.eval_max_tokens,
        limit=args.eval_limit,
        columns=(args.eval_question_column, args.eval_answer_column),
        stop="eos",  # the recipe's stop_tokens, which the trainer sets in the model's generation config
        chat_template_kwargs=args.chat_template_kwargs,  # as the training prompts render (None: none)
    )
    evaluator.problems()
    return evaluator


def sharding_error(distributed_type: str, zero3: bool) -> str | None:
    """Why evaluation during training cannot run under this setup, or ``None`` when it can.

    >>> sharding_error("MULTI_GPU", False) is None, "ZeRO-3" in sharding_error("DEEPSPEED", True)
    (True, True)
    """
    if distributed_type == "FSDP" or (distributed_type == "DEEPSPEED" and zero3):
        kind = "FSDP" if distributed_type == "FSDP" else "DeepSpeed ZeRO-3"
        return (
            f"eval_every_steps / eval_benchmarks: evaluation during training generates with each process's "
            f"whole model, which {kind} shards across processes. Set eval_every_steps 0 and evaluate the "
            "saved checkpoints with prompt-aug-eval (docs/reproduce.md), or train with "
            "accelerate_configs/zero2.yaml or ddp.yaml."
        )
    return None


def check_unsharded() -> None:
    """Raise `EvalError` when the running setup shards the model (FSDP, DeepSpeed ZeRO-3)."""
    from accelerate import PartialState
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    error = sharding_error(PartialState().distributed_type.value, is_deepspeed_zero3_enabled())
    if error:
        raise EvalError(error)
