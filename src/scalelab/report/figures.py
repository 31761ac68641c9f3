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

from scalelab.analysis import keys  # noqa: E402
from scalelab.store import atomic_file  # noqa: E402


def save(fig, path: Path) -> Path:
    """Lay out `fig`, write it to `path` atomically (PNG at 110 dpi) and close it; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, dpi=110, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path


def _ci(frame: pd.DataFrame, point: str = keys.STEP_MEDIAN_MS, low: str | None = None,
        high: str | None = None) -> list | None:
    """Error bars of `point`'s 95 % interval (columns `low` / `high`; by default its summary interval keys);
    None when the table has no interval, 0 where a row lacks one."""
    low, high = (low, high) if low is not None else keys.ci_keys(point)
    if not all(c in frame for c in (point, low, high)):
        return None
    value = frame[point].astype(float)
    return [(value - frame[low].astype(float)).clip(lower=0).fillna(0),
            (frame[high].astype(float) - value).clip(lower=0).fillna(0)]


STEP_CI_LABEL = "step time (ms): median, bars its 95 % interval"


def time_vs_batch(table: pd.DataFrame, path: Path) -> Path:
    """Epoch time with and without data loading, and step time, with their 95 % intervals, vs global batch."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.errorbar(table["global_batch"], table[keys.EPOCH_S], yerr=_ci(table, keys.EPOCH_S), fmt="o-", capsize=3,
                 label="with data loading (bars: 95 % interval)")
    ax1.plot(table["global_batch"], table[keys.EPOCH_NO_DATA_S], "s--", label="without data loading")
    ax1.set(xscale="log", xlabel="global batch (samples)", ylabel="epoch time (s)", title="Epoch time")
    ax1.legend()
    ax2.errorbar(table["global_batch"], table[keys.STEP_MEDIAN_MS], yerr=_ci(table), fmt="o-", capsize=3)
    ax2.set(xscale="log", xlabel="global batch (samples)", ylabel=STEP_CI_LABEL,
            title="Step time over timed steps")
    for ax in (ax1, ax2):  # label the batch sizes themselves, not powers of ten
        ax.set_xticks(list(table["global_batch"]), [str(b) for b in table["global_batch"]])
        ax.minorticks_off()
    return save(fig, path)


def stage_pie(table: pd.DataFrame, path: Path) -> Path:
    """Share of a step per stage (stages under 0.5 % are folded into 'rest')."""
    run = table[(table["run_id"] == table["run_id"].iloc[0]) & table["share(%)"].notna()]  # steps only
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
    return save(fig, path)


def loss_curves(curves: pd.DataFrame, path: Path, *, hue: str) -> Path:
    """Training loss per step, one line per value of `hue`."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for value, group in curves.groupby(hue, sort=False):
        ax.plot(group["step"], group["loss"], label=f"{hue}={value}")
    ax.set(xlabel="optimizer step", ylabel="training loss (cross-entropy, rank 0)", title="Loss curves")
    ax.legend()
    return save(fig, path)


def memory_vs_segments(table: pd.DataFrame, path: Path) -> Path:
    """Saved activations and their backward peak (left axis), the process's peak memory (right axis, its own scale:
    on CPU it is hundreds of times larger), and step time, vs activation-checkpointing segments."""
    cuda = keys.MEMORY_CUDA_MAX_ALLOCATED_GIB
    mem = cuda if cuda in table else keys.MEMORY_PEAK_RSS_GIB
    segments = table["checkpoint_segments"]
    fig, (ax1, ax3) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label, style in ((keys.MEMORY_ACTIVATIONS_BYTES, "saved for backward", "o-"),
                              (keys.MEMORY_ACTIVATIONS_PEAK_BYTES, "backward peak (with recomputation)", "^-")):
        if key in table:
            ax1.plot(segments, table[key] / 2**20, style, label=label)
    ax1.set(xlabel="checkpoint segments (0 = off)", ylabel="activations per rank (MiB)",
            title="Activations vs the process's peak")
    ax1.set_ylim(bottom=0)
    handles, labels = ax1.get_legend_handles_labels()
    if mem in table:
        name = "CUDA max allocated" if mem == cuda else "process peak RSS"
        ax2 = ax1.twinx()
        handles += ax2.plot(segments, table[mem] * 2**10, "s--", color="tab:green")
        labels.append(f"{name} (right axis)")
        ax2.set(ylabel=f"{name} (MiB)", ylim=(0, None))
    ax1.legend(handles, labels, loc="lower left", fontsize="small")
    ax3.errorbar(segments, table[keys.STEP_MEDIAN_MS], yerr=_ci(table), fmt="s--", color="tab:red", capsize=3)
    ax3.set(xlabel="checkpoint segments (0 = off)", ylabel=STEP_CI_LABEL,
            title="Cost in time")
    for ax in (ax1, ax3):
        ax.set_xticks(sorted(segments.unique()))
    return save(fig, path)


def loader_bars(table: pd.DataFrame, path: Path) -> Path:
    """Throughput and data-wait share per loader setting."""
    labels = [f"w{int(r.num_workers)}{' pin' if r.pin_memory else ''}"
              f"{'' if pd.isna(r.prefetch_factor) else f' pf{int(r.prefetch_factor)}'}" for r in table.itertuples()]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(labels, table[keys.THROUGHPUT], yerr=_ci(table, keys.THROUGHPUT, "ci_low", "ci_high"), capsize=3)
    ax1.set(ylabel="training throughput (samples/s), bars: 95 % interval", title="Throughput per loader setting")
    ax2.bar(labels, table["data_wait(%)"], color="tab:orange")
    ax2.set(ylabel="data wait (% of step)", title="Time waiting for data")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=45)
    return save(fig, path)


def speedup_vs_workers(table: pd.DataFrame, path: Path, *, mode: str) -> Path:
    """Measured speedup per batch size vs workers, with the ideal (linear) line."""
    key = "global_batch" if mode == "strong" else "per_worker_batch"
    fig, ax = plt.subplots(figsize=(6, 4))
    top = int(table["workers"].max())
    ax.plot([1, top], [1, top], "k:", label="ideal")
    for value, group in table.groupby(key):
        ax.errorbar(group["workers"], group["speedup"], yerr=_ci(group, "speedup", "speedup_ci_low", "speedup_ci_high"),
                    fmt="o-", capsize=3, label=f"{key.replace('_', ' ')} {value}")
    figure = "epoch times" if mode == "strong" else "throughputs"
    ax.set(xlabel="workers (ranks)", ylabel=f"speedup (x, {figure}), bars: 95 % interval",
           title=f"{mode.title()} scaling")
    ax.set_xticks(sorted(table["workers"].unique()))
    ax.legend()
    return save(fig, path)


def compute_comm_bars(table: pd.DataFrame, path: Path) -> Path:
    """Per cell: step time split into compute (the step with no-op collectives) and exposed communication (stacked
    bars; a negative exposed part downwards), with the exposed part's 95 % interval."""
    labels = [f"{int(w)}w b{int(b)}" for w, b in zip(table["workers"], table["global_batch"])]
    compute = table["compute(ms)"].astype(float).fillna(table["step(ms)"])
    exposed = table["exposed_comm(ms)"].astype(float).fillna(0)
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    ax.bar(labels, compute, label="compute (step with no-op collectives)")
    ax.bar(labels, exposed, bottom=compute, label="exposed communication")
    if "exposed_ci_low(ms)" in table:
        low, high = (table[c].astype(float) for c in ("exposed_ci_low(ms)", "exposed_ci_high(ms)"))
        ax.errorbar(labels, compute + exposed, yerr=[(exposed - low).clip(lower=0).fillna(0),
                                                     (high - exposed).clip(lower=0).fillna(0)],
                    fmt="none", ecolor="tab:red", capsize=2, label="exposed, 95 % interval")
    if keys.COMM_TIME_MS in table:
        ax.plot(labels, table[keys.COMM_TIME_MS], "kD", label="time inside collectives")
    if "step_ci_low(ms)" in table:
        ax.errorbar([x - 0.2 for x in range(len(labels))], table["step(ms)"].astype(float),
                    yerr=_ci(table, "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)"), fmt="none", ecolor="black",
                    capsize=3, label="median step, 95 % interval")
    ax.set(ylabel="median step time (ms)", title="Compute vs communication per step")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    return save(fig, path)


def per_node(table: pd.DataFrame, path: Path) -> Path:
    """Seed 003's tables 1-3 as bars: per cell (node count, batch) one bar per node for time per epoch, CPU user
    and system (% of one core, system stacked on user) and network MB/s sent off the node."""
    cells = list(table.groupby(["nodes", "global_batch"], sort=True))
    most = int(table["node"].max()) + 1
    width = 0.8 / most
    fig, axes = plt.subplots(1, 3, figsize=(max(10, 1.2 * len(cells) * 3), 4))
    for node in range(most):
        mine = [g[g["node"] == node] for _, g in cells]
        x = [i + (node - (most - 1) / 2) * width for i in range(len(cells))]
        value = lambda col: [float(m[col].iloc[0]) if len(m) and pd.notna(m[col].iloc[0]) else 0.0 for m in mine]
        colour = f"C{node % 10}"
        axes[0].bar(x, value("epoch(s)"), width, color=colour, label=f"node {node}")
        axes[1].bar(x, value("cpu_user(%)"), width, color=colour)
        axes[1].bar(x, value("cpu_system(%)"), width, bottom=value("cpu_user(%)"), color=colour, hatch="//",
                    edgecolor="white")
        axes[2].bar(x, value("net_sent(MB/s)"), width, color=colour)
    names = [f"{int(k)} node{'s' * (k > 1)}\nb{int(b)}" for (k, b), _ in cells]
    for ax, (ylabel, title) in zip(axes, (("s per epoch", "Time per epoch"),
                                          ("% of one core (hatched: system)", "CPU user / system"),
                                          ("MB/s", "Network sent off the node"))):
        ax.set_xticks(range(len(cells)), names)
        ax.set(ylabel=ylabel, title=title)
    axes[0].legend()
    fig.tight_layout()
    return save(fig, path)


def accuracy_vs_batch(table: pd.DataFrame, path: Path) -> Path:
    """Final test accuracy vs global batch, one line per learning-rate rule."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for rule, g in table.groupby("lr_rule"):
        g = g.groupby("global_batch")["final_acc"].mean()
        ax.plot(g.index, 100 * g.values, "o-", label=rule)
    ax.set(xscale="log", xlabel="global batch (samples)", ylabel="final test accuracy (%)",
           title="Accuracy vs batch size per LR rule (same epochs)")
    ax.set_xticks(sorted(table["global_batch"].unique()), [str(b) for b in sorted(table["global_batch"].unique())])
    ax.minorticks_off()
    ax.legend()
    return save(fig, path)


def accuracy_curves(curves: pd.DataFrame, path: Path) -> Path:
    """Test accuracy per epoch, one panel per batch size, one line per rule (first worker count)."""
    batches = sorted(curves["global_batch"].unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), squeeze=False, sharey=True)
    for ax, b in zip(axes[0], batches):
        sub = curves[(curves["global_batch"] == b) & (curves["workers"] == curves["workers"].min())]
        for rule, g in sub.groupby("lr_rule"):
            ax.plot(g["epoch"], 100 * g[keys.EVAL_ACC], label=rule)
        ax.set(title=f"batch {b}", xlabel="epoch")
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][-1].legend()
    return save(fig, path)


def comm_breakdown_bars(table: pd.DataFrame, path: Path, *, label: str) -> Path:
    """Per strategy / backend (column `label`): compute (the median step of the same config with no-op
    collectives) + exposed communication, stacked (a negative exposed part is drawn downwards, not hidden), with
    the exposed part's 95 % interval; the median step's min..max spread and the time inside collectives marked.
    Rows that did not run (status skipped / failed) keep their slot, labelled with their status."""
    labels = [str(v) for v in table[label]]
    done = table["status"].eq("completed") if "status" in table else pd.Series(True, index=table.index)
    step = table["step(ms)"].astype(float).where(done)
    compute = table["compute(ms)"].astype(float).fillna(step).where(done).fillna(0)
    exposed = table["exposed_comm(ms)"].astype(float).where(done).fillna(0)
    spread = _ci(table.assign(step=step), "step", "step_ci_low(ms)", "step_ci_high(ms)")
    reps = sorted({int(n) for n in table["timed_steps"].dropna()}) if "timed_steps" in table else []
    fig, ax = plt.subplots(figsize=(max(7, len(labels) * 0.9), 4.5))
    ax.bar(labels, compute, label="compute (median step, no-op collectives)")
    ax.bar(labels, exposed, bottom=compute, label="exposed communication (step - compute)")
    if "exposed_ci_low(ms)" in table:
        low, high = (table[c].astype(float).where(done) for c in ("exposed_ci_low(ms)", "exposed_ci_high(ms)"))
        ax.errorbar([x + 0.2 for x in range(len(labels))], compute + exposed,
                    yerr=[(exposed - low).clip(lower=0).fillna(0), (high - exposed).clip(lower=0).fillna(0)],
                    fmt="none", ecolor="tab:red", capsize=2, label="exposed, 95 % interval")
    ax.errorbar(labels, step, yerr=spread, fmt="none", ecolor="black", capsize=3,
                label="median step, bars its 95 % interval")
    ax.plot(labels, table["comm(ms)"].astype(float).where(done), "kD", label="time inside collectives")
    top = max(float((compute + exposed).max()), float(table["step_ci_high(ms)"].astype(float).fillna(0).max()), 1e-6)
    for i, (ok, status) in enumerate(zip(done, table.get("status", ["completed"] * len(table)))):
        if not ok:
            ax.text(i, 0.02 * top, str(status), ha="center", va="bottom", rotation=90, color="gray")
    reps_text = f", {'/'.join(map(str, reps))} timed steps" if reps else ""
    ax.set(ylabel="time per step (ms)", title=f"Compute vs communication per {label}{reps_text}")
    ax.set_ylim(0, 1.5 * top)  # room for the legend above the bars
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize="small", loc="upper left", ncols=2 if len(labels) > 3 else 1)
    return save(fig, path)


def comm_bytes_bars(table: pd.DataFrame, path: Path, *, label: str) -> Path:
    """Per strategy / backend: payload bytes per step (stacked by phase, as the CommMeter counts them) beside
    the bytes the loopback interface carried per step (all ranks, system sampler). Rows that did not run keep
    their slot, labelled with their status."""
    labels = [str(v) for v in table[label]]
    done = table["status"].eq("completed") if "status" in table else pd.Series(True, index=table.index)
    x = list(range(len(labels)))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(7, len(labels) * 0.9), 4.5))
    bottom = pd.Series(0.0, index=table.index)
    for phase in ("forward", "backward", "optimizer"):
        values = table[f"bytes_{phase}_per_step"].astype(float).where(done).fillna(0) / 1e6
        if values.any():
            ax.bar([i - width / 2 for i in x], values, width, bottom=bottom, label=f"payload, {phase} (mean of ranks)")
            bottom = bottom + values
    if not bottom.any():  # no collectives at all (e.g. noop only): still show the zero
        ax.bar([i - width / 2 for i in x], bottom, width, label="payload (mean of ranks)")
    loop = table["loopback_bytes_per_step"].astype(float).where(done) / 1e6
    ax.bar([i + width / 2 for i in x], loop.fillna(0), width, color="tab:gray", label="loopback interface (host)")
    top = max(float(bottom.max()), float(loop.max()) if loop.notna().any() else 0.0, 1e-6)
    for i, total, ok, status in zip(x, bottom, done, table.get("status", ["completed"] * len(table))):
        if ok:  # small payloads (PowerSGD) are invisible next to big ones: print them
            ax.text(i - width / 2, total, f"{total:.3g}", ha="center", va="bottom", fontsize="x-small")
        else:
            ax.text(i, 0.02 * top, str(status), ha="center", va="bottom", rotation=90, color="gray")
    ax.set_xticks(x, labels)
    ax.set(ylabel="MB per step (10^6 bytes)", title=f"Bytes per optimizer step per {label}")
    ax.set_ylim(0, 1.35 * top)
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize="small", loc="upper left", ncols=2 if len(labels) > 3 else 1)
    return save(fig, path)


def predicted_scaling(table: pd.DataFrame, measured: pd.DataFrame, path: Path, *, mode: str,
                      compute_of: str = "this machine") -> Path:
    """Predicted speedup and efficiency vs workers (log x), one line per hardware, with measured points overlaid
    (columns workers, measured_speedup, measured_efficiency; medians of the timed steps). `compute_of` says where
    the compute was measured ("this machine", or a device and host); the title and the measured points say it."""
    lines = table["hardware"].nunique() + 1 + (len(measured) > 0)
    # the legend in a row of its own below both plots: hardware labels say whose compute they use, so are long
    fig, axes = plt.subplots(2, 2, figsize=(11, 4.4 + 0.2 * lines),
                             gridspec_kw={"height_ratios": [4.2, 0.2 * lines + 0.2]})
    (ax1, ax2), legend_row = axes[0], axes[1]
    for ax in legend_row:
        ax.remove()
    top = int(table["workers"].max())
    ax1.plot([1, top], [1, top], "k:", label="ideal")
    for hw, g in table.groupby("hardware", sort=False):
        ax1.plot(g["workers"], g["speedup"], "o-", ms=3, label=hw)
        ax2.plot(g["workers"], 100 * g["efficiency"], "o-", ms=3, label=hw)
    if len(measured):
        ax1.plot(measured["workers"], measured["measured_speedup"], "k*", ms=11, label=f"measured on {compute_of}")
        ax2.plot(measured["workers"], 100 * measured["measured_efficiency"], "k*", ms=11,
                 label=f"measured on {compute_of}")
    ax2.axhline(50, color="gray", lw=0.8, ls="--")
    what = "global batch" if mode == "strong" else "per-rank batch"
    batch = table["per_rank_batch"].iloc[0] * (table["workers"].iloc[0] if mode == "strong" else 1)
    ax1.set(xscale="log", yscale="log", xlabel="workers (ranks)", ylabel="speedup (x, predicted step times)",
            title=f"{mode.title()} scaling, {what} {batch:g}, {table['strategy'].iloc[0]}\ncompute of {compute_of}")
    ax2.set(xscale="log", xlabel="workers (ranks)", ylabel="efficiency (%)", ylim=(0, 105),
            title="Efficiency (dashed: 50 %)")
    fig.legend(*ax1.get_legend_handles_labels(), fontsize="small", loc="lower center", frameon=False)
    return save(fig, path)


def predicted_vs_measured(validation: pd.DataFrame, path: Path) -> Path:
    """Predicted vs measured median step time per run (log-log) with the y = x line; colour = sync strategy,
    marker = what the collectives went over (circle: loopback, triangle: namespace nodes' link, real or shaped by
    the kernel); open markers = caller-side padding, labelled approximate."""
    fig, ax = plt.subplots(figsize=(6, 5))
    network = validation["network"] if "network" in validation else pd.Series("loopback", index=validation.index)
    padded = network.str.contains("approximate")
    nodes = network.str.contains("nodes over")
    kind = pd.Series(list(zip(nodes, padded)), index=validation.index)
    for i, (sync, g) in enumerate(validation.groupby("sync", sort=False)):
        color = f"C{i}"
        for (on_nodes, pad), h in g.groupby(kind[g.index]):
            where = "nodes' link" if on_nodes else "loopback"
            ax.plot(h["measured"], h["predicted"], "^" if on_nodes else "o", color=color,
                    mfc="none" if pad else color, label=f"{sync}, {where}{', padded (approximate)' if pad else ''}")
    lo = float(min(validation["measured"].min(), validation["predicted"].min())) * 0.8
    hi = float(max(validation["measured"].max(), validation["predicted"].max())) * 1.25
    ax.plot([lo, hi], [lo, hi], "k:", label="y = x")
    err = validation["error(%)"].abs().median()  # of the points drawn (attrs may describe a larger frame)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (ms, median of timed steps)",
           ylabel="predicted step (ms)", title=f"Predicted vs measured: median |error| {err:.1f} %")
    from matplotlib.ticker import FuncFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain milliseconds, not powers of ten
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(round(v))[0] in "1235" else ""))
    ax.legend(fontsize="small")
    return save(fig, path)


def system_metrics(frame: pd.DataFrame, path: Path) -> Path:
    """CPU %, resident memory and loopback send rate per rank over the run."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for rank, g in frame.groupby("rank"):
        axes[0].plot(g["t(s)"], g["cpu_process(%)"], label=f"rank {rank}")
        axes[1].plot(g["t(s)"], g["rss(bytes)"] / 2**20, label=f"rank {rank}")
        if "lo_sent(bytes/s)" in g:
            axes[2].plot(g["t(s)"], g["lo_sent(bytes/s)"] / 1e6, label=f"rank {rank}")
    axes[0].set(xlabel="time (s)", ylabel="process CPU (%)", title="CPU")
    axes[1].set(xlabel="time (s)", ylabel="resident memory (MiB)", title="Memory")
    axes[2].set(xlabel="time (s)", ylabel="loopback sent (MB/s, host-wide)", title="Network")
    axes[0].legend()
    return save(fig, path)


def time_vs_threads(table: pd.DataFrame, path: Path) -> Path:
    """Step time with its spread vs torch threads; the core count as a dashed line (past it: oversubscribed)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(table["threads"], table[keys.STEP_MEDIAN_MS], yerr=_ci(table), fmt="o-", capsize=3)
    ax.axvline(int(table["cores"].iloc[0]), linestyle="--", color="grey", label="core count")
    ax.set(xscale="log", xlabel="torch threads (one process)", ylabel=STEP_CI_LABEL,
           title="Step time vs threads")
    ax.set_xticks(list(table["threads"]), [str(t) for t in table["threads"]])
    ax.minorticks_off()
    ax.legend()
    return save(fig, path)


def _grid(frame: pd.DataFrame, values: pd.Series, depths: list, widths: list) -> pd.DataFrame:
    """`values` (aligned with `frame`) laid out depth (rows) x width (columns)."""
    return (frame.assign(_v=values.astype(float)).pivot(index="depth", columns="width", values="_v")
            .reindex(index=depths, columns=widths))


def model_grid_heatmaps(table: pd.DataFrame, path: Path) -> Path:
    """Per worker count (columns): median step time over depth x width (top; one colour scale) and whether the
    cell fits under the memory cap (bottom). A cell without a number is grey, labelled with its status."""
    from matplotlib.colors import ListedColormap

    workers = sorted(table["workers"].unique())
    depths, widths = sorted(table["depth"].unique()), sorted(table["width"].unique())
    steps = table["step(ms)"].astype(float)
    lo, hi = (float(steps.min()), float(steps.max())) if steps.notna().any() else (0.0, 1.0)
    fig, axes = plt.subplots(2, len(workers), figsize=(1.2 + 3.2 * len(workers), 1.8 + 1.2 * len(depths) * 2),
                             squeeze=False)
    fits = table["fits"].map(lambda v: 1.0 if v is True else 0.0 if v is False else float("nan"))
    time_map, fit_map = plt.get_cmap("viridis").with_extremes(bad="lightgray"), \
        ListedColormap(["tab:red", "tab:green"]).with_extremes(bad="lightgray")
    for j, n in enumerate(workers):
        mine = table[table["workers"] == n]
        step = _grid(mine, steps[mine.index], depths, widths)
        ok = _grid(mine, fits[mine.index], depths, widths)
        status = mine.set_index(["depth", "width"])["status"]
        top, bottom = axes[0][j], axes[1][j]
        image = top.imshow(step.values, origin="lower", aspect="auto", cmap=time_map, vmin=lo, vmax=hi)
        bottom.imshow(ok.values, origin="lower", aspect="auto", cmap=fit_map, vmin=0, vmax=1)
        for y, d in enumerate(depths):
            for x, w in enumerate(widths):
                t, f = step.values[y, x], ok.values[y, x]
                top.text(x, y, "-" if t != t else f"{t:.3g}", ha="center", va="center",
                         color="black" if t != t else "white")
                label = "fits" if f == 1 else "does not fit" if f == 0 else str(status.get((d, w), "not run"))
                bottom.text(x, y, label, ha="center", va="center", color="black" if f != f else "white")
        for ax, what in ((top, "median step (ms)"), (bottom, "fits under the cap")):
            ax.set_xticks(range(len(widths)), [str(w) for w in widths])
            ax.set_yticks(range(len(depths)), [str(d) for d in depths])
            ax.set(xlabel="width (units per layer)", ylabel="depth (layers)",
                   title=f"{n} worker{'s' if n > 1 else ''}: {what}")
        fig.colorbar(image, ax=top, label="median step time (ms)")
    return save(fig, path)


def model_grid_memory(table: pd.DataFrame, path: Path) -> Path:
    """Memory by kind per rank for every cell, stacked (parameters, gradients, optimizer state, saved
    activations), with the activation peak in backward and the peak memory training added as markers."""
    from scalelab.analysis.model_grid import PEAK_ADDED, STACKED, memory_column

    labels = [f"d{int(d)} w{int(w)}\n{int(n)} worker{'s' if n > 1 else ''}"
              for d, w, n in zip(table["depth"], table["width"], table["workers"])]
    x = list(range(len(labels)))
    mib = 2**20
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(labels)), 4.8))
    bottom = pd.Series(0.0, index=table.index)
    for kind in STACKED:
        values = table[memory_column(kind)].astype(float).fillna(0) / mib
        ax.bar(x, values, bottom=bottom, label=kind.replace("_", " "))
        bottom = bottom + values
    peak = table[memory_column("activations_backward_peak")].astype(float) / mib
    added = table[PEAK_ADDED].astype(float) / mib
    ax.plot(x, peak, "kx", label="activation peak in backward")
    ax.plot(x, added, "kD", mfc="none", label="peak memory added by training (measured)")
    top = max([float(v) for v in (bottom.max(), peak.max(), added.max()) if v == v] + [1e-6])
    for i, (fit, stacked) in enumerate(zip(table["fits"], bottom)):
        if fit is not True:
            ax.text(i, 0.02 * top, "does not fit" if fit is False else "failed", ha="center", va="bottom",
                    rotation=90, color="gray")
        elif stacked == 0:
            ax.text(i, 0.02 * top, "by kind not recorded", ha="center", va="bottom", rotation=90, color="gray",
                    fontsize="small")
    ax.set_xticks(x, labels, fontsize="small")
    ax.set(ylabel="MiB per rank (largest rank)", title="Memory by kind per cell")
    ax.set_ylim(0, 1.4 * top)
    ax.legend(fontsize="small", loc="upper left", ncols=2)
    return save(fig, path)
