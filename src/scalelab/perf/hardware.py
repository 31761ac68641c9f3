"""Hardware for the performance model: the presets (links from their standards, and whole clusters), the fit of a
link's α and β to a collective benchmark, and a hardware description read from a file or a flag. The α-β cost
formulas and the `Hardware` record itself are in scalelab.analysis.hardware, where the sync strategies read them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from itertools import combinations
from types import MappingProxyType

import numpy as np
import pandas as pd

from scalelab.analysis.hardware import Hardware, cost_terms
from scalelab.errors import ConfigError
from scalelab.registry import Registry


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
