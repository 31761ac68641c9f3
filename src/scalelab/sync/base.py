"""The GradSync protocol every gradient-sync strategy implements, and the helpers strategies share.

Every strategy averages gradients over the ranks (except `noop`, the ablation baseline where ranks diverge) and
issues its collectives through the rank's CommMeter. The loop uses a strategy like this:

    sync = build_sync(cfg, model, ctx, meter)  # scalelab.sync.registry
    net = sync.wrap()                          # the module to call forward on
    sync.attach_optimizer(optimizer)           # once the optimizer exists (Horovod wraps it)
    for each micro-step j of K:
        with sync.micro_step(last=j == K - 1):  # no gradient sync on the first K-1 micro-steps
            forward; backward
    with timer.span("comm"):
        sync.after_backward()                  # the blocking part of the sync
    optimizer.step()

With `collectives=False` (TrainConfig.noop_collectives) a strategy keeps all of its own work (wrapping,
bucketing, hooks, copies, casts) but issues no collective and records nothing in the meter: the baseline for
exposed communication (docs/definitions.md).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager, Protocol

import torch
import torch.distributed as dist
from torch import nn

from scalelab.sync.meter import CommMeter


class GradSync(Protocol):
    meter: CommMeter

    def wrap(self) -> nn.Module:
        """The module the loop calls (the model itself, or a wrapper such as DDP)."""

    def micro_step(self, last: bool) -> ContextManager:
        """Context for one forward+backward micro-step; gradients are synced only when `last`."""

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Called once the loop's optimizer exists (restored, on a resume), before the first step."""

    def after_backward(self) -> None:
        """Finish the gradient sync after the last micro-step's backward (the loop's "comm" span)."""

    def close(self) -> None:
        """Remove hooks this strategy installed."""


class PlainSync:
    """The part every after-backward strategy shares: the model itself, no per-micro-step context, no hooks."""

    def __init__(self, model: nn.Module, meter: CommMeter, *, collectives: bool = True):
        self.model, self.meter, self.collectives = model, meter, collectives

    def wrap(self) -> nn.Module:
        return self.model

    def micro_step(self, last: bool) -> ContextManager:
        return nullcontext()

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def after_backward(self) -> None:
        pass

    def close(self) -> None:
        pass


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


def broadcast_initial_state(model: nn.Module) -> None:
    """Start every rank from rank 0's parameters and buffers, as DDP does at construction (a user model seeded
    differently per rank would otherwise train apart). Once, before training: not metered."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
