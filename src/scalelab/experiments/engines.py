"""Training engines side by side: the same config under torchrun + DDP and horovodrun + Horovod (seed 002).

Each engine that can run here is a cell, and (unless `baseline` is off) so is its exposed-communication baseline:
the same loop with the engine's own work and without its collectives (DDP with no-op collectives; Horovod's
DistributedOptimizer with its hooks, the allreduce a completed dummy: engines/horovod.py). An engine that cannot run
here (Horovod not installed, a base config it cannot honour) is a row with the reason. The DDP cell is the one
`compare backends` runs on gloo (same resolved config): run once in a study.

Like with like: Horovod's time inside collectives, critical communication and waiting for peers come from its own
timeline (analysis/hvdcomm.py), so they mean what DDP's mean; what still differs is said in words
(`comparability`): Horovod's interval figures are rank 0's (DDP's: the mean over ranks, the rank that sets the
step), and its baseline cannot keep the fusion-buffer copies (measured: `fusion_copies(ms)`) nor the background
cycle (not measured), so its exposed communication carries them.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.hvdcomm import HVD_COPIES_MS
from scalelab.analysis.interpret import fmt
from scalelab.config import TrainConfig
from scalelab.engines import registry as engines
from scalelab.errors import ConfigError
from scalelab.experiments.comparison import (DEFAULTS, Axis, answer_columns, comm_captions, comm_figures, decisions_of,
                                             ranked, run_comparison, set_aside)
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list

HOROVOD_NOTE = ("horovod: comm = comm_critical = the union of each step's ALLREDUCE spans in Horovod's timeline "
                "(the collective's execution, fusion-buffer copies included; it starts once negotiation found every "
                "rank ready), waiting_for_peers = per gradient, from a rank's enqueue to the last rank's once it has "
                "nothing left to compute (every rank's own stamps), algbw/busbw over "
                "comm; rank 0's figures: only rank 0 writes a timeline, other ranks' intervals are not available; "
                "comm_wait = from the last gradient produced to the end of synchronize(), as DDP's; collectives = "
                "gradient tensors handed to Horovod (its fusion buffer merges them on the wire); no buffers are "
                "broadcast per step")
BASELINE_NOTE = ("horovod's baseline: hvd.DistributedOptimizer with its hooks, compression and synchronize(), the "
                 "allreduce a completed dummy; it cannot keep the fusion-buffer copies (fusion_copies(ms): measured "
                 "in the real run from the timeline's MEMCPY spans, inside comm) nor Horovod's background "
                 "negotiation cycle (not measured); both land in horovod's exposed communication, with the time a "
                 "gradient waits for that cycle before its negotiation (in the blocking wait, in no timeline span)")


def run_engines(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    axis = Axis("engine", "compare_engines", engines.names(), lambda name: {"engine": name},
                label_of=lambda config: config.get("engine", "ddp"),
                skip=lambda name, cfg: engines.get(name).unavailable())
    result = run_comparison(ctx, base, axis, opts["engines"], launches=opts["launches"], baseline=opts["baseline"],
                            notes={"horovod": HOROVOD_NOTE, **({"horovod_baseline": BASELINE_NOTE}
                                                               if opts["baseline"] else {})})
    table = result.tables[axis.table]
    if len(table):
        table["fusion_copies(ms)"] = [fusion_copies(ctx, row) for row in table.to_dict("records")]
    return result


def fusion_copies(ctx: Context, row: dict) -> float | None:
    """A completed Horovod row's fusion-buffer copies per step (its last launch's summary), else None."""
    if row.get("engine") != "horovod" or row.get("status") != "completed" or not row.get("run_id"):
        return None
    return (ctx.cells.store.get(row["run_id"]).get("summary") or {}).get(HVD_COPIES_MS)


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
    lines, decision = ranked(table, "engine", "engine", 'ddp')
    rec = decision.card() if decision else None
    return out + comparability(table) + lines, rec


def comparability(table: pd.DataFrame) -> list[str]:
    """In words, which figures of a completed Horovod row compare with DDP's and which do not (module docstring)."""
    done = table[table["status"] == "completed"] if len(table) else table
    if "horovod" not in set(done.get("engine", ())):
        return []
    row = done[done["engine"] == "horovod"].iloc[0].to_dict()
    copies = row.get("fusion_copies(ms)")
    measured = ("not measured: no timeline" if copies is None or pd.isna(copies) else
                "measured from its timeline; no figure: the row is set aside" if set_aside(row, "engine") else
                f"{fmt(copies, ' ms')} per step, measured from its timeline")
    out = ["Horovod's step, blocking wait, time inside collectives, critical communication and waiting for peers "
           "mean what DDP's mean (its collective intervals from its own timeline); they are rank 0's, where "
           "DDP's time inside collectives is the mean over ranks and its critical communication the rank that "
           "sets the step."]
    if not pd.isna(row.get("exposed_comm(ms)")):
        out.append("Horovod's exposed communication is not fully comparable with DDP's: its baseline keeps the "
                   "hooks, compression and synchronize() but not the fusion-buffer copies "
                   f"({measured}) nor the background negotiation cycle (not measured), so both are in it, and so "
                   "is the time a gradient waits for that cycle before its negotiation starts, which is neither "
                   "inside a collective nor waiting for a peer (a part of the exposed communication above the "
                   "critical communication reads as interference).")
    return out


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
    decide=decisions_of("compare_engines", "engine", "ddp"),
    study_options=study_options,
    quick=False,
)
