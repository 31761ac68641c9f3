"""Training engines side by side: the same config under torchrun + DDP and horovodrun + Horovod (seed 002).

Each engine that can run here is a cell, and (unless `baseline` is off) so is its exposed-communication baseline:
the same loop without the engine's collectives (DDP with no-op collectives; Horovod with the plain optimizer and no
allreduce). An engine that cannot run here (Horovod not installed, a base config it cannot honour) is a row with
the reason. The DDP cell is the one `compare backends` runs on gloo (same resolved config): run once in a study.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.compare import engines_table
from scalelab.analysis.interpret import fmt, ranking
from scalelab.config import TrainConfig
from scalelab.engines import registry as engines
from scalelab.errors import ConfigError
from scalelab.experiments.strategies import DEFAULTS, EXPOSED_NOTE, baseline_cells, comm_figures, ordered
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked

HOROVOD_NOTE = ("horovod: comm = from each gradient's enqueue to the return of the optimizer's synchronize() (the "
                "moment the rank knows it is done; Horovod's own collective intervals are in the run's trace, from "
                "its timeline); comm_wait = the blocking synchronize(); collectives = gradient tensors handed to "
                "Horovod (its fusion buffer merges them on the wire); no buffers are broadcast per step")


def engine_skip_reason(name: str) -> str | None:
    return engines.get(name).unavailable()


def run_engines(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    with_baseline = opts["baseline"]
    cells, skipped, names = [], {}, []
    for name in ordered(opts["engines"], engines.names()):
        reason = engine_skip_reason(name)
        if reason is None:
            try:
                cell = Cell(name, with_fields(base, engine=name), repeats=opts["launches"])
                pair = [cell, *baseline_cells([cell])] if with_baseline else [cell]
            except ConfigError as err:  # the base config cannot run on this engine: say why, do not drop it
                reason = str(err)
        if reason is not None:
            ctx.say(f"[engines] {name}: skipped: {reason}")
            skipped[name] = reason
            continue
        cells += pair
        names.append(name)

    def analyse(results):
        runs = ctx.cells.rows(results)
        step = 2 if with_baseline else 1
        pairs = [(runs[i], runs[i + 1] if with_baseline else None) for i in range(0, len(runs), step)]
        pairs += [({"engine": e, "status": "skipped", "reason": why}, None) for e, why in skipped.items()]
        return engines_table(pairs, order=engines.names())

    table = run_checked(ctx, cells, group="compare", analyse=analyse)
    notes = {"exposed": EXPOSED_NOTE if with_baseline else "exposed communication: not applicable (run without "
                                                             "the baseline cells, option baseline off)",
             "horovod": HOROVOD_NOTE, "skipped": skipped}
    return Result("compare_engines", {"compare_engines": table}, notes=notes)


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
        if row["status"] == "completed":
            exposed = row.get("exposed_comm(ms)")
            out.append(f"{row['engine']}: step {fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{fmt(row['comm(ms)'], ' ms')}, blocking wait {fmt(row['comm_wait(ms)'], ' ms')}, exposed "
                       + (f"{fmt(exposed, ' ms')}." if exposed is not None and not pd.isna(exposed)
                          else "not measured (no baseline)."))
        else:
            out.append(f"{row['engine']}: {row['status']} ({row['reason']}).")
    done = table[table["status"] == "completed"] if len(table) else table
    rec = None
    if len(done) > 1:
        lines, best = ranking(done, "engine", "engine")
        out += lines
        if best is not None:
            rec = f"Use the {best['engine']} engine ({fmt(best['step(ms)'], ' ms')} per step)."
    return out, rec

def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study (the quick study leaves it out). The DDP cell is backends' gloo cell; Horovod adds
    one launch (~15 s on 2 cores), without its baseline (the default study's 10-minute budget): its exposed
    communication is marked not applicable"""
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
    interpret=engines_result,
    study_options=study_options,
    quick=False,
)
