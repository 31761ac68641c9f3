"""The default engine: torchrun starts the ranks, a torch.distributed process group connects them, and the sync
strategy `cfg.sync` (scalelab.sync; DDP by default) averages the gradients."""
from __future__ import annotations

import torch.distributed as dist

from scalelab.engines.registry import EngineEntry
from scalelab.sync.registry import build_sync as build


def connect(cfg, ctx) -> None:
    if cfg.distributed and not dist.is_initialized():
        dist.init_process_group(cfg.resolved_backend, rank=ctx.rank, world_size=ctx.world,
                                device_id=ctx.device if ctx.device.type == "cuda" else None)


def disconnect() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def build_sync(cfg, model, ctx, meter):
    return build(cfg, model, ctx, meter)


ENGINE = EngineEntry(name="ddp", description="torchrun + torch.distributed, gradients by the sync strategy "
                                             "(DDP by default)",
                     launcher="torchrun", connect=connect, disconnect=disconnect, build_sync=build_sync, order=10)
