"""Pure functions from a run's stored step records to its summary: step time, epoch time, throughput, stages.

Definitions (stated in every report):
- Warm-up steps are excluded from every timing.
- A step's time for the run is the slowest rank's wall time for that step (synchronous data parallelism waits
  for the slowest rank); stage times are averaged over ranks.
- Training time of a step = its wall time minus evaluation (evaluation is reported as its own stage).
- Epoch time = mean timed training step time x steps per epoch; without data loading it also subtracts each
  step's data wait.
- Throughput = global samples of the timed steps / their summed step time.
"""
from __future__ import annotations

import pandas as pd

from scalelab.measure.timer import STAGES

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
    out["train(s)"] = (timed["wall(s)"] - timed["eval(s)"]).groupby(timed["step"]).max()
    out["data_wait(s)"] = grouped["data(s)"].max()
    out["samples"] = grouped["samples"].sum()
    out["ranks"] = grouped["rank"].nunique()
    return out


def skew(frame: pd.DataFrame) -> float:
    """Slowest rank's total timed wall time over the median rank's (1.0 = perfectly even)."""
    timed = frame[~frame["warmup"].astype(bool)]
    totals = timed.groupby("rank")["wall(s)"].sum()
    return float(totals.max() / totals.median()) if len(totals) and totals.median() > 0 else 1.0


def summarize(records: list[dict], *, steps_per_epoch: int, evals: list[dict] | None = None,
              memory: list[dict] | None = None) -> dict:
    """The run's summary metrics; keys carry their unit."""
    frame = steps_frame(records)
    steps = per_step(frame)
    out: dict = {"steps/timed": int(len(steps)), "steps/total": int(frame["step"].nunique()),
                 "steps/per_epoch": int(steps_per_epoch)}
    if len(steps):
        wall = steps["train(s)"]
        no_data = wall - steps["data_wait(s)"]
        total, samples = float(wall.sum()), float(steps["samples"].sum())
        out.update({
            "time/step_median(ms)": 1e3 * float(wall.median()),
            "time/step_min(ms)": 1e3 * float(wall.min()),
            "time/step_max(ms)": 1e3 * float(wall.max()),
            "time/epoch(s)": float(wall.mean()) * steps_per_epoch,
            "time/epoch_no_data(s)": float(no_data.mean()) * steps_per_epoch,
            "throughput(samples/s)": samples / total if total > 0 else 0.0,
            "throughput_no_data(samples/s)": samples / float(no_data.sum()) if no_data.sum() > 0 else 0.0,
            "time/skew(slowest/median)": skew(frame),
        })
        for col in STAGE_COLUMNS:
            out[f"stage/{col[:-3]}(ms)"] = 1e3 * float(steps[col].mean())
    last = frame.sort_values("step").groupby("rank").tail(1)
    if "loss" in last:
        out["train/loss"] = float(last["loss"].mean())
        out["train/acc"] = float(last["acc"].mean())
    if evals:
        out["eval/loss"] = float(evals[-1]["loss"])
        out["eval/acc"] = float(evals[-1]["acc"])
    for key in ("peak_rss(bytes)", "cuda_max_allocated(bytes)"):
        values = [m[key] for m in memory or [] if key in m]
        if values:
            out[f"memory/{key.split('(')[0]}(GiB)"] = max(values) / 2**30
    return out
