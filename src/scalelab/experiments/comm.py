"""The collective microbenchmark in a study (seed 000 Q3.2): one `bench comm` run, busbw per message size.
`scalelab bench comm` runs the same benchmark on its own."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from scalelab.analysis.interpret import fmt
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan
from scalelab.lab.cells import Cell
from scalelab.measure.commbench import CommBenchConfig, busbw_gbps, format_size, read_results
from scalelab.report import figures
from scalelab.report.figures import Series
from scalelab.run.exports import plot_busbw
from scalelab.run.kinds import busbw_title


def bench_config(opts: dict):
    cfg = CommBenchConfig(**{k: v for k, v in opts.items() if v is not None})
    return dataclasses.replace(cfg, backend=cfg.resolved_backend)  # what runs here: the cell's identity


def _run(ctx: Context, base, opts: dict) -> Result:
    [res] = ctx.cells.run([Cell("bench comm", bench_config(opts), kind="bench")], group="comm")
    if res.status == "missing":
        return Result("comm", {}, notes={"missing": f"{ctx.cells.study}/comm"})
    rundir = ctx.cells.runs([res])[0]["files"]
    result = Result("comm", {"comm": comm_table(read_results(rundir.path))}, notes={"run": rundir.run_id})
    if res.status == "failed":
        result.notes["failed"] = res.reason
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    if len(result.tables["comm"]):  # a bench that measured nothing has no figure
        result.files.append(busbw_figure(result.tables["comm"], ctx.out_dir / "comm_busbw.png",
                                         busbw_title(bench_config(opts))))
    return result


def busbw_figure(table: pd.DataFrame, path: Path, title: str | None = None) -> Path:
    """The bench's busbw plot (run.exports.plot_busbw, the one its run folder holds) drawn again for the report
    from the study's table (`comm_table`: its single-call band under the bench's names again), saved with the
    record of what it drew: each op's line reads the table's busbw(GB/s) (report.drawn)."""
    results = table.rename(columns={ours: bench for bench, ours in SINGLE_CALL.items()})
    ops = list(dict.fromkeys(results["op"])) if len(results) else []
    skipped = {op for op in ops if not (results[results["op"] == op]["status"] == "ok").any()}
    series = [Series(f"{op} (skipped)") if op in skipped else Series(op, "comm", "busbw(GB/s)") for op in ops]
    return plot_busbw(results, path, title=title, save=lambda fig, p: figures.save(fig, p, series))


def _opt(name: str, help: str) -> Option:
    return Option(name=name, default=None, help=help)


# the bench's single-call columns, named for what they are in the study's table: the band of single calls is not the
# back-to-back loop's (issue 60: a loop's busbw outside "its" min-max, which was the single calls'), and the
# median's interval is the median's
SINGLE_CALL = {"time_ci_low(us)": "time_median_ci_low(us)", "time_ci_high(us)": "time_median_ci_high(us)",
               "busbw_min(GB/s)": "busbw_single_min(GB/s)", "busbw_max(GB/s)": "busbw_single_max(GB/s)"}
SPIKE = 1.5  # a size whose busbw is this many times both neighbours' is one size standing out, not a peak


def comm_table(results: pd.DataFrame) -> pd.DataFrame:
    """The bench's results with a readable size column, the single calls' busbw (median, slowest, fastest call)
    apart from the loop's, and every interval named after its figure."""
    table = results.rename(columns=SINGLE_CALL)
    if not len(table):
        return table
    table.insert(table.columns.get_loc("size(B)"), "size", [format_size(int(s)) for s in table["size(B)"]])
    if "time_median(us)" in table:
        single = [busbw_gbps(op, int(s), t * 1e-6, int(r)) if t and t > 0 else float("nan")
                  for op, s, t, r in zip(table["op"], table["size(B)"], table["time_median(us)"], table["ranks"])]
        table.insert(table.columns.get_loc("busbw_single_min(GB/s)"), "busbw_single(GB/s)", single)
    return table


def comm_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("comm", pd.DataFrame())
    if not len(table):
        return [], None
    out = []
    ok = table[table["status"] == "ok"]
    for op, g in ok.groupby("op", sort=False):
        g = g.sort_values("size(B)").reset_index(drop=True)
        at = int(g["busbw(GB/s)"].idxmax())
        peak = g.loc[at]
        small = g.loc[g["size(B)"].idxmin()]
        loop = small.get("time_loop(us)")
        per_call = (f"{fmt(loop, ' µs')} per call in a back-to-back loop, median single call "
                    f"{fmt(small['time_median(us)'], ' µs')}" if loop is not None and not pd.isna(loop)
                    else f"{fmt(small['time_median(us)'], ' µs')} per call")
        out.append(f"{op}: {_peak(g, at)}; at {format_size(int(small['size(B)']))} only "
                   f"{fmt(small['busbw(GB/s)'], ' GB/s')} ({per_call}: latency-bound).")
    wrong = int(table["wrong"].sum())
    out.append(f"Correctness check: {wrong} wrong element(s) over every op and size.")
    return out, None


def _peak(g: pd.DataFrame, at: int) -> str:
    """The largest busbw of one op (the loop's), or, where it stands alone above both neighbouring sizes (SPIKE
    times theirs), one size standing out, said with its neighbours."""
    peak = g.loc[at]
    words = f"busbw {fmt(peak['busbw(GB/s)'], ' GB/s')} at {format_size(int(peak['size(B)']))}"
    near = [g.loc[i, "busbw(GB/s)"] for i in (at - 1, at + 1) if 0 <= i < len(g)]
    if len(near) == 2 and peak["busbw(GB/s)"] > SPIKE * max(near):
        return (f"largest {words}, one size standing out: its neighbours reach {fmt(near[0])} and "
                f"{fmt(near[1], ' GB/s')}, so it is noise until measured again, not a plateau")
    return f"peak {words}"


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    return {"begin": "4K", "end": "4M" if q else "16M", "iters": 5 if q else 10, "ranks": 2}


EXPERIMENT = Experiment(
    name="comm", command=None, section="comm", order=70, base=False,
    title="Communication microbenchmark",
    question="What bandwidth do collectives reach per message size? (seed 000 Q3.2)",
    help="Collectives over a size sweep: algbw, busbw (nccl-tests), checked.",
    options=(_opt("ops", "allreduce, allgather, reduce_scatter, broadcast (or all)."),
             _opt("begin", "Smallest message size, e.g. 1K."), _opt("end", "Largest message size, e.g. 64M."),
             _opt("factor", "Each size is the previous one times this."),
             _opt("warmup", "Untimed iterations per size and op."),
             _opt("iters", "Timed iterations per size (default: chosen per size)."),
             _opt("ranks", "Processes."), _opt("backend", "auto, gloo or nccl."),
             _opt("dtype", "float32, float16 or bfloat16.")),
    run=_run,
    interpret=comm_result,
    captions={"comm_busbw.png": "Bus bandwidth per message size and collective.",
              "comm": "Per collective and message size: time per call (the back-to-back loop's mean; the median "
                      "single call with its 95 % interval), the loop's bus bandwidth busbw(GB/s) (nccl-tests), and "
                      "the single calls' busbw_single(GB/s) (median call) within its own band of the slowest and "
                      "fastest call; whether the results were right."},
    columns={"comm": ["op", "size", "time_loop(us)", "time_median(us)", "time_median_ci_low(us)",
                      "time_median_ci_high(us)", "busbw(GB/s)", "busbw_single(GB/s)", "busbw_single_min(GB/s)",
                      "busbw_single_max(GB/s)", "wrong", "status"]},
    version=2,  # issue 60: a size column, the single calls' band apart from the loop's busbw
    study_options=study_options,
)
