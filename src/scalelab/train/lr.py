"""Large-batch learning-rate rules and LARS.

Rules map the learning rate tuned at `base_batch` to the batch in use (`batch`), with k = batch / base_batch:
- none:           lr = base_lr
- linear:         lr = base_lr * k                           (Goyal et al. 2017, "Accurate, Large Minibatch SGD")
- sqrt:           lr = base_lr * sqrt(k)                     (Krizhevsky 2014, "One weird trick")
- linear_warmup:  linear, reached by a linear ramp from base_lr over `warmup` steps (Goyal et al. 2017, gradual
                  warm-up)
- lars:           LARS optimizer (You, Gitman & Ginsburg 2017) with the linear_warmup schedule for its global lr
"""
from __future__ import annotations

import math

import torch

RULES = ("none", "linear", "sqrt", "linear_warmup", "lars")


def target_lr(rule: str, base_lr: float, base_batch: int, batch: int) -> float:
    """The learning rate a rule aims at for this batch."""
    k = batch / base_batch
    if rule == "none":
        return base_lr
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    if rule in ("linear", "linear_warmup", "lars"):
        return base_lr * k
    raise ValueError(f"unknown lr rule {rule!r}; allowed: {', '.join(RULES)}")


def lr_at(step: int, *, rule: str, base_lr: float, base_batch: int, batch: int, warmup: int = 0) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    target = target_lr(rule, base_lr, base_batch, batch)
    if rule in ("linear_warmup", "lars") and warmup > 0 and step < warmup:
        return base_lr + (target - base_lr) * step / warmup
    return target


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class LARS(torch.optim.Optimizer):
    """SGD with momentum and a layer-wise trust ratio (You et al. 2017, Algorithm 1).

    For each parameter tensor w with gradient g: local = trust * ||w|| / (||g|| + weight_decay * ||w||)
    (1 when either norm is 0), then v = momentum * v + lr * local * (g + weight_decay * w), w -= v.
    1-D tensors (biases, norm scales) are not adapted and get no weight decay, as is common practice.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, trust: float = 0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, trust=trust))

    @staticmethod
    def trust_ratio(w: torch.Tensor, g: torch.Tensor, weight_decay: float, trust: float) -> float:
        w_norm, g_norm = float(w.norm()), float(g.norm())
        if w_norm == 0.0 or g_norm == 0.0:
            return 1.0
        return trust * w_norm / (g_norm + weight_decay * w_norm)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if p.ndim > 1:
                    wd = group["weight_decay"]
                    local = self.trust_ratio(p, g, wd, group["trust"])
                    g = (g + wd * p) * local
                state = self.state[p]
                buf = state.get("momentum")
                if buf is None:
                    buf = state["momentum"] = torch.zeros_like(p)
                buf.mul_(group["momentum"]).add_(g, alpha=group["lr"])
                p.sub_(buf)
        return loss
