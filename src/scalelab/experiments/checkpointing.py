"""Activation checkpointing with 0..k segments: saved activations, their backward peak and the process's peak
memory vs step time (seed 001 part 1b).

Every one of k segments is checkpointed (scalelab.zoo.models.run_blocks), so 1 segment keeps only the blocks'
input. The activations are measured exactly on each run's first step (scalelab.measure.activations); on CPU the
process's peak RSS includes its baseline (libraries, data, allocator caches) and hides them."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import MIN_LAUNCHES, fmt, ratio_words
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, int_list, launches_option
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.decision import BETTER, EQUIVALENT, decide, step_side
from scalelab.report.figures import Series, ci, plt, save, step_ci_label


def checkpointing_table(runs: list[dict]) -> pd.DataFrame:
    """Activation checkpointing segments vs saved activations, their backward peak, the process's peak memory and
    step time (seed 001 part 1b); ratios to no checkpointing where a run without it is there."""
    metrics = [keys.MEMORY_ACTIVATIONS_BYTES, keys.MEMORY_ACTIVATIONS_PEAK_BYTES, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, *SPREAD, keys.THROUGHPUT]
    frame = runs_frame(runs, ["checkpoint_segments", "global_batch"], metrics,
                       headline=keys.STEP_MEDIAN_MS).dropna(axis=1, how="all")
    if len(frame):
        base = frame[frame["checkpoint_segments"] == 0]
        if len(base):
            ratios = {"step_time_vs_off": keys.STEP_MEDIAN_MS, "activations_vs_off": keys.MEMORY_ACTIVATIONS_BYTES,
                      "backward_peak_vs_off": keys.MEMORY_ACTIVATIONS_PEAK_BYTES}
            for name, key in ratios.items():
                if key in frame:
                    frame[name] = frame[key] / base[key].iloc[0]
    return frame


def memory_vs_segments(table: pd.DataFrame, path: Path) -> Path:
    """Saved activations and their backward peak (left axis), the process's peak memory (right axis, its own scale:
    on CPU it is hundreds of times larger), and step time, vs activation-checkpointing segments."""
    cuda = keys.MEMORY_CUDA_MAX_ALLOCATED_GIB
    mem = cuda if cuda in table else keys.MEMORY_PEAK_RSS_GIB
    segments = table["checkpoint_segments"]
    fig, (ax1, ax3) = plt.subplots(1, 2, figsize=(11, 4))
    series = [Series("", "checkpointing", keys.STEP_MEDIAN_MS, axis=1)]  # fig.axes: ax1, ax3, then the twin
    for key, label, style in ((keys.MEMORY_ACTIVATIONS_BYTES, "saved for backward", "o-"),
                              (keys.MEMORY_ACTIVATIONS_PEAK_BYTES, "backward peak (with recomputation)", "^-")):
        if key in table:
            ax1.plot(segments, table[key] / 2**20, style, label=label)
            series.append(Series(label, "checkpointing", key, 2.0 ** -20))
    ax1.set(xlabel="checkpoint segments (0 = off)", ylabel="activations per rank (MiB)",
            title="Activations vs the process's peak")
    ax1.set_ylim(bottom=0)
    handles, labels = ax1.get_legend_handles_labels()
    if mem in table:
        name = "CUDA max allocated" if mem == cuda else "process peak RSS"
        ax2 = ax1.twinx()
        handles += ax2.plot(segments, table[mem] * 2**10, "s--", color="tab:green")
        labels.append(f"{name} (right axis)")
        series.append(Series(f"{name} (right axis)", "checkpointing", mem, 2.0 ** 10, axis=2))
        ax2.set(ylabel=f"{name} (MiB)", ylim=(0, None))
    ax1.legend(handles, labels, loc="lower left", fontsize="small")
    ax3.errorbar(segments, table[keys.STEP_MEDIAN_MS], yerr=ci(table), fmt="s--", color="tab:red", capsize=3)
    ax3.set(xlabel="checkpoint segments (0 = off)", ylabel=step_ci_label(table),
            title="Cost in time")
    for ax in (ax1, ax3):
        ax.set_xticks(sorted(segments.unique()))
    return save(fig, path, series)


def checkpointing(table: pd.DataFrame) -> tuple[list[str], str | None]:
    cuda = keys.MEMORY_CUDA_MAX_ALLOCATED_GIB
    mem = cuda if cuda in table else keys.MEMORY_PEAK_RSS_GIB
    if not len(table) or 0 not in set(table["checkpoint_segments"]):
        return [], None
    off = table[table["checkpoint_segments"] == 0].iloc[0]
    saved, peak = keys.MEMORY_ACTIVATIONS_BYTES, keys.MEMORY_ACTIVATIONS_PEAK_BYTES
    name = "CUDA max allocated" if mem == cuda else "peak RSS"
    out = []
    for d in table[table["checkpoint_segments"] > 0].to_dict("records"):
        parts = [f"saved activations {_mib(d[saved])} ({_ratio(d[saved], off[saved])} of no checkpointing)"
                 if saved in d else None,
                 f"backward peak {_mib(d[peak])} ({_ratio(d[peak], off[peak])})" if peak in d else None,
                 f"{name} {_ratio(d[mem], off[mem])}" if mem in d else None,
                 f"steps {_speed(d, off)}" + _noise_note(d, off)]
        out.append(f"{d['checkpoint_segments']} segments: " + ", ".join(p for p in parts if p) + ".")
    on = table[table["checkpoint_segments"] > 0]
    if mem != cuda and saved in table and mem in table and len(on):
        rss, act = on[mem] / off[mem], on[saved] / off[saved]
        if rss.min() > act.min():  # the process fell less than its activations
            out.append(f"On CPU the process's peak RSS went to {rss.min():.2f}×..{rss.max():.2f}× of no "
                       f"checkpointing while the saved activations went to {act.min():.2f}×..{act.max():.2f}×: "
                       "the RSS includes the process's baseline (libraries, data, allocator caches) and hides the "
                       "activations; the saved bytes show the effect.")
    return out, None


def _noise_note(row: dict, reference) -> str:
    """What a step-time ratio against no checkpointing is worth (lab.decision, either way, no material share: a
    measured cost is reported, not a default changed): "" beyond noise, " (indicative: ...)" from too few
    launches or without intervals, " (within noise)" otherwise."""
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    a = step_side(row, f"{row.get('checkpoint_segments', '?')} segments", value=keys.STEP_MEDIAN_MS, low=low, high=high)
    b = step_side(reference, "no checkpointing", value=keys.STEP_MEDIAN_MS, low=low, high=high)
    if a.interval is None or b.interval is None:
        return " (no interval)"
    verdicts = {decide(x, y, question="checkpointing", share=0.0).verdict for x, y in ((a, b), (b, a))}
    if BETTER in verdicts:
        return ""
    n = min(a.n, b.n)
    if n < MIN_LAUNCHES:
        return f" (indicative: {n} launch{'es' if n != 1 else ''})"
    return " (equivalent within ±10 %)" if EQUIVALENT in verdicts else " (within noise)"


def _speed(row: dict, reference) -> str:
    """The step's speed against no checkpointing, said one way (analysis.interpret.ratio_words)."""
    step, base = row[keys.STEP_MEDIAN_MS], reference[keys.STEP_MEDIAN_MS]
    return ratio_words(base / step if step else float("nan"), "no checkpointing")


def _mib(nbytes: float) -> str:
    return fmt(nbytes / 2**20, " MiB")


def _ratio(value: float, base: float) -> str:
    ratio = value / base if base else float("nan")
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}×"


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    return {"segments": [0, 2, 4], "launches": 2,
            "set": {"model": "resnet18", "global_batch": 8 if q else 16, "steps": 3 if q else 4,
                    "warmup_steps": 1}}


EXPERIMENT = Experiment(
    name="checkpointing", command="checkpointing", section="checkpointing", order=100,
    title="Activation checkpointing",
    question="How much memory does checkpointing save and what does it cost in time? (seed 001 part 1b)",
    help="Activation checkpointing: saved activations, backward peak and peak memory vs step time per number of "
         "segments (every segment checkpointed).",
    options=(Option(name="segments", default=[0, 1, 2, 4], help="Checkpoint segments to try (0 = off).",
                    parse=int_list), launches_option()),
    cells=lambda base, opts: [Cell(f"{k} segments", with_fields(base, checkpoint_segments=k), repeats=opts["launches"])
                              for k in opts["segments"]],
    interleave=True,
    analyse=lambda runs, base, opts: Result("checkpointing", {"checkpointing": checkpointing_table(runs)}),
    figures=lambda result, out: [memory_vs_segments(result.tables["checkpointing"],
                                                            out / "checkpointing.png")],
    interpret=lambda result: checkpointing(result.tables["checkpointing"]),
    captions={"checkpointing": "Per number of checkpoint segments: bytes saved for backward in forward, their peak "
                               "during backward (recomputation included), measured exactly on one step per rank; "
                               "the process's peak memory; step time. On CPU the process's peak RSS includes its "
                               "baseline and hides the activations; the saved bytes show the effect.",
              "checkpointing.png": "Left: saved activations and their backward peak (left axis), the process's "
                                   "peak memory (right axis, its own scale); right: step time; vs checkpoint "
                                   "segments."},
    study_options=study_options,
    version=2,  # issue 60: intervals named after their figure
)
