"""The one cell engine: every experiment's runs go through `Cells.run`.

A cell is one measurement: a run config (`kind` "train", "bench", ... says which run execution takes it) and how
many repeats it needs. Its identity is its resolved config (what actually runs), so identical configs in two
experiments of one study are one cell, measured once. The engine

- reuses a finished cell (a completed run, or a failure the cell counts as an outcome, e.g. out of memory in a
  max-batch trial) stored anywhere in the study;
- holds the cell's lock while it runs, so two processes on one store never run a cell twice;
- replays: while a report is rebuilt (`replay_only`), it never runs anything and reports missing cells;
- runs repeats in interleaved rounds when asked (A B C, A B C) so slow drift of a shared machine hits every
  cell alike;
- measures cells again when asked (`again`: a figure looked implausible): as many new launches as the cell has
  repeats, stored under GROUP/again; from then on the cell's figures come from the new launches and its result
  names the earlier ones (`CellResult.earlier`), which stay in the store;
- hands each run to one replaceable step, the executor of the cell's kind (`cell_kind`, one registration per
  kind: its executor and the reader of its stored configs).

    cells = Cells(store, "default", progress=progress)
    results = cells.run([Cell("batch 64", cfg64), Cell("batch 128", cfg128)], group="batch_sweep")
    runs = cells.runs(results)            # parsed stored runs, in cell order: what analyses receive
"""
from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from scalelab.analysis.repeats import pool
from scalelab.analysis.summary import timed_step_ms
from scalelab.config import TrainConfig
from scalelab.errors import ScalelabError
from scalelab.lab.progress import PlainProgress, Progress
from scalelab.measure.commbench import CommBenchConfig
from scalelab.run import warm
from scalelab.run.execute import RunFailed, execute, execute_run, run_commbench
from scalelab.run.script import SCRIPT, ScriptConfig
from scalelab.run.slurmnodes import refuse_unlaunchable
from scalelab.store import RunDir, Store

# Set while a report is rebuilt from stored runs: the engine then runs nothing and reports missing cells.
_REPLAY: contextvars.ContextVar[bool] = contextvars.ContextVar("scalelab_replay", default=False)

_RUN_LINE = re.compile(r"run ([A-Za-z0-9][A-Za-z0-9._-]*): ")

# The sub-group of launches that measure a cell again (stored under study STUDY/GROUP/again).
AGAIN = "again"

# How a run is operated, not what it measures: left out of a cell's identity.
OPERATIONAL = ("run_id", "hang_timeout_s", "checkpoint_every")


@contextmanager
def replay_only() -> Iterator[None]:
    """Within this block, experiments only read what is stored; they never start a run."""
    token = _REPLAY.set(True)
    try:
        yield
    finally:
        _REPLAY.reset(token)


def replaying() -> bool:
    return _REPLAY.get()


_HELD: contextvars.ContextVar[dict] = contextvars.ContextVar("scalelab_held", default={})


@contextmanager
def held(launches: dict[str, int]) -> Iterator[None]:
    """Within this block, a cell whose label is in `launches` gets at most that many repeats, whatever its
    experiment asks: a setting already worse beyond noise stops being launched while the others grow (racing,
    lab.study.top_up). The study saves what it held, so that a report re-derived from the store asks each cell
    for the launches it has."""
    token = _HELD.set(dict(launches))
    try:
        yield
    finally:
        _HELD.reset(token)


def config_identity(config: Any) -> dict:
    """The fields of a config that say what a run measures (`auto` resolved to what runs here)."""
    data = config.resolved().to_dict() if hasattr(config, "resolved") else config.to_dict()
    for name in OPERATIONAL:
        data.pop(name, None)
    return data


def cell_key(config: Any, kind: str = "train") -> str:
    """A stable identity for the run a config describes (the run id itself is not part of it)."""
    data = config_identity(config)
    text = json.dumps(data, sort_keys=True) if kind == "train" else json.dumps([kind, data], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cell:
    label: str  # shown in progress, e.g. "batch 64"
    config: Any  # a TrainConfig; the config type of `kind` otherwise (CommBenchConfig for "bench")
    kind: str = "train"
    repeats: int = 1
    isolate: bool = False  # own processes even for one rank (a max-batch trial's OOM must not touch the caller)
    # A failure reason that is an outcome, not an error (a max-batch trial that does not fit): such a failed run
    # finishes the cell and is reused like a completed one.
    outcome_failure: Callable[[str], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ScalelabError(f"cell {self.label}: repeats {self.repeats!r}; allowed: an integer >= 1")

    @property
    def key(self) -> str:
        return cell_key(self.config, self.kind)

    def accepts(self, status: str, reason: str | None) -> bool:
        """Whether a stored run with this status finishes the cell."""
        return status == "completed" or (status == "failed" and self.outcome_failure is not None
                                         and self.outcome_failure(reason or ""))


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    run_ids: tuple[str, ...]  # one per finished repeat, oldest first
    status: str  # completed | failed (an outcome failure, or the last attempt's error) | missing (replay only)
    reason: str | None = None
    reused: bool = False  # every repeat was already stored
    earlier: tuple[str, ...] = ()  # launches superseded by measuring the cell again (oldest first)

    @property
    def label(self) -> str:
        return self.cell.label

    @property
    def run_id(self) -> str | None:
        return self.run_ids[-1] if self.run_ids else None


@dataclass(frozen=True)
class Outcome:
    """What an executor reports: the run it recorded, and why it failed (None: completed)."""
    run_id: str
    failure: str | None = None


Executor = Callable[[Cell, Store, str, Callable[[str], None]], Outcome]


@dataclass(frozen=True)
class CellKind:
    """How cells of one kind run (`execute`: the one replaceable launching step) and how a stored run of that kind
    is read back (`read_config`: its stored config dict to the config object), so that it is recognised as the cell
    it ran. Every kind is registered once, with `cell_kind`."""
    name: str
    execute: Executor
    read_config: Callable[[dict], Any]


_KINDS: dict[str, CellKind] = {}


def cell_kind(name: str, read_config: Callable[[dict], Any]) -> Callable[[Executor], Executor]:
    """Register the executor it decorates for cells of kind `name`, with the reader of their stored configs."""
    def register(fn: Executor) -> Executor:
        _KINDS[name] = CellKind(name, fn, read_config)
        return fn
    return register


def _train_config(config: dict):
    return TrainConfig.from_dict(config)


def _bench_config(config: dict):
    return CommBenchConfig.from_dict(config)


def _script_config(config: dict):
    return ScriptConfig.from_dict(config)


@cell_kind("train", _train_config)
def _execute_train(cell: Cell, store: Store, study: str, say: Callable[[str], None]) -> Outcome:
    try:
        return Outcome(execute(cell.config, store, study=study, say=say, isolate=cell.isolate).run_id)
    except RunFailed as err:
        return Outcome(err.run_id, err.reason)


@cell_kind("bench", _bench_config)
def _execute_bench(cell: Cell, store: Store, study: str, say: Callable[[str], None]) -> Outcome:
    try:
        out = run_commbench(cell.config, store, study=study, say=say)
    except RunFailed as err:
        return Outcome(err.run_id, err.reason)
    return Outcome(out.run_id, out.reason)


@cell_kind("script", _script_config)
def _execute_script(cell: Cell, store: Store, study: str, say: Callable[[str], None]) -> Outcome:
    try:
        done = execute_run(SCRIPT, cell.config, store, study=study, say=say)
    except RunFailed as err:
        return Outcome(err.run_id, err.reason)
    return Outcome(done.run_id, done.reason)


class Cells:
    """The cells of one study on one store, run, reused or replayed by one rule."""

    def __init__(self, store: Store, study: str, *, progress: Progress | None = None):
        self.store, self.study = store, study
        self.progress = progress or PlainProgress()
        self._index: dict[str, list[dict]] | None = None  # cell key -> stored finished-or-failed runs
        self._known: set[str] = set()

    # ------------------------------------------------------------ the store's view of the study

    def _in_study(self, study) -> bool:
        return isinstance(study, str) and (study == self.study or study.startswith(self.study + "/"))

    def _refresh(self) -> dict[str, list[dict]]:
        """Index every stored run of the study not indexed yet by cell key (runs of other processes too)."""
        if self._index is None:
            self._index = {}
        runs = self.store.list_runs()
        for row in runs.itertuples(index=False):
            if row.run_id in self._known or not self._in_study(row.study) or row.status == "running":
                continue
            self._known.add(row.run_id)
            stored = self.store.get(row.run_id)
            key = _stored_key(stored)
            if key is not None:
                self._index.setdefault(key, []).append(stored)
        return self._index

    def _finished(self, cell: Cell) -> list[dict]:
        rows = sorted(self._refresh().get(cell.key, []), key=lambda r: (r["created"], r["run_id"]))
        return [r for r in rows if cell.accepts(r["status"], r.get("reason"))]

    # ------------------------------------------------------------ running

    def run(self, cells: Iterable[Cell], *, group: str, interleave: bool = False,
            again: Iterable[Cell] = ()) -> list[CellResult]:
        """Every cell's repeats, run where missing; one result per cell, in order. `group` names the experiment
        (runs are stored under study STUDY/GROUP); `interleave` runs repeats in rounds across the cells; cells in
        `again` are measured anew (module docstring), also when they are complete."""
        caps = _HELD.get()
        cells = [dataclasses.replace(c, repeats=min(c.repeats, caps[c.label])) if c.label in caps else c
                 for c in cells]
        fresh = {c.key for c in again}
        if fresh and not replaying():
            group = f"{group}/{AGAIN}"
        study = f"{self.study}/{group}"
        # launches each cell must have at the end: its repeats, and as many again for a cell measured anew
        have = {c.key: len(self._finished(c)) for c in cells}
        goal = {c.key: have[c.key] + c.repeats if c.key in fresh and not replaying() else c.repeats for c in cells}
        needed = {c.key: goal[c.key] - have[c.key] for c in cells}
        # --launcher slurm outside an allocation, or a cell of more nodes than it has: refused before any runs
        refuse_unlaunchable(c.config for c in cells if needed[c.key] > 0)
        self.progress.group(group, sum(max(0, n) for n in needed.values()))
        failures: dict[str, str] = {}
        rounds = max((c.repeats for c in cells), default=0) if interleave else 1
        with warm.ranks():  # multi-rank cells in warm ranks (run/warm.py); a study's block spans all its cells
            self._run_rounds(cells, rounds, goal, failures, study, interleave)
        return [self._result(c, needed[c.key], failures.get(c.key)) for c in cells]

    def _run_rounds(self, cells: list[Cell], rounds: int, goal: dict[str, int], failures: dict[str, str],
                    study: str, interleave: bool) -> None:
        for r in range(rounds):
            for cell in cells:
                start = goal[cell.key] - cell.repeats
                target = start + r + 1 if interleave else goal[cell.key]
                while cell.key not in failures and (done := len(self._finished(cell))) < min(target, goal[cell.key]):
                    if replaying():
                        break
                    failure = self._run_one(cell, study, goal[cell.key])
                    if failure is not None:
                        failures[cell.key] = failure
                    elif len(self._finished(cell)) <= done:  # never loop on a run the index cannot see
                        raise ScalelabError(f"cell {cell.label}: its run finished but is not found in study "
                                            f"{self.study} of {self.store.root}")

    def _run_one(self, cell: Cell, study: str, goal: int) -> str | None:
        """Run one repeat of `cell` under its lock (`goal`: launches it must have); the failure reason, or None
        when it finished."""
        with self._claim(cell):
            # The same study may run in another process at once: what it finished meanwhile is not run again.
            if len(self._finished(cell)) >= goal:
                self.progress.cell_done(cell.label, "done meanwhile by another process")
                return None
            self.progress.cell_started(cell.label)
            began = time.monotonic()
            outcome = _KINDS[cell.kind].execute(cell, self.store, study, self._run_say)
        self._known.discard(outcome.run_id)  # index it now
        self._refresh()
        accepted = outcome.failure is None or cell.accepts("failed", outcome.failure)
        self.progress.cell_done(cell.label, "done" if outcome.failure is None else
                                f"failed{' (an outcome, kept)' if accepted else ''}: {outcome.failure}",
                                seconds=time.monotonic() - began)
        return None if accepted else outcome.failure

    def _run_say(self, line: str) -> None:
        """A run's own lines; its first ("run ID: ...") tells the progress where the run's files are."""
        match = _RUN_LINE.match(line)
        if match and (self.store.root / "runs" / match.group(1)).is_dir():
            self.progress.run_started(RunDir(self.store.run_dir(match.group(1))))
        self.progress.run_line(line)

    def _result(self, cell: Cell, missing_before: int, failure: str | None) -> CellResult:
        finished = self._finished(cell)
        rows = finished[-cell.repeats:]
        ids = tuple(r["run_id"] for r in rows)
        anew = any(str(r.get("study", "")).endswith(f"/{AGAIN}") for r in rows)
        earlier = tuple(r["run_id"] for r in finished[:-cell.repeats]) if anew else ()
        if failure is not None:  # the failed attempt stays in the store with its reason and error.txt
            failed = self._latest(cell)
            return CellResult(cell, (failed["run_id"],) if failed else ids, "failed", failure)
        if len(rows) < cell.repeats:
            if not replaying():
                raise ScalelabError(f"cell {cell.label}: {len(rows)} of {cell.repeats} repeats stored")
            if not rows:
                self.progress.cell_done(cell.label, "missing: not in the store")
                return CellResult(cell, ids, "missing", "not in the store")
            # a replay shows what the store holds (e.g. a store of a scalelab that launched each cell once); the
            # tables' `launches` column says how many that is
            self.progress.cell_done(cell.label, f"{len(rows)} of {cell.repeats} launches in the store", reused=True)
            return CellResult(cell, ids, rows[-1]["status"], rows[-1].get("reason"), reused=True)
        if missing_before <= 0:
            self.progress.cell_done(cell.label, f"already done ({ids[-1]}), skipped", reused=True)
        status = rows[-1]["status"]
        return CellResult(cell, ids, status, rows[-1].get("reason"), reused=missing_before <= 0, earlier=earlier)

    def _latest(self, cell: Cell) -> dict | None:
        rows = self._refresh().get(cell.key, [])
        return max(rows, key=lambda r: (r["created"], r["run_id"])) if rows else None

    @contextmanager
    def _claim(self, cell: Cell) -> Iterator[None]:
        """Hold this cell for the block, across processes sharing the store: an exclusive flock on a file under
        STORE/locks. A second process waits for the first, then finds the cell finished. The kernel drops the
        lock when its holder exits, however it ends (Ctrl-C, kill -9), so a lock is never left stale."""
        import fcntl

        folder = self.store.root / "locks"
        folder.mkdir(exist_ok=True)
        name = hashlib.sha1(f"{self.study}\0{cell.key}".encode()).hexdigest()[:20]
        with open(folder / f"cell-{name}.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.progress.cell_waiting(cell.label)
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ------------------------------------------------------------ reading back

    def runs(self, results: Sequence[CellResult], *, all_repeats: bool = False) -> list[dict]:
        """The stored runs of cells that have one, in cell order, as {run_id, config, summary, status, reason,
        label, files}: what analyses get. `files` is the run's RunDir: analyses read a run's files through it."""
        out = []
        for res in results:
            for run_id in (res.run_ids if all_repeats else res.run_ids[-1:]):
                row = self.store.get(run_id)
                out.append({"run_id": row["run_id"], "config": row["config"], "summary": row["summary"] or {},
                            "status": row["status"], "reason": row.get("reason"), "label": res.label,
                            "files": RunDir(row["dir"])})
        return out

    def rows(self, results: Sequence[CellResult]) -> list[dict]:
        """One entry per cell, in cell order, also for cells without a run (their config, status and reason). A
        cell measured in several launches is one entry: its summary pools them (scalelab.analysis.repeats), its
        run_id is the last launch's and `run_ids` lists them all."""
        out = []
        for res in results:
            if res.run_id is None:
                config = config_identity(res.cell.config)
                out.append({"run_id": None, "config": config, "summary": None, "status": res.status,
                            "reason": res.reason, "label": res.label})
                continue
            launches = self.runs([res], all_repeats=True)
            row = launches[-1]
            if len(res.run_ids) > 1:
                row["summary"] = self.pooled(launches) or row["summary"]
            row["run_ids"] = [r["run_id"] for r in launches]
            row["reason"] = row["reason"] or res.reason
            out.append(row)
        return out


    def pooled(self, launches: Sequence[dict]) -> dict | None:
        """One summary of a cell's launches (stored runs as `runs` gives them): their completed ones pooled
        (scalelab.analysis.repeats); None when none completed."""
        done = [r for r in launches if r["status"] == "completed" and r.get("summary")]
        if not done:
            return None
        return pool([r["summary"] for r in done], [timed_step_ms(r["files"].read_steps()) for r in done])


def _stored_key(row: dict) -> str | None:
    """The cell key of a stored run; None for a kind or a config this scalelab cannot read (then it is never
    reused)."""
    kind = _KINDS.get(row["kind"])
    if kind is None:
        return None
    try:
        return cell_key(kind.read_config(row["config"]), row["kind"])
    except (KeyError, ValueError, TypeError, ScalelabError):
        return None


def with_fields(cfg, **changes):
    """A copy of a config with some fields changed (validated again)."""
    return dataclasses.replace(cfg, **changes)
