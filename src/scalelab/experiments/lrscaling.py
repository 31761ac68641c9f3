"""Large-batch learning-rate rules: batch sizes x rules x worker counts, same number of epochs for every cell.

For every cell: final accuracy, time to a target accuracy (wall time of the training steps until the first
evaluation that reaches it) and the accuracy curve per epoch (seed 000 Q4, seed 002 Q5-6).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments.basic import ExperimentResult
from scalelab.experiments.grid import Cell, run_grid, study_runs, with_fields, write_table
from scalelab.report import figures
from scalelab.store import RunDir, Store
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
                          "eval/acc": e["acc"], "eval/loss": e["loss"]} for e in evals])


def lr_table(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (rule, batch, workers): final accuracy and time/epochs to the target accuracy (NaN: never reached)."""
    rows = []
    for (rule, batch, workers), g in curves.groupby(["lr_rule", "global_batch", "workers"], sort=True):
        g = g.sort_values("step")
        hit = g[g["eval/acc"] >= target]
        rows.append({"lr_rule": rule, "global_batch": batch, "workers": workers,
                     "final_acc": float(g["eval/acc"].iloc[-1]), "best_acc": float(g["eval/acc"].max()),
                     f"time_to_{target:.0%}(s)": float(hit["time(s)"].iloc[0]) if len(hit) else float("nan"),
                     f"epochs_to_{target:.0%}": int(hit["epoch"].iloc[0]) if len(hit) else float("nan"),
                     "train_time(s)": float(g["time(s)"].iloc[-1])})
    return pd.DataFrame(rows)


def _share_base_runs(curves: pd.DataFrame, base_batch: int, rules: list[str]) -> pd.DataFrame:
    """At the base batch, linear / sqrt / linear_warmup are the unscaled rate: reuse the "none" curve for them."""
    if not len(curves):
        return curves
    base = curves[(curves["global_batch"] == base_batch) & (curves["lr_rule"] == "none")]
    extra = [base.assign(lr_rule=rule) for rule in ("linear", "sqrt", "linear_warmup") if rule in rules]
    return pd.concat([curves, *extra], ignore_index=True)


def lr_scaling(base: TrainConfig, batches: list[int], rules: list[str], workers: list[int], store: Store,
               study: str, out_dir: Path, *, target: float = 0.9, warmup_epochs: float = 2.0,
               say: Callable[[str], None] = print) -> ExperimentResult:
    """`base.global_batch` is the batch `base.lr` was tuned at; every cell trains `base.epochs` epochs."""
    for rule in rules:
        if rule not in RULES:
            raise ConfigError("rules", rule, f"allowed: {', '.join(RULES)}")
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
    name = "lr_scaling"
    run_grid(f"{study}/{name}", cells, store, say=say)
    runs = study_runs(store, f"{study}/{name}")
    curves = pd.concat([curves_frame(r, RunDir(store.run_dir(r["run_id"])).read_result(0)["evals"],
                                     RunDir(store.run_dir(r["run_id"])).read_steps(0)) for r in runs],
                       ignore_index=True) if runs else pd.DataFrame()
    curves = _share_base_runs(curves, base.global_batch, rules)
    table = lr_table(curves, target) if len(curves) else pd.DataFrame()
    result = ExperimentResult(name, {name: table, "lr_curves": curves}, notes={"target_acc": target,
                                                                             "base_batch": base.global_batch})
    for key, frame in ((name, table), ("lr_curves", curves)):
        paths = write_table(frame, out_dir, key)
        result.files += [paths["csv"], paths["json"]]
    if len(table):
        result.files.append(figures.accuracy_vs_batch(table, out_dir / "lr_scaling.png"))
        result.files.append(figures.accuracy_curves(curves, out_dir / "lr_curves.png"))
    return result
