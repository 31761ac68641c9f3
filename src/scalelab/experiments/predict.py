"""What larger clusters would do (docs/model.md; seed 003 conclusion, seed 000 Q2): calibrate the performance model
on this machine, predict per hardware, validate on measured runs. `scalelab predict` has its own command
(cli/predict.py) for its batch and hardware-file flags; the study runs it from here."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import fmt
from scalelab.lab.base import (
    Context,
    Experiment,
    Option,
    Result,
    StudyPlan,
    int_list,
    name_list,
    number,
)
from scalelab.perf.horizon import HORIZON
from scalelab.perf.prediction import run_prediction
from scalelab.perf.validation import VALIDATION_COLUMNS, validation_text
from scalelab.report.figures import Series, plt, save

WORKERS = [1, 2, 4, 8, 64, 512, 4096]


def _run(ctx: Context, base, opts: dict) -> Result:
    return run_prediction(ctx, base, hardware=opts["hardware"], workers=opts["workers"], mode=opts["mode"],
                          batch=opts["batch"] or base.per_rank_batch, strategy=opts["strategy"],
                          bucket_mb=base.bucket_mb, target=opts["target"],
                          calibration_batches=opts["calibration_batches"], validate=opts["validate"], say=ctx.say)


def predict_result(result) -> tuple[list[str], str | None]:
    """Per hardware: the predicted efficiency at its largest worker count within the horizon, and, marked as such,
    what the model extrapolates beyond it (perf/horizon.py); the validation; a recommendation only for a cluster
    larger than the measured scale and within the horizon."""
    table = result.tables.get("prediction", pd.DataFrame())
    if not len(table):
        return [], None
    out = []
    hw_col = "hardware" if "hardware" in table else None
    groups = table.groupby(hw_col, sort=False) if hw_col else [("model", table)]
    marked = "extrapolation" in table
    for hw, g in groups:
        g = g.sort_values("workers")
        inside = g[~g["extrapolation"].astype(bool)] if marked else g
        beyond = g.drop(inside.index)
        text = []
        if len(inside):
            top = inside.iloc[-1]
            below = inside[inside["efficiency"] < 0.5]
            first = f"falls below 50 % at {int(below['workers'].iloc[0])} workers" if len(below) else \
                f"stays above 50 % up to {int(top['workers'])} workers"
            text.append(f"{hw}: predicted efficiency {100 * top['efficiency']:.0f} % at {int(top['workers'])} "
                        f"workers ({fmt(top[keys.THROUGHPUT])} samples/s); efficiency {first}.")
        if len(beyond):
            last = beyond.iloc[-1]
            text.append(f"{'' if text else f'{hw}: '}Extrapolated from {int(beyond['workers'].iloc[0])} workers "
                        f"(beyond {int(result.meta.get('horizon', 0))} workers, or more of the step in communication "
                        "than in any run the intervals were checked on), "
                        f"{100 * last['efficiency']:.0f} % at {int(last['workers'])} workers: an extrapolation.")
        out.append(" ".join(text))
    if marked and "scale" in result.meta:
        scale, cores, own = result.meta["scale"], result.meta.get("cores"), result.meta.get("own")
        out.append(f"Predictions beyond {int(result.meta['horizon'])} workers ({HORIZON}× the largest measured "
                   f"scale, {int(scale)} workers) are extrapolation.")
        if cores is not None and int(table["workers"].max()) > cores:
            out.append(f"{own} is not predicted beyond {cores} workers: its calibration ran over one host's "
                       f"loopback, which says nothing about more ranks than that host's {cores} cores.")
    val = result.tables.get("validation")
    if val is not None and len(val):
        out.append(validation_text(val, result.meta.get("compute_of", "this machine")))
    keep = result.notes.get(next((k for k in result.notes if k.startswith("to keep")), ""), {})
    reaches, scale = result.meta.get("reach", {}), result.meta.get("scale", 0)
    # a larger cluster: a worker count past the measured one, inside the horizon
    larger = [(hw, advice) for hw, advice in (keep.items() if isinstance(keep, dict) else ())
              if not marked or (reaches.get(hw) or 0) > scale]
    if marked and not larger:
        out.append(f"No recommendation for larger clusters: no worker count above the measured {int(scale)} is "
                   "inside the horizon here.")
    rec = f"For larger clusters ({larger[0][0]}): {larger[0][1]}. Caveat: {caveat(larger[0][0], result.meta)}." \
        if larger else None
    return out, rec


def caveat(hardware: str, meta: dict) -> str:
    """What a recommendation for larger clusters rests on: a hardware preset never checked against a measurement
    here (the validation runs on this machine's own network only), and a model's prediction for more workers than
    were measured."""
    scale = int(meta.get("scale") or 0)
    beyond = f"the model's prediction for more workers than the {scale} measured here"
    if hardware == meta.get("own"):
        return beyond
    return f"{hardware}: a hardware preset, not checked against a measurement; {beyond}"


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    comm_model = plan.comm_model
    return {"workers": [1, 2, 4, 8, 16, 64, 256, 1024, 4096], "hardware": ["measured", "10gbe", "ib_hdr",
                                                                            "nvlink3"],
            # 2 ranks calibrate in situ and validate on measured runs; the quick study keeps to one rank
            # two points fit the line (a third: ~25 s more); the validation's held-out point, per-rank batch 32
            # between them, is scale's 2-worker DDP cell (same buckets), reused
            "calibration_batches": [16, 64],
            "set": {**comm_model, "ranks": 1 if q else 2, "bucket_mb": 4.0}}


# ---------------------------------------------------------------- figures (read the tables)

def prediction_figures(result: Result, out_dir: Path) -> list[Path]:
    """Predicted scaling per hardware with the measured points of the same sync and batch; predicted vs measured."""

    mode, validation = result.meta["mode"], result.tables.get("validation")
    # measured points drawn over the curves: same strategy and batch (none when nothing was validated)
    on_curve = validation if validation is not None else pd.DataFrame(columns=VALIDATION_COLUMNS + ["workers"])
    if validation is not None and len(validation):
        size = validation["per_rank_batch"] * (validation["workers"] if mode == "strong" else 1)
        on_curve = validation[(validation["sync"] == result.meta["sync"]) & (size == result.meta["batch"])]
    files = [predicted_scaling(result.tables["prediction"], on_curve, out_dir / "prediction.png", mode=mode,
                                       compute_of=result.meta.get("compute_of", "this machine"))]
    if validation is not None and len(validation):
        files.append(predicted_vs_measured(validation, out_dir / "validation.png"))
    return files


def predicted_scaling(table: pd.DataFrame, measured: pd.DataFrame, path: Path, *, mode: str,
                      compute_of: str = "this machine") -> Path:
    """Predicted speedup and efficiency vs workers (log x), one line per hardware, with measured points overlaid
    (columns workers, measured_speedup, measured_efficiency; medians of the timed steps). `compute_of` says where
    the compute was measured ("this machine", or a device and host); the title and the measured points say it."""
    lines = table["hardware"].nunique() + 1 + (len(measured) > 0)
    # the legend in a row of its own below both plots: hardware labels say whose compute they use, so are long
    fig, axes = plt.subplots(2, 2, figsize=(11, 4.4 + 0.2 * lines),
                             gridspec_kw={"height_ratios": [4.2, 0.2 * lines + 0.2]})
    (ax1, ax2), legend_row = axes[0], axes[1]
    for ax in legend_row:
        ax.remove()
    top = int(table["workers"].max())
    ax1.plot([1, top], [1, top], "k:", label="ideal")
    series = [Series("ideal")]
    for hw, g in table.groupby("hardware", sort=False):
        ax1.plot(g["workers"], g["speedup"], "o-", ms=3, label=hw)
        ax2.plot(g["workers"], 100 * g["efficiency"], "o-", ms=3, label=hw)
        series += [Series(str(hw), "prediction", "speedup"), Series(str(hw), "prediction", "efficiency", 100.0, 1)]
    if len(measured):
        ax1.plot(measured["workers"], measured["measured_speedup"], "k*", ms=11, label=f"measured on {compute_of}")
        ax2.plot(measured["workers"], 100 * measured["measured_efficiency"], "k*", ms=11,
                 label=f"measured on {compute_of}")
        series += [Series(f"measured on {compute_of}", "validation", "measured_speedup"),
                   Series(f"measured on {compute_of}", "validation", "measured_efficiency", 100.0, 1)]
    ax2.axhline(50, color="gray", lw=0.8, ls="--")
    what = "global batch" if mode == "strong" else "per-rank batch"
    batch = table["per_rank_batch"].iloc[0] * (table["workers"].iloc[0] if mode == "strong" else 1)
    ax1.set(xscale="log", yscale="log", xlabel="workers (ranks)", ylabel="speedup (x, predicted step times)",
            title=f"{mode.title()} scaling, {what} {batch:g}, {table['strategy'].iloc[0]}\ncompute of {compute_of}")
    ax2.set(xscale="log", xlabel="workers (ranks)", ylabel="efficiency (%)", ylim=(0, 105),
            title="Efficiency (dashed: 50 %)")
    fig.legend(*ax1.get_legend_handles_labels(), fontsize="small", loc="lower center", frameon=False)
    return save(fig, path, series)


def predicted_vs_measured(validation: pd.DataFrame, path: Path) -> Path:
    """Predicted (with its 95 % interval as a vertical bar, where the calibration has one) vs measured median step
    time per run (log-log) with the y = x line; colour = sync strategy,
    marker = what the collectives went over (circle: loopback, triangle: namespace nodes' link, real or shaped by
    the kernel); open markers = caller-side padding, labelled approximate."""
    fig, ax = plt.subplots(figsize=(6, 5))
    network = validation["network"] if "network" in validation else pd.Series("loopback", index=validation.index)
    padded = network.str.contains("approximate")
    nodes = network.str.contains("nodes over")
    kind = pd.Series(list(zip(nodes, padded)), index=validation.index)
    for i, (sync, g) in enumerate(validation.groupby("sync", sort=False)):
        color = f"C{i}"
        for (on_nodes, pad), h in g.groupby(kind[g.index]):
            where = "nodes' link" if on_nodes else "loopback"
            if {"predicted_ci_low", "predicted_ci_high"} <= set(h.columns) and h["predicted_ci_low"].notna().any():
                ax.errorbar(h["measured"], h["predicted"], fmt="none", ecolor=color, elinewidth=0.8, alpha=0.6,
                            yerr=[h["predicted"] - h["predicted_ci_low"], h["predicted_ci_high"] - h["predicted"]])
            ax.plot(h["measured"], h["predicted"], "^" if on_nodes else "o", color=color,
                    mfc="none" if pad else color, label=f"{sync}, {where}{', padded (approximate)' if pad else ''}")
    lo = float(min(validation["measured"].min(), validation["predicted"].min())) * 0.8
    hi = float(max(validation["measured"].max(), validation["predicted"].max())) * 1.25
    ax.plot([lo, hi], [lo, hi], "k:", label="y = x")
    err = validation["error(%)"].abs().median()  # of the points drawn (attrs may describe a larger frame)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (ms, median of timed steps)",
           ylabel="predicted step (ms)", title=f"Predicted vs measured: median |error| {err:.1f} %")
    from matplotlib.ticker import FuncFormatter

    for axis in (ax.xaxis, ax.yaxis):  # plain milliseconds, not powers of ten
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(round(v))[0] in "1235" else ""))
    ax.legend(fontsize="small")
    return save(fig, path)


EXPERIMENT = Experiment(
    name="predict", command=None, section="prediction", order=120,
    title="What larger clusters would do",
    question="What would 8, 64 or 1000 workers give, and where does efficiency fall below 50 %? "
             "(seed 003 conclusion, seed 000 Q2)",
    help="The performance model: calibrate here, predict for more workers and other hardware, validate.",
    options=(Option(name="workers", default=WORKERS, help="Worker counts to predict.", parse=int_list),
             Option(name="hardware", default=["measured"], help="Hardware presets (measured = this machine).",
                    parse=name_list),
             Option(name="mode", default="weak", help="strong or weak.",
                    parse=lambda v, n: name_list(v, n, ("strong", "weak"))[0]),
             Option(name="batch", default=None, help="Global batch (strong) or per-rank batch (weak); default the "
                                                     "base config's per-rank batch.", parse=number(1, integer=True)),
             Option(name="strategy", default="ddp", help="Gradient sync to predict."),
             Option(name="target", default=0.5, help="Efficiency the options must keep.", parse=number(0.0, 1.0)),
             Option(name="calibration_batches", default=[16, 32, 64], help="Per-rank batches of the calibration.",
                    parse=int_list),
             Option(name="validate", default=True, help="Measure the strategy at the calibration batches.")),
    run=_run,
    figures=prediction_figures,
    interpret=predict_result,
    captions={"prediction": "Predicted step, speedup and efficiency per hardware and worker count (the model: "
                            "compute + exposed communication; docs/model.md) with its 95 % interval from the "
                            "calibration's bootstrap (step_ci_low/high), and the efficiency's, the step's inverted, "
                            "at most 100 % (efficiency_ci_low/high); `extrapolation`: beyond 8x the largest "
                            "measured scale; `checked`: presets and hardware files are unvalidated. An unshaped "
                            "namespace link is predicted from its own bench, run at calibration (in-sample for the "
                            "link).",
              "validation": "The model against measured runs (`sample`: in-sample where the calibration ran that batch, "
                            "held out where it did not): predicted with its 95 % interval and measured median "
                            "step, the measurement's 95 % interval, the error.",
              "options": "What keeps the target efficiency at each hardware's largest worker count inside the "
                         "horizon (`workers`).",
              "prediction.png": "Predicted speedup (left) and efficiency (right, dashed: 50 %) over worker counts, "
                                "one line per hardware; measured points where there are runs.",
              "validation.png": "Predicted against measured step per validation run (log-log; the diagonal is a "
                                "perfect prediction)."},
    study_options=study_options,
    version=2,
)
