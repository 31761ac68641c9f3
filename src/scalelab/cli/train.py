"""`scalelab train`: one run. Every config field is a flag (generated in options.py).

    scalelab train --model cnn --dataset synthetic --ranks 2 --global-batch 128 --epochs 1
    scalelab train --config run.yaml --set lr=0.1 --sync bucketed
    scalelab train --resume RUN
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scalelab.analysis import keys
from scalelab.cli.common import console, run_failed
from scalelab.cli.options import KEYWORD, config_params, config_values, merge, store_option
from scalelab.run.execute import RunFailed, execute, resume_run
from scalelab.store import open_store


def train(**kw) -> None:
    """Train once, measuring every step's stages; store the run and print its summary."""

    flags = config_values(kw)
    if kw["resume"] is not None:
        extra = [f"--{k.replace('_', '-')}" for k in flags] + [name for name, given in
                 (("--config", kw["config"]), ("--set", kw["set_"]), ("--study", kw["study"])) if given]
        if extra:
            raise typer.BadParameter(f"a resumed run keeps its stored config; drop {', '.join(extra)}",
                                     param_hint="--resume")
    try:
        if kw["resume"] is not None:
            outcome = resume_run(kw["resume"], open_store(kw["store"]), say=console.print)
        else:
            cfg = merge({}, kw["config"], kw["set_"], flags)
            outcome = execute(cfg, open_store(kw["store"]), argv=sys.argv, study=kw["study"], say=console.print)
    except RunFailed as err:
        raise run_failed(err)
    print_summary(outcome.run_id, outcome.summary)


train.__signature__ = inspect.Signature([
    *config_params(),
    inspect.Parameter("resume", KEYWORD, annotation=Optional[str], default=typer.Option(
        None, "--resume", help="Continue this failed or interrupted run from its last checkpoint (its stored "
                               "config; no other config flags).")),
    inspect.Parameter("study", KEYWORD, annotation=Optional[str],
                      default=typer.Option(None, help="Group the run under a study name.")),
    inspect.Parameter("store", KEYWORD, annotation=Optional[Path], default=store_option()),
])


def print_summary(run_id: str, summary: dict) -> None:
    table = Table(title=f"run {run_id}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    wanted = [keys.EPOCH_S, keys.EPOCH_NO_DATA_S, keys.THROUGHPUT, keys.STEP_MEDIAN_MS,
              *(keys.stage_ms(s) for s in ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other")),
              keys.EVAL_MS, keys.COMM_TIME_MS, keys.COMM_IN_BACKWARD_MS,
              keys.COMM_WAIT_MS, keys.COMM_BYTES_PER_STEP, keys.COMM_BUSBW, keys.MEMORY_PEAK_RSS_GIB,
              keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, keys.TRAIN_LOSS, keys.EVAL_LOSS, keys.EVAL_ACC, keys.STEPS_TIMED,
              keys.PRECISION_HALF_WIDTH_PCT, keys.PRECISION_TARGET_PCT, keys.PRECISION_REACHED, keys.QUALITY,
              keys.SCRIPT_WALL_S, keys.COMM_BYTES_TOTAL, keys.COMM_COLLECTIVES_TOTAL, keys.COMM_TIME_TOTAL_MS]
    for key in wanted:
        if key in summary:
            value = summary[key]
            table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else str(value))
    console.print(table)
