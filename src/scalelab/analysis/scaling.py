"""Scaling arithmetic (pure): speedup, efficiency, skew, compute vs communication per cell.

- strong scaling keeps the global batch: speedup(N) = T(1) / T(N) for the same work (one epoch), efficiency =
  speedup / N;
- weak scaling keeps the per-worker batch: compare throughput, efficiency = X(N) / (N * X(1)), speedup = X(N) / X(1).

Speedup and efficiency carry 95 % intervals from both sides' intervals (epoch times in strong scaling, throughputs
in weak; scalelab.analysis.intervals.ratio_interval); efficiency is the headline: `n` (timed steps of the cell),
`efficiency_ci_low`, `efficiency_ci_high` follow it (every interval is named after its figure:
scalelab.analysis.tables.figure_of).
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.breakdown import baseline_step_ms
from scalelab.analysis.compare import exposed_with_interval, faster_than_link, run_quality, worst_quality
from scalelab.analysis.intervals import ratio_interval
from scalelab.analysis.repeats import LAUNCH_MEDIANS, LAUNCHES, WITHIN_DOF, WITHIN_VAR

COMM_METRICS = [keys.COMM_TIME_MS, keys.COMM_SUM_MS, keys.COMM_WAIT_MS, keys.COMM_BLOCKING_MS, keys.COMM_CRITICAL_MS,
                keys.COMM_PEERS_WAIT_MS, keys.COMM_BYTES_PER_STEP, keys.COMM_ALGBW,
                keys.COMM_BUSBW, keys.COMM_COLLECTIVES_PER_STEP, keys.COMM_LOOPBACK_BYTES_PER_STEP]
EFFICIENCY_CI = ("efficiency_ci_low", "efficiency_ci_high")  # named after their figure, as every interval
RATE_CI = ["epoch_ci_low(s)", "epoch_ci_high(s)", *keys.ci_keys(keys.THROUGHPUT)]


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
                     "per_worker_batch": c["global_batch"] // workers, "launches": s.get(LAUNCHES, 1),
                     "epoch(s)": s.get(keys.EPOCH_S), "step(ms)": s.get(keys.STEP_MEDIAN_MS),
                     "step_min(ms)": s.get(keys.STEP_MIN_MS), "step_max(ms)": s.get(keys.STEP_MAX_MS),
                     "step_ci_low(ms)": s.get(keys.STEP_MEDIAN_CI_LOW_MS),
                     "step_ci_high(ms)": s.get(keys.STEP_MEDIAN_CI_HIGH_MS),
                     keys.THROUGHPUT: s.get(keys.THROUGHPUT),
                     **{column: s.get(k) for column, k in zip(RATE_CI, (*keys.ci_keys(keys.EPOCH_S),
                                                                        *keys.ci_keys(keys.THROUGHPUT)))},
                     "compute(ms)": None, "skew(slowest/median)": s.get(keys.SKEW),
                     **{k: s.get(k) for k in (LAUNCH_MEDIANS, WITHIN_VAR, WITHIN_DOF)},  # the noise model's inputs
                     **{m: s.get(m) for m in COMM_METRICS}})
    frame = pd.DataFrame(rows)
    if not len(frame):
        return frame
    key = "global_batch" if mode == "strong" else "per_worker_batch"
    speedups, effs, references = [], [], []
    for row in frame.itertuples():
        base = frame[(frame[key] == getattr(row, key)) & (frame["workers"] == 1)]
        references.append(base["run_id"].iloc[0] if len(base) else None)
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
    frame[["speedup_ci_low", "speedup_ci_high"]] = [speedup_interval(frame, row, key, mode)
                                                    for row in frame.itertuples()]
    frame["efficiency"] = effs
    frame["reference_run_id"] = references  # the 1-worker run speedup and efficiency are relative to
    frame["run_ids"] = [",".join(r.get("run_ids") or [r["run_id"]]) for r in runs]  # the cell's launches
    frame["n"] = [(r["summary"] or {}).get(keys.STEPS_TIMED) for r in runs]
    frame[EFFICIENCY_CI[0]] = frame["speedup_ci_low"] / frame["workers"]
    frame[EFFICIENCY_CI[1]] = frame["speedup_ci_high"] / frame["workers"]
    own = {run["run_id"]: worst_quality(faster_than_link(run), run_quality(run["summary"] or {})) for run in runs}
    frame["quality"] = [worst_quality(efficiency_quality(e, lo), own.get(rid))
                        for e, lo, rid in zip(frame["efficiency"], frame[EFFICIENCY_CI[0]], frame["run_id"])]
    frame.insert(1, "mode", mode)
    return frame.sort_values([key, "workers"], kind="stable").reset_index(drop=True)


def speedup_interval(frame: pd.DataFrame, row, key: str, mode: str) -> tuple[float, float]:
    """95 % interval of a cell's speedup over its 1-worker baseline: T1 / TN from the epoch times' intervals
    (strong: the same work), XN / X1 from the throughputs' (weak)."""
    base = frame[(frame[key] == getattr(row, key)) & (frame["workers"] == 1)]
    if not len(base):
        return math.nan, math.nan
    low, high = RATE_CI[:2] if mode == "strong" else RATE_CI[2:]
    one = (base[low].iloc[0], base[high].iloc[0])
    cell = (frame.at[row.Index, low], frame.at[row.Index, high])
    if any(v is None or pd.isna(v) for v in (*one, *cell)):
        return math.nan, math.nan
    return ratio_interval(one, cell) if mode == "strong" else ratio_interval(cell, one)


SUPERLINEAR = "superlinear"


def efficiency_quality(efficiency: float | None, low: float | None) -> str | None:
    """A speedup above N (efficiency above 1) beyond its interval is real often enough (each worker's share of the
    data and model fits a cache the whole did not; more threads in all) to be kept, but never unremarked: it is
    flagged "superlinear", a finding of its own, not an error."""
    if efficiency is None or pd.isna(efficiency):
        return None
    if low is not None and not pd.isna(low) and low > 1:
        return f"{SUPERLINEAR}: speedup above the worker count beyond its interval (efficiency {100 * low:.0f} % at least)"
    return "ok"


def add_exposed_comm(table: pd.DataFrame, runs: list[dict], baselines: list[dict]) -> pd.DataFrame:
    """Per cell: compute = the median step of its baseline (the same config with no-op collectives) at its fastest
    rank; exposed communication = step - compute; hidden = waiting + wire - exposed and overlap = hidden / (waiting
    + wire), one interval; interference; all with intervals and a quality flag, never clipped: the one definition
    of scalelab.analysis.breakdown.exposed_figures, which the breakdown reads too
    (scalelab.analysis.compare.exposed_with_interval).

    `runs` are the table's runs, `baselines` the completed baseline runs of the same cells (same workers and global
    batch); 1-worker cells have none.
    """
    def cell(r: dict) -> tuple[int, int]:
        return r["config"]["ranks"] * r["config"].get("nnodes", 1), r["config"]["global_batch"]

    base = {cell(r): r for r in baselines}
    summaries = {r["run_id"]: r["summary"] or {} for r in runs}
    rows = []
    for run_id, workers, batch in zip(table["run_id"], table["workers"], table["global_batch"]):
        b = base.get((workers, batch))
        b_summary = (b or {}).get("summary") or {}
        summary = summaries.get(run_id, {})
        critical = summary.get(keys.COMM_CRITICAL_MS)  # on the critical path where measured (one host)
        comm, high = (summary.get(keys.COMM_TIME_MS), None) if critical is None else \
            (critical, summary.get(keys.ci_keys(keys.COMM_CRITICAL_MS)[1]))
        rows.append({"compute(ms)": baseline_step_ms(b_summary), "baseline_run_id": (b or {}).get("run_id"),
                     **exposed_with_interval(summary, b_summary, comm, comm_high_ms=high)})
    out = pd.concat([table.drop(columns=["compute(ms)", "quality"], errors="ignore"),
                     pd.DataFrame(rows, index=table.index)], axis=1)
    if "quality" in table:  # the exposed part's flag first, then the efficiency's or the run's own
        out["quality"] = [worst_quality(x, e) for e, x in zip(table["quality"], out["quality"])]
    return out
