"""Communication backends side by side: the same config on gloo, NCCL and MPI (seed 004 exp 4). Backends that
cannot run here are listed with the reason; each backend's baseline cell (no-op collectives) gives its exposed
communication."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.compare import BACKENDS
from scalelab.analysis.interpret import fmt
from scalelab.config import TrainConfig, cuda_device_count
from scalelab.experiments.comparison import (DEFAULTS, Axis, answer_columns, comm_captions, comm_figures, decisions_of,
                                             ranked, run_comparison, set_aside)
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list


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
    axis = Axis("backend", "compare_backends", BACKENDS, lambda backend: {"backend": backend},
                label_of=lambda config: config["backend"],
                skip=lambda backend, cfg: backend_skip_reason(backend, cfg, facts))
    return run_comparison(ctx, base, axis, opts["backends"], launches=opts["launches"])


def backends_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_backends", pd.DataFrame())
    out = []
    for row in table.to_dict("records"):
        if row["status"] == "completed" and set_aside(row, "backend"):
            out.append(set_aside(row, "backend"))
        elif row["status"] == "completed":
            out.append(f"{row['backend']}: step {fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{fmt(row['comm(ms)'], ' ms')}, busbw {fmt(row['busbw(GB/s)'], ' GB/s')}.")
        else:
            out.append(f"{row['backend']}: {row['status']} ({row['reason']}).")
    lines, decision = ranked(table, "backend", "backend", None)
    rec = decision.card() if decision else None
    return out + lines, rec


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    comm_model = plan.comm_model
    return {"launches": 2 if q else 3,  # shares cells with strategies
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
    columns={"compare_backends": answer_columns("backend")},
    captions=comm_captions("compare_backends", "backend"),
    interpret=backends_result,
    decide=decisions_of("compare_backends", "backend"),
    study_options=study_options,
)
