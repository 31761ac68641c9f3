"""Build what the loop needs from a config: the parallel wrapper and the optimizer."""
from __future__ import annotations

import torch
from torch import nn

from scalelab.config import TrainConfig
from scalelab.distenv import DistContext
from scalelab.engines import registry
from scalelab.sync.meter import CommMeter
from scalelab.zoo.data import build_data
from scalelab.zoo.models import build_model, set_checkpoint_segments


def wrap_model(model: nn.Module, cfg: TrainConfig, ctx: DistContext):
    """Apply the model wrapper (cfg.wrapper): none, DataParallel over the node's GPUs, or across ranks with the
    engine's gradient sync (scalelab.engines: the strategy `cfg.sync`, DDP by default; or Horovod's).

    Returns (module to call, GradSync or None); None means no process group, and then nothing of the sync layer
    runs in the step.
    """
    wrapper = cfg.resolved_wrapper
    if wrapper == "dp":
        return nn.DataParallel(model), None
    if wrapper == "ddp":

        sync = registry.get(cfg.engine).build_sync(cfg, model, ctx, CommMeter.from_config(cfg, ctx.world, ctx.device))
        return sync.wrap(), sync
    return model, None


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.lr_rule == "lars":
        from scalelab.train.lr import LARS

        return LARS(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_bundle(cfg: TrainConfig):
    """The dataset bundle a config names (generated datasets use their own sizes unless the config sets them)."""

    sizes = {k: v for k, v in (("samples", cfg.samples), ("eval_samples", cfg.eval_samples)) if v is not None}
    return build_data(cfg.dataset, path=cfg.data_path, seed=cfg.seed, augment=cfg.augment, **sizes)


def build_inputs(cfg: TrainConfig):
    """The dataset bundle and the (unwrapped) model; the same on every rank for the same seed."""

    bundle = build_bundle(cfg)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = build_model(cfg.model, bundle.spec, **cfg.model_overrides)
    if cfg.checkpoint_segments:
        set_checkpoint_segments(model, cfg.checkpoint_segments)
    return bundle, model
