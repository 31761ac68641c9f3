"""The performance model (docs/model.md): fitted compute + α-β communication + overlap → step time and scaling.

A step of data parallelism on n ranks (one optimizer step, K micro-steps of accumulation, per-rank batch b per
optimizer step, micro-batch m = b / K):

    compute(ms)  = K·(forward(m) + backward(m)) + optimizer + overhead(b)
    step(ms)     = compute + exposed_comm
    throughput   = n·b / step                       (samples/s, global)
    speedup      = X(n) / X(1)                      strong (global batch fixed): = T(1) / T(n) for the same work
                                                    weak (per-rank batch fixed): the throughput ratio
    efficiency   = speedup / n                      weak: = X(n) / (n·X(1))  (docs/definitions.md)

forward and backward are fitted per micro-step as c0 + c1·m, the optimizer as a constant, overhead (data wait,
host→device copy, other) as c0 + c1·b. Communication comes from `scalelab.analysis.hardware`; how much of it the
step sees depends on the sync strategy (`sync_cost`, which asks the strategy's registry entry). The model assumes each rank has its own device and that
compute per sample does not change with n (fit it from runs without communication: one rank or sync=noop; in DDP
runs the backward span also holds the wait for the last buckets).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scalelab.analysis.keys import STEP_MEDIAN_MS, THROUGHPUT, stage_ms
from scalelab.analysis.hardware import Hardware, placement
from scalelab.perf.hardware import nnls
from scalelab.analysis.synccost import (DDP_FIRST_BUCKET_BYTES, MIB, CostQuery, Emulation,  # noqa: F401 - re-exported
                                        SyncCost, bucket_sizes, completion_with_floors, exposed_after_overlap,
                                        launch_times)
from scalelab.errors import ConfigError
from scalelab.sync import registry
COMPRESSION = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # bytes on the wire per fp32 gradient byte
COLUMNS = ["workers", "nodes", "per_rank_batch", "compute(ms)", "comm(ms)", "exposed_comm(ms)", "step(ms)",
           THROUGHPUT, "speedup", "efficiency"]


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
    for col in (stage_ms(stage), f"{stage}(ms)"):
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

def sync_cost(strategy: str, *, param_bytes: Sequence[float], n: int, hardware: Hardware, backward_s: float,
              bucket_bytes: float = 25 * MIB, compression: str = "none",
              algorithm: str | None = None, emulation: Emulation | None = None) -> SyncCost:
    """Communication of one optimizer step, in s: the cost the sync strategy registered
    (`scalelab.sync.registry`; each strategy's module states its formula). S_p = bytes of parameter p's gradient
    × compression factor.

    compression     fp16 / bf16 halve the bytes (fp32 gradients assumed); any strategy, as a what-if.
    With accumulation, sync happens once per optimizer step and overlaps only the last micro-step's backward:
    pass that micro-step's backward as `backward_s`. n = 1 costs 0.
    emulation       scalelab's network emulation (`Emulation`): every collective takes at least its floor.
    """
    names = modelled_syncs()
    if strategy not in names:
        raise ConfigError("sync", strategy, f"allowed: {', '.join(names)}")
    if compression not in COMPRESSION:
        raise ConfigError("compression", compression, f"allowed: {', '.join(COMPRESSION)}")
    if n == 1:
        return SyncCost(0.0, 0.0, 0)
    query = CostQuery(param_bytes=param_bytes, factor=COMPRESSION[compression], n=n, hardware=hardware,
                      backward_s=backward_s, bucket_bytes=bucket_bytes, algorithm=algorithm, emulation=emulation)
    return registry.get(strategy).cost(query)


def __getattr__(name: str):
    if name == "STRATEGIES":  # read from the registry each time, so a strategy registered later is listed
        return modelled_syncs()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def modelled_syncs() -> tuple[str, ...]:
    """The sync strategies the model can predict (those registered with a cost), in registry order."""
    return tuple(e.name for e in registry.entries() if e.cost is not None)


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
            emulation: Emulation | None = None, compute_scale: float = 1.0,
            alone: ComputeModel | None = None) -> pd.DataFrame:
    """Predicted step time, throughput, speedup and efficiency per worker count (columns `COLUMNS`).

    mode "strong" keeps `global_batch` (per-rank batch = global / n, may be fractional; every rank needs at
    least one sample per micro-step); "weak" keeps `per_rank_batch`. The n = 1 baseline is computed even when 1
    is not in `workers`. Formulas: module docstring, `sync_cost`, `scalelab.analysis.hardware`. `emulation`
    pads every collective as scalelab's network emulation does (`Emulation`, `emulated_sync_cost`).
    `compute_scale` multiplies compute (and the backward that overlap hides behind) wherever collectives run
    (n > 1, strategy not noop): on a CPU host whose collectives share the cores and caches with compute, a rank
    computes slower than it does without communication; 1 (the default) for devices with their own links.
    `alone`: the compute of one rank alone, for the n = 1 row and so the base of speedup and efficiency, where
    `model` is that of ranks sharing a host (default `model`: every rank has a node or device of its own).
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
        return predicted_row(model, hardware, n, b, params=params, strategy=strategy, bucket_bytes=bucket_bytes,
                             compression=compression, accumulate=accumulate, algorithm=algorithm,
                             emulation=emulation, compute_scale=compute_scale, alone=alone)

    base = row(1)[THROUGHPUT]
    frame = pd.DataFrame([row(n) for n in ns], columns=COLUMNS[:-2])
    frame["speedup"] = frame[THROUGHPUT] / base
    frame["efficiency"] = frame["speedup"] / frame["workers"]
    return frame


def predicted_row(model: ComputeModel, hardware: Hardware, n: int, b: float, *, params: Sequence[float],
                  strategy: str, bucket_bytes: float, compression: str, accumulate: int, algorithm: str | None,
                  emulation: Emulation | None, compute_scale: float, alone: ComputeModel | None) -> dict:
    """One row of `predict` (n workers at per-rank batch b), without its speedup and efficiency: what a caller
    that asks many times (a prediction's options under every replica) computes without building frames."""
    scale = compute_scale if n > 1 and strategy != "noop" else 1.0
    ranks = (alone or model) if n == 1 else model
    compute = scale * ranks.step_ms(b, accumulate)
    cost = sync_cost(strategy, param_bytes=params, n=n, hardware=hardware,
                     backward_s=scale * ranks.backward(b / accumulate) / 1e3, bucket_bytes=bucket_bytes,
                     compression=compression, algorithm=algorithm, emulation=emulation)
    step = compute + 1e3 * cost.exposed_s
    return {"workers": n, "nodes": placement(n, hardware.gpus_per_node)[0], "per_rank_batch": b,
            "compute(ms)": compute, "comm(ms)": 1e3 * cost.comm_s, "exposed_comm(ms)": 1e3 * cost.exposed_s,
            "step(ms)": step, THROUGHPUT: n * b / (step / 1e3) if step > 0 else math.inf}


def efficiency_threshold(pred: pd.DataFrame, threshold: float = 0.5) -> int | None:
    """The smallest worker count whose efficiency is below `threshold` (None when none is)."""
    below = pred[pred["efficiency"] < threshold]
    return int(below["workers"].min()) if len(below) else None


def options_for_efficiency(model: ComputeModel, hardware: Hardware | Callable[[str], Hardware], workers: int, *,
                           target: float = 0.5, per_rank_batches: Sequence[float],
                           strategies: Sequence[str] | None = None,
                           **kwargs) -> pd.DataFrame:
    """Which per-rank batch (from the candidates) and strategy keep weak-scaling efficiency X(N)/(N·X(1)) >=
    `target` at N = `workers`: one row per pair (strategy, per_rank_batch, efficiency, step(ms),
    throughput(samples/s), meets_target), those meeting the target first, then the smallest batch, then the
    highest efficiency. `hardware` may be a function of the strategy (a calibration's own hardware, whose
    in-training scale depends on the collectives). `kwargs` go to `predict` (param_bytes, bucket_bytes, ...)."""
    rows = []
    for strategy in strategies if strategies is not None else [s for s in modelled_syncs() if s != "noop"]:
        for b in per_rank_batches:
            hw = hardware if isinstance(hardware, Hardware) else hardware(strategy)
            p = predict(model, hw, [workers], per_rank_batch=b, mode="weak", strategy=strategy,
                        **kwargs).iloc[0]
            rows.append({"strategy": strategy, "per_rank_batch": b, "efficiency": p["efficiency"],
                         "step(ms)": p["step(ms)"], THROUGHPUT: p[THROUGHPUT],
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
    measured_col = measured_col or (predicted_col if predicted_col in measured else STEP_MEDIAN_MS)
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
