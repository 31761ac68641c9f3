"""Bus bandwidth and what a link allows (pure).

- bus factor: nccl-tests' busbw / algbw ratio, what each rank's link must carry relative to the message size S:
  allreduce 2 (n - 1) / n, allgather / reduce_scatter / gather / scatter (n - 1) / n, broadcast 1.
- A node's link at R GB/s bounds the run: whatever the algorithm, an allreduce over N nodes moves at least
  2 (N - 1) / N x S across each node's link in each direction (reduce-scatter, then all-gather between nodes), and
  the same reasoning gives the bus factor at N for every collective. So busbw computed with the world's factor
  (W ranks) is at most R x f(W) / f(N) = R x (W - 1) N / (W (N - 1)) for the (n - 1) / n collectives, and R for
  a broadcast; LINK_BOUND takes the larger, so one figure holds for any mix.
- tbf lets a bucket of `tbf_burst_bytes` through at line rate after an idle spell (the compute between two
  syncs refills it), so a collective may beat the rate by that much: with k collectives per step of B bus bytes
  in all, the link's time is at least (B - k x burst) / R, and the ceiling is R x B / (B - k x burst); where the
  bursts could carry everything there is no ceiling to check.
"""
from __future__ import annotations

OPS = ("allreduce", "allgather", "reduce_scatter", "gather", "scatter", "broadcast")


def bus_factor(op: str, world: int) -> float:
    """nccl-tests busbw / algbw ratio for `op` on `world` ranks; ValueError for an op it does not know."""
    n = max(1, world)
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "gather", "scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


GSO_SEGMENT = 64 * 1024  # the largest packet a veth hands its qdisc (TSO/GSO on)


def tbf_burst_bytes(gbps: float) -> int:
    """The bucket scalelab gives a link shaped to `gbps` Gbit/s: as small as lets the link carry its rate, since
    after an idle spell a bucket's bytes pass early (a real link of that rate has no such burst).

    1 ms at the rate, at least one GSO segment (64 KiB), and room for two segments (128 KiB) unless one segment
    already takes 2.5 ms to refill. Measured with `benchmarks/tbf_link.py` (2 nodes, gloo allreduce both ways
    at once, 800 KiB and 2 MiB): with one segment's bucket, 1 Gbit/s ran 41-61 % (1 run) and 0.5 Gbit/s
    10-25 % (4 runs) slower than the rate (a bucket that refills in about 1 ms while a whole segment waits for it loses its tokens
    whenever the qdisc's timer fires late on a busy host); at 0.2 Gbit/s (2.6 ms) it kept the rate, as did
    128 KiB at 0.5 and 1 Gbit/s (0.98-1.05× the wire time, 3-5 runs). A collective after an idle spell then
    finished about (bucket / rate − 1 ms) early: 0-0.5 ms at 1 Gbit/s, 1.0-1.5 ms at 0.5 and 1.4-2.0 ms at 0.2;
    the model leaves this out."""
    rate = gbps * 1e9 / 8  # bytes per s
    return int(max(GSO_SEGMENT, rate * 1e-3, min(2 * GSO_SEGMENT, rate * 2.5e-3)))


def link_bound(world: int, nodes: int) -> float:
    """The largest busbw (world's factor) / link rate ratio any collective can reach over `nodes` nodes."""
    if nodes < 2 or world < 2:
        return float("inf")  # nothing crosses a node's link
    return max(1.0, (world - 1) * nodes / (world * (nodes - 1)))


def busbw_ceiling(link_gbps: float, *, world: int, nodes: int, bus_bytes_per_step: float,
                  collectives_per_step: float) -> float | None:
    """The highest busbw (GB/s) the run's collectives can reach through links of `link_gbps` Gbit/s (module
    docstring); None where nothing crosses a link or tbf's bursts alone could carry a step's traffic."""
    bound = link_bound(world, nodes)
    if bound == float("inf"):
        return None
    on_link = bus_bytes_per_step / bound  # at least this much crosses a node's link per step
    free = collectives_per_step * tbf_burst_bytes(link_gbps)
    if on_link <= free:
        return None
    return link_gbps / 8 * bound * on_link / (on_link - free)
