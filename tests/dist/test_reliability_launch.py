"""Launch reliability (issue 7, items 4, 5, 9): Ctrl-C / SIGTERM during a study, ports already taken, two studies
at once on one store, and what a one-node run exposes to the network."""
from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from conftest import cli_env, run_cli, start_cli
from scalelab.run import launch
from scalelab.config import TrainConfig
from scalelab.lab.cells import cell_key
from scalelab.store import Store, read_json

LOOPBACK_ADDRS = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
WIDE = {"COLUMNS": "400"}  # rich wraps progress lines at 80 columns when not on a terminal


# ---------------------------------------------------------------- helpers

def _proc_addr(hexaddr: str) -> tuple[str, int]:
    """'0100007F:1F90' (or the 32-hex-digit IPv6 form) of /proc/net/tcp* as (address, port)."""
    ip, port = hexaddr.split(":")
    raw = bytes.fromhex(ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    # IPv6: four 32-bit words, each in host (little-endian) byte order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """socket inode -> (address, port) of every TCP socket in state LISTEN (0A) on this host."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == "0A":
                    out[int(fields[9])] = _proc_addr(fields[1])
    return out


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process `pid` holds open (its /proc/<pid>/fd links 'socket:[inode]')."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone meanwhile
        return found
    for fd in fds:
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            found.add(int(m.group(1)))
    return found


def tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def wait_for(predicate, timeout: float, proc: subprocess.Popen, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"{what} never happened (exit {proc.returncode}): {out[-1500:]} {err[-1500:]}")


def port_is_free(port: int) -> bool:
    """Whether a new server could listen on 127.0.0.1:port now (SO_REUSEADDR, as servers do: connections of a
    finished run may linger in TIME_WAIT, which is no listener)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((launch.LOOPBACK, port))
            s.listen()
        except OSError:
            return False
        return True


@contextmanager
def taken_port():
    """A port with a server listening on it (on 127.0.0.1) for the duration of the block."""
    with socket.socket() as s:
        s.bind((launch.LOOPBACK, 0))
        s.listen()
        yield s.getsockname()[1]


def study_yaml(path: Path, model: str, *, steps: int, batches: list[int]) -> Path:
    """A one-experiment study: a batch sweep of 2-rank runs of a tiny model."""
    path.write_text(f"""
name: sweep
experiments: [batch_sweep]
reference: false  # these tests count the sweep's runs; the noise floor's reference cell is tested on its own
base: {{model: "{model}", dataset: synthetic, samples: 4096, eval_samples: 16, steps: {steps}, warmup_steps: 1,
        ranks: 2, sample_interval_s: 0.2}}
options:
  batch_sweep: {{batches: {batches}, launches: 1}}
""")
    return path


def cells_of(store: Store, status: str) -> dict[str, list[str]]:
    """cell key -> run ids with that status."""
    out: dict[str, list[str]] = {}
    for run_id in store.list_runs(status=status)["run_id"]:
        out.setdefault(cell_key(TrainConfig.from_dict(store.get(run_id)["config"])), []).append(run_id)
    return out


# ---------------------------------------------------------------- item 4: a signal during a study

@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_a_study_then_the_study_resumes(tmp_path, sleepy_model, sig):
    spec = study_yaml(tmp_path / "study.yaml", sleepy_model(0.05), steps=60, batches=[8, 16])
    root, out = tmp_path / "store", tmp_path / "out"
    proc = start_cli(["study", "--config", str(spec), "--out", str(out), "--store", str(root)], env=WIDE)
    store = Store(root)

    def second_cell_training():
        runs = store.list_runs()
        done = list(runs[runs["status"] == "completed"]["run_id"])
        running = list(runs[runs["status"] == "running"]["run_id"])
        if done and running and (root / "runs" / running[0] / "steps.rank0.jsonl").exists():
            return done, running[0]
        return None

    done, running = wait_for(second_cell_training, 200, proc, "a completed cell and a training one")
    children = tree(proc.pid)[1:]
    # the running cell's rendezvous store: hosted by the study process on loopback, whether its ranks are warm
    # (run/warm.py: they take the port from the job, not from their start-up environment) or torchrun's
    ports = {c.laddr.port for c in psutil.Process(proc.pid).net_connections("tcp")
             if c.status == psutil.CONN_LISTEN and c.laddr.ip == launch.LOOPBACK}
    assert len(ports) == 1, ports
    port = ports.pop()
    assert (launch.LOOPBACK, port) in listening_sockets().values()  # that port is the run's rendezvous store

    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"left behind: {alive}"
    runs = store.list_runs().set_index("run_id")
    assert runs.loc[running, "status"] == "interrupted", err[-1500:]
    assert runs.loc[running, "reason"]
    assert all(runs.loc[r, "status"] == "completed" for r in done)
    assert port_is_free(port)

    again = run_cli(["study", "--config", str(spec), "--out", str(out), "--store", str(root)], timeout=200, env=WIDE)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"already done ({done[0]}), skipped" in again.stdout
    completed = cells_of(store, "completed")
    assert len(completed) == 2 and all(len(ids) == 1 for ids in completed.values()), completed
    assert set(done) <= {ids[0] for ids in completed.values()}  # the finished cell was not run again
    assert list(store.list_runs(status="interrupted")["run_id"]) == [running]
    assert (out / "report" / "report.html").is_file()


# ---------------------------------------------------------------- item 5: ports already taken, two studies at once

def test_loopback_store_takes_another_port_when_the_wished_one_is_taken():
    from torch.distributed import TCPStore

    with taken_port() as port, launch.loopback_store(port) as bound:
        assert bound != port
        # torchrun's static rendezvous creates its store like this; it must reuse ours, not bind its own
        theirs = TCPStore(launch.LOOPBACK, bound, 1, True, timedelta(seconds=10), multi_tenant=True)
        client = TCPStore(launch.LOOPBACK, bound, 1, False, timedelta(seconds=10))
        theirs.set("k", "v")
        assert client.get("k") == b"v"
        mine = {inode for inode in socket_inodes(os.getpid())}
        addrs = [addr for inode, addr in listening_sockets().items() if inode in mine and addr[1] == bound]
        assert addrs == [(launch.LOOPBACK, bound)]
        del theirs, client
    assert port_is_free(bound)


@pytest.mark.timeout(180)
def test_a_run_succeeds_when_the_port_free_port_chose_is_taken(tmp_path, monkeypatch, sleepy_model):
    from scalelab.run.execute import execute

    wished = []
    real = launch.loopback_store

    @contextmanager
    def spy(port):
        with real(port) as bound:
            wished.append((port, bound))
            yield bound

    monkeypatch.setattr(launch, "loopback_store", spy)
    store = Store(tmp_path / "store")
    cfg = TrainConfig(model=sleepy_model(0.0), samples=64, eval_samples=16, global_batch=8, steps=3, ranks=2,
                      warmup_steps=1)
    # torchrun's agent, run in this process, installs its own handlers for these: give pytest its own back
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        with taken_port() as port:
            monkeypatch.setattr(launch, "free_port", lambda host=launch.LOOPBACK: port)
            outcome = execute(cfg, store, say=lambda s: None)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert wished and wished[0][0] == port and wished[0][1] != port
    assert store.get(outcome.run_id)["status"] == "completed"


@pytest.mark.timeout(120)
def test_node0_endpoint_in_use_is_one_line_naming_addr_port(tmp_path):
    root = tmp_path / "store"
    with taken_port() as port:
        proc = run_cli(["train", "--model", "mlp", "--samples", "64", "--eval-samples", "16", "--global-batch", "8",
                        "--steps", "2", "--ranks", "1", "--nnodes", "2", "--node-rank", "0",
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--store", str(root)], timeout=100)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"127.0.0.1:{port} is already in use" in lines[0] and lines[0].startswith("error: run ")
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["failed"]
    assert f"127.0.0.1:{port}" in runs["reason"][0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("same_name", [False, True], ids=["two-studies", "one-study-twice"])
def test_two_studies_at_once_on_one_store(tmp_path, sleepy_model, same_name):
    spec = study_yaml(tmp_path / "study.yaml", sleepy_model(0.0), steps=3, batches=[8, 16])
    root = tmp_path / "store"
    names = ["twin", "twin"] if same_name else ["left", "right"]
    procs = [start_cli(["study", "--config", str(spec), "--name", name, "--out", str(tmp_path / f"out{i}"),
                        "--store", str(root)], env=WIDE) for i, name in enumerate(names)]
    outs = [p.communicate(timeout=280) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[0][-1500:] + o[1][-1500:] for o in outs]
    store = Store(root)
    runs = store.list_runs()
    assert set(runs["status"]) == {"completed"}, runs[["run_id", "status", "reason"]]
    assert runs["run_id"].is_unique
    for name in set(names):  # every cell of every study: exactly one completed run
        per_cell: dict[str, int] = {}
        for run_id in store.list_runs(study=f"{name}/batch_sweep")["run_id"]:
            key = cell_key(TrainConfig.from_dict(store.get(run_id)["config"]))
            per_cell[key] = per_cell.get(key, 0) + 1
        assert sorted(per_cell.values()) == [1, 1], (name, per_cell)
    assert len(runs) == 2 * len(set(names))
    for run_id in runs["run_id"]:  # the run directories agree with the catalog
        assert read_json(store.run_dir(run_id) / "status.json")["status"] == "completed"
    for i in range(2):
        assert (tmp_path / f"out{i}" / "report" / "report.html").is_file()


OPEN_AT_ONCE = '''
import multiprocessing as mp, sys, tempfile
from pathlib import Path
from scalelab.store import Store

def one(root, barrier, q):
    barrier.wait()
    try:
        s = Store(root)
        s.finish_run(s.create_run({"model": "m"}, {}, study="s"), "completed", summary={"x": 1})
        q.put("ok")
    except Exception as e:
        q.put(f"{type(e).__name__}: {e}")

if __name__ == "__main__":
    ctx = mp.get_context("fork")  # this interpreter has no threads yet: forking is safe
    trials, n = int(sys.argv[1]), int(sys.argv[2])
    for t in range(trials):
        root = Path(tempfile.mkdtemp(dir=sys.argv[3])) / "store"
        barrier, q = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=one, args=(root, barrier, q)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        results = [q.get() for _ in range(n)]
        bad = [r for r in results if r != "ok"]
        rows = Store(root).list_runs()
        if bad or len(rows) != n or set(rows["status"]) != {"completed"}:
            print(t, bad, len(rows))
            sys.exit(1)
'''


def test_opening_a_new_store_waits_for_another_writer(tmp_path):
    # Two studies started together both create the catalog. Switching it to WAL takes a lock SQLite does not
    # wait for: the second process failed at once with "database is locked". Now it waits, as for any write.
    root = tmp_path / "store"
    (root / "runs").mkdir(parents=True)
    other = sqlite3.connect(root / "catalog.sqlite", isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    release = threading.Timer(0.5, lambda: other.execute("COMMIT"))
    release.start()
    try:
        store = Store(root)
    finally:
        release.join()
        other.close()
    assert store.list_runs().empty


@pytest.mark.timeout(120)
def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path):
    # The same race for real: 6 processes create and finish a run in a brand-new store at the same moment
    # (before the fix about half of such 20-trial tests saw "database is locked").
    script = tmp_path / "open_at_once.py"
    script.write_text(OPEN_AT_ONCE)
    proc = subprocess.run([sys.executable, str(script), "20", "6", str(tmp_path)], capture_output=True, text=True,
                          timeout=110, env=cli_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# ---------------------------------------------------------------- item 9: what a one-node run exposes

@pytest.mark.timeout(180)
def test_single_node_run_listens_only_on_loopback(tmp_path, sleepy_model):
    root = tmp_path / "store"
    proc = start_cli(["train", "--model", sleepy_model(0.05), "--samples", "4096", "--global-batch", "8", "--ranks",
                      "2", "--epochs", "1", "--store", str(root)])
    try:
        wait_for(lambda: len(list(root.glob("runs/*/steps.rank*.jsonl"))) == 2, 150, proc, "both ranks training")
        procs = tree(proc.pid)
        listening = listening_sockets()
        found = {p.pid: [listening[i] for i in socket_inodes(p.pid) if i in listening] for p in procs}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    exposed = {pid: addrs for pid, addrs in found.items() if any(a not in LOOPBACK_ADDRS for a, _ in addrs)}
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert found[proc.pid], "the rendezvous store (hosted by the scalelab process) was not found listening"
    assert sum(1 for addrs in found.values() if addrs) >= 3, found  # the store + gloo's listener in each rank
