"""`PromptAugGRPOTrainer`: TRL's `GRPOTrainer` with prompt augmentation and per-template metrics.

Thin overrides, each for one reason:

* ``_generate_and_score_completions``: TRL 1.16 hard-codes an identity data collator, so a
  generation round is augmented where it starts. The rows arrive already repeated
  ``num_generations`` times by TRL's `RepeatSampler`; our collator draws from (seed, epoch, uid), so
  every rollout of a group gets the same template on every rank. After TRL scores the round, the
  per-template metrics are added to TRL's own.
* ``_prepare_inputs``: TRL does not restore its micro-step counter on resume, so a run resumed from a
  mid-round checkpoint would replay the interrupted round; the counter is set from ``global_step``.
* ``_calculate_rewards``: keeps the round's gathered reward matrix, which TRL does not return,
  so the per-template metrics are read off the same numbers TRL trains on (no regrading).
* ``create_model_card``: TRL writes its own card at every checkpoint and at push time, which would
  overwrite ours; ours carries the recipe, the template bank and the evaluation table.
* ``_get_per_token_logps_and_entropies`` and ``compute_loss`` (collapse watch, issue 13): keep the loss
  forward pass's per-token entropies and log-probabilities, for ``templates/<name>/entropy`` and for the
  importance ratio of each mini-batch.
* ``training_step`` (RLinf's stabiliser): drops the gradient of a mini-batch whose importance ratio is too
  large before the optimizer steps (``skip_minibatch_ratio_above``), counted in
  ``stability/skipped_minibatches``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from rewards.registry import correctness_reward, format_reward, strict_correctness_reward

from .collapse import grouped_token_sums, loop_flags, ratio_deviation_sums
from .collator import PromptAugmentationCollator
from .model_card import ModelCardInfo, render_model_card


class PromptAugGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose rows (``question``, ``answer``, ``uid``) are rewritten under a drawn template.

    Args:
        prompt_collator: Draws the template of each row and renders its prompt.
        model_card: What our model card says; without it, TRL's card is written.
        skip_minibatch_ratio_above: RLinf's stabiliser: skip the optimizer update of a mini-batch whose mean
            max(r, 1/r) over its completion tokens (r = pi / pi_old) is at least this (``None``: never).
        *args, **kwargs: Passed to `trl.GRPOTrainer` unchanged.

    Logs, beside TRL's ``entropy``, ``reward`` and ``completions/*``: ``templates/<name>/accuracy``,
    ``/format``, ``/mean_length``, ``/truncated_ratio``, ``/count``, ``/entropy`` and ``/repetition`` per
    template, and ``completions/repetition_ratio`` (completions ending in an n-gram loop). With
    ``log_completions``, the completion records carry ``template``, ``uid`` and the ``process`` that
    generated each completion.
    """

    def __init__(
        self,
        *args: Any,
        prompt_collator: PromptAugmentationCollator,
        model_card: ModelCardInfo | None = None,
        skip_minibatch_ratio_above: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_collator = prompt_collator
        self.model_card_info = model_card
        self._round_rewards: torch.Tensor | None = None
        # Collapse watch and RLinf's mini-batch skip (issue 13).
        if skip_minibatch_ratio_above is not None and self.is_deepspeed_enabled:
            raise ValueError("skip_minibatch_ratio_above is not supported under DeepSpeed (its optimizer steps "
                             "inside backward, before a mini-batch can be judged); use DDP or FSDP, or unset it")
        self.skip_minibatch_ratio_above = skip_minibatch_ratio_above
        names = [t.name for t in prompt_collator.templates] + [prompt_collator.eval_template.name]
        self._template_index = {name: i for i, name in enumerate(dict.fromkeys(names))}
        self._loss_forward: tuple[torch.Tensor, torch.Tensor] | None = None
        self._ratio_window: torch.Tensor | None = None
        self._skipped_minibatches: int | None = None

    # Why: the seam where a generation round starts (TRL has no collator hook for GRPO).
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        training = self.model.training
        epoch = int(self.state.epoch or 0)  # whole epochs done: a new epoch redraws, a resume redraws the same
        inputs = self.prompt_collator(inputs, epoch=epoch, training=training)
        self._log_completion_extra("template", [row["template"] for row in inputs])
        self._log_completion_extra("uid", [row["uid"] for row in inputs])
        self._log_completion_extra("process", [self.accelerator.process_index] * len(inputs))
        output = super()._generate_and_score_completions(inputs)
        self._log_template_metrics(inputs, output, "train" if training else "eval")
        # Travels with each row through TRL's shuffle and split, for the per-template entropy in compute_loss.
        index = [self._template_index.get(row["template"], -1) for row in inputs]
        output["template_index"] = torch.tensor(index, device=self.accelerator.device)
        return output

    # Why: TRL does not restore its micro-step counter `_step` on resume. From a checkpoint saved in the
    # middle of a generation round (save_steps not a multiple of the optimizer steps per round), it
    # restarted at 0 and replayed the interrupted round in full, shifting every later round by the
    # steps already taken. The Trainer skips global_step x accumulation batches, so restore the counter
    # to match before the first round after the resume is generated.
    def _prepare_inputs(self, generation_batch: Any) -> Any:
        if self.model.training and self._buffered_inputs is None:
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
        return super()._prepare_inputs(generation_batch)

    # Why: TRL gathers the per-function rewards of the round here but does not hand them back.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._round_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._round_rewards

    def _reward_column(self, *funcs: Any) -> int | None:
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
        columns = {
            "accuracy": self._reward_column(correctness_reward, strict_correctness_reward),
            "format": self._reward_column(format_reward),
        }
        by_template: dict[str, list[int]] = defaultdict(list)
        for index, name in enumerate(names):
            by_template[name].append(index)
        metrics = self._metrics[mode]
        for name, rows in sorted(by_template.items()):
            rows_t = torch.tensor(rows)
            prefix = f"templates/{name}"
            for metric, column in columns.items():
                if column is not None and rewards is not None:
                    metrics[f"{prefix}/{metric}"].append(torch.nanmean(rewards[rows_t, column]).item())
            metrics[f"{prefix}/mean_length"].append(lengths[rows_t].mean().item())
            metrics[f"{prefix}/truncated_ratio"].append(truncated[rows_t].mean().item())
            metrics[f"{prefix}/count"].append(float(len(rows)))

        # Collapse watch (issue 13): completions that end in an n-gram loop, overall and per template.
        looping = self.accelerator.gather(loop_flags(ids, mask.sum(dim=1))).cpu()
        metrics["completions/repetition_ratio"].append(looping.mean().item())
        for name, rows in by_template.items():
            metrics[f"templates/{name}/repetition"].append(looping[torch.tensor(rows)].mean().item())

    # Why: TRL computes per-token entropies only in the loss forward pass and logs one mean; keep that call's
    # outputs (it is the only call with compute_entropy=True) for the per-template entropy and the ratio.
    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any):
        logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(*args, **kwargs)
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
            sums = grouped_token_sums(entropies, mask, inputs["template_index"], len(self._template_index))
            sums = self.accelerator.reduce(sums, reduction="sum").cpu()
            for name, i in self._template_index.items():
                if sums[1, i] > 0:
                    self._metrics[mode][f"templates/{name}/entropy"].append((sums[0, i] / sums[1, i]).item())
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
            logged = [e["stability/skipped_minibatches"] for e in self.state.log_history
                      if "stability/skipped_minibatches" in e]
            self._skipped_minibatches = int(logged[-1]) if logged else 0
        if ratio >= self.skip_minibatch_ratio_above:
            model.zero_grad(set_to_none=True)
            self._skipped_minibatches += 1
        self._metrics["train"]["stability/minibatch_ratio"].append(ratio)
        self._metrics["train"]["stability/skipped_minibatches"] = [float(self._skipped_minibatches)]
        return loss

    # Why: TRL's card would replace ours at each checkpoint and inside `push_to_hub`.
    def create_model_card(self, model_name: str | None = None, *args: Any, **kwargs: Any) -> None:
        if self.model_card_info is None:
            return super().create_model_card(model_name, *args, **kwargs)
        if not self.is_world_process_zero():
            return None
        card = render_model_card(
            self.model_card_info, self.args.output_dir, self.state.global_step, self.state.log_history,
            self.args.hub_model_id,
        )
        Path(self.args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.args.output_dir) / "README.md").write_text(card)
        return None
