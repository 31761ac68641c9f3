"""Exports of a finished run, written from its stored files alone: a Chrome / Perfetto trace, TensorBoard scalars,
and a benchmark's busbw plot.

The trace puts every rank's stage spans and collectives on one timeline. Open `trace.json` in https://ui.perfetto.dev or chrome://tracing. Each rank is a process row with two threads:
"stages" (data, h2d, forward, backward, comm, optimizer, eval, laid end to end from the step's start in the
order the loop runs them; a step scalelab found in a script's loop has data, forward_backward and optimizer; micro-steps of accumulation are merged into one forward and one backward span) and
"collectives" (each collective from launch to completion as its caller saw it; they may overlap backward).
Times come from each rank's wall clock (unix time), so ranks on one host line up. Each collective's last arrival
(the rank the others waited for: scalelab.analysis.stragglers, on clocks aligned by the run's clock offsets) carries
`"last_arrival": true` in its args and an instant event "last arrival" at its start. A run of the Horovod engine
adds a row for Horovod's timeline (rank 0): each tensor's negotiation and fused allreduce, aligned to the steps.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.analysis import timeline
from scalelab.analysis.stragglers import last_arrivals, offsets_of
from scalelab.errors import MissingExtra
from scalelab.store.rundir import RunDir

if TYPE_CHECKING:
    import pandas as pd

# forward_backward: a found step's forward and backward as one span (scalelab.run.found_steps)
TRACE_ORDER = ("data", "h2d", "forward", "backward", "forward_backward", "comm", "optimizer", "eval")


def trace_events(records: list[dict], last: set[tuple[int, int, int]] | None = None) -> list[dict]:
    """Chrome trace events (complete events, microseconds) for the step records of any ranks; `last` holds the
    (rank, step, index) of the collectives that were their last arrival (stragglers.last_arrivals): marked."""
    events: list[dict] = []
    last = last or set()
    for rec in records:
        rank, end = rec["rank"], rec["t_end(unix_s)"]
        t = end - rec["wall(s)"]
        events.append({"name": f"step {rec['step']}", "ph": "X", "pid": rank, "tid": "steps", "ts": t * 1e6,
                       "dur": rec["wall(s)"] * 1e6, "args": {"warmup": rec.get("warmup", False)}})
        for stage in TRACE_ORDER:
            dur = rec.get(f"{stage}(s)", 0.0)
            if dur > 0:
                events.append({"name": stage, "ph": "X", "pid": rank, "tid": "stages", "ts": t * 1e6,
                               "dur": dur * 1e6})
            t += dur
        if rec.get("evaluation(s)"):  # after the step's end, outside it
            events.append({"name": "eval", "ph": "X", "pid": rank, "tid": "stages", "ts": end * 1e6,
                           "dur": rec["evaluation(s)"] * 1e6})
        perf_end = rec.get("t_end(perf_s)")
        for k, (op, phase, start, seconds, nbytes) in enumerate(
                rec.get("comm_events", []) if perf_end is not None else []):
            ts = (end - (perf_end - start)) * 1e6
            args = {"phase": phase, "bytes": nbytes}
            if (rank, rec["step"], k) in last:
                args["last_arrival"] = True
                events.append({"name": "last arrival", "ph": "i", "s": "t", "pid": rank, "tid": "collectives",
                               "ts": ts})
            events.append({"name": op, "ph": "X", "pid": rank, "tid": "collectives", "ts": ts,
                           "dur": seconds * 1e6, "args": args})
    for rank in sorted({r["rank"] for r in records}):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
    return events


def write_trace(run_dir: Path) -> Path:
    """Write `trace.json` for a stored run from its step records (and Horovod's timeline, when it has one)."""
    rundir = RunDir(run_dir)
    records = rundir.read_steps()
    config = rundir.read_config() if rundir.config_file.is_file() else {}
    comparable, offsets = offsets_of(config, rundir.read_clocks())
    events = trace_events(records, last_arrivals(records, offsets) if comparable else None)
    text = rundir.read_horovod_timeline()
    if text:
        events += horovod_events(text, [r for r in records if r["rank"] == 0])
    return rundir.write_trace({"traceEvents": events, "displayTimeUnit": "ms"})


HOROVOD_PID = 1000  # the timeline's process row, apart from the ranks'


def horovod_events(text: str, rank0: list[dict]) -> list[dict]:
    """Horovod's timeline on the step clock: aligned on rank 0's gradient enqueues (analysis.timeline)."""
    spans = timeline.intervals(timeline.load_events(text))
    return timeline.trace_events(spans, timeline.align(spans, timeline.enqueues_unix(rank0)), pid=HOROVOD_PID)


TB_STAGES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other")


def step_scalars(rec: dict) -> dict[str, float]:
    """One step record's TensorBoard scalars, tag -> value: loss, accuracy, lr, step and stage times (ms), bytes."""
    out = {f"train/{key}": rec[key] for key in ("loss", "acc", "lr") if key in rec}
    out["time/step(ms)"] = 1e3 * rec["wall(s)"]
    out.update({f"stage/{stage}(ms)": 1e3 * rec[f"{stage}(s)"] for stage in TB_STAGES if f"{stage}(s)" in rec})
    if "evaluation(s)" in rec:
        out["time/eval(ms)"] = 1e3 * rec["evaluation(s)"]
    if "comm_bytes" in rec:
        out["comm/bytes"] = rec["comm_bytes"]
    return out


def write_scalars(run_dir: Path, *, required: bool = False) -> Path | None:
    """Rank 0's per-step scalars (`step_scalars`) and the evaluations' loss and accuracy, into
    `run_dir/tensorboard`. Without tensorboard: None and nothing written after a run (the export is a courtesy
    there), MissingExtra when the user asked for it (`required`, `scalelab runs tensorboard`).
    A step's scalars go in one event (a summary of several values, as TensorBoard reads them), not one event each
    as `SummaryWriter.add_scalar` writes them: ~10 scalars a step made that 5x slower, about 1 s per 3,000 steps on
    2 cores, paid after every study cell."""
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter
    except ImportError:  # tensorboard is optional: pip install 'scalelab[tensorboard]'
        if required:
            raise MissingExtra("the TensorBoard export", "tensorboard", "tensorboard") from None
        return None
    rundir = RunDir(run_dir)
    if not rundir.steps_file(0).is_file():
        return None

    def event(scalars: dict[str, float]) -> Summary:
        return Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()])

    out = rundir.tensorboard
    writer = FileWriter(str(out))
    try:
        for rec in rundir.read_steps(0):
            writer.add_summary(event(step_scalars(rec)), rec["step"])
        for ev in rundir.read_result(0)["evals"] if rundir.result_file(0).is_file() else []:
            writer.add_summary(event({"eval/loss": ev["loss"], "eval/acc": ev["acc"]}), ev["step"])
    finally:
        writer.close()
    return out


# ---------------------------------------------------------------- busbw plot

_BUSBW_COLUMNS = ("op", "size(B)", "busbw(GB/s)", "busbw_min(GB/s)", "busbw_max(GB/s)", "status")


def _bytes_label(x: float) -> str:
    """1K, 64M, 1G for powers of 1024 (the units of the size sweep), the plain number otherwise."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def plot_busbw(table: pd.DataFrame, path: Path, *, title: str | None = None, save=None) -> Path:
    """busbw (back-to-back loop) against message size, log-x, one line per op, a band from the slowest to the
    fastest single iteration.

    `table` has the columns of commbench's results; ops whose rows are all skipped appear in the legend as such.
    `save(fig, path) -> path`, when given, writes and closes the figure instead (the study's report saves it with
    the record of what it drew: report.figures.save; this layer does not import the report).
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed, and none is touched when one exists
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    missing = [c for c in _BUSBW_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"table: missing column {missing[0]!r}; needs {', '.join(_BUSBW_COLUMNS)}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for op, rows in table.groupby("op", sort=False):
            ok = rows[rows["status"] == "ok"].sort_values("size(B)")
            if ok.empty:
                ax.plot([], [], linestyle="none", label=f"{op} (skipped)")
                continue
            # plain arrays: matplotlib 3.7.0's fill_between fails on pandas Series
            sizes, low, high = (ok[c].to_numpy(dtype=float) for c in ("size(B)", "busbw_min(GB/s)", "busbw_max(GB/s)"))
            line, = ax.plot(sizes, ok["busbw(GB/s)"].to_numpy(dtype=float), marker="o", markersize=3, label=op)
            ax.fill_between(sizes, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: _bytes_label(x)))
        ax.set_xlabel("message size S (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
        ax.set_title((title + "\n" if title else "") + "line: back-to-back loop; band: single calls, slowest..fastest",
                     fontsize=9)
        fig.tight_layout()
        if save is not None:
            return Path(save(fig, Path(path)))
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
