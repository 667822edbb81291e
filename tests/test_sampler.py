"""The per-epoch sampler: TRL's order in epoch 0, then a fresh shuffle per epoch from (seed, epoch) alone; and
the rounds a run plans over its epochs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from trl.trainer.utils import RepeatSampler

from prompt_aug.batches import batch_arithmetic
from prompt_aug.sampler import EpochRepeatSampler, epoch_seed

SHAPE = {"mini_repeat_count": 4, "batch_size": 3, "repeat_count": 2}


def _sampler(epoch: list[int], seed: int = 42, shuffle: bool = True) -> EpochRepeatSampler:
    return EpochRepeatSampler(range(10), **SHAPE, shuffle=shuffle, seed=seed, epoch=lambda: epoch[0])


def test_epoch_0_is_trls_order():
    assert list(_sampler([0])) == list(RepeatSampler(range(10), **SHAPE, seed=42))


def test_each_epoch_is_its_own_shuffle_and_depends_only_on_seed_and_epoch():
    epoch = [0]
    sampler = _sampler(epoch)
    orders = []
    for e in (0, 1, 2):
        epoch[0] = e
        orders.append(list(sampler))
    assert len({tuple(o) for o in orders}) == 3
    # A sampler built afresh (a resumed run) in epoch 2 yields epoch 2's order, not epoch 0's.
    assert list(_sampler([2])) == orders[2]
    # Every round is num_generations copies of each of its questions, repeated repeat_count times.
    round_ = orders[1][: 3 * 4]
    assert orders[1][12:24] == round_ and all(round_[i : i + 4] == [round_[i]] * 4 for i in range(0, 12, 4))
    assert len(orders[1]) == len(sampler) == (10 // 3) * 3 * 4 * 2


def test_iteration_reads_the_epoch_when_it_starts_and_shuffle_false_keeps_order():
    epoch = [1]
    sampler = _sampler(epoch)
    assert sampler.permutation(1)[:3] == list(sampler)[0:12:4]
    assert _sampler([3], shuffle=False).permutation(3) == list(range(10))


def test_asking_an_epochs_order_leaves_an_iteration_begun_before_it_as_it_was():
    # TRL's __iter__ draws its permutation on the first next(), after the epoch's reseed.
    expected = list(_sampler([1]))
    sampler = _sampler([1])
    begun = iter(sampler)
    assert sampler.permutation(0) != sampler.permutation(1)
    assert list(begun) == expected


def test_seeds_next_to_each_other_do_not_share_epoch_orders():
    # A seed sweep (42, 43, ...): seed 43 must not train on seed 42's later orders, nor the reverse.
    orders = {(seed, e): _sampler([e], seed=seed).permutation(e) for seed in (42, 43) for e in (0, 1, 2)}
    assert len({tuple(order) for order in orders.values()}) == len(orders)
    assert sorted(orders[(43, 1)]) == list(range(10))


def test_a_later_epochs_order_is_the_one_released_checkpoints_began_with():
    # Runs checkpointed in epoch 1 or later resume into the order they were drawing: its seed is pinned to
    # the value the released sampler used, and the order is torch's permutation under that seed.
    assert epoch_seed(42, 1) == 7846152634477663787
    order = list(_sampler([1]))
    generator = torch.Generator().manual_seed(7846152634477663787)
    first = torch.randperm(10, generator=generator).tolist()[:3]
    assert order[:12:4] == first


def _batch_args(epochs: float, accumulation: int, per_generation: int, per_device: int) -> SimpleNamespace:
    return SimpleNamespace(
        per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
        steps_per_generation=per_generation, num_generations=4, num_iterations=1, max_steps=-1,
        num_train_epochs=epochs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("epochs", "rounds"),
    # 12 questions, 4 a round: 3 rounds of 4 optimizer steps an epoch, 12 steps. transformers trains
    # ceil(epochs × 12) steps, and a round partly trained is generated whole.
    [(1.5, 5), (2, 6), (0.4, 2)],  # 18 steps: 4 rounds + 2 steps; 24 steps; 5 steps: 1 round + 1 step
)
def test_planned_rounds_count_the_partly_trained_last_round(epochs, rounds):
    got = batch_arithmetic(_batch_args(epochs, 1, 4, 4), num_processes=1, rows=12)
    assert (got.rounds_per_epoch, got.optimizer_steps_per_round, got.total_rounds) == (3, 4, rounds)


def test_planned_rounds_count_an_epochs_short_last_step():
    # 3 questions, 3 a round: one round of 3 micro-steps an epoch, optimizer steps of 2 and 1. 1.5 epochs:
    # ceil(1.5 × 2) = 3 steps, the third the first 2 micro-steps of round 2.
    got = batch_arithmetic(_batch_args(1.5, 2, 3, 4), num_processes=1, rows=3)
    assert (got.rounds_per_epoch, got.total_rounds) == (1, 2)
