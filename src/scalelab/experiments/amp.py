"""Mixed precision: fp32 vs bf16 autocast (vs fp16 with GradScaler on CUDA): accuracy, loss curve, memory, time
(seed 001 part 2c)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import ratio_words
from scalelab.analysis.learning import COMPARE_ONLY_LEARNED, Learning, chance_over, over_seeds, seed_band
from scalelab.analysis.repeats import LAUNCHES, pool
from scalelab.analysis.summary import timed_step_ms
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.lab.base import Experiment, Option, Result, StudyPlan, launches_option, name_list, number
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.decision import NOT_ENOUGH_DATA, Decision, card, pick, step_side
from scalelab.report.figures import plt, save
from scalelab.train.setup import build_bundle


def precision_table(runs: list[dict], chance: float = math.nan, higher_is_better: bool = True) -> pd.DataFrame:
    """fp32 vs bf16 vs fp16, one row per precision: final accuracy and loss (the median over seeds, with the seeds'
    interval), peak memory and time (seed 001 part 2c); `chance` and whether the precision's runs `learned`
    (scalelab.analysis.learning: accuracy above chance, or for tokens the evaluation loss below ln V, by more than
    the seed interval). Timings come from every seed's run, each a launch of the same work (`_timing`)."""
    metrics = [keys.EVAL_ACC, keys.EVAL_LOSS, keys.TRAIN_LOSS, keys.MEMORY_PEAK_RSS_GIB,
               keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, keys.EPOCH_S, keys.THROUGHPUT, *SPREAD]
    by_precision: dict[str, list[dict]] = {}
    for run in runs:
        by_precision.setdefault(run["config"]["precision"], []).append(run)
    pooled = [{**group[0], "summary": _timing(group)} for group in by_precision.values()]
    frame = runs_frame(pooled, ["precision", "device"], metrics, headline=keys.THROUGHPUT).dropna(axis=1, how="all")
    if not len(frame):
        return frame
    figure = keys.EVAL_ACC if higher_is_better else keys.EVAL_LOSS
    rows = []
    for p in frame["precision"]:
        seeds = [(r["summary"] or {}).get(figure, math.nan) for r in by_precision[p]]
        fit = over_seeds(seeds, chance, higher_is_better=higher_is_better)
        rows.append({figure: fit.median, f"{figure}_ci_low": fit.low, f"{figure}_ci_high": fit.high,
                     "seeds": fit.seeds, "chance": chance, "learned": fit.learned})
    extra = pd.DataFrame(rows, index=frame.index)
    frame[figure] = extra.pop(figure)
    at = list(frame.columns).index(figure) + 1
    for offset, column in enumerate(extra.columns):
        frame.insert(at + offset, column, extra[column])
    if "fp32" in set(frame["precision"]):
        base = frame.loc[frame["precision"] == "fp32", keys.THROUGHPUT].iloc[0]
        frame["speedup_vs_fp32"] = frame[keys.THROUGHPUT] / base
    return frame


def _timing(runs: list[dict]) -> dict:
    """One summary for a precision's runs: several seeds of one launch each are launches of the same work (the seed
    changes the initial weights and the data order, not the step's cost), so they pool
    (scalelab.analysis.repeats); a cell launched several times already pooled its launches, and its first seed's
    row stands for the precision's time."""
    summaries = [r["summary"] or {} for r in runs]
    if len(runs) > 1 and all(s.get(LAUNCHES, 1) == 1 for s in summaries) and all("files" in r for r in runs):
        return pool(summaries, [timed_step_ms(r["files"].read_steps()) for r in runs])
    return summaries[0]


PRECISIONS = ("fp32", "bf16", "fp16")


def _chosen(base, opts) -> list[str]:
    if opts["precisions"] is not None:
        return opts["precisions"]
    return list(PRECISIONS) if base.resolved_device == "cuda" else ["fp32", "bf16"]


def loss_curves(runs: list[dict], hue: str) -> pd.DataFrame:
    """Rank 0's per-step training loss of each run (read through its `files`), labelled by a config field and the
    run's seed."""
    rows = [{hue: run["config"][hue], "seed": run["config"].get("seed", 0), "step": rec["step"],
             "loss": rec.get("loss")} for run in runs for rec in run["files"].read_steps(0)]
    return pd.DataFrame(rows, columns=[hue, "seed", "step", "loss"])


def seed_cells(base, precisions: list[str], seeds: int, launches: int) -> list[Cell]:
    """One cell per precision and seed (seeds base.seed, base.seed + 1, ...): accuracy gets its interval over the
    seeds, and whether a run learned is told from that interval (scalelab.analysis.learning)."""
    return [Cell(f"{p}, seed {base.seed + k}" if seeds > 1 else p, with_fields(base, precision=p, seed=base.seed + k),
                 repeats=launches) for k in range(seeds) for p in precisions]


def chance_of(base, seeds: int) -> tuple[float, bool]:
    """Chance for the base config's data over its seeds' datasets (scalelab.analysis.learning.chance_over)."""
    return chance_over(build_bundle(with_fields(base, seed=base.seed + k)) for k in range(seeds))


def _analyse(runs, base, opts) -> Result:
    skipped = sorted(set(PRECISIONS) - set(_chosen(base, opts)))
    notes = {"skipped": {p: "fp16 with GradScaler needs CUDA" for p in skipped}} if skipped else {}
    chance, higher = chance_of(base, opts["seeds"])
    notes["chance"] = (f"{100 * chance:.1f} % accuracy (the majority class's share of the evaluation labels)"
                       if higher else f"evaluation loss {chance:.3g} (a uniform guess over the vocabulary, ln V)")
    return Result("amp", {"amp": precision_table(runs, chance, higher), "amp_curves": loss_curves(runs, "precision")},
                  notes=notes)


def plot_loss_curves(curves: pd.DataFrame, path: Path, *, hue: str) -> Path:
    """Training loss per step, one line per value of `hue` (and per seed, when there are several)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    by = [hue, "seed"] if "seed" in curves and curves["seed"].nunique() > 1 else [hue]
    for value, group in curves.groupby(by, sort=False):
        value = value if isinstance(value, tuple) else (value,)
        ax.plot(group["step"], group["loss"], label=f"{hue}={value[0]}" + (f", seed {value[1]}" if len(by) > 1 else ""))
    ax.set(xlabel="optimizer step", ylabel="training loss (cross-entropy, rank 0)", title="Loss curves")
    ax.legend()
    return save(fig, path)


def precision_decisions(table: pd.DataFrame) -> list[Decision]:
    """The precision chosen on the median step among every precision (lab.decision: beyond noise over the whole
    family, by a material effect; fp32 is kept when none wins), recommended only where every precision learned
    (fp32 too, when it is the faster) and the chosen one ends within 1 point of fp32's accuracy (else nothing is
    recommended, and the card says why)."""
    if len(table) < 2 or "fp32" not in set(table["precision"]):
        return []
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    rows = table.to_dict("records")
    sides = [step_side(r, r["precision"], value=keys.STEP_MEDIAN_MS, low=low, high=high) for r in rows]
    decision = pick(sides, question="precision", default="fp32", action=None)
    if decision is None or not decision.recommends:
        return [decision] if decision is not None else []
    chosen = next(r for r in rows if r["precision"] == decision.chosen.label)
    base = next(r for r in rows if r["precision"] == "fp32")
    # fp32 faster is a recommendation too ("Use fp32: ... faster than bf16"): it names a precision whose runs may
    # not have learned, so it needs every precision to have learned as much as a lower precision does
    if not all(bool(r.get("learned")) for r in rows):
        why = f"{decision.chosen.label} is faster beyond noise, but accuracy is not compared: {COMPARE_ONLY_LEARNED}"
    elif decision.chosen.label == "fp32":
        return [decision]
    elif chosen[keys.EVAL_ACC] < base[keys.EVAL_ACC] - 0.01:
        why = f"{decision.chosen.label} is faster beyond noise, but its accuracy ends more than 1 point below fp32's"
    else:
        return [replace(decision, action=f"{decision.chosen.label} (accuracy within 1 point of fp32's)")]
    return [replace(decision, verdict=NOT_ENOUGH_DATA, why=why, keep="fp32, the default", withheld="accuracy")]


def precision(table: pd.DataFrame) -> tuple[list[str], str | None]:
    """Throughput of each precision against fp32's, accuracy against fp32's only where both learned (the table's
    `learned`, scalelab.analysis.learning), and the decision's card (`precision_decisions`)."""
    if not len(table) or "fp32" not in set(table["precision"]):
        return [], None
    base = table[table["precision"] == "fp32"].iloc[0]
    out, unlearned = [], []
    for d in table[table["precision"] != "fp32"].to_dict("records"):
        # one comparison said on one figure: the median step, which the decision compares too (issue 60: the
        # throughput's "1.36× slower" beside the card's "1.40× faster" for the same pair)
        step = keys.STEP_MEDIAN_MS
        speed = f"{d['precision']} runs {ratio_words(base[step] / d[step], 'fp32')} (median step)"
        both = bool(d.get("learned")) and bool(base.get("learned"))
        if both:
            out.append(f"{speed} and ends at accuracy {_accuracy(d)} vs {_accuracy(base)} (fp32).")
        else:
            out.append(f"{speed}.")
            unlearned += [r for r in (base, d) if not r.get("learned") and r["precision"] not in
                          {u["precision"] for u in unlearned}]
    out += [f"{r['precision']} {_learning(r).verdict()}." for r in unlearned]
    if unlearned:
        out.append(f"Accuracy is not compared: {COMPARE_ONLY_LEARNED}. Train longer (--steps) or with more seeds "
                   "(--seeds) for an accuracy comparison.")
    decisions = precision_decisions(table)
    return out + [d.card() for d in decisions], card(decisions)


def _learning(row) -> Learning:
    """The row's figure over seeds against chance, as the table holds it (accuracy, else the evaluation loss)."""
    acc = keys.EVAL_ACC
    higher = f"{acc}_ci_low" in row
    figure = acc if higher else keys.EVAL_LOSS
    return Learning(row.get(figure, math.nan), row.get(f"{figure}_ci_low", math.nan),
                    row.get(f"{figure}_ci_high", math.nan), int(row.get("seeds", 1) or 1), row.get("chance", math.nan),
                    higher)


def _accuracy(row) -> str:
    fit = _learning(row)
    band = seed_band(fit.seeds)
    return f"{100 * fit.median:.1f} % ({band} {100 * fit.low:.1f}–{100 * fit.high:.1f} %, {fit.seeds} seeds)" \
        if fit.higher_is_better else f"loss {fit.median:.3g} ({band} {fit.low:.3g}–{fit.high:.3g}, {fit.seeds} seeds)"


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study: the MNIST-1D CNN (as lr-scaling's), which learns in a few epochs (about
    85 % test accuracy after 1000 steps of batch 32, chance 10.6 %), where the study's CNN on synthetic images
    stayed at chance (loss 2.30 = ln 10 after 40 steps). Each seed is one launch: the seeds' runs pool as launches
    for the time (`_timing`) and give the accuracy its seed interval."""
    q = plan.quick
    return {"launches": 1, "seeds": 2 if q else 3,
            "set": {"model": "cnn", "dataset": "mnist1d", "global_batch": 32, "lr": 0.03, "samples": None,
                    "eval_samples": None, "steps": 400 if q else 1000, "eval_every": 0}}


EXPERIMENT = Experiment(
    name="amp", command="amp", section="amp", order=90,
    title="Mixed precision",
    question="Is lower precision faster, and does it cost accuracy? (seed 001 part 2c)",
    help="fp32 vs bf16 (vs fp16 + GradScaler on CUDA): loss curves, accuracy, memory, time.",
    options=(Option(name="precisions", default=None, help="Precisions to compare (default fp32,bf16 and fp16 on "
                                                          "CUDA).", parse=lambda v, n: name_list(v, n, PRECISIONS)),
             launches_option(),
             Option(name="seeds", default=2, help="Seeds per precision (initial weights and data order); accuracy "
                                                  "gets its interval over seeds, and is compared only where it is "
                                                  "above chance by more than that interval (one seed: never).",
                    parse=number(1, 20, integer=True))),
    cells=lambda base, opts: seed_cells(base, _chosen(base, opts), opts["seeds"], opts["launches"]),
    interleave=True,
    analyse=_analyse,
    figures=lambda result, out: [plot_loss_curves(result.tables["amp_curves"], out / "amp_curves.png",
                                                     hue="precision")],
    interpret=lambda result: precision(result.tables["amp"]),
    decide=lambda result: precision_decisions(result.tables["amp"]),
    captions={"amp": "Per precision: final accuracy (median over seeds, the seeds' interval), chance and whether the "
                     "runs learned, loss, peak memory, throughput, step time spread.",
              "amp_curves.png": "Training loss per step, fp32 vs lower precision (rank 0)."},
    study_options=study_options,
    version=3,  # issue 60: intervals named after their figure
)
