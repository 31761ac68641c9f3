"""torch DDP as a sync strategy, with its communication measured.

DDP buckets gradients (`bucket_cap_mb`) and all-reduces each bucket through a comm hook while backward runs. A hook
is always registered (torch's plain allreduce_hook when `hook` is "none"), wrapped so that every bucket's
collective goes through the CommMeter: bytes from the bucket, time from the hook's launch to its future's
completion. DDP waits on those futures at the end of backward, so DDP's exposed communication sits inside the
loop's "backward" span and the "comm" span stays empty.

Bytes per bucket: fp32 buffer bytes for "none"; half of them for "fp16"/"bf16" (the bucket is cast before the
all-reduce); for "powersgd", once it compresses, the uncompressed tensors plus the P and Q factors, taken from
PowerSGDState's own element counts (three all-reduces per bucket). The first step runs with DDP's initial single
bucket; DDP rebuilds buckets of `bucket_cap_mb` after it (the first step is a warm-up step).

DDP also broadcasts module buffers (e.g. BatchNorm running stats) from rank 0 before a forward, except right after
a no_sync forward (so once per optimizer step, also with accumulation); that broadcast is metered in phase
"forward" by wrapping the instance's `_distributed_broadcast_coalesced` (present in torch 2.13; without it the
buffer bytes go unmetered, with a warning).

The no-op variant (cfg.noop_collectives) registers `local_hook`: what the chosen hook does besides its collective
(the division by the world size, and fp16 / bf16's casts to the wire dtype and back), so DDP still buckets,
copies into its buckets, runs its hook machinery and divides, but nothing is all-reduced; the buffer broadcast is
skipped and nothing is metered. torch's own `noop_hook` would skip the division too (the default hook divides
before its all-reduce). PowerSGD's no-op is the plain division: its compression is billed as communication.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from scalelab.analysis.synccost import DDP_FIRST_BUCKET_BYTES, CostQuery, SyncCost, overlapped_buckets_cost
from scalelab.sync.base import tensor_bytes
from scalelab.sync.meter import CommMeter
from scalelab.sync.registry import ACCUMULATE, SyncEntry

# PowerSGD's error feedback and warm start need two plain all-reduce steps first (DDP rebuilds its buckets after
# the first); 2 is the smallest value torch accepts, so compression starts on the third step.
POWERSGD_START_ITER = 2


def broadcast_chunks(tensors: list[torch.Tensor], buffer_size: int) -> int:
    """Broadcasts torch's coalesced broadcast issues: tensors grouped by dtype, a group sent once it reaches
    `buffer_size` bytes, then every remainder (the rule of torch's take_tensors)."""
    sizes: dict[torch.dtype, int] = {}
    count = 0
    for t in tensors:
        sizes[t.dtype] = sizes.get(t.dtype, 0) + tensor_bytes(t)
        if sizes[t.dtype] >= buffer_size:
            count += 1
            sizes[t.dtype] = 0
    return count + sum(1 for s in sizes.values() if s > 0)


def one_chain_at_a_time(hook):
    """Run a comm hook's future chains one bucket after another.

    torch's PowerSGD hook blocks inside its future callbacks (`.wait()` on the next all-reduce). On gloo those
    callbacks run on the process group's worker threads (two), so two buckets in flight can block both threads
    and every rank hangs. Starting a bucket's hook only when the previous bucket's chain has completed keeps one
    thread free; the cost is that PowerSGD's buckets no longer overlap each other (they still overlap backward).
    """
    tail: list[torch.futures.Future | None] = [None]

    def serialized(state, bucket):
        out: torch.futures.Future = torch.futures.Future()

        def start(_prev=None) -> None:
            try:
                fut = hook(state, bucket)
            except Exception as err:  # noqa: BLE001 - surface it to DDP's wait
                out.set_exception(err)
                return
            fut.add_done_callback(lambda f: _forward(f, out))

        prev = tail[0]
        tail[0] = out
        if prev is None or prev.done():
            start()
        else:
            prev.add_done_callback(start)
        return out

    return serialized


def local_hook(wire_dtype: torch.dtype | None):
    """A DDP comm hook doing everything torch's allreduce / fp16 / bf16 hooks do except the all-reduce: divide the
    bucket by the world size (in the wire dtype when compressing, then copy back). Gradients stay each rank's own."""
    def hook(state, bucket):  # DDP checks the parameter is named `bucket`
        buffer = bucket.buffer()
        world = dist.get_world_size()
        if wire_dtype is None:
            buffer.div_(world)
        else:
            buffer.copy_(buffer.to(wire_dtype).div_(world))
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    return hook


def _forward(src: torch.futures.Future, dst: torch.futures.Future) -> None:
    try:
        dst.set_result(src.value())
    except Exception as err:  # noqa: BLE001
        dst.set_exception(err)


class DDPSync:
    def __init__(self, model: nn.Module, ctx, meter: CommMeter, *, bucket_mb: float, hook: str = "none",
                 powersgd_rank: int = 1, collectives: bool = True):
        self.meter = meter
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.net = DDP(model, device_ids=ids, bucket_cap_mb=bucket_mb)
        if collectives:
            self._register_hook(hook, powersgd_rank)
            meter_buffer_broadcast(self.net, meter)
        else:
            self._without_collectives(hook)

    def wrap(self) -> nn.Module:
        return self.net

    def micro_step(self, last: bool) -> ContextManager:
        return nullcontext() if last else self.net.no_sync()

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def after_backward(self) -> None:
        pass  # DDP finished the sync inside backward

    def close(self) -> None:
        pass

    def _register_hook(self, hook: str, powersgd_rank: int) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        meter = self.meter
        if hook == "powersgd":
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                       start_powerSGD_iter=POWERSGD_START_ITER)
            inner = psgd.powerSGD_hook
        else:
            state = None  # the default process group
            inner = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                     "bf16": default_hooks.bf16_compress_hook}[hook]
        wire_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(hook)

        def metered(state, bucket):  # DDP checks the parameter is named `bucket`
            buffer = bucket.buffer()
            nbytes, count = tensor_bytes(buffer), 1
            if wire_dtype is not None:
                nbytes = buffer.numel() * torch.finfo(wire_dtype).bits // 8
            compressing = hook == "powersgd" and state.iter >= state.start_powerSGD_iter
            before = state.total_numel_after_compression if compressing else 0
            start, mark = meter.now(), meter.device_mark()
            fut = inner(state, bucket)
            if compressing:  # PowerSGDState counted what this bucket sends while launching
                nbytes = (state.total_numel_after_compression - before) * buffer.element_size()
                count = 3  # uncompressed tensors, then P, then Q
            return meter.track(fut, "allreduce", nbytes, phase="backward", start=start, count=count, mark=mark)

        if hook == "powersgd" and dist.get_backend() == "gloo":
            metered = one_chain_at_a_time(metered)
        self.net.register_comm_hook(state, metered)

    def _without_collectives(self, hook: str) -> None:
        self.net.register_comm_hook(None, local_hook({"fp16": torch.float16, "bf16": torch.bfloat16}.get(hook)))
        if hasattr(self.net, "_distributed_broadcast_coalesced"):
            self.net._distributed_broadcast_coalesced = lambda tensors, buffer_size, authoritative_rank=0: None


def meter_buffer_broadcast(net: DDP, meter: CommMeter) -> None:
    """Meter the broadcast of module buffers DDP `net` makes before a forward, in phase "forward"."""
    original = getattr(net, "_distributed_broadcast_coalesced", None)
    if original is None:  # a torch without this method: buffer bytes go unmeasured rather than fail
        warnings.warn("DDP has no _distributed_broadcast_coalesced; buffer broadcasts are not metered")
        return

    def metered(tensors, buffer_size, authoritative_rank=0):
        tensors = list(tensors)
        nbytes = sum(tensor_bytes(t) for t in tensors)
        with meter.collective("broadcast", nbytes, phase="forward", count=broadcast_chunks(tensors, buffer_size)):
            original(tensors, buffer_size, authoritative_rank)

    net._distributed_broadcast_coalesced = metered


def cost(q: CostQuery) -> SyncCost:
    """As bucketed, with DDP's first bucket capped at 1 MiB; see
    `scalelab.analysis.synccost.overlapped_buckets_cost`."""
    return overlapped_buckets_cost(q, DDP_FIRST_BUCKET_BYTES)


def build(cfg, model: nn.Module, ctx, meter: CommMeter) -> DDPSync:
    return DDPSync(model, ctx, meter, bucket_mb=cfg.bucket_mb, hook=cfg.ddp_hook, powersgd_rank=cfg.powersgd_rank,
                   collectives=not cfg.noop_collectives)


ENTRY = SyncEntry(name="ddp", factory=build,
                  description="torch DDP: bucketed all-reduce overlapped with backward (bucket_mb; ddp_hook "
                              "fp16 / bf16 / powersgd compresses)",
                  options=("bucket_mb", "ddp_hook", "powersgd_rank"),
                  variants={"ddp": {}, "ddp+fp16": {"ddp_hook": "fp16"}, "ddp+bf16": {"ddp_hook": "bf16"},
                            "ddp+powersgd": {"ddp_hook": "powersgd"}, "ddp+accumulate": {"accumulate": ACCUMULATE}},
                  cost=cost, order=40, broadcasts_initial_state=True)
