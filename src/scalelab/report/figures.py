"""Experiment plots. Each function reads a table (an analysis output), draws one figure, saves it, returns the path.

Timing figures show the spread (min..max step time over the timed steps as error bars) and say so in the axis
label; every axis names its unit.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def _spread(frame: pd.DataFrame) -> list | None:
    cols = ["time/step_min(ms)", "time/step_median(ms)", "time/step_max(ms)"]
    if not all(c in frame for c in cols):
        return None
    return [frame[cols[1]] - frame[cols[0]], frame[cols[2]] - frame[cols[1]]]


def time_vs_batch(table: pd.DataFrame, path: Path) -> Path:
    """Epoch time with and without data loading, and step time with its spread, vs global batch."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(table["global_batch"], table["time/epoch(s)"], "o-", label="with data loading")
    ax1.plot(table["global_batch"], table["time/epoch_no_data(s)"], "s--", label="without data loading")
    ax1.set(xscale="log", xlabel="global batch (samples)", ylabel="epoch time (s)", title="Epoch time")
    ax1.legend()
    ax2.errorbar(table["global_batch"], table["time/step_median(ms)"], yerr=_spread(table), fmt="o-", capsize=3)
    ax2.set(xscale="log", xlabel="global batch (samples)", ylabel="step time (ms): median, bars min..max",
            title="Step time over timed steps")
    for ax in (ax1, ax2):  # label the batch sizes themselves, not powers of ten
        ax.set_xticks(list(table["global_batch"]), [str(b) for b in table["global_batch"]])
        ax.minorticks_off()
    return _save(fig, path)


def stage_pie(table: pd.DataFrame, path: Path) -> Path:
    """Share of a step per stage (stages under 0.5 % are folded into 'rest')."""
    run = table[table["run_id"] == table["run_id"].iloc[0]]
    big = run[run["share(%)"] >= 0.5]
    rest = run.loc[run["share(%)"] < 0.5, "time(ms)"].sum()
    labels = [f"{s} {t:.1f} ms" for s, t in zip(big["stage"], big["time(ms)"])]
    values = list(big["time(ms)"])
    if rest > 0:
        labels.append(f"rest {rest:.2f} ms")
        values.append(rest)
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.pie(values, labels=labels, autopct="%1.1f%%", startangle=90)
    ax.set_title(f"Where a step goes (mean per step, total {run['time(ms)'].sum():.1f} ms)")
    return _save(fig, path)


def loss_curves(curves: pd.DataFrame, path: Path, *, hue: str) -> Path:
    """Training loss per step, one line per value of `hue`."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for value, group in curves.groupby(hue, sort=False):
        ax.plot(group["step"], group["loss"], label=f"{hue}={value}")
    ax.set(xlabel="optimizer step", ylabel="training loss (cross-entropy, rank 0)", title="Loss curves")
    ax.legend()
    return _save(fig, path)


def memory_vs_segments(table: pd.DataFrame, path: Path) -> Path:
    """Peak memory and step time vs activation-checkpointing segments."""
    mem = "memory/cuda_max_allocated(GiB)" if "memory/cuda_max_allocated(GiB)" in table else "memory/peak_rss(GiB)"
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot(table["checkpoint_segments"], table[mem], "o-", color="tab:blue")
    ax1.set(xlabel="checkpoint segments (0 = off)", ylabel=f"{mem.split('/')[1]}")
    ax2 = ax1.twinx()
    ax2.errorbar(table["checkpoint_segments"], table["time/step_median(ms)"], yerr=_spread(table), fmt="s--",
                 color="tab:red", capsize=3)
    ax2.set_ylabel("step time (ms): median, bars min..max")
    ax1.set_title("Activation checkpointing: memory vs time")
    return _save(fig, path)


def loader_bars(table: pd.DataFrame, path: Path) -> Path:
    """Throughput and data-wait share per loader setting."""
    labels = [f"w{int(r.num_workers)}{' pin' if r.pin_memory else ''}"
              f"{'' if pd.isna(r.prefetch_factor) else f' pf{int(r.prefetch_factor)}'}" for r in table.itertuples()]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(labels, table["throughput(samples/s)"])
    ax1.set(ylabel="training throughput (samples/s)", title="Throughput per loader setting")
    ax2.bar(labels, table["data_wait(%)"], color="tab:orange")
    ax2.set(ylabel="data wait (% of step)", title="Time waiting for data")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=45)
    return _save(fig, path)


def speedup_vs_workers(table: pd.DataFrame, path: Path, *, mode: str) -> Path:
    """Measured speedup per batch size vs workers, with the ideal (linear) line."""
    key = "global_batch" if mode == "strong" else "per_worker_batch"
    fig, ax = plt.subplots(figsize=(6, 4))
    top = int(table["workers"].max())
    ax.plot([1, top], [1, top], "k:", label="ideal")
    for value, group in table.groupby(key):
        ax.plot(group["workers"], group["speedup"], "o-", label=f"{key.replace('_', ' ')} {value}")
    ax.set(xlabel="workers (ranks)", ylabel="speedup (x, median step times)", title=f"{mode.title()} scaling")
    ax.set_xticks(sorted(table["workers"].unique()))
    ax.legend()
    return _save(fig, path)


def compute_comm_bars(table: pd.DataFrame, path: Path) -> Path:
    """Per cell: step time split into compute (the no-sync step) and exposed communication (stacked bars)."""
    labels = [f"{int(w)}w b{int(b)}" for w, b in zip(table["workers"], table["global_batch"])]
    compute = table["step_no_sync(ms)"].fillna(table["step(ms)"])
    exposed = table["exposed_comm(ms)"].fillna(0)
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    ax.bar(labels, compute, label="compute (step with no sync)")
    ax.bar(labels, exposed, bottom=compute, label="exposed communication")
    if "comm/time(ms)" in table:
        ax.plot(labels, table["comm/time(ms)"], "kD", label="time inside collectives")
    ax.set(ylabel="median step time (ms)", title="Compute vs communication per step")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    return _save(fig, path)
