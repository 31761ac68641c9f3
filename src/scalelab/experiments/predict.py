"""What larger clusters would do (DESIGN F14; seed 003 conclusion, seed 000 Q2): calibrate the performance model
on this machine, predict per hardware, validate on measured runs. `scalelab predict` has its own command
(cli/predict.py) for its batch and hardware-file flags; the study runs it from here."""
from __future__ import annotations

from scalelab.analysis import interpret
from scalelab.lab.base import Context, Experiment, Option, Result, int_list, name_list, number
from scalelab.perf.prediction import prediction_figures, run_prediction

WORKERS = [1, 2, 4, 8, 64, 512, 4096]


def _run(ctx: Context, base, opts: dict) -> Result:
    return run_prediction(ctx, base, hardware=opts["hardware"], workers=opts["workers"], mode=opts["mode"],
                          batch=opts["batch"] or base.per_rank_batch, strategy=opts["strategy"],
                          bucket_mb=base.bucket_mb, target=opts["target"],
                          calibration_batches=opts["calibration_batches"], validate=opts["validate"], say=ctx.say)


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
    interpret=interpret.predict_result,
)
