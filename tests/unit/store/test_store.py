"""Tests for scalelab.store."""
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES
from scalelab.errors import StoreError
from scalelab.store import (Store, new_run_id, read_json, read_jsonl, write_json_atomic,
                            write_jsonl_atomic)

CFG = {"model": "resnet18", "dataset": "cifar10", "ranks": 4, "global_batch": 256,
       "wrapper": "ddp", "sync": "bucketed", "precision": "bf16", "lr": 0.1}


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- atomic files

def test_json_roundtrip_and_numpy_values(tmp_path):
    np = pytest.importorskip("numpy")
    p = tmp_path / "a.json"
    write_json_atomic(p, {"x": np.float32(1.5), "arr": np.arange(3), "path": tmp_path})
    assert read_json(p) == {"x": 1.5, "arr": [0, 1, 2], "path": str(tmp_path)}
    recs = [{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)]
    write_jsonl_atomic(tmp_path / "s.jsonl", recs)
    assert read_jsonl(tmp_path / "s.jsonl") == recs
    write_jsonl_atomic(tmp_path / "empty.jsonl", [])
    assert read_jsonl(tmp_path / "empty.jsonl") == []


@pytest.mark.parametrize("writer,payload", [(write_json_atomic, {"v": 2}),
                                            (write_jsonl_atomic, [{"v": 2}])])
def test_crash_before_rename_keeps_old_file(tmp_path, monkeypatch, writer, payload):
    p = tmp_path / "f.json"
    p.write_text('{"v": 1}\n')
    fresh = tmp_path / "new.json"

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(StoreError) as e:
        writer(p, payload)
    assert str(p) in _one_line(e)
    with pytest.raises(StoreError):
        writer(fresh, payload)
    monkeypatch.undo()
    assert json.loads(p.read_text()) == {"v": 1}
    assert not fresh.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.json"]  # temp files cleaned up


def test_unserialisable_value_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "x.json", {"f": object()})
    assert list(tmp_path.iterdir()) == []


def test_read_errors_are_one_line_and_name_the_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(StoreError) as e:
        read_json(missing)
    assert str(missing) in _one_line(e)

    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,\n  oops}')
    with pytest.raises(StoreError) as e:
        read_json(bad)
    assert str(bad) in _one_line(e) and "line 2" in str(e.value)

    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]")
    with pytest.raises(StoreError, match="expected a JSON object"):
        read_json(lst)

    jl = tmp_path / "steps.rank0.jsonl"
    jl.write_text('{"step": 0}\n\n{"step": 1}\n{"step": 2, "lo\n')
    with pytest.raises(StoreError) as e:
        read_jsonl(jl)
    assert f"{jl}:4:" in _one_line(e)

    jl.write_text('{"step": 0}\n[1]\n')
    with pytest.raises(StoreError, match=r":2: expected a JSON object"):
        read_jsonl(jl)
    with pytest.raises(StoreError) as e:
        read_jsonl(tmp_path / "missing.jsonl")
    assert "missing.jsonl" in _one_line(e)


def test_new_run_id_format_and_uniqueness():
    ids = {new_run_id() for _ in range(200)}
    assert len(ids) == 200
    rid = new_run_id()
    assert rid.startswith("run-")
    parts = rid.split("-")
    assert len(parts) == 4 and len(parts[1]) == 8 and len(parts[2]) == 6 and len(parts[3]) == 6
    assert new_run_id("").count("-") == 2
    assert new_run_id("bench").startswith("bench-")


# ---------------------------------------------------------------- store

def test_create_finish_get_roundtrip(tmp_path):
    st = Store(tmp_path / "store")
    rid = st.create_run(CFG, {"seed": 1}, study="s1")
    d = st.run_dir(rid)
    assert d == tmp_path / "store" / "runs" / rid
    assert read_json(d / "config.json") == CFG
    assert read_json(d / "provenance.json") == {"seed": 1}
    status = read_json(d / "status.json")
    assert status["status"] == "running" and status["pid"] == os.getpid()
    assert status["host"] == socket.gethostname()

    row = st.get(rid)
    assert row["status"] == "running" and row["kind"] == "train" and row["study"] == "s1"
    assert (row["model"], row["dataset"], row["ranks"], row["global_batch"], row["wrapper"], row["sync"],
            row["precision"]) == ("resnet18", "cifar10", 4, 256, "ddp", "bucketed", "bf16")
    assert row["config"] == CFG and row["summary"] is None

    summary = {"throughput": 1234.5, "time": {"epoch(s)": 12.0, "step(ms)": 80.1}, "note": "ok"}
    st.finish_run(rid, "completed", summary=summary)
    assert read_json(d / "summary.json") == summary
    status = read_json(d / "status.json")
    assert status["status"] == "completed" and status["pid"] == os.getpid()
    row = st.get(rid)
    assert row["status"] == "completed" and row["summary"] == summary and row["finished"]

    st.finish_run(rid, "failed", reason="NaN loss at step 7")
    row = st.get(rid)
    assert (row["status"], row["reason"], row["summary"]) == ("failed", "NaN loss at step 7", summary)

    with pytest.raises(StoreError, match="already exists"):
        st.create_run(CFG, {}, run_id=rid)
    with pytest.raises(StoreError, match="status"):
        st.finish_run(rid, "done")
    with pytest.raises(StoreError, match="not allowed"):
        st.create_run(CFG, {}, run_id="../escape")
    # A second Store on the same root sees the same catalog.
    assert Store(tmp_path / "store").get(rid)["status"] == "failed"


def test_node_0_adopts_a_running_run_another_node_created_first(tmp_path):
    """A multi-node run on a shared filesystem: node 1 made the directory first; node 0 (adopt) makes the run its
    own (config, status) instead of failing; a finished run of that id is never adopted."""
    st = Store(tmp_path / "store")
    node1 = {**CFG, "nnodes": 2, "node_rank": 1}
    rid = st.create_run(node1, {"seed": 1}, run_id="job-7")
    assert st.create_run({**node1, "node_rank": 0}, {"seed": 1}, run_id="job-7", adopt=True) == "job-7"
    row = st.get("job-7")
    assert (row["status"], row["config"]["node_rank"], row["ranks"]) == ("running", 0, 8)
    assert read_json(Path(row["dir"]) / "config.json")["node_rank"] == 0
    assert read_json(Path(row["dir"]) / "status.json")["pid"] == os.getpid()
    with pytest.raises(StoreError, match="already exists"):
        st.create_run(node1, {}, run_id=rid)  # without adopt: refused as before
    st.finish_run(rid, "completed")
    with pytest.raises(StoreError, match="already exists"):
        st.create_run(node1, {}, run_id=rid, adopt=True)


def test_config_is_denormalised(tmp_path):
    st = Store(tmp_path)
    row = st.get(st.create_run({**CFG, "ranks": 2, "nnodes": 3}, {}))
    assert row["ranks"] == 6  # ranks per node x nodes
    row = st.get(st.create_run({}, {}))
    assert row["model"] is None and row["ranks"] is None
    row = st.get(st.create_run({**CFG, "wrapper": "single", "sync": "auto"}, {}))
    assert (row["wrapper"], row["sync"]) == ("single", None)  # one process: nothing is synchronised
    row = st.get(st.create_run({**CFG, "sync": "auto", "engine": "horovod"}, {}))
    assert row["sync"] == "horovod"  # the engine's own sync: `runs list` tells a Horovod run apart


def test_a_catalog_of_scalelab_0_1_gains_wrapper_and_sync_from_the_stored_configs(tmp_path):
    import sqlite3

    root = tmp_path / "old"
    shutil.copytree(FIXTURES / "store_v0", root)
    columns = {r[1] for r in sqlite3.connect(root / "catalog.sqlite").execute("PRAGMA table_info(runs)")}
    assert "strategy" in columns and "sync" not in columns
    st = Store(root)
    rows = st.list_runs()
    by_sync = {r: (None if s != s else s) for r, s in zip(rows["run_id"], rows["sync"])}  # NaN: no value
    configs = {r: st.get(r)["config"] for r in rows["run_id"]}
    for run_id, config in configs.items():
        assert st.get(run_id)["wrapper"] == config.get("strategy")
        want = config.get("sync") if config.get("strategy") == "ddp" and config.get("sync") != "auto" else None
        assert by_sync[run_id] == want
    assert {"bucketed", "allreduce", "noop", "ddp"} <= set(by_sync.values())


def test_get_prefix_unknown_and_ambiguous(tmp_path):
    st = Store(tmp_path)
    st.create_run(CFG, {}, run_id="abc-111")
    st.create_run(CFG, {}, run_id="abc-222")
    st.create_run(CFG, {}, run_id="xyz-1")
    assert st.get("abc-1")["run_id"] == "abc-111"
    assert st.get("xyz")["run_id"] == "xyz-1"
    with pytest.raises(StoreError) as e:
        st.get("abc")
    assert "matches 2 runs" in _one_line(e)
    with pytest.raises(StoreError) as e:
        st.get("nope")
    assert _one_line(e) == "run: 'nope' not found (see `scalelab runs list`)"
    # Prefix matching is literal: LIKE wildcards are not special.
    with pytest.raises(StoreError, match="not found"):
        st.get("a%")
    st.finish_run("xyz", "completed")  # unique prefix also works for finish_run
    assert st.get("xyz-1")["status"] == "completed"


def test_list_runs_filters_and_order(tmp_path):
    st = Store(tmp_path)
    a = st.create_run({**CFG, "ranks": 1}, {}, study="scale")
    b = st.create_run({**CFG, "ranks": 2}, {}, study="scale")
    c = st.create_run({**CFG, "model": "mlp"}, {}, kind="bench")
    st.finish_run(a, "completed", summary={"x": 1})
    st.finish_run(c, "failed", reason="boom")

    df = st.list_runs()
    assert list(df["run_id"]) == [c, b, a]  # newest first
    assert "config_json" not in df.columns and "summary_json" not in df.columns
    assert list(st.list_runs(status="completed")["run_id"]) == [a]
    assert list(st.list_runs(kind="bench")["run_id"]) == [c]
    assert list(st.list_runs(study="scale")["run_id"]) == [b, a]
    assert list(st.list_runs(where={"ranks": 2})["run_id"]) == [b]
    assert list(st.list_runs(where={"model": "resnet18", "ranks": 4})["run_id"]) == []
    assert list(st.list_runs(where={"model": "mlp"})["run_id"]) == [c]
    assert list(st.list_runs(limit=2)["run_id"]) == [c, b]
    assert st.list_runs(status="failed").iloc[0]["reason"] == "boom"
    empty = st.list_runs(study="none")
    assert len(empty) == 0 and "run_id" in empty.columns
    with pytest.raises(StoreError, match="where"):
        st.list_runs(where={"lr": 0.1})


def test_compare(tmp_path):
    st = Store(tmp_path)
    a = st.create_run({**CFG, "ranks": 1}, {})
    b = st.create_run({**CFG, "ranks": 2}, {})
    c = st.create_run(CFG, {})
    st.finish_run(a, "completed", summary={"throughput": 100.0, "time": {"epoch(s)": 10.0}})
    st.finish_run(b, "completed", summary={"throughput": 190.0, "time": {"epoch(s)": 5.5, "comm(s)": 1.0},
                                           "status": "weird"})
    df = st.compare([a, b[:-1], c])
    assert list(df["run_id"]) == [a, b, c]
    assert list(df.columns[:9]) == ["run_id", "model", "dataset", "ranks", "global_batch",
                                    "wrapper", "sync", "precision", "status"]
    assert {"throughput", "time/epoch(s)", "time/comm(s)", "summary/status"} <= set(df.columns)
    assert list(df["ranks"]) == [1, 2, 4]
    assert df.loc[1, "time/epoch(s)"] == 5.5 and df.loc[1, "status"] == "completed"
    assert df.loc[1, "summary/status"] == "weird"
    assert df.loc[0, "time/comm(s)"] is None or df["time/comm(s)"].isna()[0]
    assert df.loc[2, "status"] == "running"

    only = st.compare([a, b], metrics=["time/epoch(s)"])
    assert list(only.columns[9:]) == ["time/epoch(s)"]
    assert list(only["time/epoch(s)"]) == [10.0, 5.5]
    with pytest.raises(StoreError, match="throughpt"):
        st.compare([a], metrics=["throughpt"])


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_mark_stale(tmp_path):
    st = Store(tmp_path)
    dead, alive, other_host, done = (st.create_run(CFG, {}) for _ in range(4))
    pid = _dead_pid()
    for rid, host in ((dead, socket.gethostname()), (other_host, "some-other-host")):
        s = read_json(st.run_dir(rid) / "status.json")
        s.update(pid=pid, host=host)
        write_json_atomic(st.run_dir(rid) / "status.json", s)
    st.finish_run(done, "completed")

    assert st.mark_stale() == 1
    row = st.get(dead)
    assert row["status"] == "interrupted" and row["reason"] == f"process {pid} no longer running"
    assert read_json(st.run_dir(dead) / "status.json")["status"] == "interrupted"
    assert st.get(alive)["status"] == "running"  # our own pid is alive
    assert st.get(other_host)["status"] == "running"  # cannot check another host
    assert st.get(done)["status"] == "completed"
    assert st.mark_stale() == 0


def test_mark_stale_detects_pid_reuse_and_repairs_catalog(tmp_path):
    st = Store(tmp_path)
    reused, crashed = st.create_run(CFG, {}), st.create_run(CFG, {})
    s = read_json(st.run_dir(reused) / "status.json")
    s["pid_create_time"] -= 3600  # our pid, but "started" an hour before this process did
    write_json_atomic(st.run_dir(reused) / "status.json", s)
    # Simulate a crash after status.json/summary.json were written but before the catalog update.
    write_json_atomic(st.run_dir(crashed) / "summary.json", {"loss": 0.5})
    s = read_json(st.run_dir(crashed) / "status.json")
    s.update(status="completed")
    write_json_atomic(st.run_dir(crashed) / "status.json", s)

    assert st.mark_stale() == 2
    assert st.get(reused)["status"] == "interrupted"
    row = st.get(crashed)
    assert row["status"] == "completed" and row["summary"] == {"loss": 0.5}


def _create_many(root: str, n: int) -> None:
    st = Store(Path(root))
    for i in range(n):
        rid = st.create_run({**CFG, "i": i}, {"pid": os.getpid()})
        if i % 2:
            st.finish_run(rid, "completed", summary={"i": i})


def test_concurrent_writers(tmp_path):
    root = tmp_path / "shared"  # does not exist yet: both processes also race to create the schema
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    procs = [ctx.Process(target=_create_many, args=(str(root), 20)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    st = Store(root)
    df = st.list_runs()
    assert len(df) == 40 and df["run_id"].is_unique
    assert len([d for d in (root / "runs").iterdir() if d.is_dir()]) == 40
    assert (df["status"] == "completed").sum() == 20
    assert not list((root / "runs").glob("*/.*.tmp"))


def test_garbage_catalog_is_one_line_error(tmp_path):
    (tmp_path / "catalog.sqlite").write_bytes(b"this is not sqlite at all\n" * 100)
    with pytest.raises(StoreError) as e:
        Store(tmp_path)
    assert "catalog.sqlite" in _one_line(e)


def test_create_run_cleans_up_when_catalog_fails(tmp_path):
    st = Store(tmp_path)
    (tmp_path / "catalog.sqlite").write_bytes(b"garbage" * 1000)
    for extra in ("catalog.sqlite-wal", "catalog.sqlite-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    with pytest.raises(StoreError):
        st.create_run(CFG, {}, run_id="r1")
    assert not st.run_dir("r1").exists()
