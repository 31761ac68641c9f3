"""What every experiment's plots share: pyplot on the file-only Agg backend (`plt`), an atomic `save`, the error
bars of a median's interval (`ci`, `STEP_CI_LABEL`), and the plots several experiments draw (the communication
comparison bars, the system metrics). Each experiment's own plots live in its module: they read a table, draw one
figure, save it and return the path. Timing figures show their interval as error bars and say so in the axis
label; every axis names its unit.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from scalelab.analysis import keys  # noqa: E402
from scalelab.analysis.figure_checks import COMPUTE_LABEL  # noqa: E402,F401  (the plots' one wording of compute)
from scalelab.analysis.intervals import coverage  # noqa: E402
from scalelab.analysis.shown_checks import few_values  # noqa: E402
from scalelab.report.drawn import Series, write_record  # noqa: E402
from scalelab.store import atomic_file  # noqa: E402


def save(fig, path: Path, series: list[Series] | None = None) -> Path:
    """Lay out `fig`, write it to `path` atomically (PNG at 110 dpi) with the record of what it drew beside it
    (report.drawn: its labels as drawn, and `series`, the table and column each legend entry reads), and close it;
    returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:  # a figure laid out by its own engine (constrained) keeps it
        fig.tight_layout()
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, dpi=110, format=path.suffix.lstrip(".") or "png")
        write_record(fig, path, series)
    finally:
        plt.close(fig)
    return path


def ci(frame: pd.DataFrame, point: str = keys.STEP_MEDIAN_MS, low: str | None = None,
        high: str | None = None) -> list | None:
    """Error bars of `point`'s 95 % interval (columns `low` / `high`; by default its summary interval keys);
    None when the table has no interval, 0 where a row lacks one."""
    low, high = (low, high) if low is not None else keys.ci_keys(point)
    if not all(c in frame for c in (point, low, high)):
        return None
    value = frame[point].astype(float)
    return [(value - frame[low].astype(float)).clip(lower=0).fillna(0),
            (frame[high].astype(float) - value).clip(lower=0).fillna(0)]


def has_values(frame: pd.DataFrame, column: str) -> bool:
    """Whether `frame` has `column` with at least one value (an interval of no row draws nothing: no legend)."""
    return column in frame and frame[column].notna().any()


def ci_label(frame: pd.DataFrame) -> str:
    """What a figure of `frame` calls its intervals: "95 % interval", or, where a row's interval rests on fewer
    values (`n`) than make one (analysis.shown_checks.few_values), what it covers at the fewest, so the drawn words
    hold (analysis.figure_checks.figure_coverage_faults)."""
    few = few_values(frame)
    if not len(few):
        return "95 % interval"
    n = int(pd.to_numeric(few["n"], errors="coerce").min())
    return f"{100 * coverage(n):.0f} % interval (range of {n} values)"


def step_ci_label(frame: pd.DataFrame) -> str:
    """STEP_CI_LABEL with the intervals of `frame` named as they are (ci_label)."""
    return f"step time (ms): median,\nbars its {ci_label(frame)}"  # two lines: the long form fits the axis


NO_BASELINE_LABEL = "median step (no no-op baseline ran: compute not measured)"


def comm_breakdown_bars(table: pd.DataFrame, path: Path, *, label: str, name: str | None = None) -> Path:
    """Per strategy / backend (column `label`): compute (the median step of the same config with no-op
    collectives) + exposed communication, stacked (a negative exposed part is drawn downwards, not hidden), with
    the exposed part's 95 % interval; the median step's min..max spread and the time inside collectives marked.
    Rows that did not run (status skipped / failed) keep their slot, labelled with their status. `name`: the
    table's key in its result, recorded with each series (report.drawn)."""
    labels = [str(v) for v in table[label]]
    done = table["status"].eq("completed") if "status" in table else pd.Series(True, index=table.index)
    step = table["step(ms)"].astype(float).where(done)
    # a row without its no-op baseline (none ran, e.g. an engine compared alone) shows its whole step, so named:
    # a bar labelled compute that is the step would say communication costs nothing
    measured = table["compute(ms)"].astype(float).notna() & done
    compute = table["compute(ms)"].astype(float).where(measured).fillna(0)
    whole = step.where(done & ~measured).fillna(0)
    exposed = table["exposed_comm(ms)"].astype(float).where(done)
    spread = ci(table.assign(step=step), "step", "step_ci_low(ms)", "step_ci_high(ms)")
    reps = sorted({int(n) for n in table["timed_steps"].dropna()}) if "timed_steps" in table else []
    fig, ax = plt.subplots(figsize=(max(7, len(labels) * 0.9), 4.5))
    drawn = [Series(f"median step, bars its {ci_label(table)}", name, "step(ms)")]
    if measured.any():
        ax.bar(labels, compute, label=COMPUTE_LABEL)
        drawn.append(Series(COMPUTE_LABEL, name, "compute(ms)"))
    if (~measured & done).any():
        ax.bar(labels, whole, color="tab:gray", label=NO_BASELINE_LABEL)
        drawn.append(Series(NO_BASELINE_LABEL, name, "step(ms)"))
    if exposed.notna().any():
        ax.bar(labels, exposed.fillna(0), bottom=compute, label="exposed communication (step - compute)")
        drawn.append(Series("exposed communication (step - compute)", name, "exposed_comm(ms)"))
    exposed = exposed.fillna(0)
    if has_values(table, "exposed_ci_low(ms)"):  # a legend entry only for an interval drawn
        low, high = (table[c].astype(float).where(done) for c in ("exposed_ci_low(ms)", "exposed_ci_high(ms)"))
        ax.errorbar([x + 0.2 for x in range(len(labels))], compute + exposed,
                    yerr=[(exposed - low).clip(lower=0).fillna(0), (high - exposed).clip(lower=0).fillna(0)],
                    fmt="none", ecolor="tab:red", capsize=2, label=f"exposed, {ci_label(table)}")
    ax.errorbar(labels, step, yerr=spread, fmt="none", ecolor="black", capsize=3,
                label=f"median step, bars its {ci_label(table)}")
    if has_values(table, "comm(ms)"):
        ax.plot(labels, table["comm(ms)"].astype(float).where(done), "kD", label="time inside collectives")
        drawn.append(Series("time inside collectives", name, "comm(ms)"))
    top = max(float((compute + exposed).max()), float(whole.max()),
              float(table["step_ci_high(ms)"].astype(float).fillna(0).max()), 1e-6)
    for i, (ok, status) in enumerate(zip(done, table.get("status", ["completed"] * len(table)))):
        if not ok:
            ax.text(i, 0.02 * top, str(status), ha="center", va="bottom", rotation=90, color="gray")
    reps_text = f", {'/'.join(map(str, reps))} timed steps" if reps else ""
    ax.set(ylabel="time per step (ms)", title=f"Compute vs communication per {label}{reps_text}")
    ax.set_ylim(0, 1.5 * top)  # room for the legend above the bars
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize="small", loc="upper left", ncols=2 if len(labels) > 3 else 1)
    if has_values(table, "exposed_ci_low(ms)"):
        drawn.append(Series(f"exposed, {ci_label(table)}", name, "exposed_ci_low(ms)"))
    return save(fig, path, drawn)


def comm_bytes_bars(table: pd.DataFrame, path: Path, *, label: str, name: str | None = None) -> Path:
    """Per strategy / backend: payload bytes per step (stacked by phase, as the CommMeter counts them) beside
    the bytes the loopback interface carried per step (all ranks, system sampler). Rows that did not run keep
    their slot, labelled with their status."""
    labels = [str(v) for v in table[label]]
    done = table["status"].eq("completed") if "status" in table else pd.Series(True, index=table.index)
    x = list(range(len(labels)))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(7, len(labels) * 0.9), 4.5))
    bottom = pd.Series(0.0, index=table.index)
    series = []
    for phase in ("forward", "backward", "optimizer"):
        values = table[f"bytes_{phase}_per_step"].astype(float).where(done).fillna(0) / 1e6
        if values.any():
            ax.bar([i - width / 2 for i in x], values, width, bottom=bottom, label=f"payload, {phase} (mean of ranks)")
            series.append(Series(f"payload, {phase} (mean of ranks)", name, f"bytes_{phase}_per_step", 1e-6))
            bottom = bottom + values
    if not bottom.any():  # no collectives at all (e.g. noop only): still show the zero
        ax.bar([i - width / 2 for i in x], bottom, width, label="payload (mean of ranks)")
        series.append(Series("payload (mean of ranks)", name, "bytes_backward_per_step", 1e-6))
    loop = table["loopback_bytes_per_step"].astype(float).where(done) / 1e6
    ax.bar([i + width / 2 for i in x], loop.fillna(0), width, color="tab:gray", label="loopback interface (host)")
    series.append(Series("loopback interface (host)", name, "loopback_bytes_per_step", 1e-6))
    top = max(float(bottom.max()), float(loop.max()) if loop.notna().any() else 0.0, 1e-6)
    for i, total, ok, status in zip(x, bottom, done, table.get("status", ["completed"] * len(table))):
        if ok:  # small payloads (PowerSGD) are invisible next to big ones: print them
            ax.text(i - width / 2, total, f"{total:.3g}", ha="center", va="bottom", fontsize="x-small")
        else:
            ax.text(i, 0.02 * top, str(status), ha="center", va="bottom", rotation=90, color="gray")
    ax.set_xticks(x, labels)
    ax.set(ylabel="bytes per step (MB, 10^6 bytes)", title=f"Bytes per optimizer step per {label}")
    ax.set_ylim(0, 1.35 * top)
    ax.tick_params(axis="x", rotation=45)
    ax.legend(fontsize="small", loc="upper left", ncols=2 if len(labels) > 3 else 1)
    return save(fig, path, series)


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


