"""A real Slurm cluster on this machine for tests: Debian's slurm-wlm and munge over namespace nodes (run/netns.py).

    with slurm_cluster(tmp_path, nodes=2) as slurm:      # munged, slurmctld, slurmd n0 and n1, all idle
        slurm.run("sbatch", "--parsable", "job.sbatch")  # any Slurm command, inside the cluster's network

Layout: munged (a private key and socket under `root`) and slurmctld (on the switch's address) in the cluster's
switch namespace, and one `slurmd -N n<k>` in each node's namespace with
NodeAddr its private address, so every job step runs inside its node's namespace. Everything Slurm writes (state,
spool, logs, pid files) is under `root`; slurm.conf is found through SLURM_CONF, nothing under /etc is touched.
Slurm commands run in the switch namespace: the host has no route to the cluster's /24.

The namespaces carry their own prefix (PREFIX), apart from scalelab's own clusters. At the end every daemon is
stopped by its pid and the namespaces are removed with whatever still runs inside them (slurmstepd, job steps);
everything started runs inside a namespace of the cluster, so after a SIGKILLed test the next cluster's leftover
sweep (netns.create_cluster) ends it all.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.run import netns

PREFIX = "slurmlab-"
PACKAGES = "slurm-wlm munge"  # Debian's; .ci/run installs them
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "squeue")
UP_TIMEOUT_S = 60.0  # daemons started to every node idle
STOP_GRACE_S = 5.0
SLURMD_TIMEOUT_S = 60


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (one line), or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"needs {PACKAGES} (Debian packages): {', '.join(missing)} not found on PATH"
    try:
        netns.check_usable()
    except netns.NamespacesUnavailable as err:
        return str(err)
    return None


@dataclass
class SlurmCluster:
    cluster: netns.Cluster
    root: Path
    conf: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command in the switch namespace (where slurmctld listens), with this cluster's slurm.conf."""
        return subprocess.run(["ip", "netns", "exec", self.cluster.switch, *argv], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, timeout=timeout)

    def logs(self) -> str:
        """The tail of every daemon's log: what a failing test shows."""
        parts = []
        for path in sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(parts)


# slurmd initialises a cgroup plugin even when nothing uses it (proctrack/linuxproc, task/none below); its
# autodetection does not recognise a v1 hierarchy under a tmpfs /sys/fs/cgroup ("No filesystem mounted on
# /sys/fs/cgroup"), so name it. Nothing is created in it: no cgroup constraint is configured.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


def node_name(k: int) -> str:
    return f"n{k}"


def slurm_conf(cluster: netns.Cluster, root: Path, munge_socket: Path) -> str:
    """A minimal slurm.conf: one partition of 1-CPU nodes, no cgroups, no accounting, root runs everything."""
    ctl_address = cluster.switch_address
    names = ",".join(node_name(n.index) for n in cluster.nodes)
    lines = [
        "ClusterName=scalelab",
        # slurmctld only starts where the host name is the controller's: the namespaces share the host's name
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctl_address})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/linear",
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "ReturnToService=2",
        # a node whose slurmd is gone (a node-loss test SIGKILLs everything in its namespace) is DOWN, and its job
        # steps end, within a minute instead of the default 300 s; still later than a test's hang timeout, so that
        # scalelab, not Slurm, is the first to act on a node lost silently (its link down)
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SlurmdParameters=config_overrides",  # a node's 2 real CPUs against CPUs=1 below is not a mismatch
        *(f"NodeName={node_name(n.index)} NodeAddr={n.address} CPUs=1 State=UNKNOWN" for n in cluster.nodes),
        f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:  # the daemon's stderr (its own log file has the rest)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def start_munge(root: Path, netns_name: str) -> tuple[subprocess.Popen, Path]:
    """munged in the foreground with a fresh key, inside `netns_name` (it needs no network: clients reach it on a
    Unix socket in `root`; inside a namespace of the cluster, a leftover sweep after a SIGKILL ends it too);
    returns it and its socket once the socket exists."""
    key, sock = root / "munge.key", root / "munge.socket"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    key.chmod(0o600)
    proc = _start(["ip", "netns", "exec", netns_name, "munged", "--foreground", "--force", f"--socket={sock}",
                   f"--key-file={key}", f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
                   f"--seed-file={root}/munged.seed"], root / "munged.stderr.log")
    _wait(lambda: sock.exists() or proc.poll() is not None, 10, "munged's socket")
    if proc.poll() is not None:
        raise RuntimeError(f"munged exited with code {proc.returncode}: "
                           f"{(root / 'munged.stderr.log').read_text()[-1000:]}")
    return proc, sock


def _wait(done, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready within {timeout:g} s")
        time.sleep(0.2)


def idle_nodes(slurm: SlurmCluster) -> set[str]:
    out = slurm.run("sinfo", "--noheader", "--Node", "--format=%N %t").stdout
    return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]}


@contextlib.contextmanager
def slurm_cluster(root: Path, nodes: int = 2, *, link_gbps: float | None = None) -> Iterator[SlurmCluster]:
    """munged, slurmctld and one slurmd per namespace node, every node idle; all of it stopped and removed at the
    end, also when a step fails. `link_gbps`: every node's link shaped to that rate (netns.create_cluster)."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    cluster = netns.create_cluster(nodes, prefix=PREFIX, link_gbps=link_gbps)
    slurm = SlurmCluster(cluster, root, root / "slurm.conf")
    try:
        munged, munge_socket = start_munge(root, cluster.switch)
        slurm.daemons.append(munged)
        slurm.conf.write_text(slurm_conf(cluster, root, munge_socket))
        (root / "cgroup.conf").write_text(CGROUP_CONF)  # read from slurm.conf's directory
        slurm.daemons.append(_start(["ip", "netns", "exec", cluster.switch, "slurmctld", "-D", "-i",
                                     "-f", str(slurm.conf)], root / "slurmctld.stderr.log"))
        for node in cluster.nodes:
            (root / "spool" / node_name(node.index)).mkdir(exist_ok=True)
            slurm.daemons.append(_start(["ip", "netns", "exec", node.netns, "slurmd", "-D", "-N",
                                         node_name(node.index), "-f", str(slurm.conf)],
                                        root / f"slurmd.{node_name(node.index)}.stderr.log"))
        want = {node_name(n.index) for n in cluster.nodes}
        try:
            _wait(lambda: want <= idle_nodes(slurm) or any(d.poll() is not None for d in slurm.daemons),
                  UP_TIMEOUT_S, "Slurm nodes idle")
        except TimeoutError as err:
            raise RuntimeError(f"{err}; sinfo: {slurm.run('sinfo', '-N').stdout!r}\n{slurm.logs()}") from None
        dead = [d.args for d in slurm.daemons if d.poll() is not None]
        if dead:
            raise RuntimeError(f"a Slurm daemon exited: {dead}\n{slurm.logs()}")
        yield slurm
    finally:
        stop(slurm)


def leftovers(slurm: SlurmCluster) -> list[str]:
    """This cluster's namespaces still listed. Its own names, not every new PREFIX name: a Slurm test of the
    other xdist worker (test_slurm_study) may hold a cluster of its own at the same time (two CI runs failed on
    that, reading the other worker's live cluster as this one's leftover)."""
    return sorted(set(slurm.cluster.namespaces) & set(netns.list_namespaces()))


def stop(slurm: SlurmCluster) -> None:
    """SIGTERM every daemon by its pid (SIGKILL after a grace), then remove the namespaces and what runs in them."""
    for proc in slurm.daemons:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in slurm.daemons:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    netns.remove_namespaces(slurm.cluster.namespaces)
