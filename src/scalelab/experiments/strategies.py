"""Gradient-sync strategies side by side on one base config (seed 003 tasks 2a/2b/3, seed 000 Q5/Q7, seed 004
exp 5).

Every strategy is a cell, and so is its baseline: the same config with no-op collectives (the strategy's own work
kept, only the collectives skipped; sync.registry.baseline_fields). The difference of median step times is the
exposed communication, measured by ablation, not taken as a remainder; beside it, the directly measured blocking
wait. Cells shared with `backends` (DDP on gloo and its baseline) are one cell and run once. `noop` (no sync at
all) is a strategy of its own, its own baseline.

Gradient accumulation keeps the global batch: with K micro-steps each rank runs K forward/backward passes of
per_rank_batch / K samples and syncs once, so its baseline has the same K.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.compare import trusted
from scalelab.analysis.interpret import fmt
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments.comparison import (
    DEFAULTS,
    Axis,
    answer_columns,
    critical_comm,
    overlap_whole,
    overlap_span,
    comm_captions,
    comm_figures,
    ordered,
    run_comparison,
)
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, launches_option, name_list, number
from scalelab.lab.decision import Decision, card, rank
from scalelab.sync import registry as syncs


def strategy_fields(name: str, accumulate: int) -> dict:
    """Config fields that select a sync variant (everything else comes from the base config)."""
    try:
        sync, fields = syncs.variant_fields(name)
    except ValueError:
        raise ConfigError("strategies", name, f"allowed: {', '.join(syncs.variants())}") from None
    fields = {k: accumulate if v == syncs.ACCUMULATE else v for k, v in fields.items()}
    return {"sync": sync, "ddp_hook": "none", "accumulate": 1, **fields}


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    accumulate = opts["accumulate"]
    axis = Axis("sync", "compare_strategies", syncs.variants(), lambda name: strategy_fields(name, accumulate),
                label_of=syncs.variant_of)
    notes = {}
    if "ddp+accumulate" in ordered(opts["strategies"], syncs.variants()):
        per_rank = base.per_rank_batch
        notes["accumulate"] = (f"ddp+accumulate keeps the global batch {base.global_batch}: each rank runs "
                               f"{accumulate} micro-steps of {per_rank / accumulate:g} samples (instead of one of "
                               f"{per_rank}) and syncs once per step; its baseline has the same accumulation")
    return run_comparison(ctx, base, axis, opts["strategies"], launches=opts["launches"], notes=notes)


def strategies(table: pd.DataFrame) -> tuple[list[str], Decision | None]:
    """`table`: one row per strategy with step(ms) and its interval, comm(ms), comm_critical(ms),
    waiting_for_peers(ms), exposed_comm(ms), overlap and its interval, interference(ms), blocks, quality.
    Sentences and the decision among the strategies (DDP, the default, kept when none wins: lab.decision)."""
    real = table[table["sync"] != "noop"]
    if not len(real):
        return [], None
    out, decision = rank(real, "sync", "gradient sync", default="ddp" if "ddp" in set(real["sync"]) else None,
                         action=lambda sync: f"the {sync} gradient sync")
    if "overlap" in real:
        out += overlap_sentences(real)
    return out, decision


def overlap_sentences(real: pd.DataFrame) -> list[str]:
    """What each strategy hides, waits for and costs beyond its collectives: only from rows that pass their
    checks (compare.trusted); a blocking strategy is never said to hide anything."""
    rows = real.dropna(subset=["overlap"]).to_dict("records")
    ok = [r for r in rows if trusted(r.get("quality"))]
    out = [f"{r['sync']}'s overlap is not used: {r['quality']}." for r in rows if not trusted(r.get("quality"))]
    for r in ok:
        if r.get("blocks"):
            out.append(blocking_sentence(r))
        waiting = r.get("waiting_for_peers(ms)")
        if waiting is not None and not pd.isna(waiting) and waiting > 0.1 * (r.get("comm(ms)") or 0):
            out.append(waiting_sentence(r, waiting))
        lost = r.get("interference(ms)")
        if lost is not None and not pd.isna(lost) and lost > 0:
            out.append(f"{r['sync']} costs the step {fmt(lost, ' ms')} beyond the time its collectives take, "
                       f"beyond noise (exposed {fmt(r['exposed_comm(ms)'], ' ms')} > communication, waiting + wire, "
                       f"{fmt(overlap_whole(r), ' ms')}): interference, the collectives' threads "
                       f"compete with compute for the cores.")
    hiding = [r for r in ok if not r.get("blocks") and r.get("overlap_ci_low") is not None
              and not pd.isna(r["overlap_ci_low"]) and r["overlap_ci_low"] > 0]
    for r in hiding:  # each on its own figure: which hides more is a comparison its intervals would have to carry
        out.append(f"{r['sync']} hides {100 * min(1.0, r['overlap']):.0f} % of its "
                   f"{fmt(overlap_whole(r), ' ms')} of communication (waiting + wire) behind compute "
                   f"({overlap_span(r)}).")
    if ok and not hiding:
        out.append("No strategy hides communication behind compute beyond noise here (every overlap interval "
                   "reaches 0).")
    return out


def blocking_sentence(r) -> str:
    """What a blocking strategy's measured overlap says, by where its interval lies (it hides nothing by
    construction; an interval above 0 is flagged by the checks and never reaches here)."""
    head = f"{r['sync']} waits for its collectives after backward: it hides nothing by construction"
    low, high = r.get("overlap_ci_low"), r.get("overlap_ci_high")
    if low is None or pd.isna(low) or high is None or pd.isna(high):
        return head + "; its overlap has no interval to hold that against."
    if low <= 0 <= high:
        return head + f", and the measurement agrees (its overlap {overlap_span(r)} reaches 0)."
    return (head + f"; its overlap {100 * r['overlap']:.0f} % ({overlap_span(r)}) lies below 0: the step lost more "
            f"than its {fmt(overlap_whole(r), ' ms')} of communication, waiting + wire (exposed "
            f"{fmt(r['exposed_comm(ms)'], ' ms')}): interference, not hiding.")


def waiting_sentence(r, waiting: float) -> str:
    """Time inside collectives before every peer had arrived, in words that fit its size: longer than a whole step
    without collectives (compute), the peers it waited for were not computing but inside the sync's own work."""
    compute = r.get("compute(ms)")
    why = ("waiting for a peer still computing, which is not communication"
           if compute is None or pd.isna(compute) or waiting <= compute else
           f"before every peer had arrived: longer than a whole step without collectives ({fmt(compute, ' ms')}), so "
           "the peers it waited for were inside the sync's own work (a root gathering and scattering, say), "
           "not computing")
    return (f"{r['sync']}: a rank stood up to {fmt(waiting, ' ms')} per step inside collectives {why}; the rank "
            f"that set the step spent {fmt(critical_comm(r), ' ms')} inside them after every peer had arrived (on "
            f"average over ranks {fmt(r['comm(ms)'], ' ms')} inside collectives).")


def strategies_decisions(result) -> list[Decision]:
    table = result.tables.get("compare_strategies", pd.DataFrame())
    ok = table[table["status"] == "completed"] if len(table) else table
    decision = strategies(ok)[1] if len(ok) else None
    return [decision] if decision is not None else []


def strategies_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_strategies", pd.DataFrame())
    ok = table[table["status"] == "completed"] if len(table) else table
    out, decision = strategies(ok) if len(ok) else ([], None)
    if len(ok) and "bytes_per_step" in ok:
        ref = ok[ok["sync"] == "ddp"]
        for row in ok[ok["sync"].isin(["ddp+fp16", "ddp+bf16", "ddp+powersgd"])].to_dict("records"):
            if len(ref) and ref["bytes_per_step"].iloc[0]:
                out.append(f"{row['sync']} moves {row['bytes_per_step'] / ref['bytes_per_step'].iloc[0]:.3g}× "
                           f"the bytes of plain ddp per step ({fmt(row['bytes_per_step'])} B).")
    return out, card([decision])


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study. Seed 003's three (the naive gather/scatter, blocking allreduce, DDP's
    overlapped buckets; the quick study the last two); every variant, scalelab's own bucketed overlap and DDP's
    hooks, is `scalelab compare strategies`: 3 launches of 9 variants and their baselines take ~7 minutes here."""
    q = plan.quick
    comm_model = plan.comm_model
    return {"strategies": ["allreduce", "ddp"] if q else ["gather_scatter", "allreduce", "ddp"],
            "launches": 2 if q else 3,
            "set": {**comm_model, "ranks": 2, "bucket_mb": 4.0}}


EXPERIMENT = Experiment(
    name="strategies", command="compare strategies", section="strategies", order=50,
    title="Gradient synchronisation strategies",
    question="Which gradient-sync strategy is fastest, how many bytes does each move and how much communication "
             "does it hide? (seed 003 tasks 2a/2b/3, seed 000 Q5/Q7, seed 004 exp 5)",
    help="Every gradient-sync strategy on one config: step, compute, comm, exposed comm, overlap, bytes, bandwidth.",
    options=(Option(name="strategies", default=None,
                    help=f"Comma-separated subset (default all): {', '.join(syncs.variants())}.",
                    parse=lambda v, n: name_list(v, n, syncs.variants())),
             launches_option(),
             Option(name="accumulate", default=2, help="Micro-steps K of ddp+accumulate (>= 2; the global batch is "
                                                       "kept, each micro-step gets 1/K of it).",
                    parse=number(2, integer=True))),
    defaults=DEFAULTS,
    run=_run,
    figures=comm_figures("compare_strategies", "sync"),
    columns={"compare_strategies": answer_columns("sync")},
    captions=comm_captions("compare_strategies", "gradient-sync strategy"),
    interpret=strategies_result,
    decide=strategies_decisions,
    study_options=study_options,
)
