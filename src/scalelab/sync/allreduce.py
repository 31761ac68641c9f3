"""`allreduce`: one blocking dist.all_reduce per parameter after backward, in registration order (every rank
walks the same list, so the collectives match across ranks), then a division by the world size."""
from __future__ import annotations

import torch.distributed as dist

from scalelab.analysis.hardware import collective_time
from scalelab.analysis.synccost import CostQuery, SyncCost
from scalelab.sync.base import PlainSync, grad_or_zeros, tensor_bytes, trainable
from scalelab.sync.registry import SyncEntry


class AllreduceSync(PlainSync):
    def after_backward(self) -> None:
        world = dist.get_world_size()
        for p in trainable(self.model):
            grad = grad_or_zeros(p)
            if self.collectives:
                with self.meter.collective("allreduce", tensor_bytes(grad), phase="backward"):
                    dist.all_reduce(grad)
            grad.div_(world)


def cost(q: CostQuery) -> SyncCost:
    """Σ_p T_allreduce(S_p): blocking, one after another after backward, so nothing is hidden and the latency term
    is paid once per parameter. Emulated: Σ_p max(T_allreduce(S_p), L + S_p/bw)."""
    comm = 0.0
    for s in q.sizes:
        t = collective_time("allreduce", s, q.n, q.hardware, q.algorithm)
        comm += max(t, q.emulation.floor_s(s)) if q.emulated else t
    return SyncCost(comm, comm, len(q.sizes))


ENTRY = SyncEntry(name="allreduce",
                  factory=lambda cfg, model, ctx, meter: AllreduceSync(model, meter,
                                                                       collectives=not cfg.noop_collectives),
                  description="one blocking all-reduce per parameter after backward", cost=cost, order=20,
                  blocks=True)
