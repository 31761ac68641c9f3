"""The launcher of `--launcher slurm`: a run's nodes are the first `local_nodes` nodes of the Slurm allocation this
process runs in (salloc, or an sbatch script), its ranks one job step across them.

    srun --nodes k --ntasks-per-node 1 --nodelist n0,n1 ... python -m scalelab.run.nodeagent SPEC

One task per node: the node agent (run/nodeagent.py) reads its node rank from SLURM_NODEID and runs torchrun's
elastic agent (or Horovod's per-node start) for that node's ranks, with a static rendezvous on the step's first
node, at the address Slurm itself reaches it on (its NodeAddr). Every rank writes into the one run directory, so
the store must be on a filesystem the nodes share; this process summarises it as for any run.

Each agent records where it ran (`slurm.node<k>.json`: job, step, Slurm node, host) and, once its ranks are done,
that it is done; node 0 keeps the rendezvous store up until every other node is (torchrun's exit barrier reads it).
A node whose agent failed writes its root cause (`failure.node<k>.json`) as on namespace nodes; a node that
vanished (SIGKILLed, its machine gone) writes nothing, and is named as lost. The first failure stops the step
(scancel, then srun itself); the job's provenance names the job, step and nodes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scalelab.errors import ScalelabError, StoreError
from scalelab.run.launch import LaunchSpec
from scalelab.run.nodes import NODE_AGENT, RDZV_PORT, SETTLE_S, NodeFailed, ranks_of
from scalelab.run.watchdog import kill_local_ranks
from scalelab.store.rundir import RunDir

PORT_ENV = "SCALELAB_PORT"  # the rendezvous port on the step's first node (as in `scalelab slurm`'s script)
SLURMD_PORT = 6818  # slurmd's default port: a node whose slurmd answers a connect is reachable
PROBE_TIMEOUT_S = 2.0
SRUN_GRACE_S = 2.0  # SIGTERM to SIGKILL of srun, after the step was cancelled


class SlurmUnavailable(ScalelabError):
    """--launcher slurm where it cannot run: outside an allocation, or more nodes than the allocation has."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hosts: tuple[str, ...]  # the allocation's Slurm node names, in Slurm's order (a step's node 0 is the first)


def expand_nodelist(nodelist: str) -> list[str]:
    """`n[0-2],gpu7` -> ['n0', 'n1', 'n2', 'gpu7'], by Slurm's own parser (scontrol)."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise SlurmUnavailable(f"SLURM_JOB_NODELIST {nodelist!r}: scontrol cannot expand it: {out.stderr.strip()}")
    return out.stdout.split()


def allocation(environ: Mapping[str, str] = os.environ,
               expand: Callable[[str], list[str]] = expand_nodelist) -> Allocation:
    """The Slurm allocation this process runs in; SlurmUnavailable outside one."""
    job, nodelist = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job or not nodelist:
        raise SlurmUnavailable("nodes_launcher slurm: not inside a Slurm allocation (SLURM_JOB_ID and "
                               "SLURM_JOB_NODELIST unset); run it under salloc or in an sbatch script, or use "
                               "--launcher namespaces")
    return Allocation(job, tuple(expand(nodelist)))


def check_nodes(nodes: int, alloc: Allocation) -> None:
    if nodes > len(alloc.hosts):
        raise SlurmUnavailable(f"local_nodes {nodes}: Slurm job {alloc.job_id} has {len(alloc.hosts)} node(s) "
                               f"({','.join(alloc.hosts)}); allowed: 1..{len(alloc.hosts)}")


def uses_slurm(cfg: Any) -> bool:
    return bool(getattr(cfg, "local_nodes", 0)) and getattr(cfg, "nodes_launcher", "namespaces") == "slurm"


def refuse_unlaunchable(configs: Iterable[Any], environ: Mapping[str, str] = os.environ,
                        expand: Callable[[str], list[str]] = expand_nodelist) -> None:
    """Refuse, before any of them starts, configs that --launcher slurm cannot launch here: none outside an
    allocation, none with more nodes than it has (a study's cells are checked together, so the 4-node cell does
    not fail after the 1- and 2-node cells ran)."""
    wanted = max((c.local_nodes for c in configs if uses_slurm(c)), default=0)
    if wanted:
        check_nodes(wanted, allocation(environ, expand))


def node_address(host: str) -> str:
    """The address Slurm reaches `host` on (its NodeAddr; the name itself when scontrol does not say)."""
    out = subprocess.run(["scontrol", "show", "node", host], capture_output=True, text=True, timeout=30).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("NodeAddr=")), host) or host


def srun_argv(spec: LaunchSpec, hosts: tuple[str, ...], *, step_name: str, launcher: str = "torchrun",
              cpus_per_task: str | None = None) -> list[str]:
    """The job step of a run across `hosts`: one node agent per node, each told to read its node rank from
    SLURM_NODEID (node_rank -1). --nodelist: the step's node 0 is the first host, the rendezvous host. No
    --kill-on-bad-exit: srun would SIGKILL the other nodes before they record why they failed (a peer gone), and
    the launcher could no longer tell the node that was lost from the ones srun stopped; the launcher ends the
    step itself SETTLE_S after the first failure, as on namespace nodes."""
    payload = json.dumps({**dataclasses.asdict(spec), "run_dir": str(spec.run_dir), "args": list(spec.args),
                          "launcher": launcher, "slurm": True})
    # --ntasks too: inside sbatch, srun would take the job's task count (SLURM_NTASKS) for a step of fewer nodes
    return ["srun", "--nodes", str(len(hosts)), "--ntasks", str(len(hosts)), "--ntasks-per-node", "1",
            "--nodelist", ",".join(hosts),
            # the agent and its ranks get the node's CPUs of the job, not the one CPU a task gets by default
            *(["--cpus-per-task", cpus_per_task] if cpus_per_task else []),
            f"--job-name={step_name}", "--export=ALL",
            sys.executable, "-m", NODE_AGENT, payload]


class SlurmNodes:
    """The launcher (a `Launcher`) for a config with local_nodes k > 0 and nodes_launcher slurm: one job step
    across the allocation's first k nodes."""

    def __init__(self, cfg: Any, launcher: str = "torchrun", environ: Mapping[str, str] = os.environ):
        self.cfg, self.launcher, self.environ = cfg, launcher, environ
        self.alloc: Allocation | None = None
        self.spec: LaunchSpec | None = None
        self.srun: subprocess.Popen | None = None
        self.addresses: list[str] = []

    def __call__(self, spec: LaunchSpec) -> None:
        alloc = self.alloc = allocation(self.environ)
        k = self.cfg.local_nodes
        check_nodes(k, alloc)
        hosts = alloc.hosts[:k]
        self.addresses = [node_address(h) for h in hosts]
        port = self.environ.get(PORT_ENV, str(RDZV_PORT))
        quiet_lookups = {} if "TORCH_CPP_LOG_LEVEL" in os.environ else {"TORCH_CPP_LOG_LEVEL": "ERROR"}
        part = self.spec = dataclasses.replace(spec, nnodes=k, node_rank=-1, env={**spec.env, **quiet_lookups},
                                               endpoint=f"{self.addresses[0]}:{port}")
        rundir = RunDir(spec.run_dir)
        for n in range(k):  # from an earlier attempt of a resumed run
            rundir.node_failure_file(n).unlink(missing_ok=True)
            rundir.slurm_node_file(n).unlink(missing_ok=True)
        argv = srun_argv(part, hosts, step_name=f"scalelab-{rundir.run_id}", launcher=self.launcher,
                         cpus_per_task=self.environ.get("SLURM_CPUS_ON_NODE"))
        # own session: a Ctrl-C at the terminal reaches scalelab, which ends the step in order
        self.srun = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, **part.env})
        errors = relay_errors(self.srun)
        try:
            with sigterm_interrupts():
                failed = wait_step(self.srun, rundir, k)
        finally:
            self.stop()
            record_provenance(rundir, alloc.job_id, k)
        if failed or self.srun.returncode != 0:
            raise NodeFailed(root_cause(part, rundir, hosts, self.srun.returncode, srun_error=errors.last()))

    def stop(self) -> None:
        """End the step: scancel it (every node's tasks, wherever they run), then srun itself."""
        proc = self.srun
        if proc is None or proc.poll() is not None:
            return
        step = step_id(RunDir(self.spec.run_dir), self.cfg.local_nodes) if self.spec else None
        if step is not None and self.alloc is not None:
            subprocess.run(["scancel", f"{self.alloc.job_id}.{step}"], capture_output=True, timeout=30)
        proc.send_signal(signal.SIGTERM)  # srun forwards it to the tasks and ends the step
        try:
            # short: scancel has ended the tasks already; a srun still up waits for a node that is gone
            proc.wait(timeout=SRUN_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def abort(self, beats: dict) -> None:
        """The hang watchdog's abort: the ranks of this host that published a pid (so they flush), then the step."""
        kill_local_ranks(beats)
        self.stop()

    def unreachable(self) -> str | None:
        """'node 2 (Slurm node n2, rank 2) unreachable ...' for the step's nodes whose slurmd gives no answer."""
        if self.spec is None or self.alloc is None:
            return None
        lost = [k for k, address in enumerate(self.addresses) if not answers(address)]
        if not lost:
            return None
        names = ", ".join(node_name(self.spec, self.alloc.hosts, k) for k in lost)
        return f"{names} unreachable: slurmd gave no answer within {PROBE_TIMEOUT_S:g} s"


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM (scancel of the job, the end of its time limit) as a Ctrl-C while a step runs: the step is ended in
    order and the run marked interrupted, instead of scalelab dying with the step left to Slurm and the run
    "running". Only in the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Errors:
    """srun's stderr relayed to ours line by line (the ranks' output comes through it too); keeps srun's own last
    error, the root cause of a step that never started ("Unable to create step ...")."""

    def __init__(self, pipe):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._relay, args=(pipe,), daemon=True)
        self.thread.start()

    def _relay(self, pipe) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            if line.startswith("srun: error:"):
                self.lines.append(line.strip())
        pipe.close()

    def last(self) -> str | None:
        self.thread.join(timeout=1.0)
        return self.lines[-1] if self.lines else None


def relay_errors(proc: subprocess.Popen) -> _Errors:
    return _Errors(proc.stderr)


def answers(address: str, port: int = SLURMD_PORT) -> bool:
    """Whether a host answers a TCP connect on `port` (a refusal is an answer too)."""
    try:
        with socket.create_connection((address, port), timeout=PROBE_TIMEOUT_S):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def wait_step(proc: subprocess.Popen, rundir: RunDir, nodes: int, poll_s: float = 0.1) -> bool:
    """Wait for the step; True when a node recorded a failure (the step is then left SETTLE_S for the other nodes
    to record theirs, and the caller stops it)."""
    failed_at = None
    while proc.poll() is None:
        if failed_at is None and any(rundir.node_failure_file(k).exists() for k in range(nodes)):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > SETTLE_S:
            break
        time.sleep(poll_s)
    return failed_at is not None or any(rundir.node_failure_file(k).exists() for k in range(nodes))


def read_nodes(rundir: RunDir, nodes: int) -> dict[int, dict]:
    out = {}
    for k in range(nodes):
        try:
            out[k] = rundir.read_slurm_node(k)
        except (OSError, ValueError, StoreError):  # not written (yet): the node's agent never started
            continue
    return out


def step_id(rundir: RunDir, nodes: int) -> str | None:
    return next((rec["step"] for rec in read_nodes(rundir, nodes).values() if rec.get("step") is not None), None)


def record_provenance(rundir: RunDir, job_id: str, nodes: int) -> None:
    """The run's provenance gets its Slurm job, step and nodes (in node-rank order) and the machines' host names."""
    seen = read_nodes(rundir, nodes)
    try:
        provenance = rundir.read_provenance()
    except (OSError, ValueError, StoreError):
        return
    provenance["slurm"] = {"job": job_id, "step": step_id(rundir, nodes),
                           "nodes": [seen.get(k, {}).get("node") for k in range(nodes)],
                           "hosts": [seen.get(k, {}).get("host") for k in range(nodes)]}
    rundir.write_provenance(provenance)


def node_name(spec: LaunchSpec, hosts: tuple[str, ...], k: int) -> str:
    return f"node {k} (Slurm node {hosts[k]}, {ranks_of(spec, k)})"


def last_beat(rundir: RunDir, spec: LaunchSpec, k: int) -> float:
    """When node k's ranks last wrote a heartbeat (now if never): of several nodes that ended without a record,
    the one lost first stopped beating first."""
    times = []
    for rank in range(k * spec.nproc_per_node, (k + 1) * spec.nproc_per_node):
        try:
            times.append(rundir.heartbeat_file(rank).stat().st_mtime)
        except OSError:
            continue
    return max(times, default=time.time())


def root_cause(spec: LaunchSpec, rundir: RunDir, hosts: tuple[str, ...], returncode: int | None, *,
               srun_error: str | None = None) -> str:
    """One line: the earliest failure that was not a consequence of another; a node that recorded neither a
    failure nor its end vanished (SIGKILLed, its machine or slurmd gone): it comes before any consequence."""
    seen = read_nodes(rundir, spec.nnodes)
    if not seen and srun_error:  # no node agent started: the step itself was refused
        return f"the job step across {','.join(hosts)} did not start: {srun_error}"
    candidates = []
    for k in range(spec.nnodes):
        record = rundir.read_node_failure(k)
        if record is not None:
            candidates.append((record["consequence"], record["time"], k,
                               f"{node_name(spec, hosts, k)}: {record['reason']}"))
        elif not seen.get(k, {}).get("done"):
            how = ("lost: its node agent ended with no record (its processes killed, or the node gone)"
                   if k in seen else "lost: its node agent never started")
            candidates.append((False, last_beat(rundir, spec, k), k, f"{node_name(spec, hosts, k)} {how}"))
    if not candidates:
        return f"the job step failed (srun exited with code {returncode}) with every node done"
    return min(candidates)[3]
