"""`PromptAugGRPOTrainer`: TRL's `GRPOTrainer` with prompt augmentation, per-template metrics and the
package's training features, all set up from its config; a drop-in for `GRPOTrainer`.

Each job has its own object, beside the code it serves; this file wires them. Every TRL override is TRL's
call plus one line per feature: `prompt_aug.padding.PaddingFreePasses` (the passes), `prompt_aug.metrics.
TemplateMetrics`, `prompt_aug.extensions.Features` (evaluation, the guard, the stabilisers, dynamic sampling,
preemption), `prompt_aug.faults.HubAndPreemption` and `prompt_aug.model_card.ModelCardMixin`. It overrides TRL
only through `prompt_aug.trl_seam.TRLSeam`'s public hooks; each override says why, in a ``# Why:`` comment
above it, and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from functools import partial
from typing import Any

import torch
from trl.data_utils import is_conversational

from .collator import PromptAugmentationCollator, augmentation_refusal, cut_completions
from .config import trainer_settings
from .evaluation.backends import stop_token_ids
from .evaluation.callback import EvalCallback
from .extensions import Features, build_features
from .extensions.stabilisers import ReferenceCheckpoint
from .faults import HubAndPreemption, LaunchRecord
from .metrics import TemplateMetrics
from .model_card import ModelCardInfo, ModelCardMixin
from .padding import PaddingFreePasses
from .records import (
    free_path,
    generation_round,
    micro_steps_done,
    micro_steps_per_epoch,
    micro_steps_per_round,
    print_records,
    records_file,
    rounds_generated,
    upload_records,
    without_wandb_table,
    write_records,
)
from .reward_checks import checked_reward_funcs
from .sampler import EpochRepeatSampler
from .sources import auto_class_name, has_vision_tower
from .templates import STOP_TOKENS, TemplateError, check_renders, templates_for
from .trl_seam import Generation, TRLSeam, completion_logs, separate_completion_logs

logger = logging.getLogger("prompt_aug")


def _warn_missing_tokens(key: str, tokens: list[str], vocab: dict[str, int]) -> None:
    """One warning naming ``key`` for the tokens of a value the recipe set that are not one token of the
    vocabulary (a misspelt special token, a tag such as ``</answer>`` that splits into several): they are
    skipped. The default, ChatML's two, is skipped quietly where a model lacks them."""
    missing = [t for t in tokens if t not in vocab]
    if missing and tuple(tokens) != STOP_TOKENS:
        verb = "is" if len(missing) == 1 else "are"
        logger.warning(
            "%s: %s %s not one token of this tokenizer's vocabulary and %s skipped; give tokens the "
            "vocabulary has (tokenizer.get_vocab())", key, missing, verb, verb,
        )  # fmt: skip


def _search_unused_parameters(
    model: Any = None, reward_funcs: Any = None, args: Any = None, *_: Any, **__: Any
) -> None:
    """Turn DDP's search for unused parameters on (``ddp_find_unused_parameters``, where the caller left it
    unset) for a vision-language ``model`` asked text alone: its vision tower gets no gradient, which DDP
    refuses in the second step without the search. TRL turns it on for a processor as the processing class
    only (the tokenizer is ours), and, as TRL, not under reentrant gradient checkpointing, which fails with
    it."""
    if args is None or args.ddp_find_unused_parameters is not None or args.world_size < 2:
        return
    if (args.gradient_checkpointing_kwargs or {}).get("use_reentrant"):
        return
    revision = (args.model_init_kwargs or {}).get("revision")  # a name is read as TRL will load it
    if has_vision_tower(model, revision=revision, trust_remote_code=args.trust_remote_code):
        args.ddp_find_unused_parameters = True


class PromptAugGRPOTrainer(HubAndPreemption, ModelCardMixin, TRLSeam):
    """`GRPOTrainer` whose prompts are rewritten under a template drawn per question and generation round.

    Constructed like `GRPOTrainer` (``model, reward_funcs, args, train_dataset, eval_dataset,
    processing_class, ...`` are passed to it unchanged, and its errors are its own). A row gives its
    question through a ``question`` column, else through TRL's ``prompt`` column (text, or messages:
    the last user turn); its id through ``uid``, else one derived from the question. TRL's ``tools``,
    ``environment_factory`` and a ``rollout_func`` on conversational data run on a prompt's messages, and
    so do images (`prompt_aug.collator.image_column`), so they need ``prompt_augmentation=False`` (refused
    at construction otherwise).

    Its settings come from ``args``: a `PromptAugGRPOConfig`, or a plain `GRPOConfig`, which means our keys'
    defaults where TRL has no equivalent (augmentation on, the built-in bank, padding-free passes) and TRL's
    behaviour elsewhere (no stop tokens beyond the model's, no reward cut, no guard, no evaluation).

    Args:
        features: The training features (`prompt_aug.extensions.build_features`); default: those ``args``
            turns on. ``prompt-aug-train`` builds them before the model loads, so that a bad evaluation set
            fails early.
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

    Logs, beside TRL's keys, the metrics of `prompt_aug.metrics.TemplateMetrics` (with augmentation off, its
    ``completions/accuracy`` and ``completions/repetition_ratio`` alone) and ``round`` in every entry. With
    ``log_completions``, the completion records carry ``template``, ``uid``, ``process`` and ``round`` (the
    logged prompt is the rendered text); with dynamic sampling, see
    `prompt_aug.extensions.dynamic_sampling` for its records and ``dynamic_sampling/*``.

    ``wandb_completions_rows`` (from ``args``) bounds the W&B completions table: ``None`` uploads every row
    (TRL), 0 none, N a sample of N rows per log step; the parquet records keep every row.
    """

    # Set in __init__. A trainer built without it (TRL's own tests build one with ``object.__new__`` and call
    # a single step) generates and scores as TRL does.
    features = Features()
    prompt_collator: PromptAugmentationCollator | None = None
    _pushing_saved_model = False  # inside push_saved_model: output_dir holds the model already
    _evaluation_prefix: str | None = None  # inside evaluate: its metric prefix (``eval``, ``eval_<name>``)
    # With sync_ref_model: the synced reference, saved in each checkpoint and restored at a resume.
    reference_checkpoint: ReferenceCheckpoint | None = None

    def __init__(
        self,
        *args: Any,
        features: Features | None = None,
        prompt_collator: PromptAugmentationCollator | None = None,
        model_card: ModelCardInfo | None = None,
        **kwargs: Any,
    ) -> None:
        _search_unused_parameters(*args, **kwargs)  # before the Trainer reads DDP's settings in __init__
        super().__init__(*args, **kwargs)
        self.config = config = trainer_settings(self.args)  # our keys; TRL's behaviour for a plain GRPOConfig
        self.wandb_completions_rows = config.wandb_completions_rows
        if prompt_collator is not None and not config.prompt_augmentation:
            raise ValueError(
                "PromptAugGRPOTrainer: a prompt_collator was given with prompt_augmentation=False"
            )
        if config.prompt_augmentation:
            refusal = augmentation_refusal(
                self.train_dataset, self.eval_dataset, tools=self.tools, rollout_func=self.rollout_func,
                environment_factories=self.environment_factories,
            )  # fmt: skip
            if refusal is not None:  # TRL would fail in the first round, or lose the images
                raise ValueError(f"PromptAugGRPOTrainer: {refusal}")
        if config.prompt_augmentation and prompt_collator is None:
            prompt_collator = self._default_collator()
        self.prompt_collator = prompt_collator
        if model_card is not None:  # the card's "How to prompt" loads the model in its own class
            model = self.accelerator.unwrap_model(self.model)
            model_card.model_class = auto_class_name(getattr(model, "get_base_model", lambda: model)())
        self.model_card_info = model_card
        bank = [*prompt_collator.templates, prompt_collator.eval_template] if prompt_collator else []
        self.template_metrics = TemplateMetrics([t.name for t in bank])
        # The reward functions as TRL calls them, each fault one line naming the function and the row; the
        # text they grade ends at the first reward-cut token.
        self._checked_reward_funcs = checked_reward_funcs(self.reward_funcs, self.reward_func_names)
        vocab = self.text_tokenizer.get_vocab()
        for key in ("stop_tokens", "reward_cut_tokens"):
            _warn_missing_tokens(key, getattr(config, key), vocab)
        self.reward_cut_ids = {vocab[t] for t in config.reward_cut_tokens if t in vocab}
        self._round_rewards: torch.Tensor | None = None  # this round's reward matrix (compute_rewards)
        self._conversational = False  # this round's dataset is conversational (compute_rewards)
        # The loss pass's log-probs and entropies, from token_logps_and_entropies to compute_loss.
        self._loss_forward: tuple[torch.Tensor, torch.Tensor] | None = None
        self._table_step: int | None = None  # the step whose W&B completions table was last uploaded
        if config.stop_tokens:
            self._apply_stop_tokens(config.stop_tokens)
        self.padding_free = PaddingFreePasses(
            config.trim_padding, config.packing_max_tokens, config.packing_pad_to_multiple_of,
            autocast=self.accelerator.autocast, processes=self.accelerator.num_processes,
            device=self.accelerator.device, share_prompts=config.packing_share_prompts,
        )  # fmt: skip
        self.padding_free.choose(self.model)
        # An evaluator among the caller's `callbacks` is the run's, not one built from the eval_* keys.
        given = next((c for c in self.callback_handler.callbacks if isinstance(c, EvalCallback)), None)
        if features is None:
            features = build_features(config, self.reward_funcs, self.reward_func_names, given)
        self.features = features
        self.preemption = features.preemption  # saving on preemption (`HubAndPreemption`)
        # Each checkpoint records its process count, which a resume checks; first, so that it has written it
        # before any other callback's on_save moves the checkpoint (the collapse guard's).
        self.callback_handler.callbacks.insert(0, LaunchRecord())
        features.attach(self)
        # TRL's synced reference model is in no checkpoint of its own: each checkpoint holds it, and a resume
        # restores it.
        if self.ref_model is not None and self.args.sync_ref_model:
            self.reference_checkpoint = ReferenceCheckpoint(self).attach()

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

    # Why: a PEFT model saves its adapter alone, so the generation config (with the recipe's stop_tokens)
    # would be lost: `prompt-aug-eval` of the folder, or of a checkpoint, would stop elsewhere than training.
    # Why (`push_saved_model`): transformers' push_to_hub saves the model into output_dir again before it
    # uploads, rewriting the weights in place; that save is skipped when the folder holds them already.
    # Why (`reference_checkpoint`): a checkpoint's model is saved here, before its trainer state (which marks
    # it complete) and its Hub push: the synced reference goes beside it then.
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if self._pushing_saved_model and output_dir is None:
            return
        super().save_model(output_dir, _internal_call)
        if self.reference_checkpoint is not None and _internal_call and output_dir is not None:
            self.reference_checkpoint.save(output_dir)
        model = self.accelerator.unwrap_model(self.model)
        if self.args.should_save and hasattr(model, "peft_config"):
            model.generation_config.save_pretrained(output_dir or self.args.output_dir)

    def push_saved_model(self, commit_message: str) -> Any:
        """`push_to_hub` (blocking) of ``output_dir`` as it is: the model saved there (`save_model_unpushed`)
        is not saved again, so a kill during the push cannot cut a finished model's weights short. The card
        is written again and the upload is transformers' (the same files, no checkpoints). Every rank calls
        it, as `push_to_hub`; only the main process uploads."""
        self._pushing_saved_model = True
        try:
            return self.push_to_hub(commit_message=commit_message)
        finally:
            self._pushing_saved_model = False

    def _default_collator(self) -> PromptAugmentationCollator:
        templates, weights, eval_template = templates_for(self.config)
        try:
            check_renders(templates, self.text_tokenizer, self.chat_template_kwargs)
        except TemplateError as err:
            raise TemplateError(
                f"{err}\nPromptAugGRPOTrainer renders the templates (templates_file's, else the built-in "
                "bank) through the processing class's chat template; "
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
    # round is handed to `prompt_aug.extensions.dynamic_sampling` instead. With augmentation off, TRL's round
    # is left as it is and only the round's share right and repetition are added (the collapse guard reads
    # them whatever the reward's scale).
    def score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        training = self.model.training
        mode = "train" if training else "eval"
        if self.prompt_collator is None:
            output = self.trl_score_round(inputs)
            self.template_metrics.log_round(self, inputs, output, self._round_rewards, mode)
            return output
        epoch = int(self.state.epoch or 0)  # whole epochs done: a new epoch redraws, a resume the same
        # The rendered text goes to generation; a conversational dataset's reward functions get messages back.
        # The prompt alone decides, as in TRL's own checks: other columns named `messages`, `chosen` or
        # `rejected` (which `is_conversational` of the whole row would read) are the user's data.
        self._conversational = "prompt" in inputs[0] and is_conversational({"prompt": inputs[0]["prompt"]})
        inputs = self.prompt_collator(inputs, epoch=epoch, training=training)
        try:
            if training and self.features.dynamic_sampling is not None:
                augment = partial(self.prompt_collator, epoch=epoch, training=True)
                return self.features.dynamic_sampling.run_round(self, inputs, augment, self._score_rows)
            for column in ("template", "uid"):
                self.log_completion_column(column, [row[column] for row in inputs])
            self.log_completion_column("process", [self.accelerator.process_index] * len(inputs))
            # An evaluation's records carry the round of its log entry: the last round trained.
            round_ = self.round_number() if training else self.log_round()
            self.log_completion_column("round", [round_] * len(inputs))
            if self.features.dynamic_sampling is not None:
                self.features.dynamic_sampling.log_blank_columns(self, len(inputs))
            output = self._score_rows(inputs)
        finally:
            self._conversational = False
        self.template_metrics.log_round(self, inputs, output, self._round_rewards, mode)
        return output

    def round_number(self) -> int:
        """The generation round being generated now, 1-based (the paper's step)."""
        return rounds_generated(self.micro_step, self.args) + 1

    def log_round(self) -> int:
        """The round every log entry carries: the rounds generated so far, counted from the optimizer steps
        taken (`prompt_aug.records.generation_round`)."""
        return generation_round(self.state.global_step, self.args, self.micro_steps_per_epoch)

    @property
    def micro_steps_per_epoch(self) -> int | None:
        """Micro-steps in an epoch of the training set (the length of TRL's training dataloader), or None for
        a dataset without a length. The Trainer restarts gradient accumulation at each epoch."""
        dataset = self.train_dataset
        return micro_steps_per_epoch(len(dataset) if isinstance(dataset, Sized) else None, self.args)

    def _score_rows(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of augmented ``rows``, plus each row's template index, which travels
        with the row through TRL's shuffle and split to the per-template entropy in `compute_loss`."""
        output = self.trl_score_round(rows)
        output["template_index"] = self.template_metrics.row_index(rows, self.accelerator.device)
        return output

    # Why: TRL does not restore its micro-step counter on resume. From a checkpoint saved in the middle of a
    # generation round (save_steps not a multiple of the optimizer steps per round), it restarted at 0 and
    # replayed the interrupted round in full, shifting every later round by the steps already taken. The
    # Trainer skips the batches of the steps taken (an epoch's short last step counted short), so restore
    # the counter to match before the first round after the resume is generated; with ignore_data_skip the
    # Trainer restarts the resumed epoch at its first batch, so the counter restarts at the epoch's start. The
    # padding-free passes then trim (and may regroup) the round.
    def prepare_micro_batch(self, generation_batch: Any) -> Any:
        training = self.model.training
        if training and self.buffered_micro_batches is None:
            ga, per_epoch = self.args.gradient_accumulation_steps, self.micro_steps_per_epoch
            done = micro_steps_done(self.state.global_step, ga, per_epoch)
            if self.args.ignore_data_skip:
                done = done // per_epoch * per_epoch if per_epoch else 0
            self.micro_step = done
        step = self.micro_step
        new_round = training and (
            self.buffered_micro_batches is None or step % micro_steps_per_round(self.args) == 0
        )
        inputs = self.trl_prepare_micro_batch(generation_batch)
        return self.padding_free.micro_batch(self, inputs, step, new_round)

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

    # Why: TRL keeps an evaluation's completion records in the training round's buffers and, at the
    # evaluation's log, writes them to the training step's file: an evaluation at a logged step replaced
    # that step's training records. An evaluation gets buffers of its own (every row it generates, with
    # log_completions; none without), written to ``completions/<prefix>_completions_<step>.parquet`` by
    # `log` (``eval``, or ``eval_<name>`` for each set of a dict of evaluation sets, as transformers prefixes
    # their metrics).
    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        outer, self._evaluation_prefix = self._evaluation_prefix, metric_key_prefix
        try:
            with separate_completion_logs(self, None if self.log_completions else 0):
                return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        finally:
            self._evaluation_prefix = outer

    # Why: TRL logs optimizer steps (the paper counts rounds) and uploads every completion to W&B each round;
    # an evaluation's records go to files of their own (`evaluate`).
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["round"] = self.log_round()
        step, rows = self.state.global_step, self.wandb_completions_rows
        to_wandb = "wandb" in (self.args.report_to or [])
        if self._evaluation_prefix is not None:
            records, self.log_completions = self.log_completions, False
            try:
                super().log(logs, start_time)
            finally:
                self.log_completions = records
            if records and self.accelerator.is_main_process:
                shown = self.num_completions_to_print  # TRL's None: a round's, as it prints in training
                print_records(
                    completion_logs(self), step, self.args.generation_batch_size if shown is None else shown
                )
                path = free_path(records_file(self.args.output_dir, step, self._evaluation_prefix))
                write_records(completion_logs(self), path, step)
                if to_wandb:
                    upload_records(
                        path, f"{self._evaluation_prefix}_completions", rows, self.args.seed + step
                    )
            return
        with without_wandb_table(self.args, rows):
            super().log(logs, start_time)
        uploads = self.log_completions and self.accelerator.is_main_process and to_wandb and rows is not None
        if uploads and step != self._table_step:  # the final log repeats the last step
            upload_records(
                records_file(self.args.output_dir, step), "completions", rows, self.args.seed + step
            )
            self._table_step = step

    # Why: TRL gathers the per-function rewards of the round here but does not hand them back; and a
    # conversational dataset's reward functions expect messages, not the text we generated from. TRL calls
    # the reward functions here: it gets checked ones, so a fault is one line naming the function and the row.
    def compute_rewards(self, inputs, prompts, completions, completion_ids_list):
        sampler = self.features.dynamic_sampling
        replayed = sampler.replayed_rewards() if sampler is not None else None
        if replayed is None:
            completions = cut_completions(
                completions, completion_ids_list, self.reward_cut_ids, self.text_tokenizer
            )
            if self._conversational:
                prompts, completions = self.prompt_collator.conversational_reward_inputs(inputs, completions)
            given, self.reward_funcs = self.reward_funcs, self._checked_reward_funcs
            try:
                replayed = self.trl_compute_rewards(inputs, prompts, completions, completion_ids_list)
            finally:
                self.reward_funcs = given
        self._round_rewards = replayed
        return replayed

    # Why: with dynamic sampling, TRL scores a round built from groups already generated and scored; their
    # stored completions are replayed instead of generated again (and compute_rewards replays their rewards).
    def generate_round(self, prompts: list) -> Generation:
        sampler = self.features.dynamic_sampling
        replayed = sampler.replayed_generation(prompts) if sampler is not None else None
        return replayed if replayed is not None else self.trl_generate_round(prompts)

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
        (logps, entropies), self._loss_forward = self._loss_forward, None
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:  # as TRL: tool-output tokens are not the policy's
            mask = mask * inputs["tool_mask"]
        self.template_metrics.add_entropy(self, entropies, mask, inputs)
        if self.model.training and self.features.minibatch_skip is not None:
            self.features.minibatch_skip.add(logps, inputs, mask)
        return loss

    # Why: RLinf discards a mini-batch whose importance ratio explodes; its gradient is complete here, after
    # the last micro-batch's backward, and the Trainer steps the optimizer right after (`MinibatchSkip`).
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self.features.minibatch_skip is not None:
            self.features.minibatch_skip.after_backward(self, model, loss.device)
        return loss
