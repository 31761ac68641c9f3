"""Atomic writes (temp file + fsync + rename), appends to logs, and strict readers of JSON, JSON Lines and text.

A crash at any moment leaves either the old file or the new one, never half of one. A log that grows by appends
(`append_jsonl`: a training run's step records) keeps every line written before the crash, and at most one torn
last line, which has no newline and which `read_jsonl` skips. A reader that finds a file missing, corrupt or of
the wrong shape raises StoreError naming the file (and the line, for JSON Lines).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import tempfile
from pathlib import Path, PurePath
from typing import IO, Any, Iterable, Iterator

from scalelab.errors import StoreError


def _json_default(obj: Any) -> Any:
    """Serialise the non-JSON values that metrics code tends to produce (numpy, tensors, paths)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def dumps(obj: Any, indent: int | None = None) -> str:
    """JSON text of `obj`, numpy values, tensors, paths and dates included."""
    return json.dumps(obj, indent=indent, default=_json_default)


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows opening a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO]:
    """A file object whose contents replace `path` when the block ends: written to a temp file in the same folder,
    fsynced, renamed over `path` (and the rename made durable), so that readers see the old file or the new one,
    never half. The folder is made when missing. On an exception nothing replaces `path` and no temp file is left;
    an OSError becomes a StoreError naming the file. `mode`: "w" (text, UTF-8) or "wb". The one atomic write of
    scalelab: every other (`write_text_atomic`, the report's files, figures, checkpoints) goes through it."""
    path = Path(path)
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
        tmp_name = None
        _fsync_dir(path.parent)
    except OSError as e:
        raise StoreError(f"{path}: cannot write ({e.strerror or e})") from e
    finally:
        if tmp_name is not None:  # the rename did not happen: leave no stray temp file behind
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (`atomic_file`); StoreError naming the file when it cannot."""
    with atomic_file(path) as f:
        f.write(text)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (`atomic_file`)."""
    with atomic_file(path, "wb") as f:
        f.write(data)


def write_json_atomic(path: Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` via temp file + fsync + rename."""
    write_text_atomic(path, dumps(obj, indent=2) + "\n")


def write_jsonl_atomic(path: Path, records: Iterable[dict]) -> None:
    """Write one JSON object per line to ``path`` via temp file + fsync + rename."""
    write_text_atomic(path, "".join(dumps(r) + "\n" for r in records))


def append_jsonl(path: Path, records: Iterable[dict]) -> int:
    """Append one JSON object per line to ``path`` in one write, then fsync; returns the bytes written. The cost is
    that of the new records alone, however long the file already is."""
    text = "".join(dumps(r) + "\n" for r in records)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise StoreError(f"{path}: cannot append ({e.strerror or e})") from e
    return len(text.encode("utf-8"))


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StoreError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}: cannot read ({e})") from e


def read_json(path: Path) -> dict:
    """Read a JSON object; StoreError (one line, naming the file) if missing, corrupt or not an object."""
    try:
        obj = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise StoreError(f"{path}: corrupt JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    if not isinstance(obj, dict):
        raise StoreError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def read_jsonl(path: Path) -> list[dict]:
    """Read one JSON object per line; blank lines are allowed, and so is a torn last line with no newline (an append
    cut short by a crash), which is skipped; any other bad line is a StoreError naming file:line."""
    out = []
    text = _read_text(path)
    lines = text.splitlines()
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if no == len(lines) and not text.endswith("\n"):
                break  # the torn tail of an interrupted append
            raise StoreError(f"{path}:{no}: corrupt JSON line ({e.msg})") from None
        if not isinstance(rec, dict):
            raise StoreError(f"{path}:{no}: expected a JSON object, found {type(rec).__name__}")
        out.append(rec)
    return out
