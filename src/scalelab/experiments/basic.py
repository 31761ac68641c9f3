"""Single-knob experiments: batch sweep, stage profile, precision, activation checkpointing, loader sweep.

Each one builds a grid of configs from a base config, runs the missing cells (resumable), then computes its
table from the stored runs alone and writes it (CSV + JSON) with its plot into `out_dir`.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scalelab.analysis import tables
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments.grid import Cell, run_grid, study_runs, with_fields, write_table
from scalelab.report import figures
from scalelab.store import Store


@dataclass
class ExperimentResult:
    name: str
    tables: dict[str, pd.DataFrame]
    files: list[Path] = field(default_factory=list)
    notes: dict = field(default_factory=dict)


def _finish(name: str, study: str, store: Store, out_dir: Path, table: pd.DataFrame,
            plot: Callable[[pd.DataFrame, Path], Path] | None, notes: dict | None = None) -> ExperimentResult:
    paths = write_table(table, out_dir, name)
    files = [paths["csv"], paths["json"]]
    if plot is not None and len(table):
        files.append(plot(table, out_dir / f"{name}.png"))
    return ExperimentResult(name, {name: table}, files, notes or {})


def batch_sweep(base: TrainConfig, batches: list[int], store: Store, study: str, out_dir: Path,
                say: Callable[[str], None] = print) -> ExperimentResult:
    """Epoch time with and without data loading, throughput and peak memory per global batch size."""
    if not batches:
        raise ConfigError("batches", batches, "give at least one batch size, e.g. 32,64,128")
    cells = [Cell(f"batch {b}", with_fields(base, global_batch=b)) for b in batches]
    name = "batch_sweep"
    run_grid(f"{study}/{name}", cells, store, say=say)
    table = tables.batch_sweep_table(study_runs(store, f"{study}/{name}"))
    return _finish(name, study, store, out_dir, table, figures.time_vs_batch)


def profile(base: TrainConfig, store: Store, study: str, out_dir: Path,
            say: Callable[[str], None] = print) -> ExperimentResult:
    """Where a step's time goes: the stage breakdown of one run, as a table and a pie chart."""
    name = "profile"
    run_grid(f"{study}/{name}", [Cell("profile", base)], store, say=say)
    table = tables.stage_profile_table(study_runs(store, f"{study}/{name}"))
    return _finish(name, study, store, out_dir, table, figures.stage_pie)


def precision(base: TrainConfig, store: Store, study: str, out_dir: Path, precisions: list[str] | None = None,
              say: Callable[[str], None] = print) -> ExperimentResult:
    """fp32 vs bf16 autocast (vs fp16 with GradScaler on CUDA): accuracy, loss curve, memory, time."""
    on_cuda = base.resolved_device == "cuda"
    chosen = precisions or (["fp32", "bf16", "fp16"] if on_cuda else ["fp32", "bf16"])
    cells = [Cell(p, with_fields(base, precision=p)) for p in chosen]
    name = "amp"
    run_grid(f"{study}/{name}", cells, store, say=say)
    runs = study_runs(store, f"{study}/{name}")
    table = tables.precision_table(runs)
    result = _finish(name, study, store, out_dir, table, None)
    curves = loss_curves(store, runs, "precision")
    result.tables["amp_curves"] = curves
    result.files.append(figures.loss_curves(curves, out_dir / "amp_curves.png", hue="precision"))
    skipped = sorted({"fp32", "bf16", "fp16"} - set(chosen))
    result.notes["skipped"] = {p: "fp16 with GradScaler needs CUDA" for p in skipped}
    return result


def checkpointing(base: TrainConfig, segments: list[int], store: Store, study: str, out_dir: Path,
                  say: Callable[[str], None] = print) -> ExperimentResult:
    """Activation checkpointing with 0..k segments: peak memory vs step time."""
    cells = [Cell(f"{k} segments", with_fields(base, checkpoint_segments=k)) for k in segments]
    name = "checkpointing"
    run_grid(f"{study}/{name}", cells, store, say=say)
    table = tables.checkpointing_table(study_runs(store, f"{study}/{name}"))
    return _finish(name, study, store, out_dir, table, figures.memory_vs_segments)


def loader_sweep(base: TrainConfig, workers: list[int], store: Store, study: str, out_dir: Path,
                 pin_memory: list[bool] = (False,), prefetch: list[int] = (2,),
                 say: Callable[[str], None] = print) -> ExperimentResult:
    """DataLoader num_workers x pin_memory x prefetch on a pipeline with real per-sample CPU work."""
    cells = []
    for w in workers:
        for pin in pin_memory:
            for pf in (prefetch if w > 0 else [None]):
                label = f"workers {w} pin {pin} prefetch {pf}"
                cells.append(Cell(label, with_fields(base, num_workers=w, pin_memory=pin, prefetch_factor=pf)))
    name = "loader_sweep"
    run_grid(f"{study}/{name}", cells, store, say=say)
    table = tables.loader_table(study_runs(store, f"{study}/{name}"))
    iteration = {}
    for cell in cells:  # the loader alone, one epoch per setting: stored like every other measurement
        c = cell.config
        iteration[(c.num_workers, c.pin_memory, c.prefetch_factor)] = loader_epoch_time(
            c, store, f"{study}/{name}_iteration", say)
    table["epoch_iteration(s)"] = [iteration.get((int(r.num_workers), bool(r.pin_memory), _none(r.prefetch_factor)))
                                   for r in table.itertuples()]
    best = tables.best_loader_setting(table)
    return _finish(name, study, store, out_dir, table, figures.loader_bars, {"recommended": best})


def _none(value):
    return None if pd.isna(value) else int(value)


def loader_epoch_time(cfg: TrainConfig, store: Store, study: str, say: Callable[[str], None]) -> float:
    """Seconds to iterate one epoch of the training loader alone (no model), stored as a run of kind "loader"."""
    from scalelab.experiments.grid import cell_key
    from scalelab.provenance import collect_provenance

    key = cell_key(cfg)
    for run_id in store.list_runs(study=study, status="completed", kind="loader")["run_id"]:
        row = store.get(run_id)
        if row["summary"].get("cell") == key:
            return row["summary"]["time/epoch_iteration(s)"]
    from scalelab.experiments.grid import REPLAY

    if REPLAY.get():
        return float("nan")  # not measured: the table shows it missing rather than measuring during a rebuild
    say(f"[{study}] loader alone: workers {cfg.num_workers} pin {cfg.pin_memory} prefetch {cfg.prefetch_factor}")
    run_id = store.create_run(cfg.to_dict(), collect_provenance(seed=cfg.seed), kind="loader", study=study)
    try:
        seconds = iterate_epoch(cfg)
    except BaseException as err:
        store.finish_run(run_id, "failed", reason=f"{type(err).__name__}: {err}".splitlines()[0])
        raise
    store.finish_run(run_id, "completed", summary={"cell": key, "time/epoch_iteration(s)": seconds})
    return seconds


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


def loss_curves(store: Store, runs: list[dict], hue: str) -> pd.DataFrame:
    """Rank 0's per-step training loss of each run, labelled by a config field."""
    from scalelab.store import RunDir

    rows = []
    for run in runs:
        for rec in RunDir(store.run_dir(run["run_id"])).read_steps(0):
            rows.append({hue: run["config"][hue], "step": rec["step"], "loss": rec.get("loss")})
    return pd.DataFrame(rows, columns=[hue, "step", "loss"])
