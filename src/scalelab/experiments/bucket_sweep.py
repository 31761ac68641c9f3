"""DDP's gradient bucket size swept: which `bucket_cap_mb` is fastest, and do buckets hide communication?

The DDP paper (Li et al., VLDB 2020, §3.2.3 and Fig. 7) shows that the bucket size trades the number of
collectives against how early the first one can start; seed 003 concluded that DDP's buckets hide communication
behind backward. Here the sizes are fractions of the model's gradient bytes (1/16, 1/4 and all of them by
default), so that they really differ for the model at hand: with one bucket of all the gradients nothing can start
before backward ends, which is what overlap is measured against.

Each size is a DDP cell of the base config. The no-op-collectives baseline (scalelab.sync.registry.baseline_fields)
is measured once, at the base config's own bucket size: exposed communication = median step - that baseline's
median step, overlap = 1 - exposed / comm, each with its interval (scalelab.analysis.compare). At the study's
sizes the base bucket's cells are the strategies experiment's DDP cell and baseline, reused. The fastest size is
named only when it beats every other size as a finding between configurations (scalelab.analysis.interpret:
step intervals separated and launches not interleaved, at least 2 launches each); "no size is faster beyond noise"
is an answer.

    scalelab bucket-sweep --model mlp --ranks 2 --fractions 0.0625,0.25,1
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from scalelab.analysis.compare import comparison_table
from scalelab.analysis.compare import trusted
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option
from scalelab.lab.decision import Decision, card, rank
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked
from scalelab.experiments.comparison import overlap_span, overlap_whole
from scalelab.report import figures
from scalelab.analysis.repeats import LAUNCH_MEDIANS, WITHIN_DOF, WITHIN_VAR
from scalelab.sync import registry as syncs
from scalelab.train.setup import build_inputs
from scalelab.zoo.models import parameter_bytes

MIB = 2**20
COLUMNS = ["bucket", "bucket_mb", "share_of_gradients", "status", "reason", "launches", "timed_steps", "step(ms)",
           "step_ci_low(ms)", "step_ci_high(ms)", "compute(ms)", "comm(ms)", "comm_critical(ms)",
           "waiting_for_peers(ms)", "exposed_comm(ms)", "exposed_ci_low(ms)",
           "exposed_ci_high(ms)", "overlap", "overlap_ci_low", "overlap_ci_high", "collectives_per_step",
           "bytes_per_step", "quality", "run_id", "baseline_run_id",
           # the launches' own medians and spread: the decision's noise model reads them (lab.decision.step_side);
           # without them a size was compared on its two sides' own intervals, 48 launches short of deciding
           "step_launch_min(ms)", "step_launch_max(ms)", LAUNCH_MEDIANS, WITHIN_VAR, WITHIN_DOF]
NOTE = ("one no-op-collectives baseline at the base config's bucket size serves every row (compute does not depend "
        "on the bucket size; DDP's per-bucket bookkeeping does, a little): exposed comm = median step - its median "
        "step at its fastest rank, overlap = 1 - exposed / (waiting + wire), with conservative 95 % intervals")


def _floats(value, name: str, hi: float, what: str, example: str) -> list[float]:
    """'0.25,1' or a list -> floats in (0, hi], else one ConfigError line saying what is allowed."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    try:
        out = [float(v) for v in items if str(v).strip()] if items is not None else []
    except (TypeError, ValueError):
        out = []
    if not out or any(not 0 < x <= hi for x in out):
        raise ConfigError(name, value, f"allowed: comma-separated {what} in (0, {hi:g}], e.g. {example}")
    return out


def fractions(value, name: str) -> list[float]:
    """Bucket sizes as shares of the gradient bytes."""
    return _floats(value, name, 4, "shares of the gradient bytes", "0.0625,0.25,1")


def sizes_mb(value, name: str) -> list[float]:
    """Bucket sizes in MiB."""
    return _floats(value, name, 4096, "MiB sizes", "1.5,4")


def gradient_bytes(base: TrainConfig) -> int:
    """What one step's gradients weigh: the trainable parameters of the base config's model."""

    return parameter_bytes(build_inputs(base)[1])


def ddp(base: TrainConfig, mb: float) -> TrainConfig:
    return with_fields(base, sync="ddp", ddp_hook="none", accumulate=1, bucket_mb=mb)


def _label(mb: float) -> str:
    return f"{mb:.3g} MiB"


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    grads = gradient_bytes(base)
    chosen = sorted({round(f * grads / MIB, 3) for f in opts["fractions"]} | set(opts["buckets_mb"] or []))
    cells = [Cell(_label(mb), ddp(base, mb), repeats=opts["launches"]) for mb in chosen]
    reference = ddp(base, base.bucket_mb)
    baseline = Cell(f"{_label(base.bucket_mb)}, no-op collectives",
                    with_fields(reference, **syncs.baseline_fields(reference)), repeats=opts["launches"])

    def analyse(results) -> pd.DataFrame:
        runs = ctx.cells.rows(results)
        pairs = [(run, runs[-1]) for run in runs[:-1]]
        table = comparison_table(pairs, axis="bucket", label_of=lambda c: _label(c["bucket_mb"]),
                                 order=[_label(mb) for mb in chosen])
        table["bucket_mb"] = chosen
        table["share_of_gradients"] = [mb * MIB / grads for mb in chosen]
        return table[COLUMNS]

    table = run_checked(ctx, [*cells, baseline], group="compare", analyse=analyse)
    notes = {"gradients": f"{grads / MIB:.2f} MiB of gradients per step ({base.model})", "exposed": NOTE,
             "default bucket": f"{_label(base.bucket_mb)} (the config's, kept unless a size wins beyond noise)"}
    return Result("bucket_sweep", {"bucket_sweep": table}, notes=notes)


def plot(result: Result, out: Path) -> list[Path]:
    """Step, compute and exposed communication over the bucket size, with their intervals."""
    t = result.tables["bucket_sweep"]
    t = t[t["status"] == "completed"]
    if not len(t):
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    x = t["bucket_mb"]
    series = []
    for col, low, high, label in (("step(ms)", "step_ci_low(ms)", "step_ci_high(ms)", "step (median)"),
                                  ("exposed_comm(ms)", "exposed_ci_low(ms)", "exposed_ci_high(ms)", "exposed comm")):
        err = [(t[col] - t[low]).clip(lower=0), (t[high] - t[col]).clip(lower=0)]
        ax.errorbar(x, t[col], yerr=err, marker="o", capsize=3, label=label)
        series.append(figures.Series(label, "bucket_sweep", col))
    ax.plot(x, t["compute(ms)"], ls="--", color="grey", label=figures.COMPUTE_LABEL)
    series.append(figures.Series(figures.COMPUTE_LABEL, "bucket_sweep", "compute(ms)"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(x), [f"{mb:.3g}" for mb in x])
    ax.minorticks_off()
    ax.set_xlabel("bucket_cap_mb (MiB)")
    ax.set_ylabel("time per step (ms)")
    ax.set_title(f"DDP bucket size: step and exposed communication\nbars: {figures.ci_label(t)}")
    ax.legend()
    return [figures.save(fig, out / "bucket_sweep.png", series)]


def decisions(result: Result) -> list[Decision]:
    """The bucket size chosen among the completed sizes (lab.decision: beyond noise over the whole family, by a
    material effect); none wins: the study's base size is kept."""
    return [d for d in [_ranked(result)[1]] if d is not None]


def _ranked(result: Result) -> tuple[list[str], Decision | None]:
    t = result.tables.get("bucket_sweep", pd.DataFrame())
    done = t[t["status"] == "completed"] if len(t) else t
    if len(done) < 2:
        return [], None
    base = str(result.notes.get("default bucket", "")).split(" (")[0]
    return rank(done, "bucket", "bucket size", default=base if base in set(done["bucket"]) else None,
                action=lambda label: f"bucket_cap_mb {label}", command="scalelab bucket-sweep")


def interpret(result: Result) -> tuple[list[str], str | None]:
    t = result.tables.get("bucket_sweep", pd.DataFrame())
    done = t[t["status"] == "completed"] if len(t) else t
    if len(done) < 2:
        return [], None
    lines, decision = _ranked(result)
    for row in done.dropna(subset=["overlap"]).to_dict("records"):
        where = (f"At {row['bucket']} ({row['share_of_gradients']:.2g} of the gradients, "
                 f"{row['collectives_per_step']:.0f} collective{'' if row['collectives_per_step'] == 1 else 's'} "
                 "per step)")
        if row.get("quality", "ok") == "re-measured":  # measured twice, ok the second time: its figures hold
            where += " (re-measured: the first measurement looked doubtful, the second is used)"
        elif not trusted(row.get("quality", "ok")):
            lines.append(f"{where} the overlap is not used: {row['quality']}.")
            continue
        # the share's whole: waiting + wire where measured (compare.exposed_with_interval), else time inside
        # collectives; the interval unclipped, so that it contains its point (below 0: interference)
        of = f"{overlap_whole(row):.3g} ms of communication, waiting + wire ({overlap_span(row)})"
        if row["overlap_ci_low"] > 0:  # a share hidden beyond noise
            lines.append(f"{where} backward hides {100 * row['overlap']:.0f} % of {of}.")
        else:
            lines.append(f"{where} no communication is hidden beyond noise: overlap {100 * row['overlap']:.0f} % "
                         f"of {of}.")
    return lines, card([decision])


def study_options(plan: StudyPlan) -> dict | None:
    """1/16 and all of the MLP's gradients beside the study's 4 MiB bucket, whose DDP cell and baseline are the
    strategies experiment's (2 new cells, ~45 s here); the quick study leaves it out."""
    return {"fractions": [1 / 16, 1.0], "buckets_mb": [4.0], "launches": 3,
            "set": {**plan.comm_model, "ranks": 2, "bucket_mb": 4.0}}


EXPERIMENT = Experiment(
    name="bucket_sweep", command="bucket-sweep", section="bucket_sweep", order=55,
    title="DDP bucket size",
    question="Which DDP bucket size (bucket_cap_mb) is fastest, and how much communication do buckets hide? "
             "(the DDP paper's bucket question; seed 003's conclusion that buckets hide communication)",
    help="DDP's bucket_cap_mb swept as shares of the model's gradient bytes: step, comm, exposed comm, overlap.",
    options=(Option(name="fractions", default=[1 / 16, 1 / 4, 1.0], parse=fractions,
                    help="Bucket sizes as shares of the model's gradient bytes, comma-separated (0 < f <= 4)."),
             Option(name="buckets_mb", default=None, parse=sizes_mb,
                    help="Bucket sizes in MiB to add, comma-separated (e.g. a study's own 4)."),
             launches_option()),
    defaults={"model": "mlp", "ranks": 2, "steps": 20},
    run=_run,
    figures=plot,
    interpret=interpret,
    decide=decisions,
    version=3,  # issues 57, 60: overlap of waiting + wire, both shown; its interval unclipped
    captions={"bucket_sweep": f"One row per bucket size: median step, {figures.COMPUTE_LABEL}; one baseline for all, "
                              "time inside collectives (comm), its parts waiting for peers and on the wire "
                              "(comm_critical, after every peer had arrived), exposed communication and overlap = "
                              "1 - exposed / (waiting + wire), with 95 % intervals.",
              "bucket_sweep.png": "Median step and exposed communication per bucket size (MiB, log scale), bars "
                                  f"their 95 % intervals; dashed: {figures.COMPUTE_LABEL}."},
    columns={"bucket_sweep": ["bucket", "status", "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)", "compute(ms)",
                              "comm(ms)", "waiting_for_peers(ms)", "comm_critical(ms)", "exposed_comm(ms)", "overlap", "overlap_ci_low",
                              "overlap_ci_high", "quality"]},
    study_options=study_options,
    quick=False,
)
