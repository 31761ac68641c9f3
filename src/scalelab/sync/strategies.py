"""Gradient-sync strategies behind one interface, and `build_sync` that picks one from the config.

Every strategy averages gradients over the ranks (except `noop`, the ablation baseline where ranks diverge) and
issues its collectives through the rank's CommMeter. The loop uses a strategy like this:

    sync = build_sync(cfg, model, ctx, meter)
    net = sync.wrap()                          # the module to call forward on
    for each micro-step j of K:
        with sync.micro_step(last=j == K - 1):  # no gradient sync on the first K-1 micro-steps
            forward; backward
    with timer.span("comm"):
        sync.after_backward()                  # the blocking part of the sync
    optimizer.step()

Strategies here sync after backward, synchronously, one collective (or two) per parameter in registration order:
every rank walks the same list, so the collectives match across ranks.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager, Protocol

import torch
import torch.distributed as dist
from torch import nn

from scalelab.sync.meter import CommMeter

SYNCS = ("ddp", "gather_scatter", "allreduce", "bucketed", "noop")


class GradSync(Protocol):
    meter: CommMeter

    def wrap(self) -> nn.Module:
        """The module the loop calls (the model itself, or a wrapper such as DDP)."""

    def micro_step(self, last: bool) -> ContextManager:
        """Context for one forward+backward micro-step; gradients are synced only when `last`."""

    def after_backward(self) -> None:
        """Finish the gradient sync after the last micro-step's backward (the loop's "comm" span)."""

    def close(self) -> None:
        """Remove hooks this strategy installed."""


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def grad_or_zeros(p: nn.Parameter) -> torch.Tensor:
    """The parameter's gradient; a parameter without one takes part with zeros, so every rank issues the same
    collectives (a rank that skipped one would hang the others)."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class NoopSync:
    """No synchronisation at all: the ablation baseline (step time with real sync minus this = exposed comm)."""

    def __init__(self, model: nn.Module, meter: CommMeter):
        self.model, self.meter = model, meter

    def wrap(self) -> nn.Module:
        return self.model

    def micro_step(self, last: bool) -> ContextManager:
        return nullcontext()

    def after_backward(self) -> None:
        pass

    def close(self) -> None:
        pass


class AllreduceSync(NoopSync):
    """One blocking dist.all_reduce per parameter after backward, then divide by the world size."""

    def after_backward(self) -> None:
        world = dist.get_world_size()
        for p in trainable(self.model):
            grad = grad_or_zeros(p)
            with self.meter.collective("allreduce", tensor_bytes(grad), phase="backward"):
                dist.all_reduce(grad)
            grad.div_(world)


class GatherScatterSync(NoopSync):
    """Per parameter: every rank sends its gradient to rank 0 (gather), rank 0 averages them and sends the average
    back (scatter). Bytes follow the meter's gather/scatter convention: S per op on other ranks, (n-1)*S on rank 0.
    """

    def after_backward(self) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        root = rank == 0
        for p in trainable(self.model):
            grad = grad_or_zeros(p)
            size = tensor_bytes(grad)
            wire = size * (world - 1) if root else size  # the root's own slice never leaves it
            parts = [torch.empty_like(grad) for _ in range(world)] if root else None
            with self.meter.collective("gather", wire, phase="backward", alg_bytes=size * world):
                dist.gather(grad, parts, dst=0)
            mean = torch.stack(parts).sum(0).div_(world) if root else None
            with self.meter.collective("scatter", wire, phase="backward", alg_bytes=size * world):
                dist.scatter(grad, [mean] * world if root else None, src=0)


def broadcast_initial_state(model: nn.Module) -> None:
    """Start every rank from rank 0's parameters and buffers, as DDP does at construction (a user model seeded
    differently per rank would otherwise train apart). Once, before training: not metered."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def build_sync(cfg, model: nn.Module, ctx, meter: CommMeter) -> GradSync:
    """The strategy `cfg.sync` names (auto = ddp) around `model`, recording into `meter`."""
    name = "ddp" if cfg.sync == "auto" else cfg.sync
    if name != "ddp":
        broadcast_initial_state(model)  # DDP does its own
    if name == "ddp":
        from scalelab.sync.ddp import DDPSync

        return DDPSync(model, ctx, meter, bucket_mb=cfg.bucket_mb, hook=cfg.ddp_hook,
                       powersgd_rank=cfg.powersgd_rank)
    if name == "bucketed":
        from scalelab.sync.bucketed import BucketedSync

        return BucketedSync(model, meter, bucket_mb=cfg.bucket_mb)
    if name == "allreduce":
        return AllreduceSync(model, meter)
    if name == "gather_scatter":
        return GatherScatterSync(model, meter)
    if name == "noop":
        return NoopSync(model, meter)
    raise ValueError(f"sync {name!r}; allowed: {', '.join(SYNCS)}")
