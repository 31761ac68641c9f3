"""The network half of the performance model (docs/model.md): the α-β cost of collectives, and the hardware they run
on. The presets, the fit of α and β to a benchmark and the parsing of a hardware description are in
scalelab.perf.hardware; this part is what the sync strategies' own cost formulas need.

Units everywhere: α in seconds per message (latency), β in seconds per byte (1 / bandwidth, one direction),
S in bytes, n ranks, times in seconds. A collective costs t = A(n)·α + B(n)·S·β; `cost_terms` gives A and B.
S follows nccl-tests (PERFORMANCE.md): the buffer for allreduce and broadcast, the total (gathered) size for
allgather, reduce_scatter, gather and scatter. Reduction arithmetic (MPICH's γ term) is left out: on GPUs and at
gradient sizes it is far below the transfer time. Every formula gives 0 for n = 1.

The ring allreduce runs segmented (`segmented_ring_allreduce`): gloo's ring (gloo/allreduce.cc) cuts S into p ≥ 2
segments per rank (at most 1 MiB each) and keeps two in flight on each link, so while one segment's latency runs
the other is on the wire. Its time is the α-β ring's (`cost_terms`) less the latency hidden behind the wire; at
n = 2 (and S ≤ 4 MiB) nothing can be hidden and the two agree, so α and β are fitted on `cost_terms` there.

Sources:
- Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1).
- Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2).
- Sanders, Speck & Träff 2009, "Two-tree algorithms for full bandwidth broadcast, reduction and scan", Parallel
  Computing 35(12) — the double binary tree NCCL 2.4 uses for allreduce.
- nccl-tests, doc/PERFORMANCE.md: algbw, busbw and the size conventions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scalelab.errors import ConfigError



def _LOG(n: int) -> int:
    """Rounds of a binary / binomial tree over n ranks: ⌈log2 n⌉ (0 for one rank)."""
    return math.ceil(math.log2(n)) if n > 1 else 0


# op -> {algorithm: (A(n), B(n))}; the first algorithm of each op is its default.
FORMULAS = {
    "allreduce": {
        "ring": lambda n: (2 * (n - 1), 2 * (n - 1) / n),  # Patarasuk & Yuan: reduce-scatter + allgather rings
        "rabenseifner": lambda n: (2 * _LOG(n), 2 * (n - 1) / n),  # Thakur et al. (power-of-two n)
        "recursive_doubling": lambda n: (_LOG(n), _LOG(n)),  # Thakur et al.: short messages
        "binomial_tree": lambda n: (2 * _LOG(n), 2 * _LOG(n)),  # binomial reduce, then binomial broadcast
        "double_binary_tree": lambda n: (2 * _LOG(n), 2.0 if n > 1 else 0.0),  # pipelined; Sanders et al.
    },
    "allgather": {"ring": lambda n: (n - 1, (n - 1) / n)},
    "reduce_scatter": {"ring": lambda n: (n - 1, (n - 1) / n)},
    "broadcast": {"binomial_tree": lambda n: (_LOG(n), _LOG(n))},
    # the root receives (sends) n-1 pieces of S/n: its link is the bottleneck. gloo and NCCL (grouped send/recv)
    # post every piece at once, so the latency is paid once; MPICH's linear algorithm pays it per piece
    "gather": {"concurrent": lambda n: (1 if n > 1 else 0, (n - 1) / n), "linear": lambda n: (n - 1, (n - 1) / n)},
    "scatter": {"concurrent": lambda n: (1 if n > 1 else 0, (n - 1) / n), "linear": lambda n: (n - 1, (n - 1) / n)},
}
OPS = tuple(FORMULAS)


def cost_terms(op: str, n: int, algorithm: str | None = None) -> tuple[float, float]:
    """(A(n), B(n)) with t = A·α + B·S·β (α s, β s/B, S bytes) for `op` on n ranks; (0, 0) for n = 1.

    allreduce ring           2(n−1)α + 2(n−1)/n·Sβ        Patarasuk & Yuan 2009 (bandwidth-optimal); its cost
                                                          (`collective_cost`) is segmented, as gloo runs it
    allreduce rabenseifner   2⌈log2 n⌉α + 2(n−1)/n·Sβ     Thakur et al. 2005 (recursive halving + doubling)
    allreduce recursive_doubling  ⌈log2 n⌉(α + Sβ)       Thakur et al. 2005
    allreduce binomial_tree  2⌈log2 n⌉(α + Sβ)            binomial reduce then broadcast, Thakur et al. 2005
    allreduce double_binary_tree  2⌈log2 n⌉α + 2Sβ       Sanders et al. 2009, pipelined; the pipeline-fill
                                                          term O(√(S·α·β·log n)) is neglected
    allgather / reduce_scatter ring  (n−1)α + (n−1)/n·Sβ  Thakur et al. 2005 (S = total size)
    broadcast binomial_tree  ⌈log2 n⌉(α + Sβ)             Thakur et al. 2005
    gather / scatter concurrent  α + (n−1)/n·Sβ           every piece posted at once (gloo's gather.cc and
                                                          scatter.cc; NCCL's grouped send/recv); the root's
                                                          link carries every piece
    gather / scatter linear  (n−1)α + (n−1)/n·Sβ          one piece after another (MPICH's linear)
    """
    if op not in FORMULAS:
        raise ConfigError("op", op, f"allowed: {', '.join(OPS)}")
    algorithms = FORMULAS[op]
    algorithm = algorithm or next(iter(algorithms))
    if algorithm not in algorithms:
        raise ConfigError("algorithm", algorithm, f"allowed for {op}: {', '.join(algorithms)}")
    if n < 1:
        raise ConfigError("n", n, "allowed: an integer >= 1 (ranks)")
    a, b = algorithms[algorithm](int(n))
    return float(a), float(b)


GLOO_MAX_SEGMENT_BYTES = 1024 * 1024  # gloo's AllreduceOptions kMaxSegmentSize: the largest segment of its ring


def segmented_ring_allreduce(nbytes: float, n: int, alpha: float, beta: float,
                             max_segment: float = GLOO_MAX_SEGMENT_BYTES) -> float:
    """Seconds of gloo's ring allreduce (gloo/allreduce.cc `ring`) of S bytes on n ranks: p = max(2, ⌈⌈S/seg⌉/n⌉)
    segments per rank of c = S·β/(n·p) seconds on the wire each; reduce-scatter, then allgather, each m = (n−1)·p
    sends per rank, issued two at a time: send i waits for receive i−2. A send reaches the wire α after it is
    issued and the link carries one segment at a time, so its arrival is a_i = max(a_{i−2} + α, a_{i−1}) + c, with
    a_0 = α + c, a_1 = α + 2c. That gives a phase a_{m−1} = α + m·c + ⌊(m−1)/2⌋·max(0, α − c):

        T = 2α + 2(n−1)/n·S·β + 2⌊(m−1)/2⌋·max(0, α − c)

    Bandwidth-bound (c ≥ α) only one latency per phase shows, the rest runs while the other segment is on the
    wire; latency-bound (c < α, small S) each pair of sends pays α. With p = 2 it is the α-β ring less the hidden
    part, 2(n−1)α + 2(n−1)/n·S·β − 2(n−2)·min(α, c); at n = 2 they agree. Receiving and reducing a segment are
    left out (part of α and β as fitted), and so are gloo's empty segments of a tiny S."""
    if n <= 1:
        return 0.0
    p = max(2, math.ceil(math.ceil(nbytes / max_segment) / n))
    m, c = (n - 1) * p, nbytes * beta / (n * p)
    return 2 * alpha + 2 * (n - 1) / n * nbytes * beta + 2 * ((m - 1) // 2) * max(0.0, alpha - c)


def collective_cost(op: str, nbytes: float, n: int, alpha: float, beta: float,
                    algorithm: str | None = None) -> float:
    """Seconds of one collective on one kind of link: A(n)·α + B(n)·S·β (see `cost_terms`); the ring allreduce
    segmented as gloo runs it (`segmented_ring_allreduce`)."""
    a, b = cost_terms(op, n, algorithm)
    if op == "allreduce" and (algorithm or "ring") == "ring":
        return segmented_ring_allreduce(nbytes, n, alpha, beta)
    return a * alpha + b * nbytes * beta


def hierarchical_allreduce(nbytes: float, nodes: int, per_node: int, hw: "Hardware") -> float:
    """Seconds of a two-level allreduce of S bytes over `nodes` × `per_node` ranks:

    1. ring reduce-scatter inside each node:  (g−1)α_intra + (g−1)/g·S·β_intra
    2. ring allreduce across nodes, each of the g ranks on its S/g shard at the same time; the g flows share the
       node's inter-node link (β_inter is per node), so together they move S: the segmented ring of S bytes
       (`segmented_ring_allreduce`), 2(N−1)α_inter + 2(N−1)/N·S·β_inter less the latency hidden behind the wire
    3. ring allgather inside each node:       (g−1)α_intra + (g−1)/g·S·β_intra
    With N = 1 it is the intra-node ring allreduce; with g = 1 the inter-node ring (as in NCCL / Horovod's
    hierarchical allreduce, and Thakur et al.'s reduce-scatter + allgather decomposition).
    """
    # reduce-scatter and allgather inside the node have the same cost
    intra = 2 * collective_cost("reduce_scatter", nbytes, per_node, hw.alpha_intra, hw.beta_intra)
    return intra + collective_cost("allreduce", nbytes, nodes, hw.alpha_inter, hw.beta_inter, "ring")


def placement(n: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, ranks on the fullest node) for n ranks packed onto nodes of `gpus_per_node`, spread evenly."""
    nodes = math.ceil(n / gpus_per_node)
    return nodes, math.ceil(n / nodes)


def collective_time(op: str, nbytes: float, n: int, hw: "Hardware", algorithm: str | None = None) -> float:
    """Seconds of one collective of S bytes on n ranks of `hw`.

    On one node: the op's formula with (α_intra, β_intra). Across nodes: allreduce with algorithm "hierarchical"
    (the default for allreduce) uses `hierarchical_allreduce`; any other op or algorithm runs flat, and every
    step waits for its slowest link, so it uses (α_inter, β_inter).
    """
    nodes, per_node = placement(n, hw.gpus_per_node)
    if op == "allreduce" and algorithm in (None, "hierarchical"):
        if nodes > 1:
            return hierarchical_allreduce(nbytes, nodes, per_node, hw)
        algorithm = "ring"
    if nodes == 1:
        return collective_cost(op, nbytes, n, hw.alpha_intra, hw.beta_intra, algorithm)
    return collective_cost(op, nbytes, n, hw.alpha_inter, hw.beta_inter, algorithm)


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """Links of a cluster. β_intra: per rank and direction inside a node; β_inter: one node's whole inter-node
    link (all its NICs together), which the node's ranks share. gpus_per_node = ranks per node."""

    name: str
    alpha_intra: float  # s per message inside a node
    beta_intra: float  # s per byte inside a node
    alpha_inter: float  # s per message between nodes
    beta_inter: float  # s per byte through a node's inter-node link
    gpus_per_node: int = 1
    source: str = ""
    # The share of the hideable communication that backward really hides (perfmodel.sync_cost): 1 where
    # collectives run on their own engine (NCCL on GPUs); less on a CPU host, where gloo's threads compete with
    # backward for the same cores. Fitted for this machine by the calibration.
    overlap: float = 1.0

    def __post_init__(self) -> None:
        for f in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"hardware.{f}", value, "allowed: a finite number >= 0")
        o = self.overlap
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not 0 <= o <= 1:
            raise ConfigError("hardware.overlap", o, "allowed: a number in [0, 1]")
        g = self.gpus_per_node
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ConfigError("hardware.gpus_per_node", g, "allowed: an integer >= 1")
