"""`PromptAugGRPOTrainer`: TRL's `GRPOTrainer` with prompt augmentation and per-template metrics.

Four thin overrides, each for one reason:

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
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from rewards.registry import correctness_reward, format_reward, strict_correctness_reward

from .collator import PromptAugmentationCollator
from .model_card import ModelCardInfo, render_model_card


class PromptAugGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose rows (``question``, ``answer``, ``uid``) are rewritten under a drawn template.

    Args:
        prompt_collator: Draws the template of each row and renders its prompt.
        model_card: What our model card says; without it, TRL's card is written.
        *args, **kwargs: Passed to `trl.GRPOTrainer` unchanged.

    Logs, beside TRL's ``entropy``, ``reward`` and ``completions/*``: ``templates/<name>/accuracy``,
    ``/format``, ``/mean_length``, ``/truncated_ratio`` and ``/count`` per template, and
    ``templates/<name>/<reward function name>`` for every reward function (named as in TRL's
    ``rewards/<reward function name>/mean``, e.g. ``correctness_reward``). With
    ``log_completions``, the completion records carry ``template``, ``uid`` and the ``process`` that
    generated each completion.
    """

    def __init__(
        self,
        *args: Any,
        prompt_collator: PromptAugmentationCollator,
        model_card: ModelCardInfo | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.prompt_collator = prompt_collator
        self.model_card_info = model_card
        self._round_rewards: torch.Tensor | None = None

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
            for column, reward_name in enumerate(self.reward_func_names if rewards is not None else []):
                metrics[f"{prefix}/{reward_name}"].append(torch.nanmean(rewards[rows_t, column]).item())
            metrics[f"{prefix}/mean_length"].append(lengths[rows_t].mean().item())
            metrics[f"{prefix}/truncated_ratio"].append(truncated[rows_t].mean().item())
            metrics[f"{prefix}/count"].append(float(len(rows)))

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
