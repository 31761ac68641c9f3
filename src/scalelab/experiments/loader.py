"""DataLoader sweep: num_workers x pin_memory x prefetch on a pipeline with real per-sample CPU work
(seed 001 part 2a). Each setting is a training cell and a "loader" cell: one epoch of the loader alone, no model,
timed in this process and stored like every other measurement."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import fmt, ratio_words
from scalelab.analysis.tables import SPREAD, runs_frame
from scalelab.config import TrainConfig
from scalelab.distenv import DistContext
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, bool_list, int_list, launches_option
from scalelab.lab.cells import Cell, Outcome, cell_kind, with_fields
from scalelab.lab.decision import Decision, card, pick, step_side
from scalelab.provenance import collect_provenance
from scalelab.report.figures import Series, ci, ci_label, plt, save
from scalelab.train.loop import make_loader
from scalelab.train.setup import build_bundle


def loader_table(runs: list[dict]) -> pd.DataFrame:
    """DataLoader settings vs data-wait share of training steps and throughput (seed 001 part 2a)."""
    metrics = [keys.stage_ms("data"), keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS,
               keys.EPOCH_S, keys.THROUGHPUT, *SPREAD[-3:]]  # the last: the noise model's inputs
    frame = runs_frame(runs, ["num_workers", "pin_memory", "prefetch_factor"], metrics, headline=keys.THROUGHPUT)
    if len(frame):
        shares = {run["run_id"]: 100.0 * data_share(run["summary"] or {}) for run in runs}
        frame["data_wait(%)"] = frame["run_id"].map(shares)
    return frame


def data_share(summary: dict) -> float:
    """Data wait as a fraction of the mean step (the stage means sum to the mean step time)."""
    stages = [v for k, v in summary.items() if k.startswith(keys.STAGE_PREFIX) and "_ci_" not in k]
    total = sum(stages)
    return summary.get(keys.stage_ms("data"), 0.0) / total if total else 0.0


def iterate_epoch(cfg: TrainConfig) -> float:
    """Seconds to iterate one epoch of the training loader alone."""
    import torch


    bundle = build_bundle(cfg)
    loader, sampler = make_loader(bundle.train, cfg, DistContext(0, 1, 0, 1, torch.device("cpu")))
    sampler.set_epoch(0)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


@cell_kind("loader", TrainConfig.from_dict)
def _execute_loader(cell: Cell, store, study: str, say) -> Outcome:
    cfg = cell.config
    run_id = store.create_run(cfg.to_dict(), collect_provenance(seed=cfg.seed), kind="loader", study=study)
    try:
        seconds = iterate_epoch(cfg)
    except Exception as err:  # noqa: BLE001 - recorded as the cell's failure
        reason = f"{type(err).__name__}: {err}".splitlines()[0]
        store.finish_run(run_id, "failed", reason=reason)
        return Outcome(run_id, reason)
    except BaseException:
        store.finish_run(run_id, "interrupted", reason="interrupted")
        raise
    store.finish_run(run_id, "completed", summary={"cell": cell.key, keys.EPOCH_ITERATION_S: seconds})
    return Outcome(run_id)


def _settings(base: TrainConfig, opts: dict) -> list[tuple[str, TrainConfig]]:
    out = []
    for w in opts["workers"]:
        for pin in opts["pin_memory"]:
            for pf in (opts["prefetch"] if w > 0 else [None]):
                out.append((f"workers {w} pin {pin} prefetch {pf}",
                            with_fields(base, num_workers=w, pin_memory=pin, prefetch_factor=pf)))
    return out


def _none(value):
    return None if pd.isna(value) else int(value)


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    settings = _settings(base, opts)
    # the settings are compared with each other: launched in interleaved rounds, each row pools its launches
    trained = ctx.cells.run([Cell(label, cfg, repeats=opts["launches"]) for label, cfg in settings],
                            group="loader_sweep", interleave=True)
    alone = ctx.cells.run([Cell(f"{label}: loader alone", cfg, kind="loader") for label, cfg in settings],
                          group="loader_sweep_iteration")
    runs = [r for r in ctx.cells.rows(trained) if r["status"] == "completed"]
    table = loader_table(runs)
    iteration = {}
    for (_, cfg), res in zip(settings, alone):
        seconds = float("nan")
        if res.status == "completed":
            seconds = ctx.cells.runs([res])[0]["summary"][keys.EPOCH_ITERATION_S]
        iteration[(cfg.num_workers, cfg.pin_memory, cfg.prefetch_factor)] = seconds
    table["epoch_iteration(s)"] = [iteration.get((int(r.num_workers), bool(r.pin_memory), _none(r.prefetch_factor)))
                                   for r in table.itertuples()]
    return Result("loader_sweep", {"loader_sweep": table})


def default_workers() -> list[int]:
    cores = os.cpu_count() or 1
    return sorted({0, 1, 2, *range(2, 2 * cores + 1, 2)})


def loader_bars(table: pd.DataFrame, path: Path) -> Path:
    """Throughput and data-wait share per loader setting."""
    labels = [f"w{int(r.num_workers)}{' pin' if r.pin_memory else ''}"
              f"{'' if pd.isna(r.prefetch_factor) else f' pf{int(r.prefetch_factor)}'}" for r in table.itertuples()]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.bar(labels, table[keys.THROUGHPUT], yerr=ci(table, keys.THROUGHPUT, *keys.ci_keys(keys.THROUGHPUT)), capsize=3)
    ax1.set(ylabel=f"training throughput (samples/s),\nbars: {ci_label(table)}", title="Throughput per loader setting")
    ax2.bar(labels, table["data_wait(%)"], color="tab:orange")
    ax2.set(ylabel="data wait (% of step)", title="Time waiting for data")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=45)
    return save(fig, path, [Series("", "loader_sweep", keys.THROUGHPUT),
                            Series("", "loader_sweep", "data_wait(%)", axis=1)])


def setting(row) -> str:
    """A loader setting as the user writes it: "num_workers=2 (pin_memory=False, prefetch_factor=2)"."""
    words = f"pin_memory={bool(row['pin_memory'])}"
    words += "" if pd.isna(row["prefetch_factor"]) else f", prefetch_factor={int(row['prefetch_factor'])}"
    return f"num_workers={int(row['num_workers'])} ({words})"


def loader_decisions(table: pd.DataFrame) -> list[Decision]:
    """The loader setting chosen on the median step among every setting (lab.decision: beyond noise over the
    whole family, by a material effect); none wins: DataLoader's default (no workers) is kept, else the setting
    with the fewest workers within noise (workers cost cores and memory)."""
    if len(table) < 2:
        return []
    rows = table.to_dict("records")
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    sides = [step_side(r, setting(r), value=keys.STEP_MEDIAN_MS, low=low, high=high) for r in rows]
    default = next((setting(r) for r in rows if r["num_workers"] == 0 and not r["pin_memory"]), None)
    workers = {setting(r): int(r["num_workers"]) for r in rows}
    decision = pick(sides, question="loader setting", default=default, cheaper=lambda s: workers[s.label],
                    command="scalelab loader-sweep")
    return [decision] if decision is not None else []


def loader(table: pd.DataFrame) -> tuple[list[str], str | None]:
    if not len(table):
        return [], None
    zero = table[table["num_workers"] == 0]
    out = []
    if len(zero):
        out.append(f"With no loader workers, steps wait for data {zero['data_wait(%)'].iloc[0]:.1f} % of the time.")
    best = table.loc[table[keys.THROUGHPUT].idxmax()]
    line = f"{setting(best)} has the highest throughput, {fmt(best[keys.THROUGHPUT])} samples/s"
    if len(zero) and best["num_workers"] != 0:  # never a ratio of a thing with itself
        line += f" ({ratio_words(best[keys.THROUGHPUT] / zero[keys.THROUGHPUT].max(), 'no workers')})"
    out.append(line + ".")
    decisions = loader_decisions(table)
    return out + [d.card() for d in decisions], card(decisions)


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study."""
    q = plan.quick
    return {"workers": [0, 2] if q else [0, 2, 4], "launches": 2,
            "set": {"dataset": "synthetic_jpeg", "augment": True, "steps": 8 if q else 20}}


EXPERIMENT = Experiment(
    name="loader", command="loader-sweep", section="loader", order=80,
    title="Data loading",
    question="Which DataLoader setting removes the data wait? (seed 001 part 2a)",
    help="DataLoader num_workers / pin_memory / prefetch: epoch iteration time, data-wait share, a recommendation.",
    options=(Option(name="workers", default=None, help="num_workers values (default 0..2×cores).", parse=int_list),
             Option(name="pin_memory", default=[False], help="pin_memory values to try (true on CUDA helps).",
                    parse=bool_list),
             Option(name="prefetch", default=[2], help="prefetch_factor values for workers > 0.", parse=int_list),
             launches_option()),
    defaults={"dataset": "synthetic_jpeg"},
    run=lambda ctx, base, opts: _run(ctx, base, {**opts, "workers": opts["workers"] or default_workers()}),
    figures=lambda result, out: [loader_bars(result.tables["loader_sweep"], out / "loader_sweep.png")],
    interpret=lambda result: loader(result.tables["loader_sweep"]),
    decide=lambda result: loader_decisions(result.tables["loader_sweep"]),
    version=3,  # issue 60: intervals named after their figure
    captions={"loader_sweep": "Per loader setting: data wait (ms/step, % of step), throughput, and one epoch of the "
                              "loader alone.",
              "loader_sweep.png": "Throughput and data-wait share per loader setting."},
    # the setting (what tells rows apart), the data wait it is about, and the step the decision is made on
    columns={"loader_sweep": ["num_workers", "pin_memory", "prefetch_factor", "stage/data(ms)", "data_wait(%)",
                              "time/step_median(ms)", "time/step_median_ci_low(ms)", "time/step_median_ci_high(ms)",
                              "throughput(samples/s)", "epoch_iteration(s)", "quality"]},
    study_options=study_options,
)
