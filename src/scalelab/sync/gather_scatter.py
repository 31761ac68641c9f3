"""`gather_scatter`: per parameter, every rank sends its gradient to rank 0 (gather), rank 0 averages them and
sends the average back (scatter). Bytes follow the meter's gather/scatter convention: S per op on other ranks,
(n-1)*S on rank 0. Synchronous, after backward, in registration order."""
from __future__ import annotations

import torch
import torch.distributed as dist

from scalelab.analysis.hardware import collective_time
from scalelab.analysis.synccost import CostQuery, SyncCost
from scalelab.sync.base import PlainSync, grad_or_zeros, tensor_bytes, trainable
from scalelab.sync.registry import SyncEntry


class GatherScatterSync(PlainSync):
    @staticmethod
    def average(parts: list[torch.Tensor]) -> torch.Tensor:
        """Rank 0's part of the sync: the mean of every rank's gradient."""
        return torch.stack(parts).sum(0).div_(len(parts))

    def after_backward(self) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        root = rank == 0
        for p in trainable(self.model):
            grad = grad_or_zeros(p)
            size = tensor_bytes(grad)
            wire = size * (world - 1) if root else size  # the root's own slice never leaves it
            if not self.collectives:  # the same buffers and the root's averaging, no gather / scatter
                if root:  # the root's own slice is local; the others would have arrived
                    self.average([grad.clone(), *(torch.zeros_like(grad) for _ in range(world - 1))])
                continue
            parts = [torch.empty_like(grad) for _ in range(world)] if root else None
            with self.meter.collective("gather", wire, phase="backward", alg_bytes=size * world):
                dist.gather(grad, parts, dst=0)
            mean = self.average(parts) if root else None
            with self.meter.collective("scatter", wire, phase="backward", alg_bytes=size * world):
                dist.scatter(grad, [mean] * world if root else None, src=0)
        if not self.collectives:
            # The real sync makes the other ranks wait for rank 0's averaging (inside scatter); without that wait
            # they run on into their next step and compete with it for the cores, which made the baseline's step
            # (and so its rank 0's averaging) longer than in the real run, and a blocking sync seem to hide
            # communication. One unmetered barrier per step keeps that dependency (a barrier of a few bytes costs
            # well under a millisecond on loopback).
            dist.barrier()


def cost(q: CostQuery) -> SyncCost:
    """Σ_p [T_gather(n·S_p) + T_scatter(n·S_p)] = Σ_p 2[(n−1)α + (n−1)·S_p·β]: the root moves every piece, so its
    bandwidth term grows with n; nothing is hidden. Emulated: each op takes at least L + (n−1)·S_p/bw (the root's
    wire bytes are the largest and every rank waits for it)."""
    comm = 0.0
    for s in q.sizes:
        for op in ("gather", "scatter"):
            t = collective_time(op, q.n * s, q.n, q.hardware)
            comm += max(t, q.emulation.floor_s((q.n - 1) * s)) if q.emulated else t
    return SyncCost(comm, comm, 2 * len(q.sizes))


ENTRY = SyncEntry(name="gather_scatter",
                  factory=lambda cfg, model, ctx, meter: GatherScatterSync(model, meter,
                                                                           collectives=not cfg.noop_collectives),
                  description="per parameter, gather on rank 0, average there, scatter back", cost=cost, order=10,
                  blocks=True)
