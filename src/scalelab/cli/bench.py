"""`scalelab bench comm`: the collective microbenchmark."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import console, err_console, run_failed
from scalelab.cli.options import field_option, store_option
from scalelab.measure.commbench import CommBenchConfig, results_rich_table
from scalelab.run.execute import RunFailed, run_commbench
from scalelab.store import open_store

app = typer.Typer(no_args_is_help=True, help="Microbenchmarks.")


@app.command("comm")
def bench_comm(
    ops: str = typer.Option("all", help="Comma-separated: allreduce, allgather, reduce_scatter, broadcast (or all)."),
    begin: str = typer.Option("1K", "--begin", "-b", help="Smallest message size S in bytes (K/M/G = 1024^1..3)."),
    end: str = typer.Option("64M", "--end", "-e", help="Largest message size S in bytes."),
    factor: int = typer.Option(2, "--factor", "-f", help="Each size is the previous one times this."),
    warmup: int = typer.Option(5, help="Untimed iterations per size and op."),
    iters: Optional[int] = typer.Option(None, help="Timed iterations per size and op; default: chosen per size "
                                                   "(~0.2 s each, 5..1000: many for small messages)."),
    ranks: int = typer.Option(2, "--ranks", "-n", help="Processes on this node (with --local-nodes: on each node)."),
    local_nodes: int = field_option("local_nodes"),
    link_gbps: Optional[float] = field_option("link_gbps"),
    link_delay_ms: Optional[float] = field_option("link_delay_ms"),
    launcher: str = typer.Option("namespaces", "--launcher", help="Where the --local-nodes nodes come from: "
                                 "namespaces of this machine, or slurm (inside an allocation: one job step across its "
                                 "first --local-nodes nodes, the cluster's own link)."),
    backend: str = typer.Option("auto", help="auto, gloo or nccl (nccl needs a CUDA GPU per rank)."),
    dtype: str = typer.Option("float32", help="float32, float16 or bfloat16."),
    store: Optional[Path] = store_option(),
) -> None:
    """Time collectives over a size sweep (algbw, busbw as nccl-tests), check every result element, store the run."""

    cfg = CommBenchConfig(ops=ops, begin=begin, end=end, factor=factor, warmup=warmup, iters=iters, ranks=ranks,
                          backend=backend, dtype=dtype, local_nodes=local_nodes, link_gbps=link_gbps,
                          link_delay_ms=link_delay_ms, nodes_launcher=launcher)
    try:
        out = run_commbench(cfg, open_store(store), argv=sys.argv, say=console.print)
    except RunFailed as err:
        raise run_failed(err)
    console.print(results_rich_table(out.table, title=f"run {out.run_id}"))
    console.print(f"wrote {out.run_dir}/results.csv, results.json, busbw.png", highlight=False)
    if out.reason:
        err_console.print(f"error: run {out.run_id} failed: {out.reason}", highlight=False)
        raise typer.Exit(1)
