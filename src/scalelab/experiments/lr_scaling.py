"""Large-batch learning-rate rules: batch sizes x rules x worker counts, same number of epochs for every cell.

For every cell: final accuracy, time to a target accuracy (wall time of the training steps until the first
evaluation that reaches it) and the accuracy curve per epoch (seed 000 Q4, seed 002 Q5-6).
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import interpret, keys
from scalelab.config import TrainConfig
from scalelab.experiments.base import Experiment, Option, Result, int_list, name_list, number
from scalelab.experiments.cells import Cell, with_fields
from scalelab.report import figures
from scalelab.train.lr import RULES


def curves_frame(run: dict, evals: list[dict], steps: list[dict]) -> pd.DataFrame:
    """Accuracy after each evaluation with the cumulative training time (s) up to that step (rank 0)."""
    elapsed, total = {}, 0.0
    for rec in sorted(steps, key=lambda r: r["step"]):
        total += rec["wall(s)"] - rec.get("eval(s)", 0.0)
        elapsed[rec["step"]] = total
    c = run["config"]
    return pd.DataFrame([{"lr_rule": c["lr_rule"], "global_batch": c["global_batch"], "workers": c["ranks"],
                          "epoch": e["epoch"] + 1, "step": e["step"], "time(s)": elapsed.get(e["step"]),
                          keys.EVAL_ACC: e["acc"], keys.EVAL_LOSS: e["loss"]} for e in evals])


def lr_table(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (rule, batch, workers): final accuracy and time/epochs to the target accuracy (NaN: never reached)."""
    rows = []
    for (rule, batch, workers), g in curves.groupby(["lr_rule", "global_batch", "workers"], sort=True):
        g = g.sort_values("step")
        hit = g[g[keys.EVAL_ACC] >= target]
        rows.append({"lr_rule": rule, "global_batch": batch, "workers": workers,
                     "final_acc": float(g[keys.EVAL_ACC].iloc[-1]), "best_acc": float(g[keys.EVAL_ACC].max()),
                     f"time_to_{target:.0%}(s)": float(hit["time(s)"].iloc[0]) if len(hit) else float("nan"),
                     f"epochs_to_{target:.0%}": int(hit["epoch"].iloc[0]) if len(hit) else float("nan"),
                     "train_time(s)": float(g["time(s)"].iloc[-1])})
    return pd.DataFrame(rows)


def _target(value, name: str) -> float:
    x = number(0.0, 1.0)(value, name)
    if x <= 0:
        from scalelab.errors import ConfigError
        raise ConfigError(name, value, "allowed: an accuracy in (0, 1]")
    return x


def _share_base_runs(curves: pd.DataFrame, base_batch: int, rules: list[str]) -> pd.DataFrame:
    """At the base batch, linear / sqrt / linear_warmup are the unscaled rate: reuse the "none" curve for them."""
    if not len(curves):
        return curves
    base = curves[(curves["global_batch"] == base_batch) & (curves["lr_rule"] == "none")]
    extra = [base.assign(lr_rule=rule) for rule in ("linear", "sqrt", "linear_warmup") if rule in rules]
    return pd.concat([curves, *extra], ignore_index=True)


def lr_cells(base: TrainConfig, batches: list[int], rules: list[str], workers: list[int], *,
             warmup_epochs: float = 2.0) -> list[Cell]:
    """`base.global_batch` is the batch `base.lr` was tuned at; every cell trains `base.epochs` epochs."""
    from scalelab.train.setup import build_bundle

    n = len(build_bundle(base).train)
    cells = []
    for b in batches:
        for rule in rules:
            if b == base.global_batch and rule in ("linear", "sqrt", "linear_warmup") and "none" in rules:
                continue  # at the base batch these rules are the base learning rate: the "none" run answers them
            for w in workers:
                if b % w:
                    continue
                steps_per_epoch = -(-n // b)
                cfg = with_fields(base, global_batch=b, ranks=w, lr_rule=rule, base_batch=base.global_batch,
                                  lr_warmup_steps=int(warmup_epochs * steps_per_epoch) if rule in (
                                      "linear_warmup", "lars") else 0, eval_every=0)
                cells.append(Cell(f"batch {b} x {rule} x {w} workers", cfg))
    return cells


def _analyse(runs: list[dict], base: TrainConfig, opts: dict) -> Result:
    curves = pd.concat([curves_frame(r, r["files"].read_result(0)["evals"], r["files"].read_steps(0)) for r in runs],
                       ignore_index=True) if runs else pd.DataFrame()
    curves = _share_base_runs(curves, base.global_batch, opts["rules"])
    table = lr_table(curves, opts["target"]) if len(curves) else pd.DataFrame()
    return Result("lr_scaling", {"lr_scaling": table, "lr_curves": curves},
                  notes={"target_acc": opts["target"], "base_batch": base.global_batch})


EXPERIMENT = Experiment(
    name="lr_scaling", command="lr-scaling", section="lrscaling", order=110,
    title="Large-batch learning-rate rules",
    question="Which learning-rate rule keeps accuracy as the batch grows? (seed 000 Q4, seed 002 Q5-6)",
    help="Batch sizes x LR rules x workers on MNIST-1D: final accuracy, time to target accuracy, curves.",
    options=(Option(name="batches", default=[32, 256, 1024], help="Global batches; the base config's batch is the "
                                                                  "one its lr is tuned for.", parse=int_list),
             Option(name="rules", default=list(RULES), help="LR rules.", parse=lambda v, n: name_list(v, n, RULES)),
             Option(name="workers", default=[1], help="Worker counts.", parse=int_list),
             Option(name="target", default=0.9, help="Target test accuracy for time-to-accuracy.",
                    parse=_target)),
    defaults={"model": "cnn", "dataset": "mnist1d", "global_batch": 32, "lr": 0.03, "epochs": 40},
    cells=lambda base, opts: lr_cells(base, opts["batches"], opts["rules"], opts["workers"]),
    analyse=_analyse,
    figures=lambda result, out: [figures.accuracy_vs_batch(result.tables["lr_scaling"], out / "lr_scaling.png"),
                                 figures.accuracy_curves(result.tables["lr_curves"], out / "lr_curves.png")],
    interpret=interpret.lr_scaling_result,
    captions={"lr_scaling": "Per rule and batch: final and best test accuracy, time and epochs to the target "
                            "accuracy.",
              "lr_scaling.png": "Final test accuracy vs batch size per learning-rate rule (same number of epochs).",
              "lr_curves.png": "Test accuracy per epoch per rule, one panel per batch size."},
)
