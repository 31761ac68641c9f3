"""Run a grid of training configs as one study: resumable, with progress, every cell stored in the catalog.

A cell is identified by its resolved config (what actually runs), so re-running a study skips every cell that
already completed and runs only the missing or failed ones. A failed cell is recorded and the grid goes on.
"""
from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from scalelab.config import TrainConfig
from scalelab.store import Store, write_json_atomic


# Set while a report is rebuilt from stored runs: grids then run nothing and report missing cells instead.
REPLAY: contextvars.ContextVar[bool] = contextvars.ContextVar("scalelab_replay", default=False)


@contextmanager
def replay_only() -> Iterator[None]:
    """Within this block, experiments only read what is stored; they never start a run."""
    token = REPLAY.set(True)
    try:
        yield
    finally:
        REPLAY.reset(token)


@dataclass(frozen=True)
class Cell:
    label: str  # shown in progress lines, e.g. "batch 64"
    config: TrainConfig


@dataclass(frozen=True)
class CellResult:
    label: str
    run_id: str | None
    status: str  # completed | failed | skipped (already completed earlier) | missing (replay only)
    reason: str | None = None


OPERATIONAL = ("run_id", "hang_timeout_s", "checkpoint_every")


def cell_key(cfg: TrainConfig) -> str:
    """A stable identity for the run a config describes (the run id itself is not part of it)."""
    data = cfg.resolved().to_dict()
    for name in OPERATIONAL:  # how a run is operated, not what it measures
        data.pop(name, None)
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def completed_cells(store: Store, study: str, *, known: Iterable[str] = ()) -> dict[str, str]:
    """cell key -> run id of every completed run of the study (runs in `known` are left out: already read)."""
    runs = store.list_runs(study=study, status="completed")
    known = set(known)
    out: dict[str, str] = {}
    for run_id in runs["run_id"]:
        if run_id in known:
            continue
        config = store.get(run_id)["config"]
        try:
            out[cell_key(TrainConfig.from_dict(config))] = run_id
        except (ValueError, TypeError):  # a config from an older scalelab: treat the cell as missing
            continue
    return out


def run_grid(study: str, cells: Iterable[Cell], store: Store, *, say: Callable[[str], None] = print,
             execute: Callable | None = None) -> list[CellResult]:
    """Run every cell not yet completed in this study; return one result per cell, in order."""
    from scalelab.run.execute import RunFailed
    from scalelab.run.execute import execute as default_execute

    execute = execute or default_execute
    cells = list(cells)
    done = completed_cells(store, study)
    results: list[CellResult] = []
    for i, cell in enumerate(cells, 1):
        key = cell_key(cell.config)
        prefix = f"[{study} {i}/{len(cells)}] {cell.label}"
        if key in done:
            say(f"{prefix}: already done ({done[key]}), skipped")
            results.append(CellResult(cell.label, done[key], "skipped"))
            continue
        if REPLAY.get():
            results.append(CellResult(cell.label, None, "missing", "not in the store"))
            continue
        with cell_claim(store, study, key, on_wait=lambda: say(f"{prefix}: another process is running this "
                                                                   "cell; waiting for it")):
            # The same study may run in another process at once (same store): whatever it completed meanwhile
            # is not run again.
            done.update(completed_cells(store, study, known=done.values()))
            if key in done:
                say(f"{prefix}: done meanwhile by another process ({done[key]}), skipped")
                results.append(CellResult(cell.label, done[key], "skipped"))
                continue
            say(f"{prefix}: running")
            try:
                outcome = execute(cell.config, store, study=study, say=lambda s: None)
            except RunFailed as err:
                say(f"{prefix}: failed: {err.reason}")
                results.append(CellResult(cell.label, err.run_id, "failed", err.reason))
                continue
        done[key] = outcome.run_id
        results.append(CellResult(cell.label, outcome.run_id, "completed"))
    return results


@contextmanager
def cell_claim(store: Store, study: str, key: str, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold this study cell for the block, across processes sharing the store: an exclusive flock on a file
    under STORE/locks. A second process waits for the first, then finds the cell completed. The kernel drops
    the lock when its holder exits, however it ends (Ctrl-C, kill -9), so a lock is never left stale."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no claim, concurrent identical studies may repeat cells
        yield
        return
    folder = store.root / "locks"
    folder.mkdir(exist_ok=True)
    name = hashlib.sha1(f"{study}\0{key}".encode()).hexdigest()[:20]
    with open(folder / f"cell-{name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def study_runs(store: Store, study: str) -> list[dict]:
    """Every completed run of a study as {run_id, config, summary}: the only input analyses get."""
    runs = store.list_runs(study=study, status="completed")
    return [{k: row[k] for k in ("run_id", "config", "summary")} for row in map(store.get, runs["run_id"])]


def write_table(frame: pd.DataFrame, out_dir: Path, name: str) -> dict[str, Path]:
    """A table as CSV and JSON (records), both written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
    tmp = csv_path.with_suffix(".csv.tmp")
    frame.to_csv(tmp, index=False)
    tmp.replace(csv_path)
    write_json_atomic(json_path, json.loads(frame.to_json(orient="records")))
    return {"csv": csv_path, "json": json_path}


def with_fields(cfg: TrainConfig, **changes) -> TrainConfig:
    """A copy of a config with some fields changed (validated again)."""
    return dataclasses.replace(cfg, **changes)
