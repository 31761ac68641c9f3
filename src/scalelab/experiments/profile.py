"""Where a step's time goes: the stage breakdown of one run, as a table and a pie chart (seed 001 2b, 003 task 1)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import run_quality
from scalelab.analysis.interpret import fmt
from scalelab.analysis.tables import headline_columns, runs_frame
from scalelab.lab.base import Experiment, Result, StudyPlan
from scalelab.lab.cells import Cell
from scalelab.report.figures import Series, plt, save


BACKWARD_COMPUTE = "backward: computing"
BACKWARD_COMM = "backward: inside collectives"
COMM_AFTER = "comm"  # the loop's span after backward: a blocking strategy's sync, a waiting one's wait


def stage_profile_table(runs: list[dict]) -> pd.DataFrame:
    """Mean time per step of each stage and its share of the step (seed 001 part 2b); the shares sum to 100 %.
    Where the run measured its collectives, backward is split into its part inside gradient collectives
    (keys.COMM_IN_BACKWARD_MS: DDP communicates inside backward) and the rest, so that the table says how much of a
    step is communication without counting that time twice; `comm` is the loop's own span after backward (a blocking strategy's sync). Evaluation is its own line after them: the time of one evaluation,
    outside every step, so it has no share. (Runs of scalelab 0.1 timed evaluation inside the step: for them it
    stays a stage.)"""
    stages = ["data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other"]
    columns = ["run_id", "stage", "time(ms)", *headline_columns("time(ms)"), "share(%)", "quality"]
    low_col, high_col = keys.ci_keys("time(ms)")
    rows = []
    for run in runs:
        summary = run["summary"] or {}
        inside = [s for s in stages if s != "eval" or summary.get(keys.stage_ms("eval"))]
        total = sum(summary.get(keys.stage_ms(s), 0.0) for s in inside)
        for s, ms, low, high in _parts(summary, inside):
            rows.append({"run_id": run["run_id"], "stage": s, "time(ms)": ms, "n": summary.get(keys.STEPS_TIMED),
                         low_col: low, high_col: high, "share(%)": 100.0 * ms / total if total else 0.0,
                         "quality": run_quality(summary)})
        if summary.get(keys.EVAL_MS) is not None:
            rows.append({"run_id": run["run_id"], "stage": EVAL_OUTSIDE, "time(ms)": summary[keys.EVAL_MS],
                         "n": summary.get(keys.EVALS), "share(%)": float("nan"), "quality": run_quality(summary)})
    return pd.DataFrame(rows, columns=columns)


def _parts(summary: dict, stages: list[str]):
    """(label, mean ms, interval) per part of the step: the stages, backward split in two where it can be."""
    for s in stages:
        ms = summary.get(keys.stage_ms(s), 0.0)
        low, high = (summary.get(k) for k in keys.ci_keys(keys.stage_ms(s)))
        if s == "backward" and summary.get(keys.COMM_IN_BACKWARD_MS) is not None:
            # two means over the same steps whose per-step values sum to backward's: they sum to its mean
            for label, key in ((BACKWARD_COMPUTE, keys.BACKWARD_OUTSIDE_COMM_MS),
                               (BACKWARD_COMM, keys.COMM_IN_BACKWARD_MS)):
                yield (label, summary.get(key, 0.0), *(summary.get(k) for k in keys.ci_keys(key)))
        else:
            yield s, ms, low, high


def rates_table(runs: list[dict]) -> pd.DataFrame:
    """The run's throughput with and without the data wait and, on a GPU, NVML's utilisation over its timed
    steps with the number of samples behind it (seed 002 Q1); columns without a value are left out."""
    frame = runs_frame(runs, ["global_batch", "ranks"], [keys.THROUGHPUT, keys.THROUGHPUT_NO_DATA, keys.GPU_UTIL,
                                                         keys.GPU_UTIL_SAMPLES])
    return frame.dropna(axis=1, how="all")


def utilisation(table: pd.DataFrame) -> list[str]:
    """One sentence per run with GPU samples: how busy NVML saw the GPU, and what that figure means."""
    if keys.GPU_UTIL not in table:
        return []
    return [f"NVML saw a kernel running {row[keys.GPU_UTIL]:.0f} % of the time over the timed steps "
            f"({int(row[keys.GPU_UTIL_SAMPLES])} samples) at {fmt(row[keys.THROUGHPUT])} samples/s: the share of "
            "time the GPU was busy, not the share of the chip in use."
            for row in table.dropna(subset=[keys.GPU_UTIL]).to_dict("records")]


EVAL_OUTSIDE = "eval (outside the step, per evaluation)"


SMALL = 3.0  # % of a step: stages below it share one slice, so that no two labels sit on top of each other


def stage_pie(table: pd.DataFrame, path: Path) -> Path:
    """Share of a step per stage; stages under SMALL % share one slice that names them. Labels are in a legend."""
    run = table[(table["run_id"] == table["run_id"].iloc[0]) & table["share(%)"].notna()]  # steps only
    big, small = run[run["share(%)"] >= SMALL], run[run["share(%)"] < SMALL]
    labels = [f"{s}: {t:.2g} ms ({p:.0f} %)" for s, t, p in zip(big["stage"], big["time(ms)"], big["share(%)"])]
    values = list(big["time(ms)"])
    if len(small) and small["time(ms)"].sum() > 0:
        labels.append(f"{', '.join(small['stage'])}: {small['time(ms)'].sum():.2g} ms "
                      f"({small['share(%)'].sum():.1f} %, each under {SMALL:g} %)")
        values.append(small["time(ms)"].sum())
    fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
    wedges, _ = ax.pie(values, startangle=90, counterclock=False)
    fig.legend(wedges, labels, loc="outside right center", frameon=False)
    ax.set_title(f"Where a step goes (mean per step, total {run['time(ms)'].sum():.1f} ms)")
    return save(fig, path, [Series(label, "profile", "time(ms)", axis=None) for label in labels])  # a pie: no axis


def profile(table: pd.DataFrame, rates: pd.DataFrame | None = None) -> tuple[list[str], str | None]:
    if not len(table):
        return [], None
    first = table[(table["run_id"] == table["run_id"].iloc[0]) & table["share(%)"].notna()]  # the step's parts
    t = first.sort_values("time(ms)", ascending=False)
    top = t.iloc[0]
    out = [f"{top.stage} takes the largest share of a step: {top['share(%)']:.1f} % ({fmt(top['time(ms)'], ' ms')})."]
    fb = t.set_index("stage")
    backward = fb["time(ms)"].reindex([BACKWARD_COMPUTE, BACKWARD_COMM, "backward"]).sum()
    if "forward" in fb.index and fb.at["forward", "time(ms)"] > 0 and backward > 0:
        out.append(f"backward / forward = {backward / fb.at['forward', 'time(ms)']:.2f}.")
    if BACKWARD_COMM in fb.index:
        inside, after = fb.at[BACKWARD_COMM, "time(ms)"], fb["time(ms)"].get(COMM_AFTER, 0.0)
        shares = fb.at[BACKWARD_COMM, "share(%)"] + fb["share(%)"].get(COMM_AFTER, 0.0)
        out.append(f"Inside collectives: {fmt(inside, ' ms')} a step during backward and {fmt(after, ' ms')} after "
                   f"it, {shares:.1f} % of the step in all (the gradient sync of this run's strategy; part of it "
                   "may be waiting for a peer still computing).")
    return out + utilisation(rates if rates is not None else pd.DataFrame()), None


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    return {"set": {"ranks": 2}}


EXPERIMENT = Experiment(
    name="profile", command="profile", section="profile", order=10,
    title="Where a step's time goes",
    question="Which stage dominates a training step: data, copy, forward, backward, communication, optimizer? "
             "(seed 001 part 2b, seed 003 task 1)",
    help="Where a step's time goes: stage table and pie chart.",
    cells=lambda base, opts: [Cell("profile", base)],
    analyse=lambda runs, base, opts: Result("profile", {"profile": stage_profile_table(runs),
                                                         "profile_rates": rates_table(runs)}),
    figures=lambda result, out: [stage_pie(result.tables["profile"], out / "profile.png")],
    interpret=lambda result: profile(result.tables["profile"], result.tables.get("profile_rates")),
    captions={"profile": "Mean time per step of each stage (ms), with its 95 % interval, and its share of the step "
                         "(%; the shares sum to 100 %). Backward is split into its part inside gradient collectives "
                         "(DDP communicates inside backward) and the rest; 'comm' is the sync's own span after "
                         "it.",
              "profile_rates": "The run's throughput with and without the data wait (samples/s); on a GPU, NVML's "
                               "utilisation over the timed steps (the share of time a kernel ran, not of the chip "
                               "used) and the number of samples behind it.",
              "profile.png": f"Each stage's share of the mean step over the timed steps; stages under {SMALL:g} % "
                             "share one slice, which names them."},
    study_options=study_options,
    version=2,  # issue 60: intervals named after their figure
)
