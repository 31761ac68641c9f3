"""A cluster of N "nodes" on this machine: Linux network namespaces joined by a bridge, with kernel-shaped links.

    with local_cluster(2, link_gbps=1.0) as cluster:   # namespaces scalelab-<pid>-<start>-0, -1 and -sw
        cluster.nodes[0].address                         # "10.213.0.1": node 0's private address on eth0

Layout: every node namespace has `lo` and `eth0` (one end of a veth pair) with an address in a private /24 that
no host address or route overlaps; the other end of each pair (`n<k>`) is a port of the bridge `br0`, which lives
in an extra "switch" namespace, so nothing at all is added to the host's network stack. `link_gbps` puts a `tbf`
qdisc on both ends of a node's veth (eth0 shapes what the node sends, n<k> what it receives: a full-duplex link of
that rate); `link_delay_ms` adds a `netem` one-way delay on eth0 where the kernel has netem.

Namespace names carry their owner (`scalelab-<pid>-<starttime>-...`, starttime from /proc/<pid>/stat): a
scalelab that was SIGKILLed cannot tear down, so every new cluster first removes the leftovers whose owner is
gone (`sweep_leftovers`). Deleting the namespaces removes their veths, bridge and qdiscs with them; processes
still inside are killed first (a namespace lives on while a process holds it).
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scalelab.analysis.bandwidth import tbf_burst_bytes
from scalelab.errors import ScalelabError
from scalelab.measure.machine import start_ticks

PREFIX = "scalelab-"
IFACE = "eth0"  # a node's interface on the cluster network (each namespace has its own, so one name serves all)
NETNS_ETC = Path("/etc/netns")  # per-namespace files that `ip netns exec` mounts over /etc (iproute2)


def _name_re(prefix: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(prefix)}(\d+)-(\d+)-(sw|\d+|probe)$")
# Candidate subnets for the cluster network: 10.213.x.0/24, the first that no host address or route overlaps.
_CANDIDATES = tuple(ipaddress.ip_network(f"10.213.{x}.0/24") for x in range(256))
_CAP_NET_ADMIN = 12
PROBE_TIMEOUT_S = 2.0  # a node on the bridge answers a TCP connect (with a reset) in well under a millisecond
# Run inside the switch namespace: exit status 0, one line of the addresses that gave no answer.
_PROBE = """
import socket, sys
lost = []
for address in sys.argv[2:]:
    s = socket.socket()
    s.settimeout(float(sys.argv[1]))
    try:
        s.connect((address, 9))  # the discard port: nothing listens, a reachable node answers with a reset
    except ConnectionRefusedError:
        pass
    except OSError:
        lost.append(address)
    finally:
        s.close()
print(" ".join(lost))
"""


class NamespacesUnavailable(ScalelabError):
    """This process cannot make network namespaces (no privilege, no `ip`/`tc`, no netem for a delay)."""


@dataclass(frozen=True)
class Node:
    index: int
    netns: str
    address: str  # on IFACE, inside `netns`


@dataclass(frozen=True)
class Cluster:
    switch: str  # the namespace holding the bridge
    subnet: str
    nodes: tuple[Node, ...]

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(n.netns for n in self.nodes)]

    @property
    def switch_address(self) -> str:
        """The switch's own address on br0 (the last of the /24): the probe's source, a scheduler's address."""
        return str(ipaddress.ip_network(self.subnet).broadcast_address - 1)


# ---------------------------------------------------------------- checks

def has_net_admin() -> bool:
    """Root, or CAP_NET_ADMIN in this process's effective capabilities (what `ip netns add` needs)."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps, 16) >> _CAP_NET_ADMIN & 1)


def check_usable(link_gbps: float | None = None, link_delay_ms: float | None = None) -> None:
    """Raise NamespacesUnavailable (one line: what is needed) unless a cluster with these links can be made here."""
    if not has_net_admin():
        raise NamespacesUnavailable("local_nodes: needs root or CAP_NET_ADMIN to create network namespaces "
                                    "(run as root, or grant cap_net_admin)")
    for tool, needed in (("ip", True), ("tc", link_gbps is not None or link_delay_ms is not None)):
        if needed and shutil.which(tool) is None:
            raise NamespacesUnavailable(f"local_nodes: needs the `{tool}` command (iproute2), not found on PATH")
    if link_delay_ms is not None and not netem_available():
        raise NamespacesUnavailable(f"link_delay_ms: {link_delay_ms} is not possible here: this kernel has no netem "
                                    "qdisc (sch_netem); leave link_delay_ms unset")


def netem_available() -> bool:
    """Whether the kernel accepts a netem qdisc: tried for real on `lo` of a throwaway namespace."""
    probe = f"{owner_tag()}-probe"
    _ip("netns", "add", probe)
    try:
        _ip("-n", probe, "link", "set", "lo", "up")
        return _run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                    check=False).returncode == 0
    finally:
        _ip("netns", "del", probe, check=False)


# ---------------------------------------------------------------- owners and leftovers

def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, as text; None when it is gone."""
    ticks = start_ticks(pid)
    return None if ticks is None else str(ticks)


def owner_tag(pid: int | None = None, prefix: str = PREFIX) -> str:
    """`scalelab-<pid>-<starttime>`: the prefix of every namespace this process makes (a reused pid differs).
    `prefix` other than PREFIX: a family of namespaces apart from scalelab's own (a test fixture's)."""
    pid = os.getpid() if pid is None else pid
    return f"{prefix}{pid}-{_start_time(pid)}"


def list_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def owner(name: str, prefix: str = PREFIX) -> tuple[int, str] | None:
    """(pid, start time) of the process whose `owner_tag` namespace `name` carries, or None for a name not ours."""
    match = _name_re(prefix).match(name)
    return (int(match.group(1)), match.group(2)) if match else None


def is_leftover(name: str, prefix: str = PREFIX) -> bool:
    """A namespace of ours whose owner process is gone (dead, or its pid reused by another process)."""
    made_by = owner(name, prefix)
    return made_by is not None and _start_time(made_by[0]) != made_by[1]


def sweep_leftovers(prefix: str = PREFIX) -> list[str]:
    """Remove every scalelab namespace whose owner is gone (a scalelab that was SIGKILLed); returns their names."""
    gone = [name for name in list_namespaces() if is_leftover(name, prefix)]
    remove_namespaces(gone)
    return gone


def kill_inside(netns: str) -> None:
    """SIGKILL every process in `netns` and wait (up to 5 s) until they are gone."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_namespaces(names: list[str]) -> None:
    """Kill what runs inside, then delete: the veths, bridge and qdiscs in them go with the namespaces; their
    files under /etc/netns too."""
    for name in names:
        kill_inside(name)
        _ip("netns", "del", name, check=False)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def write_hosts(node: "Node") -> None:
    """/etc/netns/<node>/hosts, which `ip netns exec` mounts over /etc/hosts for the node's processes: this
    machine's host name resolves to the node's own address there, as a node's name does on a real cluster.
    Software that finds its address from the host name then uses the node's link, not loopback (Horovod 0.28's
    per-process-set gloo contexts ignore HOROVOD_GLOO_IFACE and do exactly that)."""
    hostname = socket.gethostname()
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        lines = ["127.0.0.1 localhost"]
    kept = [ln for ln in lines if hostname not in ln.split("#")[0].split()[1:]]
    folder = NETNS_ETC / node.netns
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("\n".join([*kept, f"{node.address} {hostname}"]) + "\n")


# ---------------------------------------------------------------- making a cluster

def free_subnet() -> ipaddress.IPv4Network:
    """The first candidate /24 that overlaps no address or route of the host. Two clusters at once may get the
    same /24: harmless, each lives behind its own switch namespace and never reaches the other or the host."""
    used = []
    for line in _ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        match = re.search(r"\binet (\S+)", line)
        if match:
            used.append(ipaddress.ip_interface(match.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        for word in line.split()[:2]:  # "10.0.0.0/8 dev ..." or "local 127.0.0.1 dev lo ..."; not "default"
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
                break
    for subnet in _CANDIDATES:
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise NamespacesUnavailable("local_nodes: every candidate subnet 10.213.0.0/16 is in use on this host")


def create_cluster(nodes: int, *, link_gbps: float | None = None, link_delay_ms: float | None = None,
                   prefix: str = PREFIX) -> Cluster:
    """Make the namespaces, bridge, veths, addresses and qdiscs of an N-node cluster; removes it all if a step
    fails. Leftovers of dead owners (of the same `prefix`) are swept first."""
    sweep_leftovers(prefix)
    tag, subnet = owner_tag(prefix=prefix), free_subnet()
    hosts = list(subnet.hosts())
    cluster = Cluster(f"{tag}-sw", str(subnet),
                      tuple(Node(k, f"{tag}-{k}", str(hosts[k])) for k in range(nodes)))
    try:
        sw = cluster.switch
        for name in cluster.namespaces:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        # the switch's own address (the last of the /24), from which `unreachable_nodes` probes every node
        _ip("-n", sw, "addr", "add", f"{cluster.switch_address}/{subnet.prefixlen}", "dev", "br0")
        for node in cluster.nodes:
            port = f"n{node.index}"
            # created inside the switch namespace, its peer straight inside the node's: never on the host
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", node.netns)
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
            _ip("-n", node.netns, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", IFACE)
            _ip("-n", node.netns, "link", "set", IFACE, "up")
            shape_link(node.netns, IFACE, link_gbps, link_delay_ms)
            shape_link(sw, port, link_gbps, None)  # the node's receive direction: delay is counted once
            write_hosts(node)
    except BaseException:
        remove_namespaces(cluster.namespaces)
        raise
    return cluster


def tbf_args(gbps: float, burst: int | None = None) -> list[str]:
    """tbf at `gbps` Gbit/s: the smallest bucket that carries the rate (`tbf_burst_bytes`; `burst` bytes to try
    another) and up to 100 ms of queue, so TCP sees the rate rather than drops."""
    if burst is None:
        burst = tbf_burst_bytes(gbps)  # the analysis knows it too: it bounds what a shaped link lets through
    return ["tbf", "rate", f"{int(gbps * 1e6)}kbit", "burst", str(burst), "latency", "100ms"]


def shape_link(netns: str, dev: str, gbps: float | None, delay_ms: float | None) -> None:
    """Egress shaping of `dev`: netem delay as the root with tbf under it, or tbf alone."""
    if delay_ms is not None:
        _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
              f"{delay_ms}ms"])
        if gbps is not None:
            _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "parent", "1:", "handle", "2:", *tbf_args(gbps)])
    elif gbps is not None:
        _run(["tc", "-n", netns, "qdisc", "add", "dev", dev, "root", *tbf_args(gbps)])


def unreachable_nodes(cluster: Cluster) -> list[int]:
    """The nodes that do not answer a TCP connect from the switch within PROBE_TIMEOUT_S (a link down, a node's
    interface gone); [] when the probe itself cannot run."""
    addresses = [n.address for n in cluster.nodes]
    proc = _run(["ip", "netns", "exec", cluster.switch, sys.executable, "-c", _PROBE, str(PROBE_TIMEOUT_S),
                 *addresses], check=False)
    lost = set(proc.stdout.split()) if proc.returncode == 0 else set()
    return [n.index for n in cluster.nodes if n.address in lost]


@contextlib.contextmanager
def local_cluster(nodes: int, *, link_gbps: float | None = None, link_delay_ms: float | None = None,
                  prefix: str = PREFIX) -> Iterator[Cluster]:
    """A cluster for the duration of the block; removed at its end, on an exception and on Ctrl-C."""
    cluster = create_cluster(nodes, link_gbps=link_gbps, link_delay_ms=link_delay_ms, prefix=prefix)
    try:
        yield cluster
    finally:
        remove_namespaces(cluster.namespaces)


# ---------------------------------------------------------------- commands

def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NamespacesUnavailable(f"local_nodes: `{' '.join(argv)}` failed: "
                                    f"{(proc.stderr.strip().splitlines() or ['no message'])[0]}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(["ip", *args], check=check)
