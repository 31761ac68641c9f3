"""The network a run's ranks talked over, and the calibrated hosts joined by another link (issue: real what-if).

A run talks over one of: this host's loopback; an unshaped link between network-namespace nodes (veth and a
bridge, `--local-nodes`); or such a link shaped by the kernel (`--link-gbps`, tbf). Caller-side padding
(`net_latency_ms`, `net_bandwidth_gbps`) is a fourth, approximate, way: it delays the caller, not the bytes.

`link_hardware` predicts a link that was not calibrated from one that was. Per byte, moving data costs the
hosts (copies, the kernel's TCP path: what a loopback bench measures) and the wire; the two run at the same
time, so the slower one sets the pace: β(link) = max(k·β_host, β_wire(link)). The wire's β scales with the rate
the link is shaped to: calibrated over a shaped link of C Gbit/s with fitted β_C, β_C · C / L (tbf's own
efficiency at C carried along), and never below the rate itself less TCP/IP headers (`wire_beta`): an α-β line
through a sweep whose small sizes are latency-bound can come out faster than the wire, and no stream beats the
rate tbf enforces. k is the calibration's in-training scale (collectives inside training cost the hosts more
than the bench's); it scales what the hosts do (α and β_host), not a shaped wire's rate. α is the calibrated
link's whenever the target runs over the same kind of path (namespace nodes, shaped or not: shaping adds no
latency; a message between namespaces crosses two veth pairs and a bridge, which costs more than loopback), the
host's for a loopback target. Inside a node (ranks per node > 1) ranks talk over the host's loopback. The
calibrated link itself is computed the same way (`calibration.link_costs`, `calibration.link_hardware`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLink:
    """namespaced: the ranks ran on namespace nodes (else on one host's loopback); gbps: each node's shaped rate
    (None: unshaped)."""

    namespaced: bool = False
    gbps: float | None = None

    @classmethod
    def of(cls, config: dict) -> "NodeLink":
        """The link of a stored run's config (a TrainConfig or CommBenchConfig as a dict)."""
        namespaced = bool(config.get("local_nodes"))
        return cls(namespaced, config.get("link_gbps") if namespaced else None)


def link_text(gbps: float | None) -> str:
    return f"a {gbps:g} Gbit/s link (tbf)" if gbps else "an unshaped link"


def network_label(config: dict) -> str:
    """What a run's collectives went over, for tables and plots; padding is marked approximate."""
    link = NodeLink.of(config)
    parts = [f"{config.get('nnodes', 1)} nodes over {link_text(link.gbps)}" if link.namespaced else "loopback"]
    if link.namespaced and config.get("nodes_launcher") == "slurm":  # a Slurm allocation's: not scalelab's link
        parts = [f"{config.get('nnodes', 1)} Slurm nodes over the cluster's link"]
    latency, bandwidth = float(config.get("net_latency_ms") or 0.0), config.get("net_bandwidth_gbps")
    if latency > 0 or bandwidth is not None:
        padded = [f"{latency:g} ms"] if latency > 0 else []
        padded += [f"{bandwidth:g} Gbit/s"] if bandwidth is not None else []
        parts.append(f"padded {', '.join(padded)} (approximate)")
    return " + ".join(parts)


# TCP payload per frame on the nodes' 1500-byte-MTU veths: a 1448-byte segment (timestamps on) travels with 32 bytes of
# TCP, 20 of IPv4 and 14 of Ethernet header, and tbf counts them all (qdisc_pkt_len of every GSO segment)
WIRE_EFFICIENCY = 1448 / 1514


def wire_beta(gbps: float) -> float:
    """s per payload byte through a link shaped to `gbps` Gbit/s: no TCP stream can beat the rate tbf enforces."""
    return 8 / (gbps * 1e9 * WIRE_EFFICIENCY)
