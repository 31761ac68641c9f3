"""Communication cost of one optimizer step's gradient sync: the building blocks each sync strategy's cost
(`SyncEntry.cost` in scalelab.sync.registry) is made of. Pure: α-β collective times from
`scalelab.analysis.hardware`, buckets, overlap with backward and scalelab's network emulation.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scalelab.analysis.hardware import Hardware, collective_time
from scalelab.errors import ConfigError

MIB = 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES: DDP caps its first bucket at 1 MiB

@dataclass(frozen=True)
class SyncCost:
    comm_s: float  # seconds inside collectives per optimizer step
    exposed_s: float  # the part the step waits for (not hidden behind backward)
    collectives: int  # collectives per optimizer step


def bucket_sizes(param_bytes: Sequence[float], bucket_bytes: float, *,
                 first_bucket_bytes: float | None = None) -> list[float]:
    """Bytes per bucket, in launch order: parameters (given in registration order) are taken in reverse (their
    gradients are ready in that order) and a bucket closes once it holds >= its cap, as in sync/bucketed.py and
    DDP; DDP's first bucket has its own, smaller cap."""
    sizes, current, cap = [], 0.0, first_bucket_bytes or bucket_bytes
    for nbytes in reversed(list(param_bytes)):
        current += nbytes
        if current >= cap:
            sizes.append(current)
            current, cap = 0.0, bucket_bytes
    if current:
        sizes.append(current)
    return sizes


def exposed_after_overlap(ready_s: Sequence[float], comm_s: Sequence[float], backward_s: float) -> float:
    """Seconds of communication left after backward ends, for buckets launched when ready and served one at a
    time in order (one communication stream): end_i = max(ready_i, end_{i−1}) + comm_i; exposed =
    max(0, end_last − backward). When each bucket finishes before the next is ready, only the last bucket's
    comm is exposed; when communication is the bottleneck, exposed = ready_1 + Σ comm − backward."""
    end = 0.0
    for ready, comm in zip(ready_s, comm_s):
        end = max(end, ready) + comm
    return max(0.0, end - backward_s)


def launch_times(buckets: Sequence[float], backward_s: float, overlap: float = 1.0) -> tuple[list[float], list[float]]:
    """(ready, start) per bucket: bucket i is ready at backward·(bytes up to i)/(all bytes) (gradients assumed to
    arrive at a steady byte rate); its collective effectively starts at ready + (1 − overlap)·(backward − ready).
    overlap 1: as soon as it is ready; 0: only after backward (nothing hidden, as when the collectives' threads
    can get no core while backward runs); in between, that share of the hideable time is hidden."""
    total = sum(buckets)
    ready = [float(r) for r in backward_s * np.cumsum(buckets) / total] if total else [0.0] * len(buckets)
    return ready, [r + (1 - overlap) * (backward_s - r) for r in ready]


@dataclass(frozen=True)
class Emulation:
    """scalelab's network emulation (`TrainConfig.net_latency_ms`, `net_bandwidth_gbps`; sync/meter.py): the caller
    sees a collective of S bytes (S as the meter counts them) take at least latency + S / bandwidth after its
    launch; the real collective runs at the same time, so it takes max(real, floor)."""

    latency_s: float = 0.0
    bandwidth_Bps: float | None = None  # bytes per second; None: no cap

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency_s) or self.latency_s < 0:
            raise ConfigError("net_latency_ms", self.latency_s * 1e3, "allowed: a number of ms >= 0")
        if self.bandwidth_Bps is not None and not self.bandwidth_Bps > 0:
            raise ConfigError("net_bandwidth_gbps", self.bandwidth_Bps * 8 / 1e9, "allowed: Gbit/s > 0 (or unset)")

    @classmethod
    def from_config(cls, net_latency_ms: float = 0.0, net_bandwidth_gbps: float | None = None) -> "Emulation":
        """From the config's units: ms and Gbit/s (1e9 bits per second)."""
        return cls(net_latency_ms / 1e3, net_bandwidth_gbps * 1e9 / 8 if net_bandwidth_gbps else None)

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.bandwidth_Bps is not None

    def floor_s(self, nbytes: float) -> float:
        """L + S/bw in s: the least time the caller sees for one collective of `nbytes`."""
        return self.latency_s + (nbytes / self.bandwidth_Bps if self.bandwidth_Bps else 0.0)


def completion_with_floors(ready_s: Sequence[float], comm_s: Sequence[float], floor_s: Sequence[float],
                           start_s: Sequence[float] | None = None) -> list[float]:
    """When each overlapped collective completes for the caller under emulation: the real collectives are served
    one at a time (real_end_i = max(start_i, real_end_{i−1}) + comm_i; start = ready unless given, see
    `launch_times`) while each floor runs from its own launch on its own timer (a sleep, which needs no core),
    so completion_i = max(real_end_i, ready_i + floor_i). With zero floors the last completion is
    `exposed_after_overlap`'s end."""
    out, end = [], 0.0
    for ready, start, comm, floor in zip(ready_s, start_s if start_s is not None else ready_s, comm_s, floor_s):
        end = max(end, start) + comm
        out.append(max(end, ready + floor))
    return out


@dataclass(frozen=True, kw_only=True)
class CostQuery:
    """What a strategy's cost needs: per-parameter gradient bytes (registration order, uncompressed), the
    compression factor (bytes on the wire per gradient byte), n ranks on `hardware`, the backward the sync may
    hide behind (s), the bucket cap, an allreduce algorithm override and scalelab's network emulation."""

    param_bytes: Sequence[float]
    factor: float
    n: int
    hardware: Hardware
    backward_s: float
    bucket_bytes: float
    algorithm: str | None = None
    emulation: Emulation | None = None

    @property
    def sizes(self) -> list[float]:
        """Per-parameter bytes on the wire (compression applied)."""
        return [b * self.factor for b in self.param_bytes]

    @property
    def emulated(self) -> bool:
        return self.emulation is not None and self.emulation.active


def overlapped_buckets_cost(q: CostQuery, first_bucket_bytes: float | None = None) -> SyncCost:
    """Buckets (`bucket_sizes`, the first capped at `first_bucket_bytes` when given) all-reduced as they become
    ready during backward (`launch_times`, with hardware.overlap); exposed by `exposed_after_overlap`. Under
    emulation, `completion_with_floors` on the buckets: comm = Σ (completion_i − ready_i) (the meter's record),
    exposed = max(0, last completion − backward)."""
    # buckets are cut on the gradients' own bytes; a compression hook shrinks each bucket on the wire
    buckets = [b * q.factor for b in bucket_sizes(q.param_bytes, q.bucket_bytes,
                                                    first_bucket_bytes=first_bucket_bytes)]
    comms = [collective_time("allreduce", s, q.n, q.hardware, q.algorithm) for s in buckets]
    ready, start = launch_times(buckets, q.backward_s, q.hardware.overlap)
    if not q.emulated:
        return SyncCost(sum(comms), exposed_after_overlap(start, comms, q.backward_s), len(buckets))
    done = completion_with_floors(ready, comms, [q.emulation.floor_s(s) for s in buckets], start)
    comm = sum(d - r for d, r in zip(done, ready))
    return SyncCost(comm, max(0.0, max(done, default=0.0) - q.backward_s), len(buckets))
