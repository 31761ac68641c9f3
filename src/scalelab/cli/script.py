"""`scalelab run -- python train.py ARGS`: the user's own script, measured (scalelab.run.script).

    scalelab run -- python train.py --epochs 1
    scalelab run --ranks 2 -- python train.py --batch {per_worker_batch} --global-batch 256
    scalelab run --local-nodes 2 --link-gbps 1 -- python train.py
    scalelab run --nnodes 2 --node-rank 0 --rdzv-endpoint HOST:PORT --run-id job7 -- python -m mypkg.train
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import console, run_failed
from scalelab.cli.options import field_option, store_option
from scalelab.cli.train import print_summary
from scalelab.run.execute import RunFailed, execute_run
from scalelab.run.script import SCRIPT, ScriptConfig
from scalelab.store import open_store


def run_script(
    command: Optional[list[str]] = typer.Argument(None, help="The command after --: python SCRIPT.py ARGS or "
                                                             "python -m MODULE ARGS; placeholders {workers}, "
                                                             "{ranks}, {nnodes}, {global_batch}, "
                                                             "{per_worker_batch} are filled in."),
    ranks: int = typer.Option(1, "--ranks", "-n", help="Processes per node."),
    nnodes: int = typer.Option(1, help="Nodes in the run (each node runs the same command)."),
    node_rank: int = typer.Option(0, help="This node's rank, 0..nnodes-1."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="host:port of node 0 for multi-node runs."),
    local_nodes: int = field_option("local_nodes"),
    link_gbps: Optional[float] = field_option("link_gbps"),
    link_delay_ms: Optional[float] = field_option("link_delay_ms"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b",
                                               help="Fills {global_batch} and {per_worker_batch}."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per rank (default: cores / local ranks)."),
    warmup_steps: int = typer.Option(2, help="First marked steps excluded from every timing."),
    hang_timeout: float = typer.Option(300.0, "--hang-timeout",
                                       help="Fail the run when no rank makes progress (a stage, a collective) for "
                                            "this many seconds (0 = no watchdog)."),
    run_id: Optional[str] = typer.Option(None, help="Fixed run id (the nodes of one multi-node run share it)."),
    study: Optional[str] = typer.Option(None, help="Group the run under a study name."),
    store: Optional[Path] = store_option(),
) -> None:
    """Run your own training script under torchrun and measure it: wall time, system metrics and collectives
    always; steps and stages where it uses scalelab.probe."""

    cfg = ScriptConfig(command=tuple(command or ()), ranks=ranks, nnodes=nnodes, node_rank=node_rank,
                       rdzv_endpoint=rdzv_endpoint, local_nodes=local_nodes, link_gbps=link_gbps,
                       link_delay_ms=link_delay_ms, global_batch=global_batch, threads=threads,
                       warmup_steps=warmup_steps, hang_timeout_s=hang_timeout, run_id=run_id)
    try:
        done = execute_run(SCRIPT, cfg, open_store(store), argv=sys.argv, study=study, say=console.print)
    except RunFailed as err:
        raise run_failed(err)
    print_summary(done.run_id, done.summary)
    if done.status != "completed":  # it ran, but not as asked (the batch it marked is not the one given)
        raise run_failed(RunFailed(done.run_id, done.reason))
