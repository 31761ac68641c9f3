"""Mixed precision: fp32 vs bf16 autocast (vs fp16 with GradScaler on CUDA): accuracy, loss curve, memory, time
(seed 001 part 2c)."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import interpret, tables
from scalelab.lab.base import Experiment, Option, Result, launches_option, name_list
from scalelab.lab.cells import Cell, with_fields
from scalelab.report import figures

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
    return Result("amp", {"amp": tables.precision_table(runs), "amp_curves": loss_curves(runs, "precision")},
                  notes=notes)


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
    figures=lambda result, out: [figures.loss_curves(result.tables["amp_curves"], out / "amp_curves.png",
                                                     hue="precision")],
    interpret=lambda result: interpret.precision(result.tables["amp"]),
    captions={"amp": "Per precision: final accuracy and loss, peak memory, throughput, step time spread.",
              "amp_curves.png": "Training loss per step, fp32 vs lower precision (rank 0)."},
)
