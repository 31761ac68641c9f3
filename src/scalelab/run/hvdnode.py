"""Horovod's ranks of one node of a multi-node run, without ssh (`--local-nodes`, or `scalelab slurm --engine
horovod`: every node runs this launcher for its own ranks).

horovodrun starts the ranks of other hosts over ssh, which namespace nodes do not have and many Slurm sites do not
allow between compute nodes. Its gloo mode needs only two things, which this module provides per node, as
horovodrun's gloo_run does for all nodes from one host:
- a rendezvous HTTP server that knows the slot plan (each rank's host, rank, local and cross rank). Node 0 runs it,
  bound to its own address (the endpoint's host) on the endpoint's port; horovodrun's binds every interface;
- each rank's HOROVOD_* environment: its slot, the server, the controller and operations (gloo) and the interface
  gloo's sockets use (the spec's GLOO_SOCKET_IFNAME: the nodes' shared network).
Hosts in the plan are named node0..node<N-1>: the names only group ranks into nodes (gloo's sockets use the
interface's address). Node 0 also hosts the store of the torch process group the ranks keep beside Horovod
(engines/horovod.py), on the endpoint's port + 1, bound to the same address.

Each rank's output goes to the run's logs/ (`horovod.rank<r>.log`) and to the terminal unless the spec is quiet.
When a rank fails the node's other ranks are ended and LaunchFailed names the rank and its last error line; a
rank ended because its peer on another node went away is a consequence, as in horovodrun's output
(run/horovodrun.RankExit).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from scalelab.engines.horovod import STORE_ENV
from scalelab.errors import ConfigError
from scalelab.run.horovodrun import RankExit, horovodrun_launch
from scalelab.run.launch import LaunchFailed, LaunchSpec, bound_store
from scalelab.store.rundir import RunDir

STOP_GRACE_S = 5.0


def slot_env(spec: LaunchSpec, local_rank: int) -> dict[str, str]:
    """The HOROVOD_* variables of one rank of this node (horovodrun's create_slot_env_vars and run env)."""
    host, port = spec.endpoint.rsplit(":", 1)
    iface = spec.env.get("GLOO_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME")
    if not iface:
        raise ConfigError("GLOO_SOCKET_IFNAME", "", "Horovod across nodes needs the interface the nodes share; "
                                                    "export GLOO_SOCKET_IFNAME=<interface>")
    n, k, r = spec.nnodes, spec.node_rank, spec.nproc_per_node
    return {"HOROVOD_HOSTNAME": f"node{k}", "HOROVOD_RANK": str(k * r + local_rank), "HOROVOD_SIZE": str(n * r),
            "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(r), "HOROVOD_CROSS_RANK": str(k),
            "HOROVOD_CROSS_SIZE": str(n), "HOROVOD_GLOO_RENDEZVOUS_ADDR": host,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": port, "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface, STORE_ENV: f"{host}:{int(port) + 1}"}


@contextlib.contextmanager
def rendezvous_server(host: str, port: int, nnodes: int, ranks: int) -> Iterator[None]:
    """Horovod's rendezvous HTTP server for the plan of `nnodes` nodes of `ranks` ranks, on host:port only."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http import http_server

    find_port = http_server.find_port
    http_server.find_port = lambda factory: (factory((host, port)), port)  # this address and port, none other
    try:
        server = http_server.RendezvousServer()
        server.start()
    finally:
        http_server.find_port = find_port
    plan = get_host_assignments(parse_hosts(",".join(f"node{k}:{ranks}" for k in range(nnodes))), nnodes * ranks)
    server.init(plan)
    try:
        yield
    finally:
        server.stop()


@contextlib.contextmanager
def node0_services(spec: LaunchSpec) -> Iterator[None]:
    """On node 0, the rendezvous server and the side process group's store; nothing on the other nodes."""
    if spec.node_rank != 0:
        yield
        return
    host, port = spec.endpoint.rsplit(":", 1)
    with rendezvous_server(host, int(port), spec.nnodes, spec.nproc_per_node), bound_store(host, int(port) + 1):
        yield


def horovod_launch(spec: LaunchSpec) -> None:
    """The Horovod engine's launcher: horovodrun on one node, this module's per-node launch on several."""
    (horovodrun_launch if spec.nnodes == 1 else horovod_node_launch)(spec)


def horovod_node_launch(spec: LaunchSpec) -> None:
    """Start this node's ranks (node 0: after its services) and wait for them; LaunchFailed when one fails."""
    if spec.endpoint is None:
        raise ConfigError("rdzv_endpoint", None, "Horovod across nodes needs node 0's host:port")
    envs = [slot_env(spec, local) for local in range(spec.nproc_per_node)]  # refused before anything starts
    logs = RunDir(spec.run_dir).logs
    logs.mkdir(parents=True, exist_ok=True)
    with node0_services(spec):
        ranks = [_start(spec, env, logs) for env in envs]
        failed = _wait(ranks)
    if failed:
        raise LaunchFailed(min(failed, key=lambda e: e.stopped).reason(), "")


class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen, log: Path, pump: threading.Thread):
        self.rank, self.proc, self.log, self.pump = rank, proc, log, pump


def _start(spec: LaunchSpec, env: dict[str, str], logs: Path) -> _Rank:
    rank = int(env["HOROVOD_RANK"])
    log = logs / f"horovod.rank{rank}.log"
    argv = [sys.executable, "-m", spec.module, "--run-dir", str(spec.run_dir), *spec.args]
    # in this launcher's process group: a stop of the group (the --local-nodes launcher's) reaches them too
    proc = subprocess.Popen(argv, env={**os.environ, **spec.env, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    pump = threading.Thread(target=_pump, args=(proc, log, rank, spec.quiet), daemon=True)
    pump.start()
    return _Rank(rank, proc, log, pump)


def _pump(proc: subprocess.Popen, log: Path, rank: int, quiet: bool) -> None:
    with log.open("a") as out:
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if not quiet:
                print(f"[{rank}] {line}", end="", flush=True)


def _wait(ranks: list[_Rank]) -> list[RankExit]:
    """Wait for every rank; after the first failure end the others. The failed ranks, in the order they ended."""
    failed: list[RankExit] = []
    try:
        running = list(ranks)
        while running:
            for r in list(running):
                code = r.proc.poll()
                if code is None:
                    continue
                running.remove(r)
                r.pump.join(timeout=5)
                if code:
                    failed.append(RankExit(r.rank, 128 - code if code < 0 else code, _last_line(r.log)))
            if failed and running:
                _stop([r.proc for r in running])
            time.sleep(0.1)
    finally:
        _stop([r.proc for r in ranks if r.proc.poll() is None])
    return failed


def _last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    return lines[-1] if lines else ""


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each rank (it flushes its records), SIGKILL after a grace."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
