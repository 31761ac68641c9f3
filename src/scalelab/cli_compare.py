"""`scalelab compare`: gradient-sync strategies and backends side by side on one base config.

    scalelab compare strategies                          # mlp, 2 ranks, 20 steps, every strategy + noop
    scalelab compare strategies --model cnn --strategies ddp,ddp+fp16,noop --accumulate 4
    scalelab compare backends --ranks 2 --set global_batch=128

Defaults (lowest priority, a --config file, --set and flags override them): model mlp, 2 ranks, 20 steps.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scalelab.cli_experiments import (ConfigOpt, DatasetOpt, ModelOpt, OutOpt, RanksOpt, SetOpt, StepsOpt,
                                      StoreOpt, StudyOpt, _store_and_out, base_config, console, show)

app = typer.Typer(no_args_is_help=True, help="Gradient-sync strategies or backends side by side (exposed comm, "
                                             "bytes, bandwidth).")

DEFAULTS = {"model": "mlp", "ranks": 2, "steps": 20}


def say(line: str) -> None:
    """A progress line as it is: "[study/compare 1/9] ..." is not rich markup."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def name_list(text: str | None) -> list[str] | None:
    return None if text is None else [v.strip() for v in text.split(",") if v.strip()]


@app.command("strategies")
def strategies_cmd(strategies: Optional[str] = typer.Option(
                       None, help="Comma-separated subset (default all): gather_scatter, allreduce, bucketed, ddp, "
                                  "ddp+fp16, ddp+bf16, ddp+powersgd, ddp+accumulate, noop (noop always runs)."),
                   accumulate: int = typer.Option(2, help="Micro-steps K of ddp+accumulate (>= 2; the global "
                                                          "batch is kept, each micro-step gets 1/K of it)."),
                   config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                   dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
                   ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
                   out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """Every gradient-sync strategy on one config: step, compute, comm, exposed comm, overlap, bytes, bandwidth."""
    from scalelab.experiments import compare

    base = base_config(config, set_, DEFAULTS, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(compare.strategies(base, st, study, out_dir, names=name_list(strategies), accumulate=accumulate,
                            say=say))


@app.command("backends")
def backends_cmd(backends: Optional[str] = typer.Option(None, help="Comma-separated subset of gloo, nccl, mpi "
                                                                   "(default all; those that cannot run here are "
                                                                   "listed as skipped, with the reason)."),
                 config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                 dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
                 ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
                 out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """The same config on gloo, NCCL and MPI: step, comm, exposed comm, busbw, bytes."""
    from scalelab.experiments import compare

    base = base_config(config, set_, DEFAULTS, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(compare.backends(base, st, study, out_dir, names=name_list(backends), say=say))
