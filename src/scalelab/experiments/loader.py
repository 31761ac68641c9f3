"""DataLoader sweep: num_workers x pin_memory x prefetch on a pipeline with real per-sample CPU work
(seed 001 part 2a). Each setting is a training cell and a "loader" cell: one epoch of the loader alone, no model,
timed in this process and stored like every other measurement."""
from __future__ import annotations

import os
import time

import pandas as pd

from scalelab.analysis import interpret, keys, tables
from scalelab.config import TrainConfig
from scalelab.lab.base import Context, Experiment, Option, Result, bool_list, int_list, launches_option
from scalelab.lab.cells import Cell, Outcome, cell_kind, with_fields
from scalelab.report import figures


def iterate_epoch(cfg: TrainConfig) -> float:
    """Seconds to iterate one epoch of the training loader alone."""
    import torch

    from scalelab.distenv import DistContext
    from scalelab.train.loop import make_loader
    from scalelab.train.setup import build_bundle

    bundle = build_bundle(cfg)
    loader, sampler = make_loader(bundle.train, cfg, DistContext(0, 1, 0, 1, torch.device("cpu")))
    sampler.set_epoch(0)
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


@cell_kind("loader", TrainConfig.from_dict)
def _execute_loader(cell: Cell, store, study: str, say) -> Outcome:
    from scalelab.provenance import collect_provenance

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
    table = tables.loader_table(runs)
    iteration = {}
    for (_, cfg), res in zip(settings, alone):
        seconds = float("nan")
        if res.status == "completed":
            seconds = ctx.cells.runs([res])[0]["summary"][keys.EPOCH_ITERATION_S]
        iteration[(cfg.num_workers, cfg.pin_memory, cfg.prefetch_factor)] = seconds
    table["epoch_iteration(s)"] = [iteration.get((int(r.num_workers), bool(r.pin_memory), _none(r.prefetch_factor)))
                                   for r in table.itertuples()]
    return Result("loader_sweep", {"loader_sweep": table}, notes={"recommended": tables.best_loader_setting(table)})


def default_workers() -> list[int]:
    cores = os.cpu_count() or 1
    return sorted({0, 1, 2, *range(2, 2 * cores + 1, 2)})


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
    figures=lambda result, out: [figures.loader_bars(result.tables["loader_sweep"], out / "loader_sweep.png")],
    interpret=lambda result: interpret.loader(result.tables["loader_sweep"], result.notes.get("recommended", {})),
    captions={"loader_sweep": "Per loader setting: data wait (ms/step, % of step), throughput, and one epoch of the "
                              "loader alone.",
              "loader_sweep.png": "Throughput and data-wait share per loader setting."},
)
