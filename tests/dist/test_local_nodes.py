"""--local-nodes on a real cluster of network namespaces: 2 nodes of 1 rank each, a tiny MLP, a few steps.

Each test runs `scalelab` as its own process and checks what a user relies on: the run completes across the nodes
(or fails naming the node), the link shaping is real, nothing listens on the host, and `ip netns list` is back
to what it was afterwards — also after scalelab itself was SIGKILLed (the next command removes the leftovers).
Skipped, with the reason, where namespaces cannot be made (no root / CAP_NET_ADMIN, no `ip`).
"""
from __future__ import annotations

import ipaddress
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from conftest import (TINY_MLP, cli_env, heartbeat_process, namespaces_unusable, run_cli, start_cli, wait_for_steps,
                      write_sleepy)
from scalelab.analysis import keys
from scalelab.analysis.nodes import node_rows
from scalelab.analysis.noise import timed_window
from scalelab.analysis.summary import timed_step_ms
from scalelab.run import netns
from scalelab.store import RunDir, Store, read_jsonl

_unusable = namespaces_unusable


pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(_unusable() is not None, reason=str(_unusable()))]


@pytest.fixture
def mlp(tmp_path) -> str:
    path = tmp_path / "tiny_mlp.py"
    path.write_text(TINY_MLP)
    return f"{path}:make"


@pytest.fixture
def namespaces_restored():
    """The test leaves no namespace that was not there before it (a run may remove a dead run's leftovers). Of the
    new ones, those of a live process outside this one's family are another xdist worker's, still running."""
    before = set(netns.list_namespaces())
    yield
    family = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    made_by = {n: netns.owner(n) for n in set(netns.list_namespaces()) - before}
    assert not {n for n, pid_start in made_by.items() if netns.is_leftover(n) or pid_start and pid_start[0] in family}


def _train_args(model: str, root: Path, *more: str) -> list[str]:
    return ["train", "--model", model, "--samples", "256", "--global-batch", "16", "--ranks", "1",
            "--local-nodes", "2", "--store", str(root), *more]


def _failed_cleanly(proc: subprocess.Popen, family: list, root: Path) -> str:
    """The failure reason of the run `proc` stored, once it has exited 1 leaving no process and no namespace."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-2000:]
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert not _owned(proc.pid)
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["failed"]
    return runs["reason"][0]


def _reap(procs: list[subprocess.Popen]) -> None:
    """Kill and wait for whichever of the test's own processes is still running (a test that failed midway)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _owned(pid: int) -> list[str]:
    """The namespaces of the scalelab process `pid` (their names start with its owner tag)."""
    return [n for n in netns.list_namespaces() if n.startswith(f"{netns.PREFIX}{pid}-")]


def test_two_node_train_completes_each_rank_forked_by_its_agent_as_ranks_on_one_host(tmp_path, mlp,
                                                                                     namespaces_restored):
    """Both nodes' ranks write into the one run directory; the namespaces are gone afterwards (the fixture).
    A node agent forks its rank after importing torch and the worker (no second interpreter importing them): while
    the run trains, each rank's parent is its node's agent and it runs the agent's command line (forked, not
    started by exec). The known truth of what it measures: the same losses, to the bit, as 2 ranks started cold on
    one host (same seed, data, threads; a sum of two gradients does not depend on the order of its terms)."""
    root, host = tmp_path / "store", tmp_path / "host"
    fixed = ["--steps", "8", "--threads", "1"]
    proc = start_cli(_train_args(mlp, root, *fixed))
    forked = {}
    try:
        while proc.poll() is None and len(forked) < 2:
            for k in (0, 1):
                rank = heartbeat_process(root, k)
                try:
                    forked[k] = (rank.cmdline(), rank.parent().cmdline())
                except (psutil.Error, AttributeError):
                    continue  # not started yet, or ended meanwhile
            time.sleep(0.02)
        _, err = proc.communicate(timeout=200)
    finally:
        _reap([proc])
    assert proc.returncode == 0, err[-2000:]
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["completed"] and list(runs["ranks"]) == [2]  # world size: 1 rank x 2 nodes
    run = Store(root).get(runs["run_id"][0])
    assert (run["config"]["local_nodes"], run["config"]["nnodes"]) == (2, 2)
    assert run["summary"]["ranks/reported"] == 2
    for rank in (0, 1):  # each node's rank wrote its steps into the one shared run directory
        assert len(read_jsonl(Path(run["dir"]) / f"steps.rank{rank}.jsonl")) == 8
    assert len(forked) == 2, forked
    for own, parent in forked.values():
        assert own == parent and "scalelab.run.nodeagent" in own, (own, parent)
    res = run_cli(["train", "--model", mlp, "--samples", "256", "--global-batch", "16", "--ranks", "2",
                   "--store", str(host), *fixed], timeout=200)
    assert res.returncode == 0, res.stderr[-2000:]
    losses = [[r["loss"] for r in read_jsonl(Path(Store(store).get(Store(store).list_runs()["run_id"][0])["dir"])
                                             / "steps.rank0.jsonl")] for store in (root, host)]
    assert len(losses[0]) == 8 and losses[0] == losses[1], losses


def _busbw(root: Path) -> float:
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["completed"]
    table = pd.read_csv(Path(Store(root).get(runs["run_id"][0])["dir"]) / "results.csv")
    return float(table["busbw(GB/s)"].iloc[0])


def test_a_shaped_link_is_slower_than_an_unshaped_one(tmp_path, namespaces_restored):
    """Known truth: the kernel's tbf at 0.2 Gbit/s caps what crosses the link (unshaped veths carry several
    Gbit/s here). Only the ratio is asserted, generously: a 4 MiB allreduce at 0.2 Gbit/s takes ~0.17 s."""
    busbw = {}
    for name, shape in (("unshaped", []), ("shaped", ["--link-gbps", "0.2"])):
        root = tmp_path / name
        res = run_cli(["bench", "comm", "--ops", "allreduce", "--begin", "4M", "--end", "4M", "--iters", "5",
                       "--warmup", "2", "--ranks", "1", "--local-nodes", "2", *shape, "--store", str(root)],
                      timeout=200)
        assert res.returncode == 0, res.stderr[-2000:]
        busbw[name] = _busbw(root)
    assert busbw["shaped"] < 0.5 * busbw["unshaped"], busbw


def _hex_address(text: str) -> str:
    """An address of /proc/net/tcp{,6} ("0100007F" or 32 hex digits, 32-bit words in host order) as text."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _listening(tcp_tables: str) -> list[tuple[str, int, int]]:
    """(address, port, inode) of every listening socket in the text of /proc/net/tcp and /proc/net/tcp6."""
    out = []
    for line in tcp_tables.splitlines():
        fields = line.split()
        if len(fields) > 9 and fields[3] == "0A":  # state 0A: LISTEN
            host, port = fields[1].split(":")
            out.append((_hex_address(host), int(port, 16), int(fields[9])))
    return out


def _killed_run(folder: Path) -> dict:
    """A 2-node run of a model sleeping 20 ms a step: what its processes listen on while it trains (the host's TCP
    tables, and each of its namespaces' tables and addresses), then SIGKILLed, scalelab only, so it cannot tear
    anything down."""
    from dist.test_reliability_launch import socket_inodes

    root = folder / "store"
    proc = start_cli(_train_args(write_sleepy(folder, 0.02), root, "--steps", "300"))
    try:
        wait_for_steps(proc, root, rank=1)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        names = _owned(proc.pid)
        seen = {"family": family, "names": names, "ours": set().union(*(socket_inodes(p.pid) for p in family)),
                "host": _listening(Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()),
                "inside": {name: (subprocess.run(["ip", "netns", "exec", name, "cat", "/proc/net/tcp",
                                                  "/proc/net/tcp6"], capture_output=True, text=True,
                                                 check=True).stdout,
                                  subprocess.run(["ip", "-n", name, "-o", "addr"], capture_output=True,
                                                 text=True).stdout) for name in names}}
    finally:
        proc.kill()
        proc.communicate()
    return seen


def test_a_sigkilled_run_listened_only_in_its_nodes_and_the_next_command_removes_its_leftovers(tmp_path, mlp,
                                                                                                namespaces_restored):
    """One run, two properties, in one test: another worker's run (tests/alone.py) sweeps dead owners' namespaces
    as it makes its own, so the leftovers are looked for while this test holds the suite's lock.

    During a 2-node run, every listening socket of the run's processes is inside a node namespace and bound to
    that node's private address (10.213.x.y) or to loopback (127.0.0.1 / ::1); on the host's tables no listening
    socket belongs to a process of the run. A wildcard bind (0.0.0.0 / ::) is refused too, although inside a node
    namespace it would reach only lo and the private eth0: nothing binds one today (node 0's store is bound to its
    private address, gloo to eth0's), and on a real machine a wildcard bind is exactly what exposes the store.
    After scalelab is SIGKILLed, the next command removes what it left."""
    killed_run = _killed_run(tmp_path)
    try:
        ours, host = killed_run["ours"], killed_run["host"]
        assert not [s for s in host if s[2] in ours], f"listening on the host: {host}"
        names = killed_run["names"]
        assert len(names) == 3, names  # two nodes and the switch
        seen = []
        for name in names:
            tables, addrs = killed_run["inside"][name]
            private = {w.split("/")[0] for w in addrs.split() if w.startswith("10.213.")}
            allowed = private | {"127.0.0.1", "::1"}
            for address, port, inode in _listening(tables):
                address = address.removeprefix("::ffff:")
                assert address in allowed, f"{name}: listening on {address}:{port}"
                seen.append((name, address, port, inode in ours))
        assert any(port == 29500 and mine for _, _, port, mine in seen), seen  # node 0's rendezvous store

        assert set(names) <= set(netns.list_namespaces())  # the killed run could not remove them
        res = run_cli(_train_args(mlp, tmp_path / "next", "--steps", "2"), timeout=200)
        assert res.returncode == 0, res.stderr[-2000:]
        assert not set(names) & set(netns.list_namespaces())
        _, alive = psutil.wait_procs(killed_run["family"], timeout=10)
        assert not alive, f"left behind: {[p.pid for p in alive]}"
    finally:
        netns.sweep_leftovers()


def test_a_delay_without_netem_is_refused_in_one_line(tmp_path, mlp, namespaces_restored):
    if netns.netem_available():
        pytest.skip("this kernel has netem: the refusal cannot happen here")
    root = tmp_path / "store"
    res = run_cli(_train_args(mlp, root, "--steps", "2", "--link-delay-ms", "5"), timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "netem" in lines[0], res.stderr
    assert not (root / "runs").exists() or not any((root / "runs").iterdir())  # nothing recorded


def test_ctrl_c_marks_the_run_interrupted_and_removes_the_cluster(tmp_path, sleepy_model, namespaces_restored):
    root = tmp_path / "store"
    proc = start_cli(_train_args(sleepy_model(0.02), root, "--steps", "300"))
    wait_for_steps(proc, root, rank=1)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert not _owned(proc.pid)
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert list(Store(root).list_runs()["status"]) == ["interrupted"]


def test_every_process_of_one_node_killed_fails_the_run_naming_the_node(tmp_path, sleepy_model,
                                                                        namespaces_restored):
    """Issue 14 item 3: node 1's agent and rank SIGKILLed mid-epoch -> the run ends within 60 s, failed, its
    reason names node 1 and its rank; no process, namespace or listening port of the run is left."""
    root = tmp_path / "store"
    proc = start_cli(_train_args(sleepy_model(0.02), root, "--steps", "300"))
    wait_for_steps(proc, root, rank=1)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    node1 = next(n for n in _owned(proc.pid) if n.endswith("-1"))
    killed_at = time.monotonic()
    for pid in subprocess.run(["ip", "netns", "pids", node1], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    _, err = proc.communicate(timeout=90)
    elapsed = time.monotonic() - killed_at
    assert proc.returncode == 1, err[-2000:]
    assert elapsed < 60, f"took {elapsed:.1f} s to end after the kill"
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert not _owned(proc.pid)  # the namespaces, and with them every port the run listened on
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["failed"]
    assert runs["reason"][0].startswith("node 1 (rank 1): "), runs["reason"][0]


def test_a_link_taken_down_mid_run_fails_the_run_naming_the_unreachable_node(tmp_path, sleepy_model,
                                                                              namespaces_restored):
    """Issue 14 item 3: node 1's switch port set down mid-run. gloo sees no reset (the peer is silent, not gone),
    so the ranks block in the collective; the hang watchdog (10 s here) ends the run and its verdict leads with
    the node the switch cannot reach."""
    root = tmp_path / "store"
    proc = start_cli(_train_args(sleepy_model(0.02), root, "--steps", "300", "--hang-timeout", "10"))
    wait_for_steps(proc, root, rank=1)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    switch = next(n for n in _owned(proc.pid) if n.endswith("-sw"))
    subprocess.run(["ip", "-n", switch, "link", "set", "n1", "down"], check=True)
    reason = _failed_cleanly(proc, family, root)
    assert reason.startswith("node 1 (rank 1) unreachable") and "hung" in reason, reason


def test_a_node_that_never_joins_fails_the_run_in_one_line(tmp_path, mlp, namespaces_restored):
    """Issue 14 item 3: node 1's switch port set down as soon as it is up, before node 1's agent (still importing
    torch) can reach node 0's store: node 1 never joins, node 0's agent waits in the rendezvous and no rank starts.
    The hang watchdog (10 s here; it covers start-up) stops every node agent and the run fails with one line
    leading with the node the switch cannot reach."""
    root = tmp_path / "store"
    proc = start_cli(_train_args(mlp, root, "--steps", "6", "--hang-timeout", "10"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        switch = next((n for n in _owned(proc.pid) if n.endswith("-sw")), None)
        port = switch and subprocess.run(["ip", "-n", switch, "-o", "link", "show", "n1"], capture_output=True,
                                         text=True).stdout
        if port and ",UP" in port:
            break
        time.sleep(0.02)
    subprocess.run(["ip", "-n", switch, "link", "set", "n1", "down"], check=True)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    reason = _failed_cleanly(proc, family, root)
    assert "\n" not in reason and reason.startswith("node 1 (rank 1) unreachable"), reason
    assert "never started" in reason, reason


def test_nodes_with_their_own_stores_gather_every_rank_on_node_0(tmp_path, mlp, namespaces_restored):
    """No shared filesystem assumed (node-local scratch): `scalelab train --nnodes 2` by hand on each node of a
    namespace cluster, each node with its own store. Node 0's run covers both ranks: their steps, results and
    system samples, the summary's rank count and the slowest rank's step."""
    stores = [tmp_path / "node0", tmp_path / "node1"]
    with netns.local_cluster(2) as cluster:
        endpoint = f"{cluster.nodes[0].address}:29500"
        procs = [subprocess.Popen(
            ["ip", "netns", "exec", node.netns, sys.executable, "-m", "scalelab", "train", "--model", mlp,
             "--samples", "256", "--global-batch", "16", "--ranks", "1", "--steps", "6", "--nnodes", "2",
             "--node-rank", str(node.index), "--rdzv-endpoint", endpoint, "--run-id", "gathered",
             "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=cli_env({"GLOO_SOCKET_IFNAME": netns.IFACE}))  # as on a cluster: the NIC the nodes share
            for node, store in zip(cluster.nodes, stores)]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            _reap(procs)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    run = Store(stores[0]).get("gathered")
    assert run["status"] == "completed"
    run_dir = Path(run["dir"])
    for rank in (0, 1):
        assert len(read_jsonl(run_dir / f"steps.rank{rank}.jsonl")) == 6
        assert (run_dir / f"result.rank{rank}.json").is_file() and (run_dir / f"system.rank{rank}.jsonl").is_file()
    summary = run["summary"]
    assert summary["ranks/reported"] == 2
    # each step is the slower of the two ranks' (node 1's records included)
    steps = RunDir(run_dir).read_steps()
    slowest = timed_step_ms(steps)
    assert summary[keys.STEP_MEDIAN_MS] == pytest.approx(statistics.median(slowest))
    assert {r["rank"] for r in steps} == {0, 1}
    # node 1's own store holds only its rank: what node 0 gathered came through the process group
    assert not (Path(Store(stores[1]).get("gathered")["dir"]) / "steps.rank0.jsonl").exists()


def test_on_a_shared_store_node_0_adopts_the_run_node_1_created_first(tmp_path, mlp, namespaces_restored):
    """A shared filesystem (as under Slurm): node 1 starts first and creates the run directory; node 0 adopts it
    (it failed with 'already exists' before) and the run completes with both ranks and node 0's config."""
    store = tmp_path / "store"
    with netns.local_cluster(2) as cluster:
        endpoint = f"{cluster.nodes[0].address}:29500"

        def start(node):
            return subprocess.Popen(
                ["ip", "netns", "exec", node.netns, sys.executable, "-m", "scalelab", "train", "--model", mlp,
                 "--samples", "256", "--global-batch", "16", "--ranks", "1", "--steps", "4", "--nnodes", "2",
                 "--node-rank", str(node.index), "--rdzv-endpoint", endpoint, "--run-id", "shared",
                 "--store", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=cli_env({"GLOO_SOCKET_IFNAME": netns.IFACE}))

        procs = [start(cluster.nodes[1])]
        try:
            deadline = time.monotonic() + 60
            while not (store / "runs" / "shared" / "status.json").exists():
                assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()[1][-2000:]
                time.sleep(0.1)
            procs.insert(0, start(cluster.nodes[0]))
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            _reap(procs)
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    run = Store(store).get("shared")
    assert (run["status"], run["summary"]["ranks/reported"], run["config"]["node_rank"]) == ("completed", 2, 0)


@pytest.mark.timeout(420)
def test_scale_over_nodes_gives_each_node_its_epoch_cpu_and_network(tmp_path, namespaces_restored):
    # seed 003's tables 1-3: 1 and 2 namespace nodes of one rank; an MLP of 7.4 MB of gradients so the link carries
    # far more than the run's other traffic. Known truth: a 2-rank allreduce sends the payload once per step from
    # each node (reduce-scatter half + all-gather half), so over the timed window each node sends and receives the
    # payload x the timed steps (plus TCP/IP headers, a few %). The counters are sampled every 0.1 s and the traffic
    # comes in one burst a step, so the window's ends are uncertain by about a burst: 14 timed steps keep that small.
    out = tmp_path / "out"
    res = run_cli(["scale", "--nodes", "1,2", "--mode", "strong", "--batches", "32", "--launches", "1",
                   "--steps", "16", "--model", "mlp", "--model-options", "depth=2,width=512", "--ranks", "1",
                   "--sync", "allreduce", "--sample-interval", "0.1", "--store", str(tmp_path / "store"),
                   "--out", str(out)], timeout=400)
    assert res.returncode == 0, res.stderr[-2000:]
    nodes = pd.read_csv(out / "scale_strong_nodes.csv")
    assert list(zip(nodes["nodes"], nodes["node"])) == [(1, 0), (2, 0), (2, 1)]
    assert (nodes["epoch(s)"] > 0).all() and (nodes["cpu_user(%)"] > 0).all() and (nodes["cpu_system(%)"] >= 0).all()
    store = Store(tmp_path / "store")
    two_node_runs = [store.get(r) for r in store.list_runs()["run_id"]]
    two_node_runs = [r for r in two_node_runs if r["config"]["nnodes"] == 2 and not r["config"]["noop_collectives"]
                     and r["config"]["sync"] != "noop"]  # the no-sync variant (the lost speedup's) sends nothing
    assert two_node_runs
    for run in two_node_runs:  # every launch of the 2-node cell (a noisy one is measured once more)
        files = RunDir(run["dir"])
        records, payload = files.read_steps(), run["summary"][keys.COMM_BYTES_PER_STEP]
        begin, end = timed_window(records)
        timed = sum(1 for r in records if r["rank"] == 0 and not r["warmup"])
        for row in node_rows(records, files.read_system(), ranks_per_node=1, nodes=2,
                             steps_per_epoch=run["summary"][keys.STEPS_PER_EPOCH]):
            for way in ("net_sent(MB/s)", "net_recv(MB/s)"):  # the window's bytes against the payload's
                assert 0.85 <= row[way] * 1e6 * (end - begin) / (payload * timed) <= 1.25, (row, payload, timed)
    two = nodes[nodes["nodes"] == 2]
    alone = nodes[nodes["nodes"] == 1].iloc[0]
    assert alone["net_sent(MB/s)"] < 0.02 * two["net_sent(MB/s)"].min()  # one node: nothing leaves it
    assert (out / "scale_strong_nodes.png").exists()


def test_a_calibration_over_a_shaped_link_fits_its_rate_and_predicts_a_slower_one(tmp_path, mlp,
                                                                                  namespaces_restored):
    """Known truth: the kernel's tbf at 0.2 Gbit/s. Calibrating over 2 namespace nodes fits β from a bench over that
    link (each byte 40 ns on the wire; tbf delivers ~0.19 Gbit/s here) and β_hosts from a loopback bench, which is
    far faster; another link is then predicted from the same hosts (perf/links.py). The bench is the default sweep
    (1 KiB-4 MiB) with 2 warm-up and 10 timed iterations a size instead of 5 and 30: over the shaped link one round
    of the sweep takes ~0.24 s and the timed ones run twice (as a loop and one by one), so the default bench alone
    took 22 s of the test's 75; the rate it fits is the link's, whatever the count."""
    import dataclasses

    from scalelab.config import TrainConfig
    from scalelab.lab.cells import Cells
    from scalelab.perf.calibrate import bench_config, calibrate, gradient_sizes
    from scalelab.perf.links import NodeLink, wire_beta

    base = TrainConfig(model=mlp, samples=256, eval_samples=16, ranks=1, local_nodes=2, link_gbps=0.2,
                       global_batch=8, steps=4, warmup_steps=1, eval_every=1000, hang_timeout_s=120)
    bench = dataclasses.replace(bench_config(base, gradient_sizes(base)[0]), warmup=2, iters=10)
    cal = calibrate(base, Cells(Store(tmp_path / "store"), "cal"), batches=[4, 8], bench=bench, say=lambda _: None)
    assert (cal.nodes, cal.link_gbps, cal.ranks) == (2, 0.2, 2)
    gbps = 8 / cal.beta_s_per_byte / 1e9
    print(f"\nfitted over a 0.2 Gbit/s tbf link: {gbps:.3f} Gbit/s")
    # the shaped rate, give or take the fit (unshaped: ~6): a least-squares line over 1 KiB-4 MiB on busy
    # cores, whose mid sizes run below the rate (TCP's ramp), can come out shallower (faster) than the wire
    # (0.252 once in CI, where the bound was 0.25); what the model predicts with never beats the wire
    assert 0.14 < gbps < 0.2 * 1.35, gbps
    assert cal.hardware().beta_inter >= wire_beta(0.2)  # nothing beats its link
    assert cal.host_beta_s_per_byte is not None and cal.host_beta_s_per_byte < cal.beta_s_per_byte / 5
    slower = cal.hardware(link=NodeLink(True, 0.1))
    # half the rate: twice the wire's β, never faster than the rate less TCP/IP headers, the hosts' part scaled
    assert slower.beta_inter == pytest.approx(max(2 * cal.beta_s_per_byte, wire_beta(0.1),
                                                  cal.comm_scale * cal.host_beta_s_per_byte))
    assert 0.07 < 8 / slower.beta_inter / 1e9 < 0.0957
    assert [p["per_rank_batch"] for p in cal.points] == [4, 8]  # compute at the node count calibrated
    # the model-error term's residuals (perf/modelerror.py): each in-situ launch left out with its batch (2 batches ×
    # allreduce and bucketed), and the in-situ strategies at batch 8 over the same nodes unshaped
    checks = [(r["check"], r["link"], r["per_rank_batch"]) for r in cal.residuals]
    assert sorted(checks) == sorted([("leave batch out", "a 0.2 Gbit/s link (tbf)", b) for b in (4, 4, 8, 8)]
                                    + [("other link", "an unshaped link", 8)] * 2), checks


def test_a_users_script_runs_across_nodes(tmp_path, namespaces_restored):
    # `scalelab run --local-nodes 2`: the seed-like script (with the probe) on 2 namespace nodes of one rank. Both
    # ranks report their steps into the one run, and each rank's collectives are those of the other (one DDP job)
    from seed_script import collectives, seed_script

    store = tmp_path / "store"
    res = run_cli(["run", "--store", str(store), "--local-nodes", "2", "--", "python",
                   str(seed_script(tmp_path, probe=True))], timeout=200)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = Store(store).list_runs()
    assert list(runs["status"]) == ["completed"] and list(runs["ranks"]) == [2]
    run = Store(store).get(runs["run_id"][0])
    assert (run["config"]["local_nodes"], run["config"]["nnodes"], run["config"]["ranks"]) == (2, 2, 1)
    assert run["summary"][keys.RANKS_REPORTED] == 2 and run["summary"][keys.COMM_BYTES_TOTAL] > 0
    rundir = RunDir(run["dir"])
    assert all(count % 2 == 0 for count in collectives(run["dir"]).values())  # every collective on both ranks
    per_rank = [[(e[0], e[4]) for r in rundir.read_steps(rank) for e in r["comm_events"]] for rank in (0, 1)]
    assert per_rank[0] and per_rank[0] == per_rank[1]
    steps = {rank: [r["step"] for r in rundir.read_steps(rank)] for rank in (0, 1)}
    assert steps[0] == steps[1] and len(steps[0]) >= 6


def test_horovod_runs_across_nodes_without_horovodrun(tmp_path, mlp, namespaces_restored):
    # each node's agent starts its own Horovod ranks (run/hvdnode.py); node 0 hosts the rendezvous server and the
    # side process group's store on its private address. The bias-free MLP's gradients, every step on each rank
    from scalelab.engines import registry

    missing = registry.get("horovod").unavailable()
    if missing:
        pytest.skip(missing)
    root = tmp_path / "store"
    res = run_cli(_train_args(mlp, root, "--steps", "6", "--engine", "horovod"), timeout=200)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["completed"] and list(runs["ranks"]) == [2]
    run = Store(root).get(runs["run_id"][0])
    assert (run["config"]["engine"], run["config"]["nnodes"], run["summary"][keys.RANKS_REPORTED]) == ("horovod", 2, 2)
    param_bytes = (3072 * 16 + 16 * 16 + 16 * 10) * 4
    for rank in (0, 1):
        records = read_jsonl(Path(run["dir"]) / f"steps.rank{rank}.jsonl")
        assert [r["comm_bytes_backward"] for r in records] == [param_bytes] * 6
    assert (Path(run["dir"]) / "logs" / "horovod.rank1.log").exists()  # node 1's rank, its own log
