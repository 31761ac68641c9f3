"""Scaling arithmetic (pure): speedup, efficiency, skew, compute vs communication per cell.

- strong scaling keeps the global batch: speedup(N) = T(1) / T(N) for the same work (one epoch), efficiency =
  speedup / N;
- weak scaling keeps the per-worker batch: compare throughput, efficiency = X(N) / (N * X(1)), speedup = X(N) / X(1).
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys

COMM_METRICS = [keys.COMM_TIME_MS, keys.COMM_BLOCKING_MS, keys.COMM_BYTES_PER_STEP, keys.COMM_ALGBW,
                keys.COMM_BUSBW, keys.COMM_COLLECTIVES_PER_STEP, keys.COMM_LOOPBACK_BYTES_PER_STEP]


def strong_speedup(t1: float, tn: float) -> float:
    return t1 / tn


def weak_efficiency(x1: float, xn: float, n: int) -> float:
    return xn / (n * x1)


def scaling_table(runs: list[dict], mode: str) -> pd.DataFrame:
    """One row per (workers, batch): epoch time, throughput, speedup and efficiency against 1 worker.

    `mode` "strong": cells share a global batch, the baseline is the 1-worker run of that global batch.
    `mode` "weak": cells share a per-worker batch, the baseline is the 1-worker run of that per-worker batch.
    """
    rows = []
    for run in runs:
        c, s = run["config"], run["summary"] or {}
        workers = c["ranks"] * c.get("nnodes", 1)
        rows.append({"run_id": run["run_id"], "workers": workers, "global_batch": c["global_batch"],
                     "per_worker_batch": c["global_batch"] // workers,
                     "epoch(s)": s.get(keys.EPOCH_S), "step(ms)": s.get(keys.STEP_MEDIAN_MS),
                     "step_min(ms)": s.get(keys.STEP_MIN_MS), "step_max(ms)": s.get(keys.STEP_MAX_MS),
                     keys.THROUGHPUT: s.get(keys.THROUGHPUT),
                     "compute(ms)": compute_ms(s), "skew(slowest/median)": s.get(keys.SKEW),
                     **{m: s.get(m) for m in COMM_METRICS}})
    frame = pd.DataFrame(rows)
    if not len(frame):
        return frame
    key = "global_batch" if mode == "strong" else "per_worker_batch"
    speedups, effs = [], []
    for row in frame.itertuples():
        base = frame[(frame[key] == getattr(row, key)) & (frame["workers"] == 1)]
        if not len(base):
            speedups.append(None)
            effs.append(None)
        elif mode == "strong":  # the same work (an epoch at this global batch) on 1 and on N workers
            sp = strong_speedup(base["epoch(s)"].iloc[0], frame.at[row.Index, "epoch(s)"])
            speedups.append(sp)
            effs.append(sp / row.workers)
        else:
            x1, xn = base[keys.THROUGHPUT].iloc[0], frame.at[row.Index, keys.THROUGHPUT]
            speedups.append(xn / x1)
            effs.append(weak_efficiency(x1, xn, row.workers))
    frame["speedup"] = speedups
    frame["efficiency"] = effs
    frame.insert(1, "mode", mode)
    return frame.sort_values([key, "workers"], kind="stable").reset_index(drop=True)


def add_exposed_comm(table: pd.DataFrame, ablation: list[dict]) -> pd.DataFrame:
    """Exposed communication per cell = step time with real sync - step time of the same cell with no sync.

    `ablation` are the `noop` runs of the same cells (same workers and global batch); overlap = 1 - exposed / comm.
    """
    noop = {(r["config"]["ranks"] * r["config"].get("nnodes", 1), r["config"]["global_batch"]):
            (r["summary"] or {}).get(keys.STEP_MEDIAN_MS) for r in ablation}
    table = table.copy()
    table["step_no_sync(ms)"] = [noop.get((w, b)) for w, b in zip(table["workers"], table["global_batch"])]
    table["exposed_comm(ms)"] = (table["step(ms)"] - table["step_no_sync(ms)"]).clip(lower=0)
    comm = table[keys.COMM_TIME_MS].astype(float)
    table["overlap"] = (1 - table["exposed_comm(ms)"] / comm).where(comm > 0)
    return table


def compute_ms(summary: dict) -> float | None:
    """Forward + backward + optimizer per step (with DDP, backward's span also holds the exposed wait)."""
    parts = [summary.get(keys.stage_ms(s)) for s in ("forward", "backward", "optimizer")]
    return None if any(p is None for p in parts) else sum(parts)
