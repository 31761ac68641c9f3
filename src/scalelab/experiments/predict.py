"""What larger clusters would do (docs/model.md; seed 003 conclusion, seed 000 Q2): calibrate the performance model
on this machine, predict per hardware, validate on measured runs. `scalelab predict` has its own command
(cli/predict.py) for its batch and hardware-file flags; the study runs it from here."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import fmt
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, int_list, name_list, number
from scalelab.perf.horizon import HORIZON
from scalelab.perf.prediction import prediction_figures, run_prediction

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
            text.append(f"{'' if text else f'{hw}: '}Extrapolated beyond {int(result.meta.get('horizon', 0))} "
                        f"workers, {100 * last['efficiency']:.0f} % at {int(last['workers'])} workers: an "
                        "extrapolation, which no recommendation rests on.")
        out.append(" ".join(text))
    if marked and "scale" in result.meta:
        scale, cores, own = result.meta["scale"], result.meta.get("cores"), result.meta.get("own")
        out.append(f"Predictions beyond {int(result.meta['horizon'])} workers ({HORIZON}x the largest measured "
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
    rec = f"For larger clusters ({larger[0][0]}): {larger[0][1]}" if larger else None
    return out, rec


def validation_text(val: pd.DataFrame, where: str) -> str:
    """The validation in words: held-out runs apart from those the fit used, with the interval's coverage."""
    sample = val["sample"] if "sample" in val else pd.Series("in-sample", index=val.index)
    held, used = val[sample != "in-sample"], val[sample == "in-sample"]
    parts = []
    for name, part in (("held out", held), ("in-sample (runs at batches the fit used)", used)):
        if not len(part):
            continue
        err = part["error(%)"].abs()
        inside = part["inside"].dropna() if "inside" in part else pd.Series(dtype=bool)
        parts.append(f"{name}: {len(part)} run(s), median |error| {err.median():.1f} % (worst {err.max():.1f} %)"
                     + (f", measured step inside the predicted 95 % interval in {int(inside.sum())} of {len(inside)}"
                        if len(inside) else ""))
    if not len(held):
        parts.append("no held-out run: every validation run was at a batch the calibration measured, so this is "
                     "not a test of the model")
    return f"Validation on measured runs of {where}: " + "; ".join(parts) + "."


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
                            "calibration's bootstrap (step_ci_low/high); `extrapolation`: beyond 8x the largest "
                            "measured scale; `checked`: presets and hardware files are unvalidated.",
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
