"""Mixed precision: fp32 vs bf16 autocast (vs fp16 with GradScaler on CUDA): accuracy, loss curve, memory, time
(seed 001 part 2c)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import trusted
from scalelab.analysis.interpret import fmt, interval, span
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, launches_option, name_list
from scalelab.lab.cells import Cell, with_fields
from scalelab.report.figures import plt, save


def precision_table(runs: list[dict]) -> pd.DataFrame:
    """fp32 vs bf16 vs fp16: final accuracy, loss, peak memory and time (seed 001 part 2c)."""
    metrics = [keys.EVAL_ACC, keys.EVAL_LOSS, keys.TRAIN_LOSS, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, keys.EPOCH_S, keys.THROUGHPUT, *SPREAD]
    frame = runs_frame(runs, ["precision", "device"], metrics, headline=keys.THROUGHPUT).dropna(axis=1, how="all")
    if len(frame) and "fp32" in set(frame["precision"]):
        base = frame.loc[frame["precision"] == "fp32", keys.THROUGHPUT].iloc[0]
        frame["speedup_vs_fp32"] = frame[keys.THROUGHPUT] / base
    return frame

PRECISIONS = ("fp32", "bf16", "fp16")


def _chosen(base, opts) -> list[str]:
    if opts["precisions"] is not None:
        return opts["precisions"]
    return list(PRECISIONS) if base.resolved_device == "cuda" else ["fp32", "bf16"]


def loss_curves(runs: list[dict], hue: str) -> pd.DataFrame:
    """Rank 0's per-step training loss of each run (read through its `files`), labelled by a config field."""
    rows = [{hue: run["config"][hue], "step": rec["step"], "loss": rec.get("loss")}
            for run in runs for rec in run["files"].read_steps(0)]
    return pd.DataFrame(rows, columns=[hue, "step", "loss"])


def _analyse(runs, base, opts) -> Result:
    skipped = sorted(set(PRECISIONS) - set(_chosen(base, opts)))
    notes = {"skipped": {p: "fp16 with GradScaler needs CUDA" for p in skipped}} if skipped else {}
    return Result("amp", {"amp": precision_table(runs), "amp_curves": loss_curves(runs, "precision")},
                  notes=notes)


def plot_loss_curves(curves: pd.DataFrame, path: Path, *, hue: str) -> Path:
    """Training loss per step, one line per value of `hue`."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for value, group in curves.groupby(hue, sort=False):
        ax.plot(group["step"], group["loss"], label=f"{hue}={value}")
    ax.set(xlabel="optimizer step", ylabel="training loss (cross-entropy, rank 0)", title="Loss curves")
    ax.legend()
    return save(fig, path)


LEARNED = 0.9  # a run learned when its last quarter's mean loss is at most this share of its first step's


def learned(curves: pd.DataFrame, precision: str) -> tuple[bool, float, float]:
    """Whether the run of `precision` learned (its loss fell: LEARNED), with its first and last-quarter loss. An
    accuracy comparison between runs that did not learn (both near chance) says nothing about precision."""
    curve = curves[curves["precision"] == precision].sort_values("step")["loss"] if len(curves) else pd.Series()
    if len(curve) < 4:
        return False, float("nan"), float("nan")
    first, last = float(curve.iloc[0]), float(curve.iloc[-max(1, len(curve) // 4):].mean())
    return last <= LEARNED * first, first, last


def precision(table: pd.DataFrame, curves: pd.DataFrame | None = None) -> tuple[list[str], str | None]:
    if not len(table) or "fp32" not in set(table["precision"]):
        return [], None
    base = table[table["precision"] == "fp32"].iloc[0]
    out = []
    for d in table[table["precision"] != "fp32"].to_dict("records"):
        speed = d[keys.THROUGHPUT] / base[keys.THROUGHPUT]
        out.append(f"{d['precision']} runs at {speed:.2f}x the fp32 throughput and ends at accuracy "
                   f"{100 * d[keys.EVAL_ACC]:.1f} % vs {100 * base[keys.EVAL_ACC]:.1f} % (fp32).")
    best = table.loc[table[keys.THROUGHPUT].idxmax()]
    if not trusted(best.get("quality")) or not trusted(base.get("quality")):
        flagged = best if not trusted(best.get("quality")) else base
        return out + [f"{flagged.precision} is flagged ({flagged.quality}): no precision is recommended."], None
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    b, f = interval(best, low, high), interval(base, low, high)
    faster = b is not None and f is not None and b[1] < f[0]  # best's step interval lies below fp32's
    if best.precision != "fp32" and not faster:
        out.append(f"{best.precision}'s step ({span(b)}) is not faster than fp32's ({span(f)}) beyond noise.")
    fell = {p: learned(curves if curves is not None else pd.DataFrame(), p) for p in ("fp32", best.precision)}
    if not all(ok for ok, _, _ in fell.values()):
        p, (_, first, last) = next((p, v) for p, v in fell.items() if not v[0])
        out.append(f"Accuracy is not compared: the {p} run did not learn (loss {first:.3g} at its first step, "
                   f"{last:.3g} over its last quarter); train longer (--steps) for an accuracy comparison.")
        return out, None
    ok = best[keys.EVAL_ACC] >= base[keys.EVAL_ACC] - 0.01
    rec = (f"Train in {best.precision}: {best[keys.THROUGHPUT] / base[keys.THROUGHPUT]:.2f}x fp32's throughput, "
           f"step {fmt(best[keys.STEP_MEDIAN_MS], ' ms')} ({span(b)}) against {fmt(base[keys.STEP_MEDIAN_MS], ' ms')} "
           f"({span(f)}), with accuracy within 1 point." if ok and faster and best.precision != "fp32"
           else "Keep fp32: no lower precision was both faster beyond noise and as accurate here.")
    return out, rec


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    return {"launches": 1 if q else 3, "set": {"steps": 20 if q else 40, "eval_every": 10}}


EXPERIMENT = Experiment(
    name="amp", command="amp", section="amp", order=90,
    title="Mixed precision",
    question="Is lower precision faster, and does it cost accuracy? (seed 001 part 2c)",
    help="fp32 vs bf16 (vs fp16 + GradScaler on CUDA): loss curves, accuracy, memory, time.",
    options=(Option(name="precisions", default=None, help="Precisions to compare (default fp32,bf16 and fp16 on "
                                                          "CUDA).", parse=lambda v, n: name_list(v, n, PRECISIONS)),
             launches_option()),
    cells=lambda base, opts: [Cell(p, with_fields(base, precision=p), repeats=opts["launches"])
                              for p in _chosen(base, opts)],
    interleave=True,
    analyse=_analyse,
    figures=lambda result, out: [plot_loss_curves(result.tables["amp_curves"], out / "amp_curves.png",
                                                     hue="precision")],
    interpret=lambda result: precision(result.tables["amp"], result.tables.get("amp_curves")),
    captions={"amp": "Per precision: final accuracy and loss, peak memory, throughput, step time spread.",
              "amp_curves.png": "Training loss per step, fp32 vs lower precision (rank 0)."},
    study_options=study_options,
)
