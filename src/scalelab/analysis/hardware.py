"""The network half of the performance model (DESIGN F14): α-β cost of collectives, their fit, and the hardware.

Units everywhere: α in seconds per message (latency), β in seconds per byte (1 / bandwidth, one direction),
S in bytes, n ranks, times in seconds. A collective costs t = A(n)·α + B(n)·S·β; `cost_terms` gives A and B.
S follows nccl-tests (PERFORMANCE.md): the buffer for allreduce and broadcast, the total (gathered) size for
allgather, reduce_scatter, gather and scatter. Reduction arithmetic (MPICH's γ term) is left out: on GPUs and at
gradient sizes it is far below the transfer time. Every formula gives 0 for n = 1.

Sources:
- Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1).
- Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2).
- Sanders, Speck & Träff 2009, "Two-tree algorithms for full bandwidth broadcast, reduction and scan", Parallel
  Computing 35(12) — the double binary tree NCCL 2.4 uses for allreduce.
- nccl-tests, doc/PERFORMANCE.md: algbw, busbw and the size conventions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from itertools import combinations
from types import MappingProxyType

import numpy as np
import pandas as pd

from scalelab.errors import ConfigError
from scalelab.registry import Registry



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

    allreduce ring           2(n−1)α + 2(n−1)/n·Sβ        Patarasuk & Yuan 2009 (bandwidth-optimal)
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


def collective_cost(op: str, nbytes: float, n: int, alpha: float, beta: float,
                    algorithm: str | None = None) -> float:
    """Seconds of one collective on one kind of link: A(n)·α + B(n)·S·β (see `cost_terms`)."""
    a, b = cost_terms(op, n, algorithm)
    return a * alpha + b * nbytes * beta


def hierarchical_allreduce(nbytes: float, nodes: int, per_node: int, hw: "Hardware") -> float:
    """Seconds of a two-level allreduce of S bytes over `nodes` × `per_node` ranks:

    1. ring reduce-scatter inside each node:  (g−1)α_intra + (g−1)/g·S·β_intra
    2. ring allreduce across nodes, each of the g ranks on its S/g shard at the same time; the g flows share the
       node's inter-node link (β_inter is per node), so together they move S:  2(N−1)α_inter + 2(N−1)/N·S·β_inter
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


def nnls(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of the unconstrained fits over every subset of
    columns whose coefficients are all >= 0 (exact: the optimum is the plain fit on its own support)."""
    k = matrix.shape[1]
    best, best_res = np.zeros(k), float(np.sum(target**2))
    for size in range(1, k + 1):
        for cols in combinations(range(k), size):
            sub = matrix[:, cols]
            if np.linalg.matrix_rank(sub) < size:
                continue
            coef = np.linalg.lstsq(sub, target, rcond=None)[0]
            if np.any(coef < 0):
                continue
            res = float(np.sum((sub @ coef - target) ** 2))
            if res < best_res:
                best, best_res = np.zeros(k), res
                best[list(cols)] = coef
    return best


def bench_rows(table: pd.DataFrame, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sizes in bytes, times in s, ranks) of `op`'s measured rows of a `bench comm` table.

    Accepts size(bytes) or size(B), and time_median(s), time_loop(us) or time_median(us): a `bench comm` table's
    back-to-back loop time per call first (as nccl-tests times: a small message's α is then not one scheduler
    tick), its median single call otherwise. Rows with status other than "ok" or without a time are skipped.
    """
    rows = table[table["op"] == op] if "op" in table else table
    if "status" in rows:
        rows = rows[rows["status"].fillna("ok") == "ok"]
    size_col = next((c for c in ("size(bytes)", "size(B)") if c in rows), None)
    time_col = next((c for c in ("time_median(s)", "time_loop(us)", "time_median(us)")
                     if c in rows and rows[c].notna().any()), None)
    if size_col is None or time_col is None or "ranks" not in rows:
        raise ConfigError("table", list(table.columns), "needs columns op, size(bytes) or size(B), ranks, "
                          "time_median(s) or time_median(us)")
    rows = rows.dropna(subset=[time_col])
    scale = 1e-6 if time_col.endswith("(us)") else 1.0
    return (rows[size_col].to_numpy(float), rows[time_col].to_numpy(float) * scale, rows["ranks"].to_numpy(int))


def fit_alpha_beta(sizes_bytes, times_s=None, n=None, op: str = "allreduce", *, algorithm: str | None = None,
                   weight: str = "relative") -> tuple[float, float]:
    """(α in s, β in s/byte) from timings of `op`: non-negative least squares on t = α·A(n) + β·S·B(n).

    `sizes_bytes` is a sequence of S (then `times_s` and `n`, one int or one per size, are required) or a
    `bench comm` DataFrame (see `bench_rows`; `n`, when given, overrides its ranks column). weight="relative"
    minimises the relative residuals (each row divided by its time): a size sweep spans decades of time, and an
    unweighted fit would let the largest sizes decide α. Noise-free timings are recovered exactly.
    """
    if isinstance(sizes_bytes, pd.DataFrame):
        sizes, times, ranks = bench_rows(sizes_bytes, op)
        if n is not None:
            ranks = np.full(len(sizes), n)
    else:
        if times_s is None or n is None:
            raise ValueError("fit_alpha_beta: give times_s and n with a sequence of sizes")
        sizes, times = np.asarray(sizes_bytes, float), np.asarray(times_s, float)
        ranks = np.broadcast_to(np.asarray(n), sizes.shape)
    if weight not in ("relative", "absolute"):
        raise ConfigError("weight", weight, "allowed: relative, absolute")
    if sizes.shape != times.shape or len(np.unique(sizes)) < 2 or np.any(times <= 0):
        raise ValueError(f"fit_alpha_beta needs >= 2 distinct sizes with one positive time each "
                         f"(got {len(sizes)} sizes, {len(times)} times)")
    terms = np.array([cost_terms(op, int(r), algorithm) for r in ranks])
    if np.all(terms == 0):
        raise ValueError("fit_alpha_beta: every row has 1 rank, where a collective costs nothing; use n >= 2")
    matrix = np.column_stack([terms[:, 0], sizes * terms[:, 1]])
    w = 1 / times if weight == "relative" else np.ones_like(times)
    alpha, beta = nnls(matrix * w[:, None], times * w)
    return float(alpha), float(beta)


# ---------------------------------------------------------------- hardware and presets

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


@dataclass(frozen=True)
class Link:
    name: str
    alpha: float  # s
    beta: float  # s per byte, one direction
    source: str


_TCP = "α = 20 µs assumed: kernel TCP small-message latency (gloo / NCCL sockets), not from the standard"
LINKS = {
    "10gbe": Link("10 GbE", 20e-6, 1 / 1.25e9, f"IEEE 802.3ae-2002: 10 Gbit/s = 1.25 GB/s per direction; {_TCP}"),
    "25gbe": Link("25 GbE", 20e-6, 1 / 3.125e9, f"IEEE 802.3by-2016: 25 Gbit/s = 3.125 GB/s; {_TCP}"),
    "100gbe": Link("100 GbE", 20e-6, 1 / 12.5e9, f"IEEE 802.3ba-2010: 100 Gbit/s = 12.5 GB/s; {_TCP}"),
    "ib_hdr": Link("200 Gb/s InfiniBand HDR", 1e-6, 1 / 25e9,
                   "NVIDIA ConnectX-6 datasheet: 200 Gb/s HDR = 25 GB/s per direction, adapter latency < 0.6 µs; "
                   "α = 1 µs assumed (typical MPI-level small-message latency)"),
    "nvlink3": Link("NVLink 3 (A100)", 2e-6, 1 / 300e9,
                    "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 12 NVLinks, 600 GB/s total = "
                    "300 GB/s per direction per GPU; α = 2 µs assumed (NCCL per-hop latency, typical)"),
    "pcie4_x16": Link("PCIe 4.0 x16", 2e-6, 1 / 31.5e9,
                      "PCI-SIG PCIe Base Specification 4.0: 16 GT/s × 16 lanes × 128/130 = 31.5 GB/s per "
                      "direction; α = 2 µs assumed (typical)"),
}


def hardware(intra: str, inter: str, gpus_per_node: int, *, name: str | None = None, inter_links: int = 1,
             note: str = "") -> Hardware:
    """Hardware from two link presets; `inter_links` NICs per node add up (β_inter = β_link / inter_links);
    `note` says where the node layout comes from."""
    a, b = _link("intra", intra), _link("inter", inter)
    nics = f"{inter_links}× " if inter_links > 1 else ""
    return Hardware(name=name or f"{a.name} ×{gpus_per_node}/node + {nics}{b.name}", alpha_intra=a.alpha,
                    beta_intra=a.beta, alpha_inter=b.alpha, beta_inter=b.beta / inter_links,
                    gpus_per_node=gpus_per_node, source=f"{note}intra: {a.source}. inter: {b.source}")


def _link(field: str, name: str) -> Link:
    if name not in LINKS:
        raise ConfigError(f"hardware.{field}", name, f"allowed: {', '.join(LINKS)}")
    return LINKS[name]


@dataclass(frozen=True, kw_only=True)
class PresetEntry:
    """One named hardware preset.

    name         what --hardware and a hardware file's `preset:` name.
    hardware     the Hardware (its own `name` is the label the tables show, `source` where the numbers come from).
    description  one line, for help.
    """

    name: str
    hardware: Hardware
    description: str


def _network(link: str) -> PresetEntry:
    """A network preset: one rank per node, so every collective crosses `link`."""
    name = f"{LINKS[link].name}, one rank per node"
    return PresetEntry(name=link, hardware=hardware(link, link, 1, name=name), description=name)


presets: Registry[PresetEntry] = Registry("hardware", PresetEntry, entries=(
    *(_network(k) for k in ("10gbe", "25gbe", "100gbe", "ib_hdr")),
    PresetEntry(name="nvlink3", description="DGX A100 nodes: 8 GPUs on NVLink 3, 8 HDR InfiniBand links per node",
                hardware=hardware("nvlink3", "ib_hdr", 8, inter_links=8,
                                  note="NVIDIA DGX A100 User Guide: 8 A100 on NVLink 3 (NVSwitch), 8 single-port "
                                       "HDR adapters for compute traffic. ")),
    PresetEntry(name="pcie4_x16", description="PCIe 4.0 x16 servers: 4 GPUs per node, one 100 GbE NIC",
                hardware=hardware("pcie4_x16", "100gbe", 4,
                                  note="Node layout assumed (a typical PCIe server: 4 GPUs, one 100 GbE NIC). ")),
))
# name -> Hardware, read-only: a view of the registry for code that only wants the numbers
PRESETS = MappingProxyType({e.name: e.hardware for e in presets.entries()})


def hardware_from_fit(alpha: float, beta: float, *, gpus_per_node: int = 1, name: str = "loopback (this machine)",
                      source: str = "α-β least-squares fit of `bench comm` timings", overlap: float = 1.0) -> Hardware:
    """Hardware whose links are all the fitted (α, β): what this machine's ranks measured."""
    return Hardware(name=name, alpha_intra=alpha, beta_intra=beta, alpha_inter=alpha, beta_inter=beta,
                    gpus_per_node=gpus_per_node, source=source, overlap=overlap)


_NUMERIC = {"alpha_intra": 1.0, "beta_intra": 1.0, "alpha_inter": 1.0, "beta_inter": 1.0,
            "latency_intra(us)": 1e-6, "latency_inter(us)": 1e-6,  # -> alpha, s
            "bandwidth_intra(GB/s)": 1e9, "bandwidth_inter(GB/s)": 1e9}  # -> beta = 1 / (value * 1e9)
ALLOWED_KEYS = ("preset", "intra", "inter", "inter_links", "gpus_per_node", "name", "source", "overlap", *_NUMERIC)


def hardware_from_dict(d: dict) -> Hardware:
    """Hardware from YAML or flags: {"preset": ...} and/or {"intra": link, "inter": link} and/or numbers
    (alpha_* in s, beta_* in s/byte, latency_*(us), bandwidth_*(GB/s)); later groups override earlier ones.
    A missing side copies the other. Every bad key or value raises a one-line ConfigError."""
    if not isinstance(d, dict):
        raise ConfigError("hardware", d, "allowed: a mapping of " + ", ".join(ALLOWED_KEYS))
    for key in d:
        if key not in ALLOWED_KEYS:
            raise ConfigError(f"hardware.{key}", d[key], f"unknown key; allowed: {', '.join(ALLOWED_KEYS)}")
    values: dict = {}
    if "preset" in d:
        preset = presets.get(d["preset"], field="hardware.preset").hardware
        values = {f.name: getattr(preset, f.name) for f in fields(Hardware)}
    links = _integer(d, "inter_links", 1)
    if "inter_links" in d and "inter" not in d:
        raise ConfigError("hardware.inter_links", d["inter_links"], "allowed only with an inter link preset")
    for side in ("intra", "inter"):
        if side in d:
            link = _link(side, d[side])
            values[f"alpha_{side}"] = link.alpha
            values[f"beta_{side}"] = link.beta / (links if side == "inter" else 1)
    for key, scale in _NUMERIC.items():
        if key in d:
            side = "intra" if "intra" in key else "inter"
            number = _number(key, d[key], positive=key.startswith("bandwidth"))
            if key.startswith("bandwidth"):
                values[f"beta_{side}"] = 1 / (number * scale)
            else:  # alpha_*, beta_* as given; latency_*(us) to seconds
                values[f"{'beta' if key.startswith('beta') else 'alpha'}_{side}"] = number * scale
    for side, other in (("intra", "inter"), ("inter", "intra")):
        for kind in ("alpha", "beta"):
            if f"{kind}_{side}" not in values:
                if f"{kind}_{other}" not in values:
                    raise ConfigError(f"hardware.{kind}_{side}", None, "required: give a preset, a link "
                                      f"({', '.join(LINKS)}) or a number for one side")
                values[f"{kind}_{side}"] = values[f"{kind}_{other}"]
    values["gpus_per_node"] = _integer(d, "gpus_per_node", values.get("gpus_per_node", 1))
    if "overlap" in d:
        values["overlap"] = _number("overlap", d["overlap"], positive=False)
    values["name"] = str(d.get("name", values.get("name", "custom")))
    values["source"] = str(d.get("source", values.get("source", "user-given values")))
    return Hardware(**values)


def _number(field: str, value, *, positive: bool) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ConfigError(f"hardware.{field}", value, f"allowed: a finite number {'> 0' if positive else '>= 0'}")
    return number


def _integer(d: dict, field: str, default: int) -> int:
    value = d.get(field, default)
    try:
        ok = not isinstance(value, bool) and float(value) == int(float(value)) and int(float(value)) >= 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"hardware.{field}", value, "allowed: an integer >= 1")
    return int(float(value))
