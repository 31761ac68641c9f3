"""Large-batch learning-rate rules: batch sizes x rules x worker counts, same number of epochs for every cell.

For every cell: final accuracy, time to a target accuracy (wall time of the training steps until the first
evaluation that reaches it) and the accuracy curve per epoch (seed 000 Q4, seed 002 Q5-6).

With `seeds` > 1 every cell is trained once per seed (the seed sets the initial weights and the data order), the
seeds interleaved in rounds; accuracy and time to accuracy are then the median over seeds with a 95 % interval
(scalelab.analysis.intervals.median_interval: the range of the seeds below 6), and `n` is the number of seeds.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import interval
from scalelab.analysis.intervals import median_interval
from scalelab.analysis.learning import COMPARE_ONLY_LEARNED, chance_over, over_seeds, seed_band
from scalelab.analysis.noise import NoiseModel, fit
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, int_list, name_list, number
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.decision import Decision, card, figure_side, pick
from scalelab.report.figures import Series, plt, save
from scalelab.train.lr import RULES
from scalelab.train.setup import build_bundle


def curves_frame(run: dict, evals: list[dict], steps: list[dict]) -> pd.DataFrame:
    """Accuracy after each evaluation with the cumulative training time (s) up to that step (rank 0)."""
    elapsed, total = {}, 0.0
    for rec in sorted(steps, key=lambda r: r["step"]):
        total += rec["wall(s)"] - rec.get("eval(s)", 0.0)
        elapsed[rec["step"]] = total
    c = run["config"]
    return pd.DataFrame([{"lr_rule": c["lr_rule"], "global_batch": c["global_batch"], "workers": c["ranks"],
                          "seed": c.get("seed", 0), "epoch": e["epoch"] + 1, "step": e["step"], "time(s)": elapsed.get(e["step"]),
                          keys.EVAL_ACC: e["acc"], keys.EVAL_LOSS: e["loss"]} for e in evals])


def lr_table(curves: pd.DataFrame, target: float, chance: float = float("nan")) -> pd.DataFrame:
    """Per (rule, batch, workers): final accuracy and time / epochs to the target accuracy (NaN: never reached),
    the median over seeds with their 95 % interval (`n` seeds); `chance` (the majority class's share) and whether
    the cell `learned`: its final accuracy above chance by more than its seed interval (never with one seed;
    scalelab.analysis.learning)."""
    curves = curves if "seed" in curves else curves.assign(seed=0)
    per_seed = []
    for (rule, batch, workers, seed), g in curves.groupby(["lr_rule", "global_batch", "workers", "seed"], sort=True):
        g = g.sort_values("step")
        hit = g[g[keys.EVAL_ACC] >= target]
        per_seed.append({"lr_rule": rule, "global_batch": batch, "workers": workers, "seed": seed,
                         "final_acc": float(g[keys.EVAL_ACC].iloc[-1]), "best_acc": float(g[keys.EVAL_ACC].max()),
                         "time_to": float(hit["time(s)"].iloc[0]) if len(hit) else float("nan"),
                         "epochs_to": float(hit["epoch"].iloc[0]) if len(hit) else float("nan"),
                         "train_time(s)": float(g["time(s)"].iloc[-1])})
    rows = []
    for (rule, batch, workers), g in pd.DataFrame(per_seed).groupby(["lr_rule", "global_batch", "workers"],
                                                                        sort=True):
        reached = g["time_to"].dropna()
        # one seed has no interval: how far another seed would move it is unknown
        fit = over_seeds(list(g["final_acc"]), chance)
        acc_low, acc_high = fit.low, fit.high
        t_low, t_high = median_interval(reached) if len(reached) == len(g) > 1 else (float("nan"),) * 2
        rows.append({"lr_rule": rule, "global_batch": batch, "workers": workers,
                     "final_acc": float(g["final_acc"].median()), "n": len(g), "final_acc_ci_low": acc_low,
                     # each seed's final accuracy in seed order: rules are compared seed by seed (lab.decision)
                     ACC_SEEDS: [float(x) for x in g["final_acc"]],
                     "final_acc_ci_high": acc_high, "chance": chance, "learned": fit.learned,
                     "best_acc": float(g["best_acc"].median()),
                     # reached by every seed, else not reached: a median over the seeds that got there would flatter
                     f"time_to_{target:.0%}(s)": float(reached.median()) if len(reached) == len(g) else float("nan"),
                     f"time_to_{target:.0%}_ci_low(s)": t_low, f"time_to_{target:.0%}_ci_high(s)": t_high,
                     f"epochs_to_{target:.0%}": float(g["epochs_to"].median()) if len(reached) == len(g)
                     else float("nan"),
                     "seeds_reaching": len(reached), "train_time(s)": float(g["train_time(s)"].median())})
    return pd.DataFrame(rows)


def _target(value, name: str) -> float:
    x = number(0.0, 1.0)(value, name)
    if x <= 0:
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
             warmup_epochs: float = 2.0, seeds: int = 1) -> list[Cell]:
    """`base.global_batch` is the batch `base.lr` was tuned at; every cell trains `base.epochs` epochs."""

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
    # one round per seed: every cell with seed 0, then every cell with seed 1 ... (drift hits all alike)
    return [Cell(f"{c.label}, seed {base.seed + k}" if seeds > 1 else c.label, with_fields(c.config, seed=base.seed + k))
            for k in range(seeds) for c in cells]


def _analyse(runs: list[dict], base: TrainConfig, opts: dict) -> Result:
    curves = pd.concat([curves_frame(r, r["files"].read_result(0)["evals"], r["files"].read_steps(0)) for r in runs],
                       ignore_index=True) if runs else pd.DataFrame()
    curves = _share_base_runs(curves, base.global_batch, opts["rules"])
    chance, _ = chance_over(build_bundle(with_fields(base, seed=base.seed + k)) for k in range(opts["seeds"]))
    table = lr_table(curves, opts["target"], chance) if len(curves) else pd.DataFrame()
    return Result("lr_scaling", {"lr_scaling": table, "lr_curves": curves},
                  notes={"target_acc": opts["target"], "base_batch": base.global_batch, "chance": chance})


def accuracy_vs_batch(table: pd.DataFrame, path: Path) -> Path:
    """Final test accuracy vs global batch, one line per learning-rate rule."""
    fig, ax = plt.subplots(figsize=(7, 4))
    series = []
    for rule, g in table.groupby("lr_rule"):
        g = g.groupby("global_batch")["final_acc"].mean()
        ax.plot(g.index, 100 * g.values, "o-", label=rule)
        series.append(Series(str(rule), "lr_scaling", "final_acc", 100.0))
    ax.set(xscale="log", xlabel="global batch (samples)", ylabel="final test accuracy (%)",
           title="Accuracy vs batch size per LR rule (same epochs)")
    ax.set_xticks(sorted(table["global_batch"].unique()), [str(b) for b in sorted(table["global_batch"].unique())])
    ax.minorticks_off()
    ax.legend()
    return save(fig, path, series)


def accuracy_curves(curves: pd.DataFrame, path: Path) -> Path:
    """Test accuracy per epoch, one panel per batch size, one line per rule (first worker count)."""
    batches = sorted(curves["global_batch"].unique())
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), squeeze=False, sharey=True)
    for ax, b in zip(axes[0], batches):
        sub = curves[(curves["global_batch"] == b) & (curves["workers"] == curves["workers"].min())]
        for rule, g in sub.groupby("lr_rule"):
            ax.plot(g["epoch"], 100 * g[keys.EVAL_ACC], label=rule)
        ax.set(title=f"batch {b}", xlabel="epoch")
    axes[0][0].set_ylabel("test accuracy (%)")
    axes[0][-1].legend()
    return save(fig, path)


ACC_CI = ("final_acc_ci_low", "final_acc_ci_high")  # the final accuracy's interval over seeds
ACC_SEEDS = "final_acc_seeds"  # each seed's final accuracy, in seed order
QUESTION = "learning-rate rule for batch"  # a decision's question, with its batch


def rule_decision(learned: pd.DataFrame, batch: int, only: bool = False, pool: NoiseModel | None = None) -> Decision:
    """The rule chosen at one batch among the rules that learned, on final accuracy over seeds (lab.decision,
    higher is better, n = seeds: beyond seed noise over the whole family, by a material effect); `only`: the one
    rule that learned, against the best of those that did not."""
    sides = [replace(figure_side({k: 100 * v if k in ("final_acc", *ACC_CI) else v for k, v in r.items()},
                                 r["lr_rule"], value="final_acc", low=ACC_CI[0], high=ACC_CI[1], n=int(r["n"]),
                                 values=int(r["n"])), launch_values=_seeds(r))
             for r in learned.to_dict("records")]
    decision = pick(sides, question=f"{QUESTION} {batch}", figure="final test accuracy",
                    unit=" %", lower_is_better=False, count="seeds", speed=False, command="scalelab lr-scaling",
                    pool=pool)
    return replace(decision, action=f"the {decision.chosen.label} rule for batch {batch}"
                                    + (" (the only one that learned)" if only else ""))


def _seeds(row: dict) -> tuple[float, ...] | None:
    """A row's per-seed final accuracies in points (None: a table saved before they were kept)."""
    values = row.get(ACC_SEEDS)
    return tuple(100 * float(v) for v in values) if isinstance(values, (list, tuple)) and len(values) else None


def seed_pool(table: pd.DataFrame) -> NoiseModel | None:
    """The seed-to-seed variance of final accuracy (points), pooled over every cell of the table that learned (at
    every batch: one property of the model and data), a cell whose own spread is beyond the pool's kept apart
    (noise.fit, on the points' own scale); None without per-seed figures. A cell at chance is left out: its tiny
    spread says nothing of a learning run's and would narrow every interval."""
    if ACC_SEEDS not in table:
        return None
    rows = [r for r in table.to_dict("records") if bool(r.get("learned", True))]
    model = fit([(f"{r['lr_rule']} at batch {r['global_batch']}", _seeds(r) or (), math.nan, 0) for r in rows],
                log=False)
    return model if model.dof else None


def lr_decisions(result) -> list[Decision]:
    """Per batch above the base with two or more seeds and two or more rules that learned: its decision."""
    t = result.tables["lr_scaling"]
    if not len(t):
        return []
    base_batch = result.notes.get("base_batch", int(t["global_batch"].min()))
    pool = seed_pool(t)
    out = []
    for b in sorted(t["global_batch"].unique()):
        g = t[t["global_batch"] == b]
        learned = g[g["learned"].astype(bool)] if "learned" in g else g
        missed = g.drop(learned.index).sort_values("final_acc", ascending=False)
        if b == base_batch or int(g["n"].max()) < 2 or not len(learned):
            continue
        if len(learned) >= 2:
            out.append(rule_decision(learned, int(b), pool=pool))
        elif len(missed):
            best = learned.sort_values("final_acc", ascending=False)
            out.append(rule_decision(g.loc[[best.index[0], missed.index[0]]], int(b), only=True, pool=pool))
    return out


def lr_scaling_result(result) -> tuple[list[str], str | None]:
    """Per batch above the base: the rules' accuracies, and a rule recommended only from two or more seeds, between
    rules that learned (scalelab.analysis.learning), when the best one's seed interval lies clear of the next one's.
    One seed: the ranking is said to be indicative, and nothing is recommended."""
    t = result.tables["lr_scaling"]
    if not len(t):
        return [], None
    base_batch = result.notes.get("base_batch", int(t["global_batch"].min()))
    chance = float(t["chance"].iloc[0]) if "chance" in t else float("nan")
    at_chance = f" (chance {100 * chance:.1f} %)" if chance == chance else ""
    out = []
    base = t[t["global_batch"] == base_batch]
    if len(base):
        out.append(f"At the base batch {base_batch} the model reaches {100 * base['final_acc'].max():.1f} % test "
                   f"accuracy{at_chance}.")
    decisions = lr_decisions(result)
    for b in sorted(t["global_batch"].unique()):
        if b == base_batch:
            continue
        g = t[t["global_batch"] == b].sort_values("final_acc", ascending=False)
        listed = ", ".join(f"{r.lr_rule} {100 * r.final_acc:.1f} %" for r in g.itertuples())
        if int(g["n"].max()) < 2:
            out.append(f"At batch {b} ({b // base_batch}x), indicative, one seed: {listed}{at_chance}. One seed "
                       "has no interval, so whether a rule learned, and whether its lead holds beyond seed noise, is "
                       "unknown: no rule is recommended (--seeds 3 gives each an interval).")
            continue
        learned = g[g["learned"].astype(bool)] if "learned" in g else g
        missed = g.drop(learned.index)
        if len(missed):
            out.append(f"At batch {b}, " + ", ".join(r.lr_rule for r in missed.itertuples())
                       + f" did not learn: final accuracy not clear of chance{at_chance} over the seeds; "
                         f"{COMPARE_ONLY_LEARNED}.")
        if not len(learned):
            continue
        best = learned.iloc[0]
        runner = learned.iloc[1] if len(learned) > 1 else None
        iv = interval(best, *ACC_CI)
        if runner is None:
            out.append(f"At batch {b} ({b // base_batch}x), only {best.lr_rule} learned: {100 * best.final_acc:.1f} % "
                       f"({100 * iv[0]:.1f}–{100 * iv[1]:.1f} % over {int(best.n)} seeds).")
            out += [d.card() for d in decisions if d.question == f"{QUESTION} {b}"]
            continue
        out.append(f"At batch {b} ({b // base_batch}x), among the rules that learned ({seed_band(int(best.n))}s "
                   "over seeds): "
                   + ", ".join(f"{r.lr_rule} {100 * r.final_acc:.1f} % "
                               f"({100 * r.final_acc_ci_low:.1f}–{100 * r.final_acc_ci_high:.1f} %)"
                               for r in learned.itertuples()) + f" over {int(best.n)} seeds.")
        out += [d.card() for d in decisions if d.question == f"{QUESTION} {b}"]
    return out, card(decisions)


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study. 1024 (where the linear rule diverges) is left to `lr-scaling --batches`
    (~30 s more). 3 seeds in the default study: rules are compared seed by seed (paired) from 3 on (~13 s a seed)."""
    q = plan.quick
    return {"batches": [32, 256], "workers": [1], "target": 0.9, "seeds": 1 if q else 3,
            "rules": ["none", "linear", "lars"] if q else ["none", "linear", "sqrt", "linear_warmup",
                                                          "lars"],
            "set": {"model": "cnn", "dataset": "mnist1d", "global_batch": 32, "lr": 0.03,
                    "epochs": 4 if q else 24, "steps": None, "samples": None, "eval_samples": None,
                    "warmup_steps": 1}}


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
                    parse=_target),
             Option(name="seeds", default=1, help="Seeds per cell (initial weights and data order); accuracy and "
                                                  "time to accuracy get their interval over seeds.",
                    parse=number(1, 40, integer=True))),
    defaults={"model": "cnn", "dataset": "mnist1d", "global_batch": 32, "lr": 0.03, "epochs": 40},
    cells=lambda base, opts: lr_cells(base, opts["batches"], opts["rules"], opts["workers"], seeds=opts["seeds"]),
    analyse=_analyse,
    figures=lambda result, out: [accuracy_vs_batch(result.tables["lr_scaling"], out / "lr_scaling.png"),
                                 accuracy_curves(result.tables["lr_curves"], out / "lr_curves.png")],
    interpret=lr_scaling_result,
    decide=lr_decisions,
    captions={"lr_scaling": "Per rule, batch and workers: final test accuracy (median over n seeds; its "
                            "interval is a 95 % one from 6 seeds on, below that the seeds' range, which covers the "
                            "median with 1 - 2 x 0.5^n: 50 % for 2 seeds, analysis.intervals.coverage), "
                            "best accuracy, time and epochs to the target accuracy (when every seed reached it).",
              "lr_scaling.png": "Final test accuracy vs batch size per learning-rate rule (same number of epochs).",
              "lr_curves.png": "Test accuracy per epoch per rule, one panel per batch size."},
    study_options=study_options,
    version=3,  # issue 60: intervals named after their figure
)
