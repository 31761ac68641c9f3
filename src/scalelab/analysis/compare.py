"""Gradient-sync strategies and backends side by side (pure): one row per sync variant or backend.

Definitions (DESIGN.md, "Measurement definitions"):
- step = the run's median timed step (min and max beside it); compute = the median step of the no-op run of the
  same config (no gradient sync at all: the ablation baseline);
- comm = time inside collectives as the caller sees it (summary comm/time(ms); async collectives may overlap
  compute and each other); blocking comm = the loop's "comm" span (comm/blocking(ms));
- exposed comm = step - compute, clipped at 0 (as scalelab.analysis.scaling.add_exposed_comm: a negative
  difference is noise between two runs); overlap = 1 - exposed / comm (empty when comm is 0). Overlap below 0
  means the sync costs more than its collectives (casts, copies, rank 0's averaging);
- bytes are payload bytes per step as the CommMeter counts them (scalelab.sync.meter), averaged over ranks;
  loopback bytes are what the host's loopback interface carried per step (all ranks, from the system sampler).

Inputs are stored runs as dicts {run_id, config, summary, status, reason}; a backend that could not run is a dict
{backend, status: "skipped", reason}. The sync variant of a run and the variants' order are given by the caller
(they come from scalelab.sync.registry, a layer above this one).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from scalelab.analysis import keys

BACKENDS = ("gloo", "nccl", "mpi")

# table column -> summary key (scalelab.analysis.summary)
SUMMARY_COLUMNS = {
    "step(ms)": keys.STEP_MEDIAN_MS, "step_min(ms)": keys.STEP_MIN_MS, "step_max(ms)": keys.STEP_MAX_MS,
    "comm(ms)": keys.COMM_TIME_MS, "comm_blocking(ms)": keys.COMM_BLOCKING_MS,
    "collectives_per_step": keys.COMM_COLLECTIVES_PER_STEP, "bytes_per_step": keys.COMM_BYTES_PER_STEP,
    "bytes_forward_per_step": keys.COMM_BYTES_FORWARD_PER_STEP,
    "bytes_backward_per_step": keys.COMM_BYTES_BACKWARD_PER_STEP,
    "bytes_optimizer_per_step": keys.COMM_BYTES_OPTIMIZER_PER_STEP,
    "algbw(GB/s)": keys.COMM_ALGBW, "busbw(GB/s)": keys.COMM_BUSBW,
    "loopback_bytes_per_step": keys.COMM_LOOPBACK_BYTES_PER_STEP, "train_loss": keys.TRAIN_LOSS,
    "timed_steps": keys.STEPS_TIMED,
}
STRATEGY_COLUMNS = ["sync", "status", "reason", "sync_config", "ddp_hook", "accumulate", "micro_batch_per_rank",
                    "global_batch", "timed_steps", "step(ms)", "step_min(ms)", "step_max(ms)", "compute(ms)",
                    "comm(ms)", "comm_blocking(ms)", "exposed_comm(ms)", "overlap", "collectives_per_step",
                    "bytes_per_step", "bytes_forward_per_step", "bytes_backward_per_step",
                    "bytes_optimizer_per_step", "algbw(GB/s)", "busbw(GB/s)", "loopback_bytes_per_step",
                    "loopback/payload", "train_loss", "run_id", "noop_run_id"]
BACKEND_COLUMNS = ["backend", "status", "reason", "sync", "timed_steps", "step(ms)", "step_min(ms)",
                   "step_max(ms)", "compute(ms)", "comm(ms)", "comm_blocking(ms)", "exposed_comm(ms)", "overlap",
                   "busbw(GB/s)", "algbw(GB/s)", "collectives_per_step", "bytes_per_step", "bytes_forward_per_step",
                   "bytes_backward_per_step", "bytes_optimizer_per_step", "loopback_bytes_per_step",
                   "loopback/payload", "train_loss", "run_id", "noop_run_id"]


def exposed_comm(step_ms: float | None, noop_step_ms: float | None) -> float | None:
    """Step time with real sync minus step time with no sync (the ablation), clipped at 0."""
    if _missing(step_ms) or _missing(noop_step_ms):
        return None
    return max(0.0, step_ms - noop_step_ms)


def overlap(exposed_ms: float | None, comm_ms: float | None) -> float | None:
    """1 - exposed / time inside collectives; None without communication."""
    if _missing(exposed_ms) or _missing(comm_ms) or comm_ms <= 0:
        return None
    return 1.0 - exposed_ms / comm_ms


def run_metrics(run: dict) -> dict:
    """The comparison's metric columns of one stored run (None where the summary lacks a key)."""
    summary = run.get("summary") or {}
    out = {col: summary.get(key) for col, key in SUMMARY_COLUMNS.items()}
    payload, loop = out["bytes_per_step"], out["loopback_bytes_per_step"]
    out["loopback/payload"] = loop / payload if not _missing(loop) and not _missing(payload) and payload > 0 else None
    return out


def with_baseline(row: dict, noop: dict | None) -> dict:
    """Add compute (the noop run's median step), exposed comm and overlap to a row of run_metrics."""
    compute = (noop or {}).get("summary", {}) or {}
    row["compute(ms)"] = compute.get(keys.STEP_MEDIAN_MS)
    row["noop_run_id"] = (noop or {}).get("run_id")
    row["exposed_comm(ms)"] = exposed_comm(row.get("step(ms)"), row["compute(ms)"])
    row["overlap"] = overlap(row["exposed_comm(ms)"], row.get("comm(ms)"))
    return row


def strategies_table(runs: list[dict], noop_runs: list[dict], *, variant_of: Callable[[dict], str],
                     order: Sequence[str]) -> pd.DataFrame:
    """One row per run (column sync: the variant `variant_of(config)`; sync_config: the config's sync value), in
    `order`; each against the noop run with the same accumulation."""
    baselines = {r["config"].get("accumulate", 1): r for r in noop_runs if r.get("status", "completed") == "completed"}
    rows = []
    for run in runs:
        c = run["config"]
        k = c.get("accumulate", 1)
        row = {"sync": variant_of(c), "status": run.get("status", "completed"), "reason": run.get("reason"),
               "sync_config": c.get("sync"), "ddp_hook": c.get("ddp_hook", "none"), "accumulate": k,
               "micro_batch_per_rank": c["global_batch"] // (c["ranks"] * c.get("nnodes", 1)) / k,
               "global_batch": c["global_batch"], "run_id": run["run_id"], **run_metrics(run)}
        rows.append(with_baseline(row, baselines.get(k)))
    frame = pd.DataFrame(rows, columns=STRATEGY_COLUMNS)
    rank = {s: i for i, s in enumerate(order)}
    frame = frame.sort_values("sync", key=lambda s: s.map(rank), kind="stable")
    return frame.reset_index(drop=True)


def backends_table(entries: list[dict], noop_runs: list[dict]) -> pd.DataFrame:
    """One row per backend (BACKENDS order): a run against the noop run of the same backend, or a skip reason."""
    baselines = {r["config"]["backend"]: r for r in noop_runs if r.get("status", "completed") == "completed"}
    rows = []
    for entry in entries:
        if "config" not in entry:  # a backend that cannot run here
            rows.append({"backend": entry["backend"], "status": entry["status"], "reason": entry["reason"]})
            continue
        c = entry["config"]
        row = {"backend": c["backend"], "status": entry.get("status", "completed"), "reason": entry.get("reason"),
               "sync": c.get("sync"), "run_id": entry["run_id"], **run_metrics(entry)}
        rows.append(with_baseline(row, baselines.get(c["backend"])))
    frame = pd.DataFrame(rows, columns=BACKEND_COLUMNS)
    order = {b: i for i, b in enumerate(BACKENDS)}
    frame = frame.sort_values("backend", key=lambda s: s.map(order), kind="stable")
    return frame.reset_index(drop=True)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
