"""Optional training behaviour beside prompt augmentation, each off unless a recipe key turns it on, and the
one place that builds it from a config (`build_features`).

* `collapse`: the collapse guard (watches entropy, accuracy, truncation, repetition and evaluation; logs,
  checkpoints or stops).
* `stabilisers`: ProRL's optimizer reset at each reference sync and RLinf's mini-batch skip.
* `dynamic_sampling`: DAPO's dynamic sampling (train each round only on groups whose rewards differ).
* evaluation during training (`prompt_aug.evaluation.callback`) and saving on preemption
  (`prompt_aug.faults`) are built here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..evaluation.callback import EvalCallback, evaluator_from_args
from ..faults import PreemptionCallback
from ..records import optimizer_steps_per_round
from .collapse import CollapseGuard, guard_from_args
from .dynamic_sampling import DynamicSampler, from_args
from .stabilisers import MinibatchSkip, OptimizerResetCallback


@dataclass
class Features:
    """The training features a config turns on, each ``None`` when off."""

    evaluator: EvalCallback | None = None
    guard: CollapseGuard | None = None
    optimizer_reset: OptimizerResetCallback | None = None
    preemption: PreemptionCallback | None = None
    dynamic_sampling: DynamicSampler | None = None
    minibatch_skip: MinibatchSkip | None = None

    def attach(self, trainer: Any) -> None:
        """Check each feature against the built trainer and add the callbacks: preemption first (a stop is
        decided before a due evaluation runs), then evaluation (W&B sees ``eval/*``), the guard (it watches
        ``eval/macro``) and the optimizer reset."""
        if self.dynamic_sampling is not None:
            if getattr(trainer, "prompt_collator", None) is None:
                raise ValueError(
                    "dynamic_sampling needs prompt augmentation; set prompt_augmentation to true or drop "
                    "dynamic_sampling"
                )
            self.dynamic_sampling.check(trainer)
        if self.minibatch_skip is not None:
            self.minibatch_skip.check(trainer)
        if self.evaluator is not None:
            if self.evaluator in trainer.callback_handler.callbacks:
                trainer.callback_handler.remove_callback(self.evaluator)
            self.evaluator.attach(trainer)
        if self.guard is not None:
            self.guard.attach(trainer)
        if self.optimizer_reset is not None:
            trainer.add_callback(self.optimizer_reset)
        if self.preemption is not None:
            self.preemption.attach(trainer)


def build_features(
    config: Any, reward_funcs: list[Any], reward_func_names: list[str], evaluator: EvalCallback | None = None
) -> Features:
    """Every feature ``config`` (a `PromptAugGRPOConfig`, or `prompt_aug.config.trainer_settings` of a plain
    `GRPOConfig`) turns on, over these reward functions. Fails now, in one line naming the key, on what the
    config's own checks cannot see: an evaluation set that does not load (`EvalError`), a dynamic-sampling
    signal that is no reward function's name, a collapse threshold that can never fire (`ValueError`).

    ``evaluator`` (one built earlier) is used in place of the one the ``eval_*`` keys would build.
    """
    threshold = config.skip_minibatch_ratio_above
    return Features(
        evaluator=evaluator if evaluator is not None else evaluator_from_args(config),
        guard=guard_from_args(config, optimizer_steps_per_round(config), reward_funcs),
        optimizer_reset=OptimizerResetCallback() if config.reset_optimizer_on_ref_sync else None,
        preemption=PreemptionCallback() if config.save_on_preemption else None,
        dynamic_sampling=from_args(config, reward_funcs, reward_func_names),
        minibatch_skip=MinibatchSkip(threshold) if threshold is not None else None,
    )


def check_features(config: Any, reward_funcs: list[Any], reward_func_names: list[str]) -> None:
    """The checks of `build_features` that read no data, for a recipe's check at parse time (the dry run's
    too): the collapse guard's keys and thresholds and the dynamic-sampling signal (`ValueError`, one line
    naming the key)."""
    guard_from_args(config, optimizer_steps_per_round(config), reward_funcs)
    from_args(config, reward_funcs, reward_func_names)
