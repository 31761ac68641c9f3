"""The collective microbenchmark in a study (seed 000 Q3.2): one `bench comm` run, busbw per message size.
`scalelab bench comm` runs the same benchmark on its own."""
from __future__ import annotations

import dataclasses
import shutil

import pandas as pd

from scalelab.analysis.interpret import fmt
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan
from scalelab.lab.cells import Cell
from scalelab.measure.commbench import CommBenchConfig, read_results


def bench_config(opts: dict):
    cfg = CommBenchConfig(**{k: v for k, v in opts.items() if v is not None})
    return dataclasses.replace(cfg, backend=cfg.resolved_backend)  # what runs here: the cell's identity


def _run(ctx: Context, base, opts: dict) -> Result:
    [res] = ctx.cells.run([Cell("bench comm", bench_config(opts), kind="bench")], group="comm")
    if res.status == "missing":
        return Result("comm", {}, notes={"missing": f"{ctx.cells.study}/comm"})
    rundir = ctx.cells.runs([res])[0]["files"]
    result = Result("comm", {"comm": read_results(rundir.path)}, notes={"run": rundir.run_id})
    if res.status == "failed":
        result.notes["failed"] = res.reason
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    result.files.append(shutil.copyfile(rundir.busbw_plot, ctx.out_dir / "comm_busbw.png"))
    return result


def _opt(name: str, help: str) -> Option:
    return Option(name=name, default=None, help=help)


def comm_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("comm", pd.DataFrame())
    if not len(table):
        return [], None
    out = []
    ok = table[table["status"] == "ok"]
    for op, g in ok.groupby("op", sort=False):
        peak = g.loc[g["busbw(GB/s)"].idxmax()]
        small = g.loc[g["size(B)"].idxmin()]
        loop = small.get("time_loop(us)")
        per_call = (f"{fmt(loop, ' µs')} per call in a back-to-back loop, median single call "
                    f"{fmt(small['time_median(us)'], ' µs')}" if loop is not None and not pd.isna(loop)
                    else f"{fmt(small['time_median(us)'], ' µs')} per call")
        out.append(f"{op}: peak busbw {fmt(peak['busbw(GB/s)'], ' GB/s')} at {int(peak['size(B)']):,} B; at "
                   f"{int(small['size(B)']):,} B only {fmt(small['busbw(GB/s)'], ' GB/s')} "
                   f"({per_call}: latency-bound).")
    wrong = int(table["wrong"].sum())
    out.append(f"Correctness check: {wrong} wrong element(s) over every op and size.")
    return out, None


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
              "comm": "Per collective, implementation and message size: time per call (the loop's mean, and the "
                      "median with its 95 % interval), algorithm and bus bandwidth (the nccl-tests definitions), and "
                      "whether the results were right."},
    study_options=study_options,
)
