"""The training sampler: TRL's `RepeatSampler` order, reshuffled per epoch from ``(seed, epoch)``.

Why it exists (facts of TRL 1.16 and transformers 5.23):

* TRL's `RepeatSampler` seeds its generator once, in ``__init__``, and has no ``set_epoch``: epoch e's
  order is the e-th permutation drawn from that generator, so it depends on how many epochs this
  process has already iterated.
* On resume, the Trainer starts the loop at the checkpoint's epoch without iterating the earlier ones,
  and skips the first batches of that epoch (`accelerate.skip_first_batches`). A fresh `RepeatSampler`
  then yields epoch 0's permutation inside epoch e > 0: the rest of the epoch repeats some questions and
  never shows others.
* The Trainer does call ``set_epoch`` on the dataloader, but on several processes, after
  ``skip_first_batches``, the sampler sits behind SkipBatchSampler → BatchSamplerShard → BatchSampler
  and the call does not reach it.

So this sampler takes the epoch from a callable (the trainer passes ``int(state.epoch)``), read when an
epoch's iteration starts, and draws that epoch's permutation from a generator seeded with `epoch_seed`.
Epoch 0 is exactly TRL's order (same generator, same seed); every epoch depends only on (seed, epoch), so a
resumed run sees the same order as an uninterrupted one. Later epochs' seeds are hashed from (seed, epoch),
not ``seed + epoch``: a sweep over seeds 42, 43, ... would otherwise train seed 43 on seed 42's orders,
one epoch early.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sized

import torch
from trl.trainer.utils import RepeatSampler


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of ``epoch``: ``seed`` itself in epoch 0 (TRL's order), a hash of both after.

    >>> epoch_seed(42, 0), epoch_seed(42, 1) == epoch_seed(43, 0), epoch_seed(42, 1) == epoch_seed(42, 1)
    (42, False, True)
    """
    if epoch == 0:
        return seed
    # Kept as released: a checkpoint resumed in a later epoch must get the order its run began with.
    digest = hashlib.blake2b(f"{seed}\x1fepoch\x1f{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # below 2**63: manual_seed's range


class EpochRepeatSampler(RepeatSampler):
    """`RepeatSampler` whose shuffle is a pure function of ``(seed, epoch)``.

    Args:
        data_source: The dataset (only its length is used).
        mini_repeat_count: Times each index is repeated in a row (``num_generations``).
        batch_size: Distinct indices per generation round.
        repeat_count: Times each round's chunk is repeated (``num_iterations × steps_per_generation``).
        shuffle: Shuffle the indices (per epoch); ``False`` keeps dataset order.
        seed: The shuffle seed (the training seed).
        epoch: Returns the current 0-based epoch; read once at the start of each iteration.

    >>> sampler = EpochRepeatSampler(range(6), mini_repeat_count=2, batch_size=3, seed=0, epoch=lambda: 0)
    >>> len(list(sampler)), len(sampler)
    (12, 12)
    >>> sampler.permutation(0) != sampler.permutation(1)
    True
    """

    def __init__(
        self,
        data_source: Sized,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        if seed is None:
            raise ValueError("EpochRepeatSampler needs a seed: epoch e's order is derived from (seed, e)")
        super().__init__(data_source, mini_repeat_count, batch_size, repeat_count, shuffle, seed)
        self.epoch = epoch

    def permutation(self, epoch: int) -> list[int]:
        """The dataset order of ``epoch`` (before chunking and repeating). It draws from a generator of its
        own: an iteration begun but not yet drawn from (TRL's ``__iter__`` draws on the first ``next``) keeps
        its order."""
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            # RepeatSampler draws its permutation from self.generator: reseed it for this epoch.
            self.generator.manual_seed(epoch_seed(self.seed, int(self.epoch())))
        return super().__iter__()
