"""Gradient-sync strategies and backends side by side, each on one base config (F5, F6).

Every strategy (or backend) is a cell of one resumable grid; the no-op sync of the same config is a cell too, and
the difference of median step times is the exposed communication (measured by ablation, not a remainder).
Both commands store their cells in the study `STUDY/compare`, so a cell they share (e.g. DDP on gloo and its
no-op baseline) runs once. Each table is computed from the stored runs of this invocation's cells alone.

Gradient accumulation keeps the global batch: with K micro-steps each rank runs K forward/backward passes of
per_rank_batch / K samples and syncs once, so its compute baseline is a no-op run with the same K.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from scalelab.analysis.compare import BACKENDS, STRATEGIES, backends_table, strategies_table
from scalelab.config import TrainConfig, cuda_device_count
from scalelab.errors import ConfigError
from scalelab.experiments.basic import ExperimentResult
from scalelab.experiments.grid import Cell, CellResult, run_grid, with_fields, write_table
from scalelab.report import figures
from scalelab.store import Store

GRID = "compare"  # the grid's study is f"{study}/{GRID}"
EXPOSED_NOTE = ("exposed comm = median step - median step of the noop run of the same config (clipped at 0); "
                "overlap = 1 - exposed / time inside collectives")
LOOPBACK_NOTE = ("loopback bytes: the host's loopback counter (all ranks) sampled every sample_interval_s and "
                 "interpolated over the timed steps; with steps shorter than the sampling period, traffic of "
                 "neighbouring steps (e.g. warm-up) leaks in")


def strategy_fields(name: str, accumulate: int) -> dict:
    """Config fields that select a strategy (everything else comes from the base config)."""
    if name not in STRATEGIES:
        raise ConfigError("strategies", name, f"allowed: {', '.join(STRATEGIES)}")
    if name.startswith("ddp+") and name != "ddp+accumulate":
        return {"sync": "ddp", "ddp_hook": name.split("+")[1], "accumulate": 1}
    if name == "ddp+accumulate":
        return {"sync": "ddp", "ddp_hook": "none", "accumulate": accumulate}
    return {"sync": name, "ddp_hook": "none", "accumulate": 1}


def check_names(names: list[str] | None, allowed: tuple[str, ...], field: str) -> list[str]:
    """The names to run, in the canonical order; every name must be known."""
    if names is None:
        return list(allowed)
    if not names:
        raise ConfigError(field, "", f"give at least one of: {', '.join(allowed)}")
    for name in names:
        if name not in allowed:
            raise ConfigError(field, name, f"allowed: {', '.join(allowed)}")
    return [n for n in allowed if n in names]


def strategies(base: TrainConfig, store: Store, study: str, out_dir: Path, *, names: list[str] | None = None,
               accumulate: int = 2, say: Callable[[str], None] = print) -> ExperimentResult:
    """Run every gradient-sync strategy (or those in `names`) on `base`; the noop baseline always runs."""
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 2:
        raise ConfigError("accumulate", accumulate, "allowed: an integer >= 2 (micro-steps per optimizer step)")
    chosen = check_names(names, STRATEGIES, "strategies")
    if "noop" not in chosen:
        chosen.append("noop")  # the compute baseline of every row
    # every config is validated before anything runs
    cells = [Cell(name, with_fields(base, **strategy_fields(name, accumulate))) for name in chosen]
    k_values = sorted({c.config.accumulate for c in cells} - {1})
    baselines = [Cell(f"noop, accumulate {k} (baseline of ddp+accumulate)",
                      with_fields(base, **{**strategy_fields("noop", 1), "accumulate": k})) for k in k_values]
    grid_cells = [*cells, *baselines]
    runs = _stored(store, grid_cells, run_grid(f"{study}/{GRID}", grid_cells, store, say=say))
    noop_runs = [r for r in runs if r["config"].get("sync") == "noop"]
    table = strategies_table(runs[:len(cells)], noop_runs)
    name = "compare_strategies"
    notes = {"exposed": EXPOSED_NOTE, "loopback": LOOPBACK_NOTE}
    if k_values:
        per_rank = base.per_rank_batch
        notes["accumulate"] = (f"ddp+accumulate keeps the global batch {base.global_batch}: each rank runs "
                               f"{accumulate} micro-steps of {per_rank / accumulate:g} samples (instead of one of "
                               f"{per_rank}) and syncs once per step; its compute is a noop run with the same "
                               f"accumulation")
    return _finish(name, table, out_dir, "sync", notes)


def runtime_facts() -> dict:
    """What this machine offers the backends, checked now."""
    import torch.distributed as dist

    return {"gpus": cuda_device_count(), "gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available()}


def backend_skip_reason(backend: str, base: TrainConfig, facts: dict) -> str | None:
    """Why `backend` cannot run `base` here (None when it can)."""
    if backend == "gloo" and not facts["gloo"]:
        return "torch.distributed.is_gloo_available() is False"
    if backend == "nccl":
        if facts["gpus"] < base.ranks:
            return f"needs CUDA with >= {base.ranks} GPUs (found {facts['gpus']})"
        if not facts["nccl"]:
            return "torch.distributed.is_nccl_available() is False"
        if base.device == "cpu":
            return "needs device cuda (the base config sets device cpu)"
    if backend == "mpi" and not facts["mpi"]:
        return "torch.distributed.is_mpi_available() is False"
    return None


def backends(base: TrainConfig, store: Store, study: str, out_dir: Path, *, names: list[str] | None = None,
             facts: dict | None = None, say: Callable[[str], None] = print) -> ExperimentResult:
    """Run `base` on each backend that can run here, with a noop cell per backend; list the others as skipped."""
    chosen = check_names(names, BACKENDS, "backends")
    facts = runtime_facts() if facts is None else facts
    grid = f"{study}/{GRID}"
    cells, skipped = [], {}
    for backend in chosen:
        reason = backend_skip_reason(backend, base, facts)
        if reason is None:
            try:
                cfg = with_fields(base, backend=backend)
                noop = with_fields(cfg, **{**strategy_fields("noop", 1), "accumulate": cfg.accumulate})
            except ConfigError as err:  # the config cannot run on this backend here: say why, do not drop it
                reason = str(err)
        if reason is not None:
            say(f"[{grid}] {backend}: skipped: {reason}")
            skipped[backend] = reason
            continue
        cells += [Cell(backend, cfg), Cell(f"{backend} noop", noop)]
    runs = _stored(store, cells, run_grid(grid, cells, store, say=say))
    entries = runs[0::2] + [{"backend": b, "status": "skipped", "reason": why} for b, why in skipped.items()]
    table = backends_table(entries, runs[1::2])  # cells come in pairs: the backend, then its noop
    notes = {"exposed": EXPOSED_NOTE, "loopback": LOOPBACK_NOTE, "skipped": skipped}
    return _finish("compare_backends", table, out_dir, "backend", notes)


def _stored(store: Store, cells: list[Cell], results: list[CellResult]) -> list[dict]:
    """The stored run of each cell, in cell order: {run_id, config, summary, status, reason}. A cell without a run
    (a grid that only replays what is stored) keeps its config, with the grid's status and reason."""
    out = []
    for cell, res in zip(cells, results):
        if res.run_id is None:
            out.append({"run_id": None, "config": cell.config.resolved().to_dict(), "summary": None,
                        "status": res.status, "reason": res.reason})
            continue
        row = store.get(res.run_id)
        out.append({"run_id": row["run_id"], "config": row["config"], "summary": row["summary"],
                    "status": row["status"], "reason": row.get("reason") or res.reason})
    return out


def _finish(name: str, table: pd.DataFrame, out_dir: Path, label: str, notes: dict) -> ExperimentResult:
    paths = write_table(table, out_dir, name)
    files = [paths["csv"], paths["json"]]
    if (table["status"] == "completed").any():  # rows that did not run keep their slot, marked with their status
        files.append(figures.comm_breakdown_bars(table, out_dir / f"{name}.png", label=label))
        files.append(figures.comm_bytes_bars(table, out_dir / f"{name}_bytes.png", label=label))
    return ExperimentResult(name, {name: table}, files, notes)
