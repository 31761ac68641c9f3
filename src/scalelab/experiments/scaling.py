"""Scaling study: worker counts x batch sizes, strong and weak, with compute vs communication per cell.

Each multi-worker cell also runs once with `sync=noop` (no gradient synchronisation, same everything else):
the difference of step times is the exposed communication, measured rather than taken as a remainder.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


from scalelab.analysis.scaling import add_exposed_comm, scaling_table
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments.basic import ExperimentResult
from scalelab.experiments.grid import Cell, run_grid, study_runs, with_fields, write_table
from scalelab.report import figures
from scalelab.store import Store


def scale(base: TrainConfig, workers: list[int], batches: list[int], store: Store, study: str, out_dir: Path,
          modes: tuple[str, ...] = ("strong", "weak"), say: Callable[[str], None] = print) -> ExperimentResult:
    """Strong mode: `batches` are global batches; weak mode: `batches` are per-worker batches."""
    if not workers or min(workers) < 1:
        raise ConfigError("workers", workers, "allowed: worker counts >= 1, e.g. 1,2,4")
    for mode in modes:
        if mode not in ("strong", "weak"):
            raise ConfigError("modes", mode, "allowed: strong, weak")
    result = ExperimentResult("scale", {})
    for mode in modes:
        name = f"scale_{mode}"
        cells, ablation = [], []
        for b in batches:
            for n in workers:
                global_batch = b if mode == "strong" else b * n
                if global_batch % n:
                    say(f"[{name}] skip {n} workers x batch {b}: not divisible")
                    continue
                cfg = with_fields(base, ranks=n, global_batch=global_batch)
                cells.append(Cell(f"{mode}: {n} workers, batch {global_batch}", cfg))
                if n > 1:
                    ablation.append(Cell(f"{mode}: {n} workers, batch {global_batch}, no sync",
                                         with_fields(cfg, sync="noop")))
        run_grid(f"{study}/{name}", cells, store, say=say)
        run_grid(f"{study}/{name}_nosync", ablation, store, say=say)
        table = scaling_table(study_runs(store, f"{study}/{name}"), mode)
        table = add_exposed_comm(table, study_runs(store, f"{study}/{name}_nosync"))
        result.tables[name] = table
        paths = write_table(table, out_dir, name)
        result.files += [paths["csv"], paths["json"]]
        if len(table):
            result.files.append(figures.speedup_vs_workers(table, out_dir / f"{name}.png", mode=mode))
            result.files.append(figures.compute_comm_bars(table, out_dir / f"{name}_breakdown.png"))
    return result
