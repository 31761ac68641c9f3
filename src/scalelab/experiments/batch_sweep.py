"""Batch size: epoch time with and without data loading, throughput and peak memory per global batch (seed 000 Q1)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import fmt, ratio_words
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, int_list, launches_option
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.decision import Decision, card, figure_side, pick
from scalelab.report.figures import Series, ci, ci_label, plt, save, step_ci_label


def batch_sweep_table(runs: list[dict]) -> pd.DataFrame:
    """Per global batch size: epoch time with and without data loading, throughput, GPU utilisation (on CUDA, with
    its number of NVML samples), peak memory (seed 000 T1, seed 002 Q1)."""
    metrics = [keys.EPOCH_S, keys.EPOCH_NO_DATA_S, keys.THROUGHPUT, keys.GPU_UTIL, keys.GPU_UTIL_SAMPLES,
               keys.MEMORY_PEAK_RSS_GIB, keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, *SPREAD, keys.STEPS_TIMED]
    frame = runs_frame(runs, ["global_batch", "ranks"], metrics, headline=keys.THROUGHPUT)
    return frame.dropna(axis=1, how="all")


def batch_decisions(table: pd.DataFrame) -> list[Decision]:
    """The batch chosen for throughput (lab.decision, higher is better, over the whole family of batches): the
    highest when it beats every other beyond noise; else the smallest batch equivalent to the highest within the
    margin (it costs the least memory and generalises best) that no other batch beats beyond noise, said so;
    undecided when a batch is neither beaten by nor equivalent to the highest."""
    if len(table) < 2:
        return []
    sides = [figure_side(r, f"batch {int(r['global_batch'])}", value=keys.THROUGHPUT,
                         low=keys.ci_keys(keys.THROUGHPUT)[0], high=keys.ci_keys(keys.THROUGHPUT)[1])
             for r in table.to_dict("records")]
    decision = pick(sides, question="batch size", figure="throughput", unit=" samples/s", lower_is_better=False,
                    cheaper=lambda s: int(s.label.split()[1]), command="scalelab batch-sweep")
    if decision is not None and decision.keep and decision.keep.endswith("the cheapest equivalent to the best"):
        decision = replace(decision, keep=f"{decision.chosen.label}, the smallest batch equivalent to the highest "
                                          f"throughput ({decision.against.label})")
    elif decision is not None and decision.keep and decision.keep.endswith(", the best"):
        decision = replace(decision, keep=f"{decision.chosen.label}, the highest throughput")
    return [decision] if decision is not None else []


def batch_sweep(table: pd.DataFrame) -> tuple[list[str], str | None]:
    if not len(table):
        return [], None
    t = table.sort_values("global_batch")
    lo, hi = t.iloc[0], t.iloc[-1]
    best = t.loc[t[keys.THROUGHPUT].idxmax()]
    out = [f"Going from batch {int(lo.global_batch)} to {int(hi.global_batch)} changes throughput from "
           f"{fmt(lo[keys.THROUGHPUT])} to {fmt(hi[keys.THROUGHPUT])} samples/s "
           f"({ratio_words(hi[keys.THROUGHPUT] / lo[keys.THROUGHPUT], f'batch {int(lo.global_batch)}')}) "
           f"and the epoch from {fmt(lo[keys.EPOCH_S])} s to {fmt(hi[keys.EPOCH_S])} s.",
           _highest(t, best)]
    share = 1 - t[keys.EPOCH_NO_DATA_S] / t[keys.EPOCH_S]
    out.append(f"Data loading is {100 * share.min():.1f}–{100 * share.max():.1f} % of the epoch time.")
    decisions = batch_decisions(t)
    return out + [d.card() for d in decisions], card(decisions)


def _highest(t: pd.DataFrame, best) -> str:
    """The batch of the highest throughput, said as a finding only where its interval clears every other batch's
    (issue 60: "The highest throughput is at batch 256" beside a card calling it within noise of batch 64)."""
    low, high = keys.ci_keys(keys.THROUGHPUT)
    others = t[t["global_batch"] != best["global_batch"]]
    clear = (low in t and not pd.isna(best.get(low)) and len(others)
             and bool((others[high] < best[low]).all()))
    words = f"batch {int(best.global_batch)}: {fmt(best[keys.THROUGHPUT])} samples/s"
    if clear:
        return f"The highest throughput is at {words}, its interval clear of every other batch's."
    return (f"The largest throughput figure is at {words}; its interval meets another batch's, so which batch is "
            "fastest is not a finding here (the card below says which is kept).")


def time_vs_batch(table: pd.DataFrame, path: Path) -> Path:
    """Epoch time with and without data loading, and step time, with their 95 % intervals, vs global batch."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.errorbar(table["global_batch"], table[keys.EPOCH_S], yerr=ci(table, keys.EPOCH_S), fmt="o-", capsize=3,
                 label=f"with data loading (bars: {ci_label(table)})")
    ax1.plot(table["global_batch"], table[keys.EPOCH_NO_DATA_S], "s--", label="without data loading")
    ax1.set(xscale="log", xlabel="global batch (samples)", ylabel="epoch time (s)", title="Epoch time")
    ax1.legend()
    ax2.errorbar(table["global_batch"], table[keys.STEP_MEDIAN_MS], yerr=ci(table), fmt="o-", capsize=3)
    ax2.set(xscale="log", xlabel="global batch (samples)", ylabel=step_ci_label(table),
            title="Step time over timed steps")
    for ax in (ax1, ax2):  # label the batch sizes themselves, not powers of ten
        ax.set_xticks(list(table["global_batch"]), [str(b) for b in table["global_batch"]])
        ax.minorticks_off()
    return save(fig, path, [Series(f"with data loading (bars: {ci_label(table)})", "batch_sweep", keys.EPOCH_S),
                            Series("without data loading", "batch_sweep", keys.EPOCH_NO_DATA_S),
                            Series("", "batch_sweep", keys.STEP_MEDIAN_MS, axis=1)])


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    # 2 launches, in the quick study too: a comparison between configurations needs 2 or more (lab.decision)
    return {"batches": [16, 64, 256] if q else [16, 32, 64, 128, 256], "launches": 2}


EXPERIMENT = Experiment(
    name="batch_sweep", command="batch-sweep", section="batch", order=20,
    title="Batch size: epoch time, throughput, memory",
    question="How do epoch time (with and without data loading) and throughput change with the batch size? "
             "(seed 000 Q1)",
    help="Epoch time with and without data loading, throughput and peak memory per batch size.",
    options=(Option(name="batches", default=[32, 64, 128, 256], help="Global batch sizes.", parse=int_list),
             launches_option()),
    cells=lambda base, opts: [Cell(f"batch {b}", with_fields(base, global_batch=b), repeats=opts["launches"])
                              for b in opts["batches"]],
    interleave=True,
    analyse=lambda runs, base, opts: Result("batch_sweep", {"batch_sweep": batch_sweep_table(runs)}),
    figures=lambda result, out: [time_vs_batch(result.tables["batch_sweep"], out / "batch_sweep.png")],
    interpret=lambda result: batch_sweep(result.tables["batch_sweep"]),
    decide=lambda result: batch_decisions(result.tables["batch_sweep"]),
    captions={"batch_sweep": "Per global batch: epoch time with and without data loading (s), throughput "
                             "(samples/s), on a GPU its utilisation over the timed steps (NVML: the share of time "
                             "a kernel ran, not of the chip used; util_samples: how many samples), peak memory "
                             "(GiB), step time min/median/max over timed steps (ms).",
              "batch_sweep.png": "Epoch time and step time (median, bars min..max) vs global batch."},
    study_options=study_options,
    version=2,  # issue 60: intervals named after their figure
)
