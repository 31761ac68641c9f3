"""The launcher of `--local-nodes N`: a run's ranks on N namespaced nodes of this machine (run/netns.py).

Each node gets one node agent, `ip netns exec <node> python -m scalelab.run.nodeagent SPEC`, which runs torchrun's
elastic agent for that node (`run_torchrun`, nnodes N, its node rank, a static rendezvous on node 0's private
address), its ranks' gloo/NCCL sockets on the node's interface. So the rendezvous store and the collectives
listen only inside the namespaces, never on the host. All nodes share this machine's filesystem: every rank
writes into the one run directory, which this process summarises as for any run.

A node agent that fails writes its root cause (`failure.node<k>.json`) into the run directory; the first failure
stops the other nodes (their process groups, then whatever is left in the namespaces), and the run fails with one
line naming the node and its ranks. The cluster is removed at the end whatever happened, Ctrl-C included.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from scalelab.errors import ScalelabError
from scalelab.run import netns
from scalelab.run.launch import Launcher, LaunchSpec, torchrun_launch
from scalelab.run.watchdog import kill_local_ranks
from scalelab.store.rundir import RunDir

NODE_AGENT = "scalelab.run.nodeagent"
RDZV_PORT = 29500  # the namespace is private to the run: nothing else can hold the port there
SETTLE_S = 5.0  # after the first failure, how long the other nodes get to notice and record their own
STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL of a node agent's process group


class NodeFailed(ScalelabError):
    """A node of a --local-nodes run failed; the message names the node, its ranks and the root cause."""


class LocalNodes:
    """The launcher (a `Launcher`) for a config with local_nodes > 0 (TrainConfig or CommBenchConfig): a cluster
    for the duration of the launch, the spec's ranks run across it."""

    def __init__(self, cfg: Any, node_launcher: Launcher = torchrun_launch):
        self.cfg = cfg
        self.node_launcher = node_launcher  # what each node's agent runs for its ranks (torchrun, Horovod's)
        self.spec: LaunchSpec | None = None
        self.cluster: netns.Cluster | None = None
        self.agents: list[subprocess.Popen] = []  # the running launch's node agents

    def __call__(self, spec: LaunchSpec) -> None:
        cfg = self.cfg
        with netns.local_cluster(cfg.local_nodes, link_gbps=cfg.link_gbps,
                                 link_delay_ms=cfg.link_delay_ms) as cluster:
            self.spec, self.cluster = spec, cluster
            try:
                run_on_cluster(spec, cluster, self.agents, launcher=launcher_name(self.node_launcher))
            finally:
                self.cluster = None

    def abort(self, beats: dict) -> None:
        """The hang watchdog's abort: the ranks that published a pid (so they flush), then every node agent; an
        agent blocked in the rendezvous (a node that never joined) started no rank at all."""
        kill_local_ranks(beats)
        stop_agents(self.agents)

    def unreachable(self) -> str | None:
        """'node 1 (rank 1) unreachable ...' for the nodes the switch cannot reach now; None when all answer."""
        cluster, spec = self.cluster, self.spec
        if cluster is None or spec is None:
            return None
        lost = netns.unreachable_nodes(cluster)
        if not lost:
            return None
        names = ", ".join(f"node {k} ({ranks_of(spec, k)})" for k in lost)
        return f"{names} unreachable: no answer on the cluster network within {netns.PROBE_TIMEOUT_S:g} s"


def node_spec(spec: LaunchSpec, cluster: netns.Cluster, k: int) -> LaunchSpec:
    """Node k's part of `spec`: its node rank, node 0's private address as the endpoint, sockets on its link."""
    iface = {"GLOO_SOCKET_IFNAME": netns.IFACE, "NCCL_SOCKET_IFNAME": netns.IFACE}
    # c10d looks up the peer's host name of every store connection and warns when it cannot: the private
    # addresses have no name (no DNS here), so every connection would print a warning; errors still show
    quiet_lookups = {} if "TORCH_CPP_LOG_LEVEL" in os.environ else {"TORCH_CPP_LOG_LEVEL": "ERROR"}
    return dataclasses.replace(spec, nnodes=len(cluster.nodes), node_rank=k,
                               env={**spec.env, **iface, **quiet_lookups},
                               endpoint=f"{cluster.nodes[0].address}:{RDZV_PORT}")


def launcher_name(launcher: Launcher) -> str:
    """The name a node agent finds the launcher by (run/kinds.LAUNCHERS)."""
    from scalelab.run.kinds import LAUNCHERS

    return next(name for name, fn in LAUNCHERS.items() if fn is launcher)


def agent_argv(spec: LaunchSpec, node: netns.Node, launcher: str = "torchrun") -> list[str]:
    payload = json.dumps({**dataclasses.asdict(spec), "run_dir": str(spec.run_dir), "args": list(spec.args),
                          "launcher": launcher})
    return ["ip", "netns", "exec", node.netns, sys.executable, "-m", NODE_AGENT, payload]


def ranks_of(spec: LaunchSpec, k: int) -> str:
    """'rank 1' or 'ranks 2-3': the global ranks on node k."""
    first, last = k * spec.nproc_per_node, (k + 1) * spec.nproc_per_node - 1
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def run_on_cluster(spec: LaunchSpec, cluster: netns.Cluster, agents: list[subprocess.Popen] | None = None, *,
                   launcher: str = "torchrun") -> None:
    """Start a node agent per node (into `agents`) and wait for them; raises NodeFailed naming the root cause when
    one fails."""
    rundir = RunDir(spec.run_dir)
    for k in range(len(cluster.nodes)):
        rundir.node_failure_file(k).unlink(missing_ok=True)  # from an earlier attempt of a resumed run
    agents = [] if agents is None else agents
    agents.clear()
    ended: dict[int, float] = {}  # node -> when its agent was seen to end
    stopped: set[int] = set()  # nodes this process stopped (their failure is a consequence)
    try:
        for node in cluster.nodes:
            part = node_spec(spec, cluster, node.index)
            # own session: a Ctrl-C at the terminal reaches scalelab, which stops the nodes in order. The agent's
            # own environment has the node's too: torch reads TORCH_CPP_LOG_LEVEL when it is imported.
            agents.append(subprocess.Popen(agent_argv(part, node, launcher), start_new_session=True,
                                           env={**os.environ, **part.env},
                                           stdin=subprocess.PIPE if node.index == 0 else subprocess.DEVNULL))
        failed_at = None
        while len(ended) < len(agents):
            for k, proc in enumerate(agents):
                if k not in ended and proc.poll() is not None:
                    ended[k] = time.time()
                    if proc.returncode != 0 and failed_at is None:
                        failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > SETTLE_S:
                break
            if all(k in ended for k in range(1, len(agents))):
                _close(agents[0].stdin)  # the other nodes are done with node 0's store: it may end
            time.sleep(0.1)
        if failed_at is None:
            return
    finally:
        stopped |= {k for k, proc in enumerate(agents) if proc.poll() is None}
        stop_agents(agents)
    raise NodeFailed(root_cause(spec, agents, ended, stopped))


def _close(pipe) -> None:
    if pipe is not None and not pipe.closed:
        pipe.close()


def stop_agents(agents: list[subprocess.Popen]) -> None:
    """SIGTERM each running agent's process group (torchrun's agent stops its ranks), SIGKILL after a grace."""
    for proc in agents:
        _close(proc.stdin)
    running = [p for p in list(agents) if p.poll() is None]
    for proc in running:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the agent's pid
    except ProcessLookupError:
        pass


def root_cause(spec: LaunchSpec, agents: list[subprocess.Popen], ended: dict[int, float], stopped: set[int]) -> str:
    """One line: the earliest failure that was not a consequence of another (a peer gone, a stop by us)."""
    rundir = RunDir(spec.run_dir)
    candidates = []
    for k, proc in enumerate(agents):
        where = f"node {k} ({ranks_of(spec, k)})"
        record = rundir.read_node_failure(k)
        if record is not None:
            candidates.append((record["consequence"] or k in stopped, record["time"], k,
                               f"{where}: {record['reason']}"))
        elif proc.returncode:
            how = (f"its processes were killed by signal {signal.Signals(-proc.returncode).name}"
                   if proc.returncode < 0 else f"its agent exited with code {proc.returncode}")
            candidates.append((k in stopped, ended.get(k, time.time()), k, f"{where}: {how}"))
    if not candidates:
        return "a node failed without a reason"
    return min(candidates)[3]
