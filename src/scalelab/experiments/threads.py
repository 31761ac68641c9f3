"""Training time over torch intra-op threads in one process (seed 003 figure 2): threads 1 .. 2×cores, each cell in
a process of its own (fresh thread pools); rows past the machine's core count are marked oversubscribed, since
there the threads compete for cores and the time says more about the scheduler than about the model."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import ratio_words, step_span
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, int_list, launches_option
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.decision import Decision, card, pick, step_side
from scalelab.report.figures import Series, ci, plt, save, step_ci_label


def default_threads(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to 2×cores, and the core count itself."""
    cores = cores or os.cpu_count() or 1
    out, t = {cores, 2 * cores}, 1
    while t <= 2 * cores:
        out.add(t)
        t *= 2
    return sorted(out)


def thread_cells(base: TrainConfig, threads: list[int], launches: int = 1) -> list[Cell]:
    if base.world_size != 1:
        raise ConfigError("ranks", base.world_size, "the threads sweep runs one process: allowed 1")
    if min(threads) < 1:
        raise ConfigError("threads", threads, "allowed: thread counts >= 1, e.g. 1,2,4")
    return [Cell(f"{t} threads", with_fields(base, threads=t), isolate=True, repeats=launches) for t in threads]


def threads_table(runs: list[dict], cores: int) -> pd.DataFrame:
    """Per thread count: epoch time, throughput, step spread, speedup over the fewest threads, oversubscribed."""
    metrics = [keys.EPOCH_S, keys.EPOCH_NO_DATA_S, keys.THROUGHPUT, *SPREAD, keys.THREADS_USED]
    frame = runs_frame(runs, ["threads"], metrics, headline=keys.EPOCH_S)
    if not len(frame):
        return frame
    first = frame.iloc[0]
    frame["speedup"] = first[keys.STEP_MEDIAN_MS] / frame[keys.STEP_MEDIAN_MS]
    frame["cores"] = cores
    frame["oversubscribed"] = frame["threads"] > cores
    return frame


def threads_decisions(result: Result) -> list[Decision]:
    """The thread count chosen among the ones within the core count (lab.decision: beyond noise over the whole
    family, by a material effect); none wins: the fewest threads within noise of the best are kept (cheaper)."""
    t = result.tables["threads"]
    fair = t[~t["oversubscribed"]] if len(t) else t
    rows = (fair if len(fair) else t).to_dict("records")
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    sides = [step_side(r, f"{int(r['threads'])} thread{'s' if r['threads'] != 1 else ''}",
                       value=keys.STEP_MEDIAN_MS, low=low, high=high) for r in rows]
    decision = pick(sides, question="thread count", cheaper=lambda s: int(s.label.split()[0]),
                    command="scalelab threads")
    if decision is None:
        return []
    # measured in one process: the advice holds for that layout; ranks sharing the host share its cores too, and the
    # same count in each of them would oversubscribe it (issue 60: 2 threads × 2 ranks on 2 cores)
    n, cores = decision.chosen.label.split()[0], int(t["cores"].iloc[0])
    return [replace(decision, action=f"{n} torch thread{_s(n)} in a single process on this machine's {cores} "
                                     f"cores (the layout measured; R ranks on it share them, about {cores}/R "
                                     "threads each)")]


def interpret_threads(result: Result) -> tuple[list[str], str | None]:
    t = result.tables["threads"]
    if not len(t):
        return [], None
    fair = t[~t["oversubscribed"]]
    best = (fair if len(fair) else t).sort_values(keys.STEP_MEDIAN_MS).iloc[0]
    first = t.iloc[0]
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    line = (f"With {int(best.threads)} threads a step takes {best[keys.STEP_MEDIAN_MS]:.3g} ms "
            f"({step_span(best, low=low, high=high)})")
    if int(best.threads) != int(first.threads):  # never a ratio of a thing with itself
        line += f", {ratio_words(best.speedup, f'{int(first.threads)} thread{_s(first.threads)}')}"
    out = [line + f" ({int(best.cores)} cores here)."]
    over = t[t["oversubscribed"]]
    if len(over):
        worst = over.sort_values("threads").iloc[-1]
        out.append(f"Oversubscribed ({int(worst.threads)} threads on {int(worst.cores)} cores): "
                   f"{worst[keys.STEP_MEDIAN_MS]:.3g} ms per step.")
    decisions = threads_decisions(result)
    return out + [d.card() for d in decisions], card(decisions)


def _s(n) -> str:
    return "" if int(n) == 1 else "s"


def _figures(result: Result, out) -> list:
    return [time_vs_threads(result.tables["threads"], out / "threads.png")]


def time_vs_threads(table: pd.DataFrame, path: Path) -> Path:
    """Step time with its spread vs torch threads; the core count as a dashed line (past it: oversubscribed)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(table["threads"], table[keys.STEP_MEDIAN_MS], yerr=ci(table), fmt="o-", capsize=3)
    ax.axvline(int(table["cores"].iloc[0]), linestyle="--", color="grey", label="core count")
    ax.set(xscale="log", xlabel="torch threads (one process)", ylabel=step_ci_label(table),
           title="Step time vs threads")
    ax.set_xticks(list(table["threads"]), [str(t) for t in table["threads"]])
    ax.minorticks_off()
    ax.legend()
    # the core count is a vertical line at the table's `cores` (an x position, not a figure on the y axis)
    return save(fig, path, [Series("", "threads", keys.STEP_MEDIAN_MS), Series("core count")])


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    # default: 1, 2, 4 (oversubscribed) on 2 cores; 2 launches: recommending a thread count compares launches
    return {"threads": [1, 2] if q else None, "launches": 2}


EXPERIMENT = Experiment(
    name="threads", command="threads", section="threads", order=15,
    title="Threads in one process",
    question="How does training time change with the number of torch threads, up to and past the core count? "
             "(seed 003 figure 2)",
    help="Training time over torch intra-op threads (one process; past the core count marked oversubscribed).",
    options=(Option(name="threads", default=None, help="Thread counts (default 1, 2, 4, ... up to 2×cores).",
                    parse=int_list),
             launches_option()),
    cells=lambda base, opts: thread_cells(base, opts["threads"] or default_threads(), opts["launches"]),
    interleave=True,
    analyse=lambda runs, base, opts: Result("threads", {"threads": threads_table(runs, os.cpu_count() or 1)}),
    figures=_figures,
    interpret=interpret_threads,
    decide=threads_decisions,
    captions={"threads": "Per torch thread count (one process): epoch time, throughput, step time spread, speedup "
                         "over the fewest threads; threads above the core count are oversubscribed.",
              "threads.png": "Step time (median, bars min..max) vs torch threads; the dashed line is the core "
                             "count."},
    study_options=study_options,
    version=2,  # issue 60: intervals named after their figure
)
