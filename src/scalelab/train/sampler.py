"""Batch sampler that shards each global batch across ranks.

Every epoch draws one permutation (seed + epoch, the same on every rank) and cuts it into global batches; rank r
takes the r-th contiguous slice of each, so the ranks' slices of a step put together are exactly the global batch
one process would see. All ranks get the same number of batches, so no rank waits in a collective for a batch
that never comes:
- drop_last: an incomplete last global batch is dropped (shuffling drops different samples each epoch);
- otherwise it is split as evenly as possible; only if it has fewer samples than ranks is it padded with samples
  from the start of the permutation, so each rank gets one. Union of all ranks' samples = the whole dataset.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch


class ShardedBatchSampler:
    def __init__(self, n: int, global_batch: int, *, rank: int = 0, world: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False):
        if n < 1:
            raise ValueError(f"dataset is empty (n={n})")
        if global_batch % world:
            raise ValueError(f"global_batch {global_batch} not divisible by world {world}")
        self.n, self.global_batch, self.rank, self.world = n, global_batch, rank, world
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Must be called before each epoch: the permutation depends on it, so the order changes every epoch.
        `skip`: start at this batch of the epoch (a resumed run continues where its checkpoint was taken)."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        order = self._order()
        per_rank = self.global_batch // self.world
        full = self.n // self.global_batch
        for b in range(self.skip, full):
            start = b * self.global_batch + self.rank * per_rank
            yield order[start:start + per_rank]
        rest = order[full * self.global_batch:]
        if rest and not self.drop_last and self.skip <= full:
            if len(rest) < self.world:
                rest = rest + order[: self.world - len(rest)]
            k, m = divmod(len(rest), self.world)
            start = self.rank * k + min(self.rank, m)
            yield rest[start:start + k + (1 if self.rank < m else 0)]
