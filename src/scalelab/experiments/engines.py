"""Training engines side by side: the same config under torchrun + DDP and horovodrun + Horovod (seed 002).

Each engine that can run here is a cell, and (unless `baseline` is off) so is its exposed-communication baseline:
the same loop without the engine's collectives (DDP with no-op collectives; Horovod with the plain optimizer and no
allreduce). An engine that cannot run here (Horovod not installed, a base config it cannot honour) is a row with
the reason. The DDP cell is the one `compare backends` runs on gloo (same resolved config): run once in a study.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.interpret import fmt
from scalelab.config import TrainConfig
from scalelab.engines import registry as engines
from scalelab.errors import ConfigError
from scalelab.experiments.comparison import (DEFAULTS, Axis, answer_columns, comm_captions, comm_figures, ranked,
                                             run_comparison, set_aside)
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list

HOROVOD_NOTE = ("horovod: comm = from each gradient's enqueue to the return of the optimizer's synchronize() (the "
                "moment the rank knows it is done; Horovod's own collective intervals are in the run's trace, from "
                "its timeline); comm_wait = the blocking synchronize(); collectives = gradient tensors handed to "
                "Horovod (its fusion buffer merges them on the wire); no buffers are broadcast per step")


def run_engines(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    axis = Axis("engine", "compare_engines", engines.names(), lambda name: {"engine": name},
                label_of=lambda config: config.get("engine", "ddp"),
                skip=lambda name, cfg: engines.get(name).unavailable())
    return run_comparison(ctx, base, axis, opts["engines"], launches=opts["launches"], baseline=opts["baseline"],
                          notes={"horovod": HOROVOD_NOTE})


def _flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(name, value, "allowed: true or false")


def engines_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_engines", pd.DataFrame())
    out = []
    for row in table.to_dict("records"):
        if row["status"] == "completed" and set_aside(row, "engine"):
            out.append(set_aside(row, "engine"))
        elif row["status"] == "completed":
            exposed = row.get("exposed_comm(ms)")
            out.append(f"{row['engine']}: step {fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{fmt(row['comm(ms)'], ' ms')}, blocking wait {fmt(row['comm_wait(ms)'], ' ms')}, exposed "
                       + (f"{fmt(exposed, ' ms')}." if exposed is not None and not pd.isna(exposed)
                          else "not measured (no baseline)."))
        else:
            out.append(f"{row['engine']}: {row['status']} ({row['reason']}).")
    lines, rec = ranked(table, "engine", "engine")
    return out + lines, rec


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study (the quick study leaves it out). The DDP cell is backends' gloo cell;
    Horovod adds one launch (~15 s on 2 cores), without its baseline (the default study's 10-minute budget): its
    exposed communication is marked not applicable."""
    comm_model = plan.comm_model
    return {"launches": 1, "baseline": False, "set": {**comm_model, "ranks": 2, "bucket_mb": 4.0}}


EXPERIMENT = Experiment(
    name="engines", command="compare engines", section="engines", order=65,
    title="Training engines: DDP and Horovod",
    question="Horovod (seed 002's engine) next to torchrun + DDP on the same model, data and loop: step, "
             "communication, exposed communication, bytes.",
    help="The same config under torchrun + DDP and horovodrun + Horovod (skipped, with the reason, where Horovod "
         "is not installed: run `scalelab setup horovod`).",
    options=(Option(name="engines", default=None,
                    help=f"Comma-separated subset (default all): {', '.join(engines.names())}.",
                    parse=lambda v, n: name_list(v, n, engines.names())),
             launches_option(),
             Option(name="baseline", default=True, help="Run each engine's baseline cell (no collectives) for its "
                                                         "exposed communication; off: marked not applicable.",
                    parse=_flag)),
    defaults=DEFAULTS,
    run=run_engines,
    figures=comm_figures("compare_engines", "engine"),
    columns={"compare_engines": answer_columns("engine")},
    captions=comm_captions("compare_engines", "training engine"),
    interpret=engines_result,
    study_options=study_options,
    quick=False,
)
