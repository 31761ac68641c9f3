"""Communication microbenchmark (docs/definitions.md, "Collective microbenchmark"): collectives over a size
sweep, timed two ways, checked.

    scalelab bench comm                                   # 2 ranks, 1K..64M ×2, all four collectives
    scalelab bench comm --ops allreduce --begin 1M --end 256M --iters 50 --ranks 4   # a fixed count per size
    python -m scalelab.measure.commbench_worker --run-dir DIR   # one rank (torchrun starts it)

This module holds the benchmark's math, config and tables; the run itself (record a run of kind "bench", start
the ranks under torchrun on 127.0.0.1, mark it) goes through run/execute.py like every run (run/kinds.py: BENCH). Rank 0 writes timings.json (every
rank's loop and per-iteration times), results.csv and results.json; the parent adds busbw.png and summary.json.

Timing. Every size is timed twice with the same n iterations on every rank:
- the back-to-back loop (nccl-tests' timing, the headline): a barrier, then n collectives with no synchronisation
  between them and one at the end; time_loop = the slowest rank's loop time / n. A small message timed alone
  pays a thread wake-up or a scheduler tick per call (a 4 KiB gloo allreduce: median 1.4 ms, min 0.45 ms);
  back to back, that cost is paid about once per loop, so α fitted on these times is the collective's latency.
- per iteration: a barrier before each call and a sync after it; an iteration's time is the slowest rank's, as a
  collective is done when its last rank is. Its min, median (with the 95 % interval of
  `scalelab.analysis.intervals.median_interval`) and max are the spread a single isolated call sees.
n is `iters` when given; otherwise it is chosen per size so that small messages get many iterations
(`choose_iters`): about ITERS_TARGET_S of per-iteration timing (the loop takes at most as long), at least
ITERS_MIN and at most ITERS_MAX, from a probe of PROBE_ITERS timed calls after the warm-up whose median the
ranks share by a MAX all_reduce, so every rank runs the same n.

Definitions (nccl-tests): S is the total buffer size in bytes (allreduce and broadcast: the buffer; allgather:
the output; reduce_scatter: the input). algbw = S / t with t = time_loop, busbw = algbw · factor with factor
2(n−1)/n for allreduce, (n−1)/n for allgather and reduce_scatter, 1 for broadcast; bandwidths in GB/s (1e9
bytes/s); busbw_min / busbw_max are those of the slowest and fastest single iteration. Sizes with K/M/G are
powers of 1024.
"""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scalelab import config as _config
from scalelab.analysis.bandwidth import bus_factor
from scalelab.analysis.intervals import median_interval
from scalelab.errors import ConfigError, StoreError
from scalelab.store.rundir import RunDir

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
BACKENDS = ("auto", "gloo", "nccl")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}  # bytes per element
# Columns of results.csv / results.json, in order. time_loop: the back-to-back loop's time per iteration (the
# headline, algbw and busbw are computed from it); time_min/median/max and the median's 95 % interval
# (time_ci_low/high): single iterations, each timed between syncs; every time is the slowest rank's.
COLUMNS = ("op", "impl", "size(B)", "count", "dtype", "ranks", "iters", "time_loop(us)", "time_min(us)",
           "time_median(us)", "time_ci_low(us)", "time_ci_high(us)", "time_max(us)", "algbw(GB/s)", "busbw(GB/s)",
           "busbw_min(GB/s)", "busbw_max(GB/s)", "wrong", "status", "reason")
# Iterations per size when `iters` is not given (choose_iters).
ITERS_TARGET_S = 0.2  # seconds of per-iteration timing per size and op
ITERS_MIN = 5  # enough for a median and its range
ITERS_MAX = 1000  # a 1 KiB allreduce at 50 µs would otherwise run 4000
PROBE_ITERS = 3  # timed calls after the warm-up that estimate one call's time

_SIZE_RE = re.compile(r"\s*(\d+)\s*([KMG]?)(?:I?B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


# ---------------------------------------------------------------- pure math

def parse_size(text: str | int, field: str = "size") -> int:
    """Bytes from '64M', '1K', '4096' or an int; K/M/G are powers of 1024 (as nccl-tests reads -b/-e)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE_RE.fullmatch(str(text))
        if not match:
            raise ConfigError(field, text, "allowed: a whole number of bytes with an optional K, M or G suffix, e.g. 64M")
        value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if value < 1:
        raise ConfigError(field, text, "allowed: a size of at least 1 byte, e.g. 1K")
    return value


def format_size(nbytes: int) -> str:
    """'64M' for 67108864, '1536' for 1536: the largest power-of-1024 unit that divides the size exactly."""
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def size_sweep(begin: int, end: int, factor: int) -> list[int]:
    """begin, begin·factor, begin·factor², ... up to and including end."""
    if factor < 2:
        raise ConfigError("factor", factor, "allowed: an integer >= 2")
    if end < begin:
        raise ConfigError("end", format_size(end), f"allowed: a size >= begin ({format_size(begin)})")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        size *= factor
    return sizes


def message_count(size: int, elem_bytes: int, ranks: int) -> int:
    """Elements in a buffer of about `size` bytes, rounded down to a multiple of ranks (allgather/reduce_scatter
    split it into equal chunks). 0 when the size holds less than one element per rank."""
    return size // elem_bytes // ranks * ranks


def parse_ops(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """'allreduce,broadcast' or a list → a tuple in the given order without repeats; 'all' is every op."""
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else [str(s).strip() for s in text]
    items = [s for s in items if s]
    if items == ["all"]:
        return OPS
    bad = [s for s in items if s not in OPS]
    if bad or not items:
        raise ConfigError("ops", bad[0] if bad else text, f"allowed: a comma-separated list of {', '.join(OPS)} (or all)")
    return tuple(dict.fromkeys(items))


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of a benchmarked op (scalelab.analysis.bandwidth)."""
    if op not in OPS:
        raise ConfigError("op", op, f"allowed: {', '.join(OPS)}")
    return bus_factor(op, ranks)


def algbw_gbps(size: int, seconds: float) -> float:
    """Algorithm bandwidth S / t in GB/s (1e9 bytes per second)."""
    return size / seconds / 1e9


def busbw_gbps(op: str, size: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor."""
    return algbw_gbps(size, seconds) * busbw_factor(op, ranks)


def choose_iters(probe_s: float, target_s: float = ITERS_TARGET_S, lo: int = ITERS_MIN, hi: int = ITERS_MAX) -> int:
    """Iterations for one size: ceil(target_s / probe_s) within [lo, hi]; `probe_s` is one call's time in s
    (the slowest rank's probe median), so a 4 KiB allreduce gets hundreds and a 256 MiB one `lo`."""
    if not probe_s > 0:  # a clock too coarse to see the call (or NaN): as many as allowed
        return hi
    return max(lo, min(hi, math.ceil(target_s / probe_s)))


def iteration_times(per_rank: list[list[float]]) -> list[float]:
    """Per iteration the slowest rank's time: the collective is done only when its last rank is."""
    if len({len(t) for t in per_rank}) != 1:
        raise ValueError(f"ranks timed different numbers of iterations: {[len(t) for t in per_rank]}")
    return [max(ts) for ts in zip(*per_rank)]


def build_table(records: list[dict], ranks: int, dtype: str) -> pd.DataFrame:
    """One row per (op, size) from every rank's records, in sweep order.

    A record is {"op", "size(B)", "count", "rank", "impl", "times(s)": [...], "loop(s)", "wrong"} from a measured
    op ("times(s)": each timed iteration's seconds; "loop(s)": the seconds of len(times) back-to-back calls), or
    {"op", "size(B)", "count", "rank", "skipped": reason} from an op the backend refused.
    """
    groups: dict[tuple[str, int], list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["op"], rec["size(B)"]), []).append(rec)
    rows = []
    for (op, size), recs in groups.items():
        if len({r["rank"] for r in recs}) != ranks:
            raise ValueError(f"{op} at {size} B: records from {len(recs)} of {ranks} ranks")
        row = {"op": op, "impl": None, "size(B)": size, "count": recs[0]["count"], "dtype": dtype, "ranks": ranks,
               "iters": 0, "wrong": None, "status": "ok", "reason": None}
        skipped = [r["skipped"] for r in recs if r.get("skipped")]
        if skipped:
            row.update(status="skipped", reason=skipped[0])
        else:
            times = iteration_times([r["times(s)"] for r in sorted(recs, key=lambda r: r["rank"])])
            t_loop = max(r["loop(s)"] for r in recs) / len(times)  # the loop ends when its slowest rank's does
            t_min, t_med, t_max = min(times), statistics.median(times), max(times)
            ci_low, ci_high = median_interval(times, positive=True)  # a time: never below 0
            row.update(impl=recs[0]["impl"], iters=len(times), wrong=sum(r["wrong"] for r in recs),
                       **{"time_loop(us)": t_loop * 1e6, "time_min(us)": t_min * 1e6, "time_median(us)": t_med * 1e6,
                          "time_ci_low(us)": ci_low * 1e6, "time_ci_high(us)": ci_high * 1e6,
                          "time_max(us)": t_max * 1e6,
                          "algbw(GB/s)": algbw_gbps(size, t_loop), "busbw(GB/s)": busbw_gbps(op, size, t_loop, ranks),
                          # the spread: the slowest iteration gives the lowest bandwidth
                          "busbw_min(GB/s)": busbw_gbps(op, size, t_max, ranks),
                          "busbw_max(GB/s)": busbw_gbps(op, size, t_min, ranks)})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({"wrong": "Int64", "iters": "int64"})


def summarize_table(table: pd.DataFrame) -> dict:
    """Run summary: per op the peak busbw (from the loop) and the size where it was reached; wrong elements; skips."""
    summary: dict = {"rows": int(len(table)), "wrong": int(table["wrong"].fillna(0).sum())}
    for op, rows in table.groupby("op", sort=False):
        ok = rows[rows["status"] == "ok"]
        if ok.empty:
            summary[f"{op}/skipped"] = rows["reason"].iloc[0]
            continue
        best = ok.loc[ok["busbw(GB/s)"].idxmax()]
        summary[f"{op}/busbw_peak(GB/s)"] = float(best["busbw(GB/s)"])
        summary[f"{op}/busbw_peak_size(B)"] = int(best["size(B)"])
        summary[f"{op}/wrong"] = int(ok["wrong"].sum())
    return summary


def wrong_reason(table: pd.DataFrame) -> str | None:
    """One line naming each op whose results had wrong elements, or None when every check passed."""
    bad = table[table["wrong"].fillna(0) > 0].groupby("op", sort=False)["wrong"].sum()
    if bad.empty:
        return None
    return "correctness check failed: " + ", ".join(f"{op} has {int(n)} wrong element(s)" for op, n in bad.items())


# ---------------------------------------------------------------- config

@dataclass(kw_only=True)
class CommBenchConfig:
    """One benchmark run. Sizes accept '64M'-style strings and are stored as bytes."""

    ops: tuple[str, ...] = OPS  # or a comma-separated string
    begin: int = 1024  # smallest message size S in bytes
    end: int = 64 * 1024**2  # largest message size S in bytes (included when on the sweep)
    factor: int = 2  # each size is the previous one times this
    warmup: int = 5  # untimed iterations per size and op
    iters: int | None = None  # timed iterations per size and op (loop and per-iteration); None: chosen per size
    ranks: int = 2  # processes on this node
    backend: str = "auto"  # auto: nccl when CUDA has a GPU per rank, else gloo
    dtype: str = "float32"
    run_id: str | None = None
    local_nodes: int = 0  # nodes made of network namespaces on this machine (run/netns.py), ranks each; 0 = off
    link_gbps: float | None = None  # with local_nodes: each node's link shaped to this many Gbit/s (kernel tbf)
    link_delay_ms: float | None = None  # with local_nodes: one-way delay on each node's link (kernel netem)
    # where the local_nodes nodes come from: namespaces of this machine, or the Slurm allocation's first nodes (one
    # job step, run/slurmnodes.py: the cluster's own link, as the training cells under --launcher slurm)
    nodes_launcher: str = "namespaces"
    sizes: tuple[int, ...] = field(init=False)  # the sweep, derived

    def __post_init__(self) -> None:
        self.ops = parse_ops(self.ops)
        self.begin, self.end = parse_size(self.begin, "begin"), parse_size(self.end, "end")
        if self.nodes_launcher not in ("namespaces", "slurm"):
            raise ConfigError("nodes_launcher", self.nodes_launcher, "allowed: namespaces, slurm")
        _config.check_local_nodes(self)
        # a collective needs two ranks: on one node two processes, across local nodes one per node is enough
        for name, low in (("factor", 2), ("warmup", 0), ("iters", 1), ("ranks", 1 if self.local_nodes > 1 else 2)):
            value = getattr(self, name)
            if name == "iters" and value is None:
                continue  # chosen per size (choose_iters)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(name, value, f"allowed: an integer >= {low}")
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", self.dtype, f"allowed: {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"allowed: {', '.join(BACKENDS)}")
        least = DTYPES[self.dtype] * self.world  # one element per rank in allgather / reduce_scatter
        if self.begin < least:
            raise ConfigError("begin", self.begin, f"allowed: >= {least} bytes ({self.dtype} × {self.world} ranks)")
        self.sizes = tuple(size_sweep(self.begin, self.end, self.factor))
        gpus = _config.cuda_device_count()
        if self.backend == "nccl" and gpus < self.ranks:
            raise ConfigError("backend", "nccl", f"needs a CUDA GPU per rank ({self.ranks}), found {gpus}; "
                                                 "allowed here: gloo or auto")

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if _config.cuda_device_count() >= self.ranks else "gloo"

    @property
    def nnodes(self) -> int:
        return max(1, self.local_nodes)

    @property
    def world(self) -> int:
        """Ranks in the benchmark: `ranks` per node."""
        return self.ranks * self.nnodes

    @property
    def iters_label(self) -> str:
        """'20', or how the count is chosen when it is not fixed."""
        if self.iters is not None:
            return str(self.iters)
        return f"~{ITERS_TARGET_S:g} s ({ITERS_MIN}..{ITERS_MAX})"

    @property
    def device(self) -> str:
        return "cuda" if self.resolved_backend == "nccl" else "cpu"

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        out["ops"], out["sizes"], out["device"] = list(self.ops), list(self.sizes), self.device
        out["nnodes"] = self.nnodes  # derived, as in TrainConfig: the catalog counts ranks x nnodes workers
        if out["nodes_launcher"] == "namespaces":  # the default left out: a bench cell's identity as before Slurm
            del out["nodes_launcher"]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "CommBenchConfig":
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - known - {"sizes", "device", "nnodes"})
        if unknown:
            raise ConfigError(unknown[0], data[unknown[0]], f"unknown field; allowed: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------- stored results

def read_results(run_dir: Path) -> pd.DataFrame:
    """The results table rank 0 stored, as a DataFrame with COLUMNS."""
    rundir = RunDir(run_dir)
    if not rundir.results_json.exists():
        raise StoreError(f"run {rundir.run_id}: rank 0 wrote no results.json")
    return pd.DataFrame(rundir.read_results_table()["rows"], columns=list(COLUMNS)).astype({"wrong": "Int64"})


def results_rich_table(table: pd.DataFrame, title: str | None = None):
    """The results as a rich Table narrow enough for 80 columns (the CSV has every column)."""
    from rich import box
    from rich.table import Table

    out = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                caption="µs per iteration, slowest rank. loop: back-to-back calls (busbw in GB/s from it); "
                        "median/min/max: single calls; wrong: result elements that failed the check")
    # units go in the caption so that the table fits 80 columns; results.csv has algbw and the median's interval
    heads = ("op", "size", "iters", "loop", "median", "min", "max", "busbw", "wrong")
    for head in heads:
        out.add_column(head, justify="left" if head == "op" else "right", no_wrap=True)
    for row in table.to_dict("records"):
        if row["status"] != "ok":
            out.add_row(row["op"], format_size(row["size(B)"]), f"skipped: {row['reason']}", *[""] * 6)
            continue
        times = (f"{row[c]:,.0f}" if row[c] >= 100 else f"{row[c]:.1f}"
                 for c in ("time_loop(us)", "time_median(us)", "time_min(us)", "time_max(us)"))
        out.add_row(row["op"], format_size(row["size(B)"]), str(row["iters"]), *times, _bandwidth(row["busbw(GB/s)"]),
                    str(row["wrong"]))
    return out


def _bandwidth(gbps: float) -> str:
    # at most 6 characters, so that the table fits 80 columns; results.csv keeps full precision
    return f"{gbps:.0f}" if gbps >= 100 else f"{gbps:.2f}" if gbps >= 1 else f"{gbps:.4f}"
