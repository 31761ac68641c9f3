"""scalelab's own overlapped, bucketed all-reduce (what DDP does, written out so it can be read and measured).

Parameters are cut into flat buckets of `bucket_mb` MiB in reverse registration order (roughly the order their
gradients become ready in backward). A bucket closes once it holds at least `bucket_mb` (the same rule as DDP's
bucket assignment, so a bucket may exceed the cap by its last parameter) or when the dtype changes. During
backward a post-accumulate-grad hook counts ready gradients; when a bucket is complete its gradients are copied
into one flat tensor and all-reduced with async_op=True while backward goes on. `after_backward` launches any
bucket that never completed (parameters without a gradient take part as zeros), then waits on every bucket in
launch order (the wait is the exposed part of the communication) and copies the averages back into .grad. Its
no-op variant packs and unpacks the same buckets but all-reduces nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from scalelab.analysis.synccost import CostQuery, SyncCost, overlapped_buckets_cost
from scalelab.sync.base import grad_or_zeros, tensor_bytes, trainable
from scalelab.sync.meter import CommMeter
from scalelab.sync.registry import SyncEntry

MIB = 1024 * 1024


def assign_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Indices of `params` per bucket, in order: a bucket closes once it reaches `bucket_bytes` or on a dtype
    change."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, p in enumerate(params):
        if current and p.dtype != params[current[0]].dtype:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += tensor_bytes(p)
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class BucketedSync:
    def __init__(self, model: nn.Module, meter: CommMeter, *, bucket_mb: float, collectives: bool = True):
        self.model, self.meter, self.collectives = model, meter, collectives
        self.params = trainable(model)[::-1]  # the last layer's gradients are ready first
        self.buckets = assign_buckets(self.params, max(1, int(bucket_mb * MIB)))
        self._bucket_of = {id(self.params[i]): b for b, idx in enumerate(self.buckets) for i in idx}
        self._ready = [0] * len(self.buckets)
        self._inflight: dict[int, tuple[torch.Tensor, torch.futures.Future]] = {}
        self._order: list[int] = []  # launch order this step
        self._syncing = True
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self.params]

    def wrap(self) -> nn.Module:
        return self.model

    @contextmanager
    def micro_step(self, last: bool) -> Iterator[None]:
        self._syncing = last  # earlier micro-steps only accumulate into .grad
        try:
            yield
        finally:
            self._syncing = True

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._syncing:
            return
        b = self._bucket_of[id(param)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._launch(b)

    def _launch(self, b: int) -> None:
        flat = torch.cat([grad_or_zeros(self.params[i]).reshape(-1) for i in self.buckets[b]])
        if self.collectives:
            start, mark = self.meter.now(), self.meter.device_mark()
            work = dist.all_reduce(flat, async_op=True)
            fut = self.meter.track(work.get_future(), "allreduce", tensor_bytes(flat), phase="backward", start=start,
                                   mark=mark)
        else:  # the bucket as it was packed, already "complete"
            fut = torch.futures.Future()
            fut.set_result([flat])
        self._inflight[b] = (flat, fut)
        self._order.append(b)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def after_backward(self) -> None:
        for b in range(len(self.buckets)):
            if b not in self._inflight:
                self._launch(b)
        world = dist.get_world_size()
        for b in self._order:
            flat, fut = self._inflight[b]
            fut.wait()  # the exposed communication: whatever backward did not hide
            flat.div_(world)
            offset = 0
            for i in self.buckets[b]:
                grad = self.params[i].grad
                n = grad.numel()
                grad.copy_(flat[offset:offset + n].view_as(grad))
                offset += n
        self._inflight.clear()
        self._order.clear()
        self._ready = [0] * len(self.buckets)

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def cost(q: CostQuery) -> SyncCost:
    """Buckets (bucket_mb each) all-reduced as they become ready during backward; see
    `scalelab.analysis.synccost.overlapped_buckets_cost`."""
    return overlapped_buckets_cost(q)


ENTRY = SyncEntry(name="bucketed",
                  factory=lambda cfg, model, ctx, meter: BucketedSync(model, meter, bucket_mb=cfg.bucket_mb,
                                                                      collectives=not cfg.noop_collectives),
                  description="scalelab's own bucketed all-reduce, overlapped with backward (bucket_mb)",
                  options=("bucket_mb",), cost=cost, order=30)
