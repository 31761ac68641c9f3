"""Pure functions from a run's stored step records to its summary: step time, epoch time, throughput, stages.

Definitions (stated in every report):
- Warm-up steps are excluded from every timing.
- A step's time for the run is the slowest rank's wall time for that step (synchronous data parallelism waits
  for the slowest rank); stage times are averaged over ranks. The fastest rank's time of each step is kept too
  (its median and interval): the lost-speedup breakdown reads it (scalelab.analysis.breakdown).
- Training time of a step = its wall time; evaluation runs after a step ends and is reported on its own (time per
  evaluation). Records of scalelab 0.1 timed evaluation inside the step: their evaluation is subtracted.
- The median step carries a 95 % interval (scalelab.analysis.intervals.median_interval: order statistics widened
  for correlation between consecutive steps). Means over the timed steps (epoch time, each stage, time inside
  collectives) carry the mean's (mean_interval, widened the same way); a rate over such a mean (throughput,
  algbw, busbw: a fixed count of samples or bytes) carries the count over the mean's interval (keys.ci_keys).
  Every one of them is a time or a rate, never below 0: their intervals are built on a log scale
  (`positive=True`), so they never reach below 0 either.
- Precision: the wider side of the median step's interval in % of the median; a run of auto length
  (`steps: auto`) also records its target and whether it reached it (scalelab.analysis.precision).
- Epoch time = mean timed training step time x steps per epoch; without data loading it also subtracts each
  step's data wait.
- Throughput = global samples of the timed steps / their summed step time.
- Communication (runs with a process group): per rank and step, bytes and collective counts as the rank's
  CommMeter recorded them (conventions in scalelab.sync.meter), averaged over ranks, then over timed steps.
  comm/time = the union of the step's collective intervals (may overlap compute, never counted twice); comm/sum =
  their plain sum; comm/wait = from the last gradient produced to the end of the sync (the blocking wait, the same
  meaning for every strategy); comm/blocking = the loop's "comm" span (DDP waits inside backward instead).
  comm/critical = the time inside collectives once every peer had arrived, of the rank that sets the step;
  comm/waiting_for_peers = the most a rank stood inside collectives for a peer that had not arrived (one host
  only: scalelab.analysis.peers).
  algbw = sum of buffer sizes S / summed union time over the timed steps of all ranks; busbw = the same with
  each S weighted by its nccl-tests factor (2(n-1)/n allreduce, (n-1)/n gather/scatter, 1 broadcast).
- Memory by kind (parameters, gradients, optimizer state, saved activations and their backward peak) is measured
  on each rank's first step (scalelab.train.memory); the summary keeps the largest rank's value.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.intervals import mean_interval, median_interval
from scalelab.analysis.keys import STAGES
from scalelab.analysis.noise import noise_summary, timed_window, window_deltas
from scalelab.analysis.peers import step_split, union_seconds
from scalelab.analysis.precision import precision_summary

STAGE_COLUMNS = [f"{s}(s)" for s in (*STAGES, "other")]


def steps_frame(records: list[dict]) -> pd.DataFrame:
    """All ranks' step records as one table (one row per rank and step)."""
    frame = pd.DataFrame.from_records(records)
    for col in ("wall(s)", *STAGE_COLUMNS):
        if col not in frame:
            frame[col] = 0.0
    return frame


def per_step(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per timed step: slowest rank's wall, mean stage times over ranks, global samples."""
    timed = frame[~frame["warmup"].astype(bool)]
    grouped = timed.groupby("step")
    out = grouped[STAGE_COLUMNS].mean()
    out["wall(s)"] = grouped["wall(s)"].max()
    train = (timed["wall(s)"] - timed["eval(s)"]).groupby(timed["step"])
    out["train(s)"] = train.max()
    out["fastest(s)"] = train.min()
    out["data_wait(s)"] = grouped["data(s)"].max()
    out["samples"] = grouped["samples"].sum()
    out["ranks"] = grouped["rank"].nunique()
    return out


def timed_step_ms(records: list[dict]) -> list[float]:
    """The timed steps' training times (ms, in step order) as the summary's median sees them: the slowest rank's."""
    steps = per_step(steps_frame(records)) if records else None
    return [] if steps is None or not len(steps) else [1e3 * float(t) for t in steps["train(s)"]]


def skew(frame: pd.DataFrame) -> float:
    """Slowest rank's total timed wall time over the median rank's (1.0 = perfectly even)."""
    timed = frame[~frame["warmup"].astype(bool)]
    totals = timed.groupby("rank")["wall(s)"].sum()
    return float(totals.max() / totals.median()) if len(totals) and totals.median() > 0 else 1.0


def summarize(records: list[dict], *, steps_per_epoch: int, evals: list[dict] | None = None,
              memory: list[dict] | None = None, system: list[dict] | None = None,
              target_precision: float | None = None, one_clock: bool = True) -> dict:
    """The run's summary metrics; keys carry their unit. `target_precision`: an auto-length run's target;
    `one_clock`: every rank ran on one host (comm_summary)."""
    frame = steps_frame(records)
    steps = per_step(frame)
    out: dict = {keys.STEPS_TIMED: int(len(steps)), keys.STEPS_TOTAL: int(frame["step"].nunique()),
                 keys.STEPS_PER_EPOCH: int(steps_per_epoch)}
    if len(steps):
        wall = steps["train(s)"]
        no_data = wall - steps["data_wait(s)"]
        total, samples = float(wall.sum()), float(steps["samples"].sum())
        low, high = median_interval(wall, positive=True)
        out.update({
            keys.STEP_MEDIAN_MS: 1e3 * float(wall.median()),
            keys.STEP_MEDIAN_CI_LOW_MS: 1e3 * low,
            keys.STEP_MEDIAN_CI_HIGH_MS: 1e3 * high,
            keys.STEP_MIN_MS: 1e3 * float(wall.min()),
            keys.STEP_MAX_MS: 1e3 * float(wall.max()),
            keys.EPOCH_S: float(wall.mean()) * steps_per_epoch,
            keys.EPOCH_NO_DATA_S: float(no_data.mean()) * steps_per_epoch,
            keys.THROUGHPUT: samples / total if total > 0 else 0.0,
            keys.THROUGHPUT_NO_DATA: samples / float(no_data.sum()) if no_data.sum() > 0 else 0.0,
            keys.SKEW: skew(frame),
        })
        for col in STAGE_COLUMNS:
            out[keys.stage_ms(col[:-3])] = 1e3 * float(steps[col].mean())
            add_mean_interval(out, keys.stage_ms(col[:-3]), steps[col], 1e3)
        add_mean_interval(out, keys.EPOCH_S, wall, steps_per_epoch)
        fastest = steps["fastest(s)"]
        out[keys.STEP_FASTEST_MEDIAN_MS] = 1e3 * float(fastest.median())
        fastest_iv = median_interval(fastest, positive=True)
        out.update(zip(keys.ci_keys(keys.STEP_FASTEST_MEDIAN_MS), (1e3 * v for v in fastest_iv)))
    if "evaluation(s)" in frame:  # evaluations after steps (every rank evaluates its shard: the slowest counts)
        per_eval = frame.groupby("step")["evaluation(s)"].max().dropna()
        if len(per_eval):
            out[keys.EVAL_MS] = 1e3 * float(per_eval.mean())
            out[keys.EVALS] = int(len(per_eval))
    last = frame.sort_values("step").groupby("rank").tail(1)
    if "loss" in last:
        out[keys.TRAIN_LOSS] = float(last["loss"].mean())
        out[keys.TRAIN_ACC] = float(last["acc"].mean())
    if evals:
        out[keys.EVAL_LOSS] = float(evals[-1]["loss"])
        out[keys.EVAL_ACC] = float(evals[-1]["acc"])
    out.update(comm_summary(frame, one_clock))
    add_rate_intervals(out)
    out.update(noise_summary(system or [], records))  # `system`: every rank's system samples
    out.update(gpu_utilisation(system or [], records))
    out.update(precision_summary(steps["train(s)"], target_precision))
    added = [m["train_added(bytes)"] for m in memory or [] if "train_added(bytes)" in m]
    if added:
        out[keys.MEMORY_TRAIN_ADDED_BYTES] = max(added)  # what training adds on top of set-up (max over ranks)
    for key in ("peak_rss(bytes)", "cuda_max_allocated(bytes)"):
        values = [m[key] for m in memory or [] if key in m]
        if values:
            out[keys.memory_gib(key.split('(')[0])] = max(values) / 2**30
    for key, field in MEMORY_BY_KIND.items():  # measured on one warm-up step per rank; the largest rank counts
        values = [m[field] for m in memory or [] if field in m]
        if values:
            out[key] = max(values)
    return out


def gpu_utilisation(samples: list[dict], records: list[dict]) -> dict:
    """The mean of NVML's GPU utilisation over the samples taken inside the timed steps (every rank samples its
    own GPU), and their number. NVML's figure is the share of its last sample period (1/6 s to 1 s, by card) in
    which a kernel ran, not the share of the chip in use; a sample just after the first timed step began may
    still cover some of the warm-up. Empty without GPU samples inside the window."""
    window = timed_window(records)
    if window is None:
        return {}
    inside = [s["gpu_util(%)"] for s in samples
              if "gpu_util(%)" in s and "time" in s and window[0] <= s["time"] <= window[1]]
    if not inside:
        return {}
    return {keys.GPU_UTIL: float(np.mean(inside)), keys.GPU_UTIL_SAMPLES: len(inside)}


# summary key -> the rank result's "memory" field (scalelab.train.memory)
MEMORY_BY_KIND = {keys.MEMORY_PARAMETERS_BYTES: "parameters(bytes)", keys.MEMORY_GRADIENTS_BYTES: "gradients(bytes)",
                  keys.MEMORY_OPTIMIZER_BYTES: "optimizer_state(bytes)",
                  keys.MEMORY_ACTIVATIONS_BYTES: "activations_saved(bytes)",
                  keys.MEMORY_ACTIVATIONS_PEAK_BYTES: "activations_backward_peak(bytes)"}


COMM_PER_STEP = {keys.COMM_COLLECTIVES_PER_STEP: "collectives", keys.COMM_BYTES_PER_STEP: "comm_bytes",
                 keys.COMM_BYTES_FORWARD_PER_STEP: "comm_bytes_forward",
                 keys.COMM_BYTES_BACKWARD_PER_STEP: "comm_bytes_backward",
                 keys.COMM_BYTES_OPTIMIZER_PER_STEP: "comm_bytes_optimizer"}


def comm_summary(frame: pd.DataFrame, one_clock: bool = True) -> dict:
    """Communication metrics of the timed steps (empty for runs without a process group). `one_clock`: the ranks'
    meter clocks are one (one host, its namespaces included): critical communication and waiting for peers."""
    if "comm_bytes" not in frame:
        return {}
    timed = frame[~frame["warmup"].astype(bool)]
    if not len(timed):
        return {}
    by_step = timed.groupby("step")
    out = {key: float(by_step[col].mean().mean()) for key, col in COMM_PER_STEP.items()}
    union = by_step["comm_total(s)"].mean()
    out[keys.COMM_TIME_MS] = 1e3 * float(union.mean())
    add_mean_interval(out, keys.COMM_TIME_MS, union, 1e3)
    if "comm_sum(s)" in timed:  # records of scalelab 0.1 summed the intervals into comm_total(s)
        out[keys.COMM_SUM_MS] = 1e3 * float(by_step["comm_sum(s)"].mean().mean())
    out[keys.COMM_BLOCKING_MS] = 1e3 * float(by_step["comm(s)"].mean().mean())
    if one_clock:
        split = split_per_step(timed)
        for key, col in ((keys.COMM_CRITICAL_MS, "critical(s)"), (keys.COMM_PEERS_WAIT_MS, "waiting(s)")):
            if len(split):
                out[key] = 1e3 * float(split[col].mean())
                add_mean_interval(out, key, split[col], 1e3)
    if "comm_events" in timed and "backward(s)" in timed:
        inside = timed.apply(in_backward_s, axis=1)
        outside = timed["backward(s)"] - inside
        for key, part in ((keys.COMM_IN_BACKWARD_MS, inside), (keys.BACKWARD_OUTSIDE_COMM_MS, outside)):
            per_step = part.groupby(timed["step"]).mean()  # the mean over ranks, as a stage's
            out[key] = 1e3 * float(per_step.mean())
            add_mean_interval(out, key, per_step, 1e3)
    if "wait(s)" in timed and timed["wait(s)"].notna().any():
        out[keys.COMM_WAIT_MS] = 1e3 * float(by_step["wait(s)"].mean().mean())
    seconds = float(timed["comm_total(s)"].sum())
    out[keys.COMM_ALGBW] = float(timed["comm_alg_bytes"].sum()) / seconds / 1e9 if seconds > 0 else 0.0
    out[keys.COMM_BUSBW] = float(timed["comm_bus_bytes"].sum()) / seconds / 1e9 if seconds > 0 else 0.0
    return out


def in_backward_s(record) -> float:
    """Seconds of one rank's backward stage spent inside its gradient collectives (keys.COMM_IN_BACKWARD_MS): the
    union of its backward-phase collective intervals less the time the loop spent in its "comm" span after
    backward (a strategy that waits there, or syncs there, is inside collectives there), within [0, backward].
    DDP launches its buckets and waits for them inside backward: all of its collective time is backward's."""
    events = record["comm_events"] if isinstance(record["comm_events"], list) else []
    union = union_seconds((e[2], e[2] + e[3]) for e in events if len(e) >= 4 and e[1] == "backward")
    comm = record.get("comm(s)", 0.0)
    return min(float(record["backward(s)"]), max(0.0, union - (0.0 if pd.isna(comm) else float(comm))))


def split_per_step(timed: pd.DataFrame) -> pd.DataFrame:
    """Per timed step (one row each), critical(s) and waiting(s) of scalelab.analysis.peers; empty when no step
    could be split (one rank, no collectives, ranks whose collectives differ)."""
    rows = {}
    if "comm_events" in timed:
        for step, group in timed.sort_values("rank").groupby("step"):
            split = step_split([list(e) if isinstance(e, list) else [] for e in group["comm_events"]])
            if split is not None:
                rows[step] = split
    return pd.DataFrame.from_dict(rows, orient="index", columns=["critical(s)", "waiting(s)"])


ROUNDING_S = 1e-9  # a time below 0 by less than this is float rounding (`other` = wall - the stages): taken as 0


def add_mean_interval(out: dict, key: str, series, scale: float) -> None:
    """Store the 95 % interval of `series`' mean (a time: never below 0, intervals.mean_interval's log scale),
    times `scale`, under key's interval keys. A series truly below 0 keeps the linear interval, so that the
    run's invariant check (scalelab.analysis.checks.run_failures) shows the negative time instead of a crash."""
    values = np.asarray(series, dtype=float)
    if len(values) and values.min() >= -ROUNDING_S:
        low, high = mean_interval(np.maximum(values, 0.0), positive=True)
    else:
        low, high = mean_interval(values)
    lo_key, hi_key = keys.ci_keys(key)
    out[lo_key], out[hi_key] = scale * low, scale * high


def add_rate_intervals(out: dict) -> None:
    """A rate = a fixed count / a mean time: its interval is the rate scaled by mean / the mean's interval ends
    (a mean interval reaching 0 leaves the rate unbounded above: NaN)."""
    for rate, mean in keys.RATE_FIGURES.items():
        m_low, m_high = (out.get(k) for k in keys.ci_keys(mean))
        if out.get(rate) is None or m_low is None or not out.get(mean):
            continue
        lo_key, hi_key = keys.ci_keys(rate)
        out[lo_key] = out[rate] * out[mean] / m_high if m_high > 0 else float("nan")
        out[hi_key] = out[rate] * out[mean] / m_low if m_low > 0 else float("nan")


def loopback_bytes_per_step(samples: list[dict], records: list[dict]) -> float | None:
    """Bytes sent on the loopback interface per timed step, from one host's system samples.

    The window runs from the start of the first timed step to the end of the last one (rank 0's clock);
    the counter (host-wide: all ranks on the host, and anything else using loopback) is interpolated linearly
    between samples at both ends. None when the data is missing or the window is not covered by samples.
    """
    window = timed_window(records)
    sent = window_deltas(samples, ("lo_sent(bytes)",), *window) if window else None
    if sent is None:
        return None
    timed = sum(1 for r in records if r.get("rank") == 0 and "t_end(unix_s)" in r and not r["warmup"])
    return sent["lo_sent(bytes)"] / timed
