"""Horovod as an engine: horovodrun starts the ranks (gloo controller and CPU ops, loopback only), `hvd.init()`
connects them and `hvd.DistributedOptimizer` averages the gradients; the loop, data, sampler, timing and records
are the ones DDP runs with.

Gradient sync (`HorovodSync`): `hvd.DistributedOptimizer` is built around the run's optimizer once it exists
(`attach_optimizer`); its hooks enqueue each gradient's allreduce as backward produces it (with accumulation, after
the K-th micro-step), Horovod's background thread fuses them (HOROVOD_FUSION_THRESHOLD bytes, every
HOROVOD_CYCLE_TIME ms), and the loop's "comm" span is the optimizer's `synchronize()`: the rank's blocking wait.
The loop then steps the optimizer it built (the Horovod optimizer shares its parameter groups, and its gradients
are averaged in place), so the step itself is the same code as DDP's.

Metering: every gradient handed to Horovod is one "allreduce" record of phase "backward", its bytes the tensor as
it goes on the wire (half of fp32 with fp16 compression), its interval from the hook's enqueue to the return of
`synchronize()`. That interval spans backward compute: it is kept for the trace (its starts align the timeline,
run/exports.py) and is not the run's time inside collectives. The summary takes those from Horovod's own timeline
(rank 0: analysis/hvdcomm.py): the union of its ALLREDUCE spans per step is comm/time and comm/critical; the
records' enqueue stamps, on every rank, give each rank's readiness per gradient, hence waiting for peers. Horovod sends no buffers per step (DDP broadcasts them in "forward"), so a
model's running statistics stay each rank's own; the initial broadcast of parameters and buffers is once, before
training, and not metered, as DDP's.

Network emulation: with `net_latency_ms` every rank sleeps that long after `synchronize()` returns, on the
caller's side, inside the loop's comm span and the allreduce records; the summary counts it inside the collective
(as the meter counts DDP's emulated remainder). A bandwidth cap is refused: Horovod fuses tensors, so there is no
per-collective byte count on the caller's side to pad by.

Optimizer state: `hvd.broadcast_optimizer_state` runs when the state is not empty (a resumed run). A fresh
optimizer has no state to send, and Horovod's way of creating one first (a step on zero gradients) would move
the weights under weight decay and advance Adam's step count, so the run would no longer be DDP's.

The baseline of exposed communication (cfg.noop_collectives) keeps as much of Horovod's own work as can be kept:
the same hvd.DistributedOptimizer with its hooks, delay counters, compression and decompression, and
`synchronize()` setting each gradient from its handle; only the enqueue is replaced by a completed dummy (a
callable handle that returns the compressed gradient, which `synchronize()` reads instead of calling
hvd.synchronize), and nothing is metered. What it cannot keep, because it lives behind the enqueue in Horovod's C++
background thread: the fusion-buffer copies (measured from the real run's timeline, comm/hvd_fusion_copies(ms))
and the negotiation of real tensors by the background cycle (every HOROVOD_CYCLE_TIME ms; not measured: in the
baseline the thread still cycles, with nothing to negotiate).

A torch gloo process group runs beside Horovod for the loop's reductions outside the timed steps (evaluation
totals, the auto-length agreement); its store is hosted by the launcher on 127.0.0.1 (run/horovodrun.py).
"""
from __future__ import annotations

import datetime
import functools
import importlib.util
import os
import time
from contextlib import nullcontext
from typing import ContextManager

import torch
import torch.distributed as dist
from torch import nn

from scalelab.engines.registry import EngineEntry
from scalelab.errors import ConfigError
from scalelab.install.horovod import installed_version
from scalelab.store.rundir import RunDir
from scalelab.sync.base import tensor_bytes
from scalelab.sync.meter import CommMeter

STORE_ENV = "SCALELAB_HOROVOD_STORE"  # host:port of the launcher's store for the side process group
SETUP_HINT = "run `scalelab setup horovod`"


def unavailable() -> str | None:
    """Why Horovod cannot run here, or None: not installed, or installed but not loadable with gloo (a build for
    another torch). The load is tried once per process, in a fresh interpreter (a broken build may crash it)."""
    try:
        found = importlib.util.find_spec("horovod.torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"horovod is not installed ({SETUP_HINT})"
    if _loadable() is None:
        return f"horovod is installed but `import horovod.torch` with gloo fails ({SETUP_HINT} --rebuild)"
    return None


@functools.lru_cache(maxsize=1)
def _loadable() -> str | None:
    return installed_version()


def check(cfg) -> None:
    """What this engine cannot honour; one ConfigError naming the field."""
    reasons = {
        "sync": (cfg.sync != "auto", "Horovod's DistributedOptimizer is the sync; allowed: auto"),
        "wrapper": (cfg.wrapper not in ("auto", "ddp"), "horovodrun runs one process per rank; allowed: auto"),
        "device": (cfg.resolved_device != "cpu", "the Horovod engine is built for CPU (gloo) here; NCCL builds "
                                                  "are untested; allowed: cpu"),
        "lr_rule": (cfg.lr_rule == "lars", "LARS cannot be wrapped by hvd.DistributedOptimizer; allowed: none, "
                                           "linear, sqrt, linear_warmup"),
        "net_bandwidth_gbps": (cfg.net_bandwidth_gbps is not None,
                               "Horovod fuses tensors, so no collective's bytes can be padded on the caller's side; "
                               "allowed: unset (net_latency_ms is allowed)"),
        "memory_limit": (cfg.memory_limit is not None, "not with the Horovod engine; leave it unset"),
    }
    for name, (bad, allowed) in reasons.items():
        if bad:
            raise ConfigError(name, getattr(cfg, name), allowed)


def env(cfg, run_dir) -> dict[str, str]:
    """Horovod's knobs for the ranks: fusion buffer, cycle time, and the timeline into the run directory."""
    out = {"HOROVOD_TIMELINE": str(RunDir(run_dir).horovod_timeline)}
    if cfg.hvd_fusion_threshold is not None:
        out["HOROVOD_FUSION_THRESHOLD"] = str(cfg.hvd_fusion_threshold)
    if cfg.hvd_cycle_time_ms is not None:
        out["HOROVOD_CYCLE_TIME"] = f"{cfg.hvd_cycle_time_ms:g}"
    return out


def connect(cfg, ctx) -> None:
    """hvd.init(), then the side gloo process group on the launcher's store (a client: nothing listens here)."""
    import horovod.torch as hvd

    hvd.init()
    if (hvd.rank(), hvd.size()) != (ctx.rank, ctx.world):
        raise RuntimeError(f"horovod places this rank at {hvd.rank()}/{hvd.size()}, the environment at "
                           f"{ctx.rank}/{ctx.world}")
    host, _, port = os.environ[STORE_ENV].rpartition(":")
    store = dist.TCPStore(host, int(port), ctx.world, False, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=ctx.rank, world_size=ctx.world)


def disconnect() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    try:
        import horovod.torch as hvd

        hvd.shutdown()
    except ImportError:
        pass


def wire_bytes(grad: torch.Tensor, fp16: bool) -> int:
    """Bytes Horovod allreduces for `grad`: Compression.fp16 sends floating tensors as float16."""
    return grad.numel() * 2 if fp16 and grad.dtype.is_floating_point else tensor_bytes(grad)


class HorovodSync:
    """GradSync over hvd.DistributedOptimizer (see the module docstring)."""

    def __init__(self, model: nn.Module, meter: CommMeter, *, fp16: bool, accumulate: int, collectives: bool):
        import horovod.torch as hvd

        self.model, self.meter, self.fp16 = model, meter, fp16
        self.accumulate, self.collectives = accumulate, collectives
        self.optimizer = None  # the hvd.DistributedOptimizer, once attached
        self._launched: list[tuple[float, int]] = []  # (enqueue time, wire bytes) of this step's allreduces
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # once, before training; not metered (as DDP)

    def wrap(self) -> nn.Module:
        return self.model

    def micro_step(self, last: bool) -> ContextManager:
        return nullcontext()  # the optimizer counts backward passes itself (backward_passes_per_step)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        import horovod.torch as hvd

        if self.collectives and optimizer.state_dict()["state"]:  # resumed: every rank continues from rank 0's
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        compression = hvd.Compression.fp16 if self.fp16 else hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters(),
                                                  compression=compression,
                                                  backward_passes_per_step=self.accumulate)
        if not self.collectives:  # the baseline: Horovod's hooks and synchronize(), the allreduce a completed dummy
            self.optimizer._allreduce_grad_async = functools.partial(noop_enqueue, self.optimizer)
            return
        enqueue = self.optimizer._allreduce_grad_async  # Horovod's hook and synchronize() both go through it

        def metered(p):
            start = self.meter.now()
            out = enqueue(p)
            self._launched.append((start, wire_bytes(p.grad, self.fp16)))
            return out

        self.optimizer._allreduce_grad_async = metered

    def after_backward(self) -> None:
        if self.optimizer is None:
            return
        self.optimizer.synchronize()  # the blocking wait: every enqueued allreduce done, gradients averaged
        if self.collectives and self.meter.latency_s > 0:
            time.sleep(self.meter.latency_s)  # the emulated network, on the caller's side (module docstring)
        end = self.meter.now()
        for start, nbytes in self._launched:
            self.meter.record("allreduce", nbytes, end - start, phase="backward")
        self._launched.clear()

    def close(self) -> None:
        self._launched.clear()


def noop_enqueue(optimizer, p: torch.Tensor):
    """Horovod's `_allreduce_grad_async` without the allreduce: the same local work (a missing gradient zeroed,
    the compression), and a callable handle, which `synchronize()` calls for the result instead of waiting on
    Horovod."""
    if p.grad is None:
        p.grad = p.data.new(p.size()).zero_()
    compressed, ctx = optimizer._compression.compress(p.grad)
    return (lambda: compressed), ctx


def build_sync(cfg, model: nn.Module, ctx, meter: CommMeter) -> HorovodSync:
    return HorovodSync(model, meter, fp16=cfg.hvd_fp16, accumulate=cfg.accumulate,
                       collectives=not cfg.noop_collectives)


ENGINE = EngineEntry(name="horovod",
                     description="horovodrun (gloo, loopback) + hvd.DistributedOptimizer (hvd_fusion_threshold, "
                                 "hvd_cycle_time_ms, hvd_fp16); needs `scalelab setup horovod`",
                     launcher="horovodrun", connect=connect, disconnect=disconnect, build_sync=build_sync,
                     check=check, env=env, options=("hvd_fusion_threshold", "hvd_cycle_time_ms", "hvd_fp16"),
                     unavailable=unavailable, order=20)
