"""The per-epoch sampler: TRL's order in epoch 0, then a fresh shuffle per epoch from (seed, epoch) alone."""

from __future__ import annotations

import torch
from trl.trainer.utils import RepeatSampler

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
