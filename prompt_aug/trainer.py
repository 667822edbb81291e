"""`PromptAugGRPOTrainer`: TRL's `GRPOTrainer` with prompt augmentation, per-template metrics and the
package's training features, all set up from its config.

A drop-in for `GRPOTrainer`: it takes TRL's arguments alone (the built-in template bank, the processing
class's chat template and ``args.seed`` by default), and with ``prompt_augmentation=False`` it is
`GRPOTrainer`. Built from a `PromptAugGRPOConfig`, it applies every trainer-level key itself: evaluation
during training, the collapse guard, the optimizer reset at reference syncs, stop tokens, the reward cut,
dynamic sampling, the mini-batch skip, padding-free passes and saving on preemption.

It overrides TRL only through `prompt_aug.trl_seam.TRLSeam`'s public hooks; each override says why, in a
``# Why:`` comment above it, and nowhere else.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import HubStrategy
from trl.data_utils import is_conversational

from rewards.registry import CORRECTNESS_REWARDS, format_reward

from .collator import PromptAugmentationCollator
from .config import PromptAugGRPOConfig
from .evaluation.backends import stop_token_ids
from .evaluation.callback import EvalCallback, evaluator_from_args
from .extensions.collapse import (
    OptimizerResetCallback,
    grouped_token_sums,
    guard_from_args,
    loop_flags,
    ratio_deviation_sums,
)
from .extensions.dynamic_sampling import DynamicSampler
from .extensions.dynamic_sampling import from_args as dynamic_sampler_from_args
from .faults import (
    HubPushError,
    PreemptionCallback,
    checked_reward_funcs,
    disk_full_is_one_line,
    hub_push_failed,
    hub_unreachable,
    one_line,
)
from .metrics import per_template_metrics, template_rows
from .model_card import ModelCardInfo, extend_trl_card, render_model_card
from .padding import PaddingFreePasses, can_trim, optimizer_step_segments, regroup, trim
from .records import (
    generation_round,
    micro_steps_per_round,
    optimizer_steps_per_round,
    rounds_generated,
    upload_sampled_table,
    without_wandb_table,
)
from .sampler import EpochRepeatSampler
from .templates import TemplateError, check_renders, load_templates, templates_for
from .trl_seam import Generation, TRLSeam

logger = logging.getLogger("prompt_aug")


class PromptAugGRPOTrainer(TRLSeam):
    """`GRPOTrainer` whose prompts are rewritten under a template drawn per question and generation round.

    Constructed like `GRPOTrainer` (``model, reward_funcs, args, train_dataset, eval_dataset,
    processing_class, ...`` are passed to it unchanged, and its errors are its own). A row gives its
    question through a ``question`` column, else through TRL's ``prompt`` column (text, or messages:
    the last user turn); its id through ``uid``, else one derived from the question.

    Its settings come from ``args``: a `PromptAugGRPOConfig`, or a plain `GRPOConfig`, which means our keys'
    defaults where TRL has no equivalent (augmentation on, the built-in bank, padding-free passes) and TRL's
    behaviour elsewhere (no stop tokens beyond the model's, no reward cut, no guard, no evaluation).

    Args:
        prompt_collator: Draws the template of each row and renders its prompt. Default: the bank of
            ``args`` (the built-in one with a plain `GRPOConfig`), its weights, the processing class's chat
            template (with ``args.chat_template_kwargs``) and ``args.seed``; the evaluation template is
            ``args.eval_template`` (``qwen-math``). Only with ``prompt_augmentation`` on.
        model_card: What our model card adds to TRL's; without it, TRL's card alone is written.

    An `EvalCallback` passed in TRL's ``callbacks`` is the run's evaluator (moved ahead of the other
    callbacks), in place of the one the config's ``eval_*`` keys would build.

    What reward functions receive with augmentation on (TRL's keyword arguments, plus these columns):

    * ``completions``: the generated text (without the template's prefill), cut before the first of
      ``reward_cut_tokens`` if it has one. For a conversational dataset, TRL's conversational form
      ``[{"role": "assistant", "content": text}]``.
    * ``prompts``: for a text dataset, the rendered prompt text (chat template and prefill included);
      for a conversational dataset, the messages the question was asked in (the template's system turn,
      if any, and its user turn), without the prefill.
    * ``template`` (name), ``answer_rule`` (``"boxed"`` or ``"tag"``) and ``format_markers`` (list):
      the format rules of the row's template, which the rewards in `rewards` read; and ``question``,
      ``uid`` and every other dataset column, one value per completion.

    Logs, beside TRL's ``entropy``, ``reward`` and ``completions/*``: ``templates/<name>/accuracy``,
    ``/format``, ``/mean_length``, ``/truncated_ratio``, ``/count``, ``/entropy`` and ``/repetition`` per
    template, ``templates/<name>/<reward function name>`` for every reward function (named as in TRL's
    ``rewards/<reward function name>/mean``, e.g. ``correctness_reward``), and
    ``completions/repetition_ratio`` (completions ending in an n-gram loop). With
    ``log_completions``, the completion records carry ``template``, ``uid`` and the ``process`` that
    generated each completion (the logged prompt is the rendered text), and every log entry carries
    ``round``. With dynamic sampling, also ``dynamic_sampling/*`` and ``templates/<name>/kept``, and
    records of every generated completion with ``kept``, ``group_status`` and ``generation_pass`` (see
    `prompt_aug.extensions.dynamic_sampling`).

    ``wandb_completions_rows`` (from ``args``) bounds the W&B completions table: ``None`` uploads every row
    (TRL), 0 none, N a sample of N rows per log step; the parquet records keep every row.
    """

    # Set in __init__. A trainer built without it (TRL's own tests build one with ``object.__new__`` and call
    # a single step) generates and scores as TRL does.
    dynamic_sampling: DynamicSampler | None = None

    def __init__(
        self,
        *args: Any,
        prompt_collator: PromptAugmentationCollator | None = None,
        model_card: ModelCardInfo | None = None,
        **kwargs: Any,
    ) -> None:
        self.hub_error: str | None = None  # why the Hub could not be reached when the trainer was built
        self._final_push = False
        super().__init__(*args, **kwargs)
        # The reward functions as TRL calls them, each fault one line naming the function and the row.
        self._checked_reward_funcs = checked_reward_funcs(self.reward_funcs, self.reward_func_names)
        config = self.args if isinstance(self.args, PromptAugGRPOConfig) else None
        prompt_augmentation = config.prompt_augmentation if config is not None else True
        self.wandb_completions_rows = config.wandb_completions_rows if config is not None else None
        if prompt_collator is not None and not prompt_augmentation:
            raise ValueError(
                "PromptAugGRPOTrainer: a prompt_collator was given with prompt_augmentation=False"
            )
        if prompt_augmentation and prompt_collator is None:
            prompt_collator = self._default_collator()
        self.prompt_collator = prompt_collator
        self.model_card_info = model_card
        self._round_rewards: torch.Tensor | None = None
        self._conversational = False  # this round's dataset is conversational (see compute_rewards)
        names = []
        if prompt_collator is not None:
            names = [t.name for t in prompt_collator.templates] + [prompt_collator.eval_template.name]
        self._template_index = {name: i for i, name in enumerate(dict.fromkeys(names))}
        self._loss_forward: tuple[torch.Tensor, torch.Tensor] | None = None
        self._entropy_window: torch.Tensor | None = None
        self._ratio_window: torch.Tensor | None = None
        self._skipped_minibatches: int | None = None

        # Stopping and the reward cut.
        if config is not None:
            self._apply_stop_tokens(config.stop_tokens)
        vocab = self.text_tokenizer.get_vocab()
        cut = config.reward_cut_tokens if config is not None else ()
        self.reward_cut_ids = {vocab[t] for t in cut if t in vocab}

        # Stabilisers, dynamic sampling and padding-free passes.
        self.skip_minibatch_ratio_above = config.skip_minibatch_ratio_above if config is not None else None
        if self.skip_minibatch_ratio_above is not None and self.is_deepspeed_enabled:
            raise ValueError(
                "skip_minibatch_ratio_above is not supported under DeepSpeed (its optimizer steps "
                "inside backward, before a mini-batch can be judged); use DDP or FSDP, or unset it"
            )
        self.dynamic_sampling = None
        if config is not None:
            self.dynamic_sampling = dynamic_sampler_from_args(
                config, self.reward_funcs, self.reward_func_names
            )
        if self.dynamic_sampling is not None:
            if prompt_collator is None:
                raise ValueError(
                    "dynamic_sampling needs prompt augmentation; set prompt_augmentation to true or drop "
                    "dynamic_sampling"
                )
            self.dynamic_sampling.check(self)
        self.padding_free = PaddingFreePasses(
            config.trim_padding if config is not None else "packed",
            config.packing_max_tokens if config is not None else None,
            config.packing_pad_to_multiple_of if config is not None else None,
            autocast=self.accelerator.autocast,
        )
        if self.padding_free.max_tokens is not None and self.accelerator.num_processes > 1:
            raise ValueError(
                "packing_max_tokens splits calls, and with several processes every process must make as many "
                "calls: unset packing_max_tokens (the default budget never splits)"
            )
        self.padding_free.choose(self.model)

        # Callbacks: evaluation first (W&B sees eval/*), then the guard (it watches eval/macro), then ProRL's
        # optimizer reset at each reference sync.
        # An evaluator among the caller's `callbacks` (prompt-aug-train builds one early, to fail before the
        # model loads) is used, moved first, in place of one built from the config's eval_* keys.
        given = next((c for c in self.callback_handler.callbacks if isinstance(c, EvalCallback)), None)
        evaluator = given if given is not None or config is None else evaluator_from_args(config)
        if evaluator is not None:
            if given is not None:
                self.callback_handler.remove_callback(given)
            evaluator.attach(self)
        if config is not None:
            guard = guard_from_args(config, optimizer_steps_per_round(config))
            if guard is not None:
                guard.attach(self)
            if config.reset_optimizer_on_ref_sync:
                self.add_callback(OptimizerResetCallback())
        # Preemption: SIGTERM / SIGUSR1 stop the run at a step end, saved (prompt_aug/faults.py).
        self.preemption = None
        if config is None or config.save_on_preemption:
            self.preemption = PreemptionCallback()
            self.add_callback(self.preemption)

    def _apply_stop_tokens(self, tokens: list[str]) -> None:
        """Stop generating at every token of ``tokens`` in the vocabulary, beside the model's EOS: in TRL's
        stop list, the HF generation config, the vLLM sampling parameters and the saved model's config."""
        ids = stop_token_ids(self.text_tokenizer, self.eos_token_ids, tokens)
        self.eos_token_ids = ids
        self.model.generation_config.eos_token_id = ids
        if self.use_vllm:
            kwargs = self.vllm_generation.generation_kwargs
            self.vllm_generation.generation_kwargs = {"stop_token_ids": ids, **kwargs}
        else:
            self.generation_config.eos_token_id = ids
            self.generation_kwargs["eos_token_id"] = ids

    def _default_collator(self) -> PromptAugmentationCollator:
        if isinstance(self.args, PromptAugGRPOConfig):
            templates, weights, eval_template = templates_for(self.args)
        else:
            templates, weights, eval_template = list(load_templates().values()), None, None
        try:
            check_renders(templates, self.text_tokenizer)
        except TemplateError as err:
            raise TemplateError(
                f"{err}\nPromptAugGRPOTrainer renders the built-in templates "
                "through the processing class's chat template; "
                "pass prompt_augmentation=False to train on the dataset's prompts as GRPOTrainer does."
            ) from err
        return PromptAugmentationCollator(
            templates, self.text_tokenizer, weights, seed=self.args.seed, eval_template=eval_template,
            chat_template_kwargs=self.chat_template_kwargs,
        )  # fmt: skip

    # Why: TRL 1.16 hard-codes an identity data collator for GRPO, so a generation round is augmented where it
    # starts. The rows arrive already repeated num_generations times by TRL's RepeatSampler; the collator
    # draws from (seed, epoch, uid), so every rollout of a group gets the same template on every rank. After
    # TRL scores the round, the per-template metrics are added to TRL's own. With dynamic sampling on, the
    # round is handed to `prompt_aug.extensions.dynamic_sampling` instead.
    def score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.prompt_collator is None:
            return self.trl_score_round(inputs)
        training = self.model.training
        epoch = int(
            self.state.epoch or 0
        )  # whole epochs done: a new epoch redraws, a resume redraws the same
        # The rendered text goes to generation; a conversational dataset's reward functions get messages back.
        self._conversational = is_conversational(inputs[0])
        inputs = self.prompt_collator(inputs, epoch=epoch, training=training)
        try:
            if training and self.dynamic_sampling is not None:
                augment = partial(self.prompt_collator, epoch=epoch, training=True)
                return self.dynamic_sampling.run_round(self, inputs, augment, self._score_rows)
            self.log_completion_column("template", [row["template"] for row in inputs])
            self.log_completion_column("uid", [row["uid"] for row in inputs])
            self.log_completion_column("process", [self.accelerator.process_index] * len(inputs))
            self.log_completion_column("round", [self.round_number()] * len(inputs))
            output = self._score_rows(inputs)
        finally:
            self._conversational = False
        self._log_template_metrics(inputs, output, "train" if training else "eval")
        return output

    def round_number(self) -> int:
        """The generation round being generated now, 1-based (the paper's step)."""
        return rounds_generated(self.micro_step, self.args) + 1

    def _score_rows(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of augmented ``rows``, plus each row's template index, which travels
        with the row through TRL's shuffle and split to the per-template entropy in `compute_loss`."""
        output = self.trl_score_round(rows)
        index = [self._template_index.get(row["template"], -1) for row in rows]
        output["template_index"] = torch.tensor(index, device=self.accelerator.device)
        return output

    # Why: TRL does not restore its micro-step counter on resume. From a checkpoint saved in the
    # middle of a generation round (save_steps not a multiple of the optimizer steps per round), it
    # restarted at 0 and replayed the interrupted round in full, shifting every later round by the
    # steps already taken. The Trainer skips global_step x accumulation batches, so restore the counter
    # to match before the first round after the resume is generated.
    #
    # Why (padding-free passes): TRL cuts the shuffled round into micro-batches that all keep the round's
    # widths. A new round's buffered micro-batches are trimmed, and on the trim path first regrouped by length
    # within each optimizer step where that leaves the update unchanged.
    def prepare_micro_batch(self, generation_batch: Any) -> Any:
        training = self.model.training
        if training and self.buffered_micro_batches is None:
            self.micro_step = self.state.global_step * self.args.gradient_accumulation_steps
        spg = self.args.steps_per_generation
        generate_every = micro_steps_per_round(self.args)  # micro-steps per generation round
        step = self.micro_step
        new_round = training and (self.buffered_micro_batches is None or step % generate_every == 0)
        inputs = self.trl_prepare_micro_batch(generation_batch)
        if self.padding_free.mode == "off":
            return inputs
        if not training:
            return trim(inputs) if can_trim(inputs) else inputs
        if new_round and can_trim(self.buffered_micro_batches[0]):
            ga = self.args.gradient_accumulation_steps
            # The round's first micro-step (a resume regenerates a round in its middle; TRL then takes
            # micro-batch `step % spg`, as if the round had started there).
            first = step - step % generate_every
            segments = optimizer_step_segments(first, spg, self.num_iterations, ga)
            exact = self.padding_free.mode == "trim" and self._length_grouping_is_exact()  # packed: no need
            self.buffered_micro_batches = regroup(self.buffered_micro_batches, segments, sort=exact)
            inputs = self.buffered_micro_batches[step % spg]
        return inputs

    def _length_grouping_is_exact(self) -> bool:
        """Whether moving rows between micro-batches of one optimizer step leaves the update unchanged.

        True when the loss weighs each row independently of its micro-batch (not bnpo, whose normaliser is the
        micro-batch's token count; nor the entropy bonus, the entropy quantile mask or a MoE aux loss, all
        computed per micro-batch), and this optimizer step accumulates the full
        ``gradient_accumulation_steps`` (not an epoch's short last one).
        """
        per_micro_batch = (
            self.loss_type == "bnpo"
            or self.entropy_bonus_enabled
            or self.top_entropy_quantile < 1.0
            or self.aux_loss_enabled
        )
        full_step = self.current_gradient_accumulation_steps == self.args.gradient_accumulation_steps
        return not per_micro_batch and full_step

    # Why: TRL's RepeatSampler seeds once and has no set_epoch, so a resume into epoch e > 0 replays epoch 0.
    def train_sampler(self, dataset: Any = None) -> EpochRepeatSampler:
        trl_sampler = self.trl_train_sampler(dataset)
        return EpochRepeatSampler(
            trl_sampler.data_source,
            mini_repeat_count=trl_sampler.mini_repeat_count,
            batch_size=trl_sampler.batch_size,
            repeat_count=trl_sampler.repeat_count,
            shuffle=trl_sampler.shuffle,
            seed=self.args.seed,
            epoch=lambda: int(self.state.epoch or 0),  # whole epochs done when the epoch's iteration starts
        )

    # Why: TRL logs optimizer steps (the paper counts rounds) and uploads every completion to W&B each round.
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["round"] = generation_round(self.state.global_step, self.args)
        with without_wandb_table(self.args, self.wandb_completions_rows):
            super().log(logs, start_time)
        step = self.state.global_step
        to_wandb = "wandb" in (self.args.report_to or [])
        uploads = self.log_completions and self.accelerator.is_main_process and to_wandb
        if uploads and step != getattr(self, "_table_step", None):  # the final log repeats the last step
            upload_sampled_table(self.args.output_dir, step, self.wandb_completions_rows, self.args.seed)
            self._table_step = step

    # Why: TRL gathers the per-function rewards of the round here but does not hand them back; and a
    # conversational dataset's reward functions expect messages, not the text we generated from. TRL calls
    # the reward functions here: it gets checked ones, so a fault is one line naming the function and the row.
    def compute_rewards(self, inputs, prompts, completions, completion_ids_list):
        replayed = self.dynamic_sampling.replayed_rewards() if self.dynamic_sampling is not None else None
        if replayed is None:
            completions = self._cut_for_rewards(completions, completion_ids_list)
            if self._conversational:
                prompts = [
                    self.prompt_collator.template_named(row["template"]).messages(row["question"])
                    for row in inputs
                ]
                completions = [[{"role": "assistant", "content": text}] for text in completions]
            with self._calling_checked_rewards():
                replayed = self.trl_compute_rewards(inputs, prompts, completions, completion_ids_list)
        self._round_rewards = replayed
        return self._round_rewards

    @contextmanager
    def _calling_checked_rewards(self):
        """TRL's reward loop calls the checked reward functions; `reward_funcs` is the given list after."""
        given = self.reward_funcs
        self.reward_funcs = self._checked_reward_funcs
        try:
            yield
        finally:
            self.reward_funcs = given

    def _cut_for_rewards(self, completions: list[Any], completion_ids_list: list[list[int]]) -> list[Any]:
        """Each completion's text up to the first of ``reward_cut_ids`` (decoded as TRL decodes: without
        special tokens); completions without one are unchanged."""
        if not self.reward_cut_ids:
            return completions
        out = []
        for completion, ids in zip(completions, completion_ids_list, strict=True):
            end = next((k for k, token in enumerate(ids) if token in self.reward_cut_ids), None)
            if end is not None:
                text = self.text_tokenizer.decode(list(ids[:end]), skip_special_tokens=True)
                if isinstance(completion, list):  # TRL's conversational form: the assistant message is last
                    completion = [*completion[:-1], {**completion[-1], "content": text}]
                else:
                    completion = text
            out.append(completion)
        return out

    # Why: with dynamic sampling, TRL scores a round built from groups already generated and scored; their
    # stored completions are replayed instead of generated again (and compute_rewards replays their rewards).
    def generate_round(self, prompts: list) -> Generation:
        replayed = (
            self.dynamic_sampling.replayed_generation(prompts) if self.dynamic_sampling is not None else None
        )
        return replayed if replayed is not None else self.trl_generate_round(prompts)

    def reward_column(self, *funcs: Any) -> int | None:
        """The column of the first of ``funcs`` among the trainer's reward functions, or ``None``."""
        for index, func in enumerate(self.reward_funcs):
            if any(func is f for f in funcs):
                return index
        return None

    def _log_template_metrics(self, inputs: list[dict[str, Any]], output: dict[str, Any], mode: str) -> None:
        device = self.accelerator.device
        mask, ids = output["completion_mask"], output["completion_ids"]
        lengths = mask.sum(dim=1)
        # Last generated token; a row whose mask TRL zeroed (mask_truncated_completions) was truncated.
        last = ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ended = torch.isin(last, torch.tensor(self.eos_token_ids, device=device)) & (lengths > 0)
        lengths = torch.where(lengths > 0, lengths, torch.full_like(lengths, self.max_completion_length))
        lengths = self.accelerator.gather(lengths.float()).cpu()
        truncated = self.accelerator.gather((~ended).float()).cpu()
        names = gather_object([row["template"] for row in inputs])
        rewards = self._round_rewards.cpu() if self._round_rewards is not None else None
        self.append_template_metrics(names, rewards, lengths, truncated, mode)
        # Collapse watch: completions that end in an n-gram loop, overall and per template.
        looping = self.accelerator.gather(loop_flags(ids, mask.sum(dim=1))).cpu()
        metrics = self.metric_buffer(mode)
        metrics["completions/repetition_ratio"].append(looping.mean().item())
        for name, rows in template_rows(names).items():
            metrics[f"templates/{name}/repetition"].append(looping[rows].mean().item())

    def append_template_metrics(
        self,
        names: list[str],
        rewards: torch.Tensor | None,
        lengths: torch.Tensor,
        truncated: torch.Tensor,
        mode: str,
        kept: torch.Tensor | None = None,
    ) -> None:
        """Per-template metrics of gathered rows (`prompt_aug.metrics`); ``kept`` (bool per row) adds
        ``templates/<name>/kept``."""
        columns = {
            "accuracy": self.reward_column(*CORRECTNESS_REWARDS),
            "format": self.reward_column(format_reward),
            **{name: column for column, name in enumerate(self.reward_func_names)},
        }
        buffer = self.metric_buffer(mode)
        for key, value in per_template_metrics(names, rewards, columns, lengths, truncated, kept).items():
            buffer[key].append(value)

    # Why: TRL computes per-token entropies only in the loss forward pass and logs one mean; keep that call's
    # outputs (it is the only call with compute_entropy=True) for the per-template entropy and the ratio.
    # Why (padding-free passes): TRL runs a micro-batch, and the old-log-prob and reference passes over the
    # round, at the full width of the batch it is given; `PaddingFreePasses` runs the same calls packed or
    # trimmed. Inputs it cannot carry (images, token type ids) and a MoE aux loss keep TRL's call.
    def token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **kwargs: Any,
    ):  # fmt: skip
        if not compute_aux_loss and all(v is None for v in kwargs.values()):
            logps, entropies = self.padding_free.forward(
                self.trl_token_logps_and_entropies, model, input_ids, attention_mask, logits_to_keep,
                batch_size, compute_entropy,
            )  # fmt: skip
            aux_loss = None
        else:
            logps, entropies, aux_loss = self.trl_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                compute_aux_loss, **kwargs,
            )  # fmt: skip
        if entropies is not None:
            self._loss_forward = (logps.detach(), entropies.detach())
        return logps, entropies, aux_loss

    # Why: the per-template entropy and each mini-batch's importance ratio need the loss forward's tensors.
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._loss_forward is None:
            return loss
        logps, entropies = self._loss_forward
        self._loss_forward = None
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:  # as TRL: tool-output tokens are not the policy's
            mask = mask * inputs["tool_mask"]
        mode = "train" if self.model.training else "eval"
        if "template_index" in inputs:
            # Summed over the optimizer step's micro-batches (token-weighted), so the value does not depend on
            # how its rows were grouped into micro-batches (the trim path regroups them).
            sums = grouped_token_sums(entropies, mask, inputs["template_index"], len(self._template_index))
            self._entropy_window = sums if self._entropy_window is None else self._entropy_window + sums
            if mode == "eval" or self.accelerator.sync_gradients:
                sums = self.accelerator.reduce(self._entropy_window, reduction="sum").cpu()
                self._entropy_window = None
                for name, i in self._template_index.items():
                    if sums[1, i] > 0:
                        entropy = (sums[0, i] / sums[1, i]).item()
                        self.metric_buffer(mode)[f"templates/{name}/entropy"].append(entropy)
        if mode == "train" and self.skip_minibatch_ratio_above is not None:
            old = inputs.get("old_per_token_logps")
            window = ratio_deviation_sums(logps, logps if old is None else old, mask)
            self._ratio_window = window if self._ratio_window is None else self._ratio_window + window
        return loss

    # Why: RLinf discards a mini-batch whose importance ratio explodes. Its gradient is complete once the last
    # micro-batch's backward has run (here, where DDP also all-reduces it) and the Trainer steps the optimizer
    # right after: dropping the gradients here makes torch's optimizers skip every parameter (no update, no
    # weight decay, no moment change), the scheduler and the round go on. DeepSpeed steps inside backward,
    # so it is refused in __init__.
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.skip_minibatch_ratio_above is None or not self.accelerator.sync_gradients:
            return loss
        window = self._ratio_window if self._ratio_window is not None else torch.zeros(2, device=loss.device)
        self._ratio_window = None
        total, count = self.accelerator.reduce(window.to(loss.device), reduction="sum").tolist()
        ratio = total / count if count else 1.0
        if self._skipped_minibatches is None:  # carry the count over a resume
            logged = [
                e["stability/skipped_minibatches"]
                for e in self.state.log_history
                if "stability/skipped_minibatches" in e
            ]
            self._skipped_minibatches = int(logged[-1]) if logged else 0
        if ratio >= self.skip_minibatch_ratio_above:
            model.zero_grad(set_to_none=True)
            self._skipped_minibatches += 1
        self.metric_buffer("train")["stability/minibatch_ratio"].append(ratio)
        self.metric_buffer("train")["stability/skipped_minibatches"] = [float(self._skipped_minibatches)]
        return loss

    # Why: TRL writes its card (base model, W&B link, framework versions, citations) at every checkpoint and
    # inside `push_to_hub`; ours adds the recipe, the template bank, the metrics and the evaluation table.
    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
    ) -> None:
        info = self.model_card_info
        if info is None:
            return super().create_model_card(model_name, dataset_name, tags)
        extra = [tags] if isinstance(tags, str) else list(tags or [])
        super().create_model_card(model_name, dataset_name or info.dataset, [*info.tags, *extra])
        if not self.is_world_process_zero():
            return None
        path = Path(self.args.output_dir) / "README.md"
        hub_model_id = getattr(self, "hub_model_id", None) or self.args.hub_model_id  # full id once pushed
        ours = render_model_card(
            info, self.args.output_dir, self.state.global_step, self.state.log_history, hub_model_id
        )
        path.write_text(extend_trl_card(path.read_text(), ours, info.base_model))
        return None

    @property
    def preempted(self) -> str | None:
        """The signal (``"SIGTERM"``, ``"SIGUSR1"``) that stopped the last ``train()`` call, or None."""
        return self.preemption.stopped_by if self.preemption is not None else None

    # Why: a preemption signal is caught only while training (the handlers are restored after), and a write
    # that fails for want of disk space, in a checkpoint save or elsewhere, is one line naming output_dir
    # instead of a stack trace from deep inside the save.
    def train(self, *args: Any, **kwargs: Any) -> Any:
        catching = self.preemption.catching_signals() if self.preemption is not None else nullcontext()
        with catching, disk_full_is_one_line(self.args.output_dir):
            return super().train(*args, **kwargs)

    # Why: transformers creates the Hub repository while the trainer is built, so a Hub that could not be
    # reached then (offline, the network) stopped the run before it trained. Now the run trains without
    # pushing checkpoints and pushes at the end; a refused request (a token, an id) still fails at once, in
    # one line.
    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        repo_id = self._hub_repo_id()
        try:
            super().init_hf_repo(token, private)
        except Exception as err:
            if self._final_push:  # push_to_hub's error says that the model is on disk and how to push it
                raise
            if not hub_unreachable(err):
                raise HubPushError(
                    f"push_to_hub: cannot create the Hub repository {repo_id} ({one_line(err, 200)}); check "
                    "hub_model_id and your token (hf auth login), or set push_to_hub false"
                ) from err
            self.hub_error = one_line(err, 200)
            self.args.hub_strategy = HubStrategy.END  # no checkpoint pushes: no repository to push to
            logger.warning(
                "push_to_hub: cannot reach the Hub to create %s (%s); training goes on without pushing "
                "checkpoints, and the model is pushed at the end", repo_id, self.hub_error,
            )  # fmt: skip

    # Why: a failed upload at the end of a run is one line saying that the model and card are on disk and how
    # to push them later, not a network stack trace.
    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        self._final_push = True
        try:
            return super().push_to_hub(*args, **kwargs)
        except Exception as err:
            raise hub_push_failed(self.args, self._hub_repo_id(), err) from err
        finally:
            self._final_push = False

    def _hub_repo_id(self) -> str:
        """The repository pushed to: the one created, else the one asked for (as transformers names it)."""
        return self.hub_model_id or self.args.hub_model_id or Path(self.args.output_dir).absolute().name
