"""Communication backends side by side: the same config on gloo, NCCL and MPI (seed 004 exp 4). Backends that
cannot run here are listed with the reason; each backend's baseline cell (no-op collectives) gives its exposed
communication."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.compare import BACKENDS, backends_table
from scalelab.analysis.interpret import fmt, ranking
from scalelab.config import TrainConfig, cuda_device_count
from scalelab.errors import ConfigError
from scalelab.experiments.strategies import DEFAULTS, EXPOSED_NOTE, LOOPBACK_NOTE, baseline_cells, comm_figures, ordered
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked


def runtime_facts() -> dict:
    """What this machine offers the backends, checked now."""
    import torch.distributed as dist

    return {"gpus": cuda_device_count(), "gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available()}


def backend_skip_reason(backend: str, base: TrainConfig, facts: dict) -> str | None:
    """Why `backend` cannot run `base` here (None when it can)."""
    if backend == "gloo" and not facts["gloo"]:
        return "torch.distributed.is_gloo_available() is False"
    if backend == "nccl":
        if facts["gpus"] < base.ranks:
            return f"needs CUDA with >= {base.ranks} GPUs (found {facts['gpus']})"
        if not facts["nccl"]:
            return "torch.distributed.is_nccl_available() is False"
        if base.device == "cpu":
            return "needs device cuda (the base config sets device cpu)"
    if backend == "mpi" and not facts["mpi"]:
        return "torch.distributed.is_mpi_available() is False"
    return None


def run_backends(ctx: Context, base: TrainConfig, opts: dict, facts: dict | None = None) -> Result:
    facts = runtime_facts() if facts is None else facts
    cells, skipped = [], {}
    for backend in ordered(opts["backends"], BACKENDS):
        reason = backend_skip_reason(backend, base, facts)
        if reason is None:
            try:
                cell = Cell(backend, with_fields(base, backend=backend), repeats=opts["launches"])
                baseline = baseline_cells([cell])[0]
            except ConfigError as err:  # the config cannot run on this backend here: say why, do not drop it
                reason = str(err)
        if reason is not None:
            ctx.say(f"[backends] {backend}: skipped: {reason}")
            skipped[backend] = reason
            continue
        cells += [cell, baseline]

    def analyse(results):
        runs = ctx.cells.rows(results)
        pairs = list(zip(runs[0::2], runs[1::2]))  # cells come in pairs: the backend, then its baseline
        pairs += [({"backend": b, "status": "skipped", "reason": why}, None) for b, why in skipped.items()]
        return backends_table(pairs)

    return Result("compare_backends", {"compare_backends": run_checked(ctx, cells, group="compare",
                                                                       analyse=analyse)},
                  notes={"exposed": EXPOSED_NOTE, "loopback": LOOPBACK_NOTE, "skipped": skipped})


def backends_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_backends", pd.DataFrame())
    out = []
    for row in table.to_dict("records"):
        if row["status"] == "completed":
            out.append(f"{row['backend']}: step {fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{fmt(row['comm(ms)'], ' ms')}, busbw {fmt(row['busbw(GB/s)'], ' GB/s')}.")
        else:
            out.append(f"{row['backend']}: {row['status']} ({row['reason']}).")
    done = table[table["status"] == "completed"] if len(table) else table
    rec = None
    if len(done) > 1:
        lines, best = ranking(done, "backend", "backend")
        out += lines
        if best is not None:
            rec = f"Use the {best['backend']} backend ({fmt(best['step(ms)'], ' ms')} per step)."
    return out, rec

def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    comm_model = plan.comm_model
    return {"launches": 1 if q else 3,  # shares cells with strategies
            "set": {**comm_model, "ranks": 2, "bucket_mb": 4.0}}


EXPERIMENT = Experiment(
    name="backends", command="compare backends", section="backends", order=60,
    title="Communication backends",
    question="gloo vs NCCL (vs MPI): which is faster here? (seed 004 exp 4)",
    help="The same config on gloo, NCCL and MPI: step, comm, exposed comm, busbw, bytes.",
    options=(Option(name="backends", default=None, help="Comma-separated subset of gloo, nccl, mpi (default all; "
                                                        "those that cannot run here are listed as skipped, with "
                                                        "the reason).",
                    parse=lambda v, n: name_list(v, n, BACKENDS)), launches_option()),
    defaults=DEFAULTS,
    run=run_backends,
    figures=comm_figures("compare_backends", "backend"),
    interpret=backends_result,
    study_options=study_options,
)
