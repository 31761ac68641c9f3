"""Pure functions from a study's stored runs ({run_id, config, summary}) to the tables the experiments show.

Every table keeps the spread of its timings (min/median/max step time over the timed steps, and the median's 95 %
interval) and says its unit in the column name. Its headline column is followed by `n` (timed steps, pooled over
launches), `ci_low` and `ci_high` (that column's 95 % interval); `launches` and `quality` ("ok", or why not: the
run's noise reason, "precision not reached") close each row.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import run_quality
from scalelab.analysis.repeats import LAUNCHES

SPREAD = [keys.STEP_MIN_MS, keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS,
          keys.STEP_MAX_MS]


HEADLINE = ["n", "ci_low", "ci_high"]


def runs_frame(runs: list[dict], config_keys: list[str], metrics: list[str], headline: str | None = None
               ) -> pd.DataFrame:
    """One row per run: the chosen config fields and summary metrics (missing metrics are NaN); with a
    `headline` metric, its n and interval right after it, and launches and quality at the end."""
    rows, columns = [], ["run_id", *config_keys, *metrics]
    if headline is not None:
        at = columns.index(headline) + 1
        columns[at:at] = HEADLINE
        columns += [LAUNCHES, "quality"]
    for run in runs:
        summary = run["summary"] or {}
        row = {"run_id": run["run_id"]}
        row.update({k: run["config"].get(k) for k in config_keys})
        row.update({m: summary.get(m) for m in metrics})
        if headline is not None:
            low, high = keys.ci_keys(headline)
            row.update({"n": summary.get(keys.STEPS_TIMED), "ci_low": summary.get(low), "ci_high": summary.get(high),
                        LAUNCHES: summary.get(LAUNCHES, 1), "quality": run_quality(summary)})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(config_keys, kind="stable").reset_index(drop=True) if len(frame) else frame


def batch_sweep_table(runs: list[dict]) -> pd.DataFrame:
    """Per global batch size: epoch time with and without data loading, throughput, peak memory (seed 000 T1)."""
    metrics = [keys.EPOCH_S, keys.EPOCH_NO_DATA_S, keys.THROUGHPUT, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, *SPREAD, keys.STEPS_TIMED]
    frame = runs_frame(runs, ["global_batch", "ranks"], metrics, headline=keys.THROUGHPUT)
    return frame.dropna(axis=1, how="all")


EVAL_OUTSIDE = "eval (outside the step, per evaluation)"


def stage_profile_table(runs: list[dict]) -> pd.DataFrame:
    """Mean time per step of each stage and its share of the step (seed 001 part 2b). Evaluation is its own line
    after them: the time of one evaluation, outside every step, so it has no share. (Runs of scalelab 0.1 timed
    evaluation inside the step: for them it stays a stage.)"""
    stages = ["data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other"]
    rows = []
    for run in runs:
        summary = run["summary"] or {}
        inside = [s for s in stages if s != "eval" or summary.get(keys.stage_ms("eval"))]
        total = sum(summary.get(keys.stage_ms(s), 0.0) for s in inside)
        for s in inside:
            ms = summary.get(keys.stage_ms(s), 0.0)
            low, high = (summary.get(k) for k in keys.ci_keys(keys.stage_ms(s)))
            rows.append({"run_id": run["run_id"], "stage": s, "time(ms)": ms, "n": summary.get(keys.STEPS_TIMED),
                         "ci_low": low, "ci_high": high, "share(%)": 100.0 * ms / total if total else 0.0,
                         "quality": run_quality(summary)})
        if summary.get(keys.EVAL_MS) is not None:
            rows.append({"run_id": run["run_id"], "stage": EVAL_OUTSIDE, "time(ms)": summary[keys.EVAL_MS],
                         "n": summary.get(keys.EVALS), "share(%)": float("nan"), "quality": run_quality(summary)})
    return pd.DataFrame(rows, columns=["run_id", "stage", "time(ms)", *HEADLINE, "share(%)", "quality"])


def precision_table(runs: list[dict]) -> pd.DataFrame:
    """fp32 vs bf16 vs fp16: final accuracy, loss, peak memory and time (seed 001 part 2c)."""
    metrics = [keys.EVAL_ACC, keys.EVAL_LOSS, keys.TRAIN_LOSS, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, keys.EPOCH_S, keys.THROUGHPUT, *SPREAD]
    frame = runs_frame(runs, ["precision", "device"], metrics, headline=keys.THROUGHPUT).dropna(axis=1, how="all")
    if len(frame) and "fp32" in set(frame["precision"]):
        base = frame.loc[frame["precision"] == "fp32", keys.THROUGHPUT].iloc[0]
        frame["speedup_vs_fp32"] = frame[keys.THROUGHPUT] / base
    return frame


def checkpointing_table(runs: list[dict]) -> pd.DataFrame:
    """Activation checkpointing segments vs saved activations, their backward peak, the process's peak memory and
    step time (seed 001 part 1b); ratios to no checkpointing where a run without it is there."""
    metrics = [keys.MEMORY_ACTIVATIONS_BYTES, keys.MEMORY_ACTIVATIONS_PEAK_BYTES, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, *SPREAD, keys.THROUGHPUT]
    frame = runs_frame(runs, ["checkpoint_segments", "global_batch"], metrics,
                       headline=keys.STEP_MEDIAN_MS).dropna(axis=1, how="all")
    if len(frame):
        base = frame[frame["checkpoint_segments"] == 0]
        if len(base):
            ratios = {"step_time_vs_off": keys.STEP_MEDIAN_MS, "activations_vs_off": keys.MEMORY_ACTIVATIONS_BYTES,
                      "backward_peak_vs_off": keys.MEMORY_ACTIVATIONS_PEAK_BYTES}
            for name, key in ratios.items():
                if key in frame:
                    frame[name] = frame[key] / base[key].iloc[0]
    return frame


def loader_table(runs: list[dict]) -> pd.DataFrame:
    """DataLoader settings vs data-wait share of training steps and throughput (seed 001 part 2a)."""
    metrics = [keys.stage_ms("data"), keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS,
               keys.EPOCH_S, keys.THROUGHPUT]
    frame = runs_frame(runs, ["num_workers", "pin_memory", "prefetch_factor"], metrics, headline=keys.THROUGHPUT)
    if len(frame):
        shares = {run["run_id"]: 100.0 * data_share(run["summary"] or {}) for run in runs}
        frame["data_wait(%)"] = frame["run_id"].map(shares)
    return frame


def data_share(summary: dict) -> float:
    """Data wait as a fraction of the mean step (the stage means sum to the mean step time)."""
    stages = [v for k, v in summary.items() if k.startswith(keys.STAGE_PREFIX) and "_ci_" not in k]
    total = sum(stages)
    return summary.get(keys.stage_ms("data"), 0.0) / total if total else 0.0


def best_loader_setting(table: pd.DataFrame) -> dict:
    """The fastest setting, preferring fewer workers when within 5 % of the best throughput."""
    if not len(table):
        return {}
    best = table[keys.THROUGHPUT].max()
    near = table[table[keys.THROUGHPUT] >= 0.95 * best].sort_values(["num_workers"], kind="stable")
    row = near.iloc[0]
    return {"num_workers": int(row["num_workers"]), "pin_memory": bool(row["pin_memory"]),
            "prefetch_factor": None if pd.isna(row["prefetch_factor"]) else int(row["prefetch_factor"]),
            keys.THROUGHPUT: float(row[keys.THROUGHPUT]),
            "speedup_vs_0_workers": float(row[keys.THROUGHPUT] /
                                          table.loc[table["num_workers"] == 0, keys.THROUGHPUT].max())
            if (table["num_workers"] == 0).any() else None}
