"""The performance model (DESIGN F14): fitted compute + α-β communication + overlap → step time and scaling.

A step of data parallelism on n ranks (one optimizer step, K micro-steps of accumulation, per-rank batch b per
optimizer step, micro-batch m = b / K):

    compute(ms)  = K·(forward(m) + backward(m)) + optimizer + overhead(b)
    step(ms)     = compute + exposed_comm
    throughput   = n·b / step                       (samples/s, global)
    speedup      = X(n) / X(1)                      strong (global batch fixed): = T(1) / T(n) for the same work
                                                    weak (per-rank batch fixed): the throughput ratio
    efficiency   = speedup / n                      weak: = X(n) / (n·X(1))  (DESIGN "Measurement definitions")

forward and backward are fitted per micro-step as c0 + c1·m, the optimizer as a constant, overhead (data wait,
host→device copy, other) as c0 + c1·b. Communication comes from `scalelab.analysis.hardware`; how much of it the
step sees depends on the sync strategy (`sync_cost`). The model assumes each rank has its own device and that
compute per sample does not change with n (fit it from runs without communication: one rank or sync=noop; in DDP
runs the backward span also holds the wait for the last buckets).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalelab.analysis.hardware import Hardware, collective_time, nnls, placement
from scalelab.errors import ConfigError

MIB = 1024 * 1024
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES: DDP caps its first bucket at 1 MiB
STRATEGIES = ("ddp", "bucketed", "allreduce", "gather_scatter", "noop")
COMPRESSION = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # bytes on the wire per fp32 gradient byte
COLUMNS = ["workers", "nodes", "per_rank_batch", "compute(ms)", "comm(ms)", "exposed_comm(ms)", "step(ms)",
           "throughput(samples/s)", "speedup", "efficiency"]


# ---------------------------------------------------------------- compute

@dataclass(frozen=True)
class Linear:
    """time(ms) = c0 + c1·b with c0 in ms and c1 in ms per sample."""

    c0: float
    c1: float = 0.0

    def __call__(self, batch: float) -> float:
        return self.c0 + self.c1 * batch


def fit_compute(per_rank_batch, time_ms, *, constant: bool = False) -> Linear:
    """Least squares time(ms) = c0 + c1·b with c0, c1 >= 0 over measured (batch, time) rows; `constant` fits c0
    alone (the mean), for stages whose time does not depend on the batch (the optimizer)."""
    b, t = np.asarray(per_rank_batch, float), np.asarray(time_ms, float)
    if b.shape != t.shape or not len(b):
        raise ValueError(f"fit_compute needs one time per batch size (got {b.shape} and {t.shape})")
    if constant:
        return Linear(max(0.0, float(t.mean())), 0.0)
    c0, c1 = nnls(np.column_stack([np.ones_like(b), b]), t)
    return Linear(float(c0), float(c1))


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    """Per-rank compute of one optimizer step (see the module docstring for the formula)."""

    forward: Linear  # per micro-step, b = micro-batch per rank
    backward: Linear  # per micro-step
    optimizer: Linear  # per optimizer step, constant
    overhead: Linear = Linear(0.0)  # data + h2d + other per optimizer step, b = per-rank batch

    def step_ms(self, per_rank_batch: float, accumulate: int = 1) -> float:
        micro = per_rank_batch / accumulate
        return (accumulate * (self.forward(micro) + self.backward(micro)) + self.optimizer(0)
                + self.overhead(per_rank_batch))


def _stage(frame: pd.DataFrame, stage: str) -> pd.Series | None:
    for col in (f"stage/{stage}(ms)", f"{stage}(ms)"):
        if col in frame:
            return frame[col].astype(float)
    return None


def fit_compute_model(frame: pd.DataFrame) -> ComputeModel:
    """ComputeModel from one row per measured run: per_rank_batch (or global_batch and ranks, optional nnodes),
    optional accumulate, and stage times per optimizer step in ms as stage/<s>(ms) (the summary keys) or
    <s>(ms). forward and backward are divided by accumulate (the spans sum the micro-steps)."""
    k = frame["accumulate"].astype(float) if "accumulate" in frame else pd.Series(1.0, index=frame.index)
    if "per_rank_batch" in frame:
        batch = frame["per_rank_batch"].astype(float)
    elif {"global_batch", "ranks"} <= set(frame.columns):
        nodes = frame["nnodes"].astype(float) if "nnodes" in frame else 1.0
        batch = frame["global_batch"].astype(float) / (frame["ranks"].astype(float) * nodes)
    else:
        raise ConfigError("frame", list(frame.columns), "needs per_rank_batch, or global_batch and ranks")
    parts = {}
    for stage in ("forward", "backward", "optimizer"):
        times = _stage(frame, stage)
        if times is None:
            raise ConfigError("frame", list(frame.columns), f"needs stage/{stage}(ms) or {stage}(ms)")
        parts[stage] = times
    extra = [t for t in (_stage(frame, s) for s in ("data", "h2d", "other")) if t is not None]
    overhead = fit_compute(batch, sum(extra)) if extra else Linear(0.0)
    return ComputeModel(forward=fit_compute(batch / k, parts["forward"] / k),
                        backward=fit_compute(batch / k, parts["backward"] / k),
                        optimizer=fit_compute(batch, parts["optimizer"], constant=True), overhead=overhead)


def compute_frame(runs: list[dict]) -> pd.DataFrame:
    """Stored runs ({config, summary}) → the rows `fit_compute_model` reads."""
    rows = [{"per_rank_batch": r["config"]["global_batch"] / (r["config"].get("ranks", 1) *
                                                               r["config"].get("nnodes", 1)),
             "accumulate": r["config"].get("accumulate", 1), **(r.get("summary") or {})} for r in runs]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- communication and overlap

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


def sync_cost(strategy: str, *, param_bytes: Sequence[float], n: int, hardware: Hardware, backward_s: float,
              bucket_bytes: float = 25 * MIB, compression: str = "none",
              algorithm: str | None = None, emulation: "Emulation | None" = None) -> SyncCost:
    """Communication of one optimizer step, in s. S_p = bytes of parameter p's gradient × compression factor.

    noop            0 (the ablation baseline).
    allreduce       Σ_p T_allreduce(S_p), one blocking collective per parameter after backward: nothing is
                    hidden, and the latency term is paid once per parameter.
    gather_scatter  Σ_p [T_gather(n·S_p) + T_scatter(n·S_p)] = Σ_p 2[(n−1)α + (n−1)·S_p·β]: the root moves
                    every piece, so its bandwidth term grows with n; nothing is hidden.
    bucketed / ddp  buckets (`bucket_sizes`; ddp's first bucket is capped at 1 MiB) are all-reduced as they
                    become ready during backward (`launch_times`, with hardware.overlap); exposed by
                    `exposed_after_overlap`.
    compression     fp16 / bf16 halve the bytes (fp32 gradients assumed); any strategy, as a what-if.
    With accumulation, sync happens once per optimizer step and overlaps only the last micro-step's backward:
    pass that micro-step's backward as `backward_s`. n = 1 costs 0.
    emulation       scalelab's network emulation (`Emulation`): see `emulated_sync_cost`.
    """
    if strategy not in STRATEGIES:
        raise ConfigError("strategy", strategy, f"allowed: {', '.join(STRATEGIES)}")
    if compression not in COMPRESSION:
        raise ConfigError("compression", compression, f"allowed: {', '.join(COMPRESSION)}")
    factor = COMPRESSION[compression]
    sizes = [b * factor for b in param_bytes]
    if strategy == "noop" or n == 1:
        return SyncCost(0.0, 0.0, 0)
    if emulation is not None and emulation.active:
        return emulated_sync_cost(strategy, sizes=sizes, param_bytes=param_bytes, factor=factor, n=n,
                                  hardware=hardware, backward_s=backward_s, bucket_bytes=bucket_bytes,
                                  algorithm=algorithm, emulation=emulation)
    if strategy == "allreduce":
        comm = sum(collective_time("allreduce", s, n, hardware, algorithm) for s in sizes)
        return SyncCost(comm, comm, len(sizes))
    if strategy == "gather_scatter":
        comm = sum(collective_time(op, n * s, n, hardware) for s in sizes for op in ("gather", "scatter"))
        return SyncCost(comm, comm, 2 * len(sizes))
    buckets, comms, _, start = _overlapped_buckets(strategy, param_bytes, factor, bucket_bytes, n, hardware,
                                                   algorithm, backward_s)
    return SyncCost(sum(comms), exposed_after_overlap(start, comms, backward_s), len(buckets))


def _overlapped_buckets(strategy: str, param_bytes: Sequence[float], factor: float, bucket_bytes: float, n: int,
                        hardware: Hardware, algorithm: str | None, backward_s: float):
    """(bucket bytes on the wire, their all-reduce times, ready times, start times) for bucketed / ddp."""
    # buckets are cut on the gradients' own bytes; a compression hook shrinks each bucket on the wire
    first = DDP_FIRST_BUCKET_BYTES if strategy == "ddp" else None
    buckets = [b * factor for b in bucket_sizes(param_bytes, bucket_bytes, first_bucket_bytes=first)]
    comms = [collective_time("allreduce", s, n, hardware, algorithm) for s in buckets]
    return (buckets, comms, *launch_times(buckets, backward_s, hardware.overlap))


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


def emulated_sync_cost(strategy: str, *, sizes: Sequence[float], param_bytes: Sequence[float], factor: float,
                       n: int, hardware: Hardware, backward_s: float, bucket_bytes: float,
                       algorithm: str | None, emulation: Emulation) -> SyncCost:
    """`sync_cost` under emulation; `sizes` are the per-parameter bytes on the wire (compression applied).

    allreduce       Σ_p max(T_allreduce(S_p), L + S_p/bw): blocking, one after another.
    gather_scatter  Σ_p Σ_{gather, scatter} max(T_op(n·S_p), L + (n−1)·S_p/bw): the root's wire bytes are the
                    largest and every rank waits for it.
    bucketed / ddp  `completion_with_floors` on the buckets; comm = Σ (completion_i − ready_i) (the meter's
                    record), exposed = max(0, last completion − backward).
    """
    if strategy == "allreduce":
        comm = sum(max(collective_time("allreduce", s, n, hardware, algorithm), emulation.floor_s(s)) for s in sizes)
        return SyncCost(comm, comm, len(sizes))
    if strategy == "gather_scatter":
        comm = sum(max(collective_time(op, n * s, n, hardware), emulation.floor_s((n - 1) * s))
                   for s in sizes for op in ("gather", "scatter"))
        return SyncCost(comm, comm, 2 * len(sizes))
    buckets, comms, ready, start = _overlapped_buckets(strategy, param_bytes, factor, bucket_bytes, n, hardware,
                                                       algorithm, backward_s)
    done = completion_with_floors(ready, comms, [emulation.floor_s(s) for s in buckets], start)
    comm = sum(d - r for d, r in zip(done, ready))
    return SyncCost(comm, max(0.0, max(done, default=0.0) - backward_s), len(buckets))


def param_list(param_bytes: int | float | Sequence[float], n_params: int | None = None) -> list[float]:
    """Per-parameter gradient bytes: a sequence as given, or a total split evenly over `n_params` tensors."""
    if isinstance(param_bytes, (int, float)):
        count = n_params or 1
        if param_bytes < 0 or count < 1:
            raise ConfigError("param_bytes", param_bytes, "allowed: bytes >= 0 over n_params >= 1 tensors")
        return [param_bytes / count] * count
    return [float(b) for b in param_bytes]


# ---------------------------------------------------------------- prediction

def predict(model: ComputeModel, hardware: Hardware, workers: Sequence[int], *,
            param_bytes: int | float | Sequence[float], n_params: int | None = None,
            per_rank_batch: float | None = None, global_batch: float | None = None, mode: str = "strong",
            strategy: str = "ddp", bucket_bytes: float = 25 * MIB, compression: str = "none",
            accumulate: int = 1, algorithm: str | None = None,
            emulation: Emulation | None = None, compute_scale: float = 1.0) -> pd.DataFrame:
    """Predicted step time, throughput, speedup and efficiency per worker count (columns `COLUMNS`).

    mode "strong" keeps `global_batch` (per-rank batch = global / n, may be fractional; every rank needs at
    least one sample per micro-step); "weak" keeps `per_rank_batch`. The n = 1 baseline is computed even when 1
    is not in `workers`. Formulas: module docstring, `sync_cost`, `scalelab.analysis.hardware`. `emulation`
    pads every collective as scalelab's network emulation does (`Emulation`, `emulated_sync_cost`).
    `compute_scale` multiplies compute (and the backward that overlap hides behind) wherever collectives run
    (n > 1, strategy not noop): on a CPU host whose collectives share the cores and caches with compute, a rank
    computes slower than it does without communication; 1 (the default) for devices with their own links.
    """
    if mode not in ("strong", "weak"):
        raise ConfigError("mode", mode, "allowed: strong, weak")
    if accumulate < 1:
        raise ConfigError("accumulate", accumulate, "allowed: an integer >= 1")
    batch_name, batch = ("global_batch", global_batch) if mode == "strong" else ("per_rank_batch", per_rank_batch)
    if batch is None or batch <= 0:
        raise ConfigError(batch_name, batch, f"required with mode {mode}: a number > 0")
    ns = [int(n) for n in workers]
    if not ns or min(ns) < 1:
        raise ConfigError("workers", list(workers), "allowed: worker counts >= 1")
    if not math.isfinite(compute_scale) or compute_scale <= 0:
        raise ConfigError("compute_scale", compute_scale, "allowed: a number > 0")
    if mode == "strong" and batch / (max(ns) * accumulate) < 1:
        raise ConfigError("workers", max(ns), f"strong scaling with global_batch {batch} and accumulate "
                          f"{accumulate} allows at most {int(batch // accumulate)} workers")
    params = param_list(param_bytes, n_params)

    def row(n: int) -> dict:
        b = batch / n if mode == "strong" else batch
        scale = compute_scale if n > 1 and strategy != "noop" else 1.0
        compute = scale * model.step_ms(b, accumulate)
        cost = sync_cost(strategy, param_bytes=params, n=n, hardware=hardware,
                         backward_s=scale * model.backward(b / accumulate) / 1e3, bucket_bytes=bucket_bytes,
                         compression=compression, algorithm=algorithm, emulation=emulation)
        step = compute + 1e3 * cost.exposed_s
        return {"workers": n, "nodes": placement(n, hardware.gpus_per_node)[0], "per_rank_batch": b,
                "compute(ms)": compute, "comm(ms)": 1e3 * cost.comm_s, "exposed_comm(ms)": 1e3 * cost.exposed_s,
                "step(ms)": step, "throughput(samples/s)": n * b / (step / 1e3) if step > 0 else math.inf}

    base = row(1)["throughput(samples/s)"]
    frame = pd.DataFrame([row(n) for n in ns], columns=COLUMNS[:-2])
    frame["speedup"] = frame["throughput(samples/s)"] / base
    frame["efficiency"] = frame["speedup"] / frame["workers"]
    return frame


def efficiency_threshold(pred: pd.DataFrame, threshold: float = 0.5) -> int | None:
    """The smallest worker count whose efficiency is below `threshold` (None when none is)."""
    below = pred[pred["efficiency"] < threshold]
    return int(below["workers"].min()) if len(below) else None


def options_for_efficiency(model: ComputeModel, hardware: Hardware, workers: int, *, target: float = 0.5,
                           per_rank_batches: Sequence[float], strategies: Sequence[str] = STRATEGIES[:-1],
                           **kwargs) -> pd.DataFrame:
    """Which per-rank batch (from the candidates) and strategy keep weak-scaling efficiency X(N)/(N·X(1)) >=
    `target` at N = `workers`: one row per pair (strategy, per_rank_batch, efficiency, step(ms),
    throughput(samples/s), meets_target), those meeting the target first, then the smallest batch, then the
    highest efficiency. `kwargs` go to `predict` (param_bytes, bucket_bytes, compression, ...)."""
    rows = []
    for strategy in strategies:
        for b in per_rank_batches:
            p = predict(model, hardware, [workers], per_rank_batch=b, mode="weak", strategy=strategy,
                        **kwargs).iloc[0]
            rows.append({"strategy": strategy, "per_rank_batch": b, "efficiency": p["efficiency"],
                         "step(ms)": p["step(ms)"], "throughput(samples/s)": p["throughput(samples/s)"],
                         "meets_target": bool(p["efficiency"] >= target)})
    frame = pd.DataFrame(rows)
    order = frame.assign(_miss=~frame["meets_target"], _eff=-frame["efficiency"])
    order = order.sort_values(["_miss", "per_rank_batch", "_eff"], kind="stable")
    return order.drop(columns=["_miss", "_eff"]).reset_index(drop=True)


# ---------------------------------------------------------------- validation

def validate(predicted: pd.DataFrame, measured: pd.DataFrame, keys: Sequence[str], *,
             predicted_col: str = "step(ms)", measured_col: str | None = None) -> pd.DataFrame:
    """Predicted vs measured at the points both have (inner join on `keys`): columns *keys, predicted, measured,
    error(%) = 100·(predicted − measured)/measured. attrs["median_abs_error(%)"] = median |error(%)|."""
    measured_col = measured_col or (predicted_col if predicted_col in measured else "time/step_median(ms)")
    for frame, col, name in ((predicted, predicted_col, "predicted_col"), (measured, measured_col, "measured_col")):
        if col not in frame:
            raise ConfigError(name, col, f"allowed: a column of the frame ({', '.join(map(str, frame.columns))})")
    left = predicted[list(keys) + [predicted_col]].rename(columns={predicted_col: "predicted"})
    right = measured[list(keys) + [measured_col]].rename(columns={measured_col: "measured"})
    out = left.merge(right, on=list(keys), how="inner")
    with np.errstate(divide="ignore", invalid="ignore"):
        out["error(%)"] = 100.0 * (out["predicted"] - out["measured"]) / out["measured"].where(out["measured"] != 0)
    out.attrs["median_abs_error(%)"] = median_abs_error(out)
    return out


def median_abs_error(frame: pd.DataFrame) -> float:
    """Median of |error(%)| over the points of a `validate` frame (NaN when there are none)."""
    return float(frame["error(%)"].abs().median()) if len(frame) else math.nan
