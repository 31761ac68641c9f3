"""The sqlite catalog of runs: ``<root>/catalog.sqlite`` with one row per run directory ``<root>/runs/<run_id>``
(whose files `rundir.RunDir` names). Files are replaced atomically so a crash never
leaves a half-written JSON file; the catalog uses WAL and a busy timeout so several processes
can create and finish runs at the same time.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
import secrets
import shutil
import socket
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from scalelab.errors import StoreError
from scalelab.store.files import dumps
from scalelab.store.liveness import own_create_time, pid_alive
from scalelab.store.rundir import RunDir

if TYPE_CHECKING:  # pandas only where tables are built: every rank imports the store, and pandas costs it ~0.3 s
    import pandas as pd

STATUSES = ("running", "completed", "failed", "interrupted")
FINAL_STATUSES = ("completed", "failed", "interrupted")
# Columns copied out of config.json so runs can be listed and filtered without parsing JSON.
# wrapper: single / dp / ddp (called strategy in catalogs of scalelab 0.1); sync: the gradient-sync method.
DENORM_COLUMNS = ("model", "dataset", "ranks", "global_batch", "wrapper", "sync", "precision")
LIST_COLUMNS = ("run_id", "created", "finished", "kind", "study", "status", "reason") + DENORM_COLUMNS
COMPARE_ID_COLUMNS = ("run_id",) + DENORM_COLUMNS + ("status",)
# A row as `get` returns it (a 0.1 catalog keeps its unused `strategy` column; it is not read).
ROW_COLUMNS = LIST_COLUMNS + ("summary_json", "config_json")
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUSY_TIMEOUT_S = 10.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    finished TEXT,
    kind TEXT NOT NULL,
    study TEXT,
    status TEXT NOT NULL,
    reason TEXT,
    model TEXT,
    dataset TEXT,
    ranks INTEGER,
    global_batch INTEGER,
    wrapper TEXT,
    sync TEXT,
    precision TEXT,
    summary_json TEXT,
    config_json TEXT
);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created);
CREATE INDEX IF NOT EXISTS runs_study ON runs(study);
"""


def new_run_id(prefix: str = "run") -> str:
    """``<prefix>-YYYYmmdd-HHMMSS-<6 hex>`` in UTC: sorts by time, random suffix makes it unique across processes."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    rid = f"{stamp}-{secrets.token_hex(3)}"
    return f"{prefix}-{rid}" if prefix else rid


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _flatten(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def _denormalise(config: dict) -> dict:
    """The catalog's columns from a flat config as scalelab writes them (TrainConfig, CommBenchConfig)."""
    out = {}
    for col in DENORM_COLUMNS:
        v = config.get(col)
        if col == "ranks" and isinstance(v, int) and isinstance(config.get("nnodes"), int):
            v *= config["nnodes"]  # TrainConfig's ranks are per node
        if col == "wrapper" and v is None:
            v = config.get("strategy")  # the wrapper's name in configs of scalelab 0.1
        if col == "sync" and (config.get("wrapper", config.get("strategy")) != "ddp" or v == "auto"):
            v = None  # no process group, nothing synchronised
        if col == "sync" and config.get("engine", "ddp") != "ddp":
            v = config["engine"]  # an engine's own sync (horovod: hvd.DistributedOptimizer)
        if col in ("ranks", "global_batch"):
            v = int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        elif v is not None:
            v = str(v)
        out[col] = v
    return out


def _migrate(conn: sqlite3.Connection) -> None:
    """A catalog written by scalelab 0.1 has a `strategy` column and no `wrapper` / `sync`: add them, filled from
    each run's stored config (the catalog is an index of the run directories; nothing else changes)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    missing = [c for c in ("wrapper", "sync") if c not in have]
    if not missing:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}  # another process may have done it
        for col in [c for c in missing if c not in have]:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {col} TEXT")
        for run_id, text in conn.execute("SELECT run_id, config_json FROM runs").fetchall():
            try:
                den = _denormalise(json.loads(text or "{}"))
            except (json.JSONDecodeError, TypeError, AttributeError):
                continue
            conn.execute("UPDATE runs SET wrapper=?, sync=? WHERE run_id=?", (den["wrapper"], den["sync"], run_id))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the catalog in WAL mode (persistent in the file: later opens find it set and change nothing).

    Switching takes a lock SQLite does not wait for (the busy handler is not called), so when several processes
    open a new store at the same moment (two studies started together) all but one get "database is locked":
    retry until one of them has switched it, within the usual busy timeout."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# ---------------------------------------------------------------- store

class Store:
    """A directory of runs plus ``catalog.sqlite``. Safe to use from several processes at once."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.catalog_path = self.root / "catalog.sqlite"
        try:
            (self.root / "runs").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.root}: cannot create store directory ({e.strerror or e})") from e
        with self._connect() as conn:
            _use_wal(conn)
            conn.executescript(_SCHEMA)
            _migrate(conn)

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # A fresh connection per operation: nothing survives a fork, and locks are never held for long.
        try:
            conn = sqlite3.connect(self.catalog_path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise StoreError(f"{self.catalog_path}: cannot open catalog ({e})") from e
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
            yield conn
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.catalog_path}: catalog unusable ({e}); move it aside to start a new one"
                             if "not a database" in str(e) or "malformed" in str(e)
                             else f"{self.catalog_path}: catalog error ({e})") from e
        finally:
            conn.close()

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def _resolve(self, run_id: str) -> str:
        """Exact run_id or a unique prefix of one."""
        with self._connect() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone():
                return run_id
            rows = conn.execute("SELECT run_id FROM runs WHERE substr(run_id, 1, ?)=? ORDER BY run_id",
                                (len(run_id), run_id)).fetchall()
        if not rows:
            raise StoreError(f"run: {run_id!r} not found (see `scalelab runs list`)")
        if len(rows) > 1:
            shown = ", ".join(r[0] for r in rows[:3]) + (", ..." if len(rows) > 3 else "")
            raise StoreError(f"run: {run_id!r} is ambiguous: matches {len(rows)} runs ({shown})")
        return rows[0][0]

    def create_run(self, config: dict, provenance: dict, *, kind: str = "train",
                   study: str | None = None, run_id: str | None = None, adopt: bool = False) -> str:
        """Create the run directory and its catalog row (status "running"); returns the run_id.

        `adopt` (with `run_id`): when that run exists and is running, make it this process's (its config,
        provenance and status replace the creator's). Node 0 of a multi-node run on a shared filesystem owns the
        run, but another node may have created the directory first: node 0 adopts it.
        """
        if run_id is not None and not _RUN_ID_RE.fullmatch(run_id):
            raise StoreError(f"run_id: {run_id!r} is not allowed; use letters, digits, '.', '_', '-'")
        adopted = False
        for _ in range(5):
            rid = run_id or new_run_id()
            try:
                # mkdir is the atomic claim on the id across processes.
                self.run_dir(rid).mkdir()
                break
            except FileExistsError:
                if run_id is not None:
                    if adopt and self._running_soon(run_id):
                        adopted = True
                        break
                    raise StoreError(f"run: {run_id!r} already exists in {self.root}") from None
            except OSError as e:
                raise StoreError(f"{self.run_dir(rid)}: cannot create run directory ({e.strerror or e})") from e
        else:
            raise StoreError(f"{self.root}: could not find an unused run id")
        d, created = self.run_dir(rid), _now_iso()
        rd = RunDir(d)
        try:
            rd.write_config(config)
            rd.write_provenance(provenance)
            rd.write_status({
                "run_id": rid, "status": "running", "reason": None, "kind": kind, "created": created,
                "pid": os.getpid(), "pid_create_time": own_create_time(), "host": socket.gethostname()})
            den = _denormalise(config)
            with self._connect() as conn:
                if adopted:
                    conn.execute("UPDATE runs SET created=?, kind=?, study=?, config_json=?, "
                                 + ", ".join(f"{c}=?" for c in DENORM_COLUMNS) + " WHERE run_id=?",
                                 (created, kind, study, dumps(config), *(den[c] for c in DENORM_COLUMNS), rid))
                    return rid
                try:
                    conn.execute(
                        "INSERT INTO runs (run_id, created, kind, study, status, config_json, "
                        + ", ".join(DENORM_COLUMNS) + ") VALUES (?, ?, ?, ?, 'running', ?"
                        + ", ?" * len(DENORM_COLUMNS) + ")",
                        (rid, created, kind, study, dumps(config), *(den[c] for c in DENORM_COLUMNS)))
                except sqlite3.IntegrityError:
                    raise StoreError(f"run: {rid!r} already exists in the catalog {self.catalog_path}") from None
        except BaseException:
            # The directory is ours (we just made it): do not leave a run without a catalog row.
            if not adopted:
                shutil.rmtree(d, ignore_errors=True)
            raise
        return rid

    def _running_soon(self, run_id: str, timeout_s: float = 10.0) -> bool:
        """Whether `run_id` is in the catalog as running within `timeout_s` (its creator may be between making
        the directory and writing the row: milliseconds)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._connect() as conn:
                row = conn.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
            if row is not None or time.monotonic() > deadline:
                return row is not None and row[0] == "running"
            time.sleep(0.1)

    def finish_run(self, run_id: str, status: str, *, reason: str | None = None,
                   summary: dict | None = None) -> None:
        """Write summary.json (if given) and status.json, then update the catalog row."""
        if status not in FINAL_STATUSES:
            raise StoreError(f"status: {status!r} is not allowed; one of {', '.join(FINAL_STATUSES)}")
        rid = self._resolve(run_id)
        finished = _now_iso()
        # summary first: a "completed" status.json then always has its summary next to it.
        if summary is not None:
            RunDir(self.run_dir(rid)).write_summary(summary)
        self._write_status(rid, status, reason, finished)
        sets, args = ["status=?", "reason=?", "finished=?"], [status, reason, finished]
        if summary is not None:
            sets.append("summary_json=?")
            args.append(dumps(summary))
        with self._connect() as conn:
            conn.execute(f"UPDATE runs SET {', '.join(sets)} WHERE run_id=?", (*args, rid))

    def reopen_run(self, run_id: str) -> None:
        """A failed or interrupted run goes back to "running" in this process (it is being resumed); the reason it
        stopped is kept in status.json's history."""
        rid = self._resolve(run_id)
        rd = RunDir(self.run_dir(rid))
        st = rd.read_status()
        history = [*st.get("history", []), {k: st.get(k) for k in ("status", "reason", "finished")}]
        st.update(status="running", reason=None, finished=None, history=history, pid=os.getpid(),
                  pid_create_time=own_create_time(), host=socket.gethostname())
        rd.write_status(st)
        with self._connect() as conn:
            conn.execute("UPDATE runs SET status='running', reason=NULL, finished=NULL WHERE run_id=?", (rid,))

    def _write_status(self, rid: str, status: str, reason: str | None, finished: str) -> None:
        rd = RunDir(self.run_dir(rid))
        try:
            st = rd.read_status()
        except StoreError:
            st = {"run_id": rid}  # keep going: the new status is what matters
        st.update(status=status, reason=reason, finished=finished)
        rd.write_status(st)

    def get(self, run_id: str) -> dict:
        """The catalog row as a dict, with ``config`` and ``summary`` parsed and ``dir`` added."""
        rid = self._resolve(run_id)
        with self._connect() as conn:
            row = dict(conn.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM runs WHERE run_id=?", (rid,)).fetchone())
        for key in ("config", "summary"):
            text = row.pop(f"{key}_json")
            try:
                row[key] = json.loads(text) if text is not None else None
            except json.JSONDecodeError:
                raise StoreError(f"{self.catalog_path}: corrupt {key}_json for run {rid!r}") from None
        row["dir"] = str(self.run_dir(rid))
        return row

    def list_runs(self, *, status: str | None = None, kind: str | None = None, study: str | None = None,
                  where: dict | None = None, limit: int | None = None) -> pd.DataFrame:
        """Runs newest first, as a DataFrame with LIST_COLUMNS; ``where`` filters denormalised columns by equality."""
        bad = [c for c in (where or {}) if c not in DENORM_COLUMNS]
        if bad:
            raise StoreError(f"where: {bad[0]!r} is not allowed; one of {', '.join(DENORM_COLUMNS)}")
        filters = {"status": status, "kind": kind, "study": study}
        conds = [f"{c}=?" for c, v in filters.items() if v is not None]
        args: list = [v for v in filters.values() if v is not None]
        for col, val in (where or {}).items():
            conds.append(f"{col} IS NULL" if val is None else f"{col}=?")
            args += [] if val is None else [val]
        sql = f"SELECT {', '.join(LIST_COLUMNS)} FROM runs"
        if conds:
            sql += " WHERE " + " AND ".join(conds)
        sql += " ORDER BY created DESC, run_id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._connect() as conn:
            rows = [tuple(r) for r in conn.execute(sql, args).fetchall()]
        import pandas as pd

        df = pd.DataFrame.from_records(rows, columns=list(LIST_COLUMNS))
        return df.astype({"ranks": "Int64", "global_batch": "Int64"})

    def compare(self, run_ids: list[str], metrics: list[str] | None = None) -> pd.DataFrame:
        """One row per run: identifying columns then flattened summary metrics ('/'-joined keys)."""
        records, seen = [], {}
        for r in run_ids:
            row = self.get(r)
            flat = _flatten(row["summary"] or {})
            for k in flat:
                seen.setdefault(k, None)
            records.append(({c: row[c] for c in COMPARE_ID_COLUMNS}, flat))
        if metrics is None:
            metrics = list(seen)
        else:
            missing = [m for m in metrics if m not in seen]
            if missing:
                avail = ", ".join(seen) or "none"
                raise StoreError(f"metric: {missing[0]!r} is in no run's summary; available: {avail}")
        # A metric named like an identifying column gets a prefix instead of overwriting it.
        names = {m: (f"summary/{m}" if m in COMPARE_ID_COLUMNS else m) for m in metrics}
        out = [{**ident, **{names[m]: flat.get(m) for m in metrics}} for ident, flat in records]
        import pandas as pd

        df = pd.DataFrame(out, columns=list(COMPARE_ID_COLUMNS) + list(names.values()))
        return df.astype({"ranks": "Int64", "global_batch": "Int64"})

    def mark_stale(self) -> int:
        """Mark "running" runs whose process is gone from this host as "interrupted".

        Also repairs rows whose status.json already holds a final status (a crash between the file
        and the catalog update). Returns the number of catalog rows changed.
        """
        host, changed = socket.gethostname(), 0
        with self._connect() as conn:
            running = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE status='running'")]
        for rid in running:
            rd = RunDir(self.run_dir(rid))
            try:
                st = rd.read_status()
            except StoreError:
                continue  # cannot tell who owns it; leave it for a human
            if st.get("status") in FINAL_STATUSES:
                summary = rd.read_summary()
                changed += self._set_if_running(rid, st["status"], st.get("reason"),
                                                st.get("finished") or _now_iso(), summary)
                continue
            pid = st.get("pid")
            if st.get("host") != host or not isinstance(pid, int) or pid_alive(pid, st.get("pid_create_time")):
                continue
            reason, finished = f"process {pid} no longer running", _now_iso()
            if self._set_if_running(rid, "interrupted", reason, finished, None):
                self._write_status(rid, "interrupted", reason, finished)
                changed += 1
        return changed

    def _set_if_running(self, rid: str, status: str, reason: str | None, finished: str,
                        summary: dict | None) -> int:
        # Conditional so a run finished by its owner meanwhile is never overwritten.
        with self._connect() as conn:
            cur = conn.execute(
                "UPDATE runs SET status=?, reason=?, finished=?, summary_json=COALESCE(?, summary_json) "
                "WHERE run_id=? AND status='running'",
                (status, reason, finished, dumps(summary) if summary is not None else None, rid))
            return cur.rowcount


DEFAULT_ROOT = "scalelab-runs"


def open_store(path: Path | str | None = None) -> "Store":
    """The store at `path`, else $SCALELAB_STORE, else ./scalelab-runs (the CLI's one rule for it)."""
    return Store(Path(path or os.environ.get("SCALELAB_STORE", DEFAULT_ROOT)))
