"""Noise detection (pure): how busy the rest of the machine was while a run was timed, and the drift of a
reference cell between a study's start and end.

- The timed window runs from the start of the first timed step to the end of the last (rank 0's clock, as for
  loopback bytes). The machine's cumulative counters sampled by the first rank of each host
  (scalelab.measure.machine) are interpolated linearly at both ends of the window and differenced.
- outside CPU (cores) = machine busy cores - the run's own processes' CPU seconds / window seconds: the cores
  other processes kept busy on average. Machine busy cores = cpus x busy seconds / total seconds of /proc/stat,
  not busy seconds / wall seconds: /proc/stat is tick-sampled, and a virtual machine under load loses ticks (seen
  here: its total advanced 1.92 s per wall second on 2 cores while a hog and a run kept both cores busy), while
  the processes' own CPU times are exact. Without the cpu count (older runs) busy seconds / wall seconds. steal (%) = steal seconds / total CPU seconds. load = the
  mean 1-minute load average of the samples inside the window (the interpolated ends included). With several
  hosts the busiest host counts; samplers of one machine (its boot id: the nodes of a cluster of network
  namespaces) are one host whose run CPU is all of theirs.
- A run is noisy when outside CPU exceeds OUTSIDE_CPU_THRESHOLD cores or steal exceeds STEAL_THRESHOLD.
- Noise floor of a study: drift = (end median step - start median step) / start median step of one reference
  cell measured before the first experiment and after the last; its 95 % interval is the ratio interval of the
  two medians' intervals (scalelab.analysis.intervals.ratio_interval) minus 1.
"""
from __future__ import annotations

import math

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.intervals import ratio_interval

OUTSIDE_CPU_THRESHOLD = 0.25  # cores busy outside the run, averaged over the timed window
STEAL_THRESHOLD = 5.0  # % of the machine's CPU time taken by the hypervisor

COUNTERS = ("cpu_busy(s)", "cpu_run(s)", "cpu_steal(s)", "cpu_total(s)")


def timed_window(records: list[dict]) -> tuple[float, float] | None:
    """(begin, end) in unix seconds of rank 0's timed steps; None without timed steps or timestamps."""
    rank0 = sorted((r for r in records if r.get("rank") == 0 and "t_end(unix_s)" in r), key=lambda r: r["step"])
    timed = [r for r in rank0 if not r["warmup"]]
    if not timed:
        return None
    return timed[0]["t_end(unix_s)"] - timed[0]["wall(s)"], timed[-1]["t_end(unix_s)"]


def window_deltas(samples: list[dict], counters, begin: float, end: float) -> dict[str, float] | None:
    """How much each cumulative counter advanced over [begin, end], interpolated linearly between the samples
    (unix `time`) that hold all of them; None when those samples do not cover the window."""
    rows = sorted((s for s in samples if "time" in s and all(k in s for k in counters)), key=lambda s: s["time"])
    if len(rows) < 2 or not rows[0]["time"] <= begin < end <= rows[-1]["time"]:
        return None
    t = np.array([s["time"] for s in rows])
    return {k: float(np.interp(end, t, values) - np.interp(begin, t, values))
            for k in counters for values in [np.array([s[k] for s in rows], dtype=float)]}


def host_noise(samples: list[dict], begin: float, end: float, *, also_run_s: float = 0.0) -> dict | None:
    """Outside CPU (cores), steal (%) and load over [begin, end] from one host's machine samples; None when the
    samples do not cover the window. `also_run_s`: CPU seconds the run's processes that another sampler of the
    same machine watched used over the window (the other nodes of a cluster of namespaces on one machine)."""
    d = window_deltas(samples, COUNTERS, begin, end)
    if d is None:
        return None
    rows = sorted((s for s in samples if "time" in s and all(k in s for k in COUNTERS)), key=lambda s: s["time"])
    total, cpus = d["cpu_total(s)"], rows[-1].get("cpus")
    busy_cores = cpus * d["cpu_busy(s)"] / total if cpus and total > 0 else d["cpu_busy(s)"] / (end - begin)
    out = {"outside": max(0.0, busy_cores - (d["cpu_run(s)"] + also_run_s) / (end - begin)),
           "steal": 100.0 * d["cpu_steal(s)"] / total if total > 0 else 0.0}
    loads = [(s["time"], s["load1"]) for s in rows if "load1" in s]
    if len(loads) >= 2:
        lt, lv = np.array([x[0] for x in loads]), np.array([x[1] for x in loads])
        inside = [v for ti, v in loads if begin < ti < end]
        out["load"] = float(np.mean([np.interp(begin, lt, lv), *inside, np.interp(end, lt, lv)]))
    return out


def noise_reason(outside_cores: float, steal_pct: float) -> str:
    """The verdict in words: "ok" or "noisy: ..." naming what crossed its threshold."""
    why = []
    if outside_cores > OUTSIDE_CPU_THRESHOLD:
        why.append(f"{outside_cores:.2f} cores busy outside the run")
    if steal_pct > STEAL_THRESHOLD:
        why.append(f"{steal_pct:.1f} % CPU stolen by the hypervisor")
    return "noisy: " + ", ".join(why) if why else "ok"


def noise_summary(samples: list[dict], records: list[dict]) -> dict:
    """The run's noise keys from all ranks' system samples and step records; {} when no host's machine samples
    cover the timed window (older runs, runs too short to be sampled)."""
    window = timed_window(records)
    if window is None:
        return {}
    by_rank: dict[int, list[dict]] = {}
    for s in samples:
        by_rank.setdefault(s.get("rank", 0), []).append(s)
    # samplers on one machine (the nodes of a --local-nodes cluster: one boot id) see the same /proc/stat: the
    # machine is judged once, with the CPU of every node's run processes taken off
    machines: dict[str, list[list[dict]]] = {}
    for rank, rows in by_rank.items():
        machines.setdefault(str(rows[0].get("host", f"rank {rank}")), []).append(rows)
    hosts = []
    for samplers in machines.values():
        others = [window_deltas(rows, ("cpu_run(s)",), *window) for rows in samplers[1:]]
        h = host_noise(samplers[0], *window, also_run_s=sum(d["cpu_run(s)"] for d in others if d))
        if h is not None:
            hosts.append(h)
    if not hosts:
        return {}
    outside, steal = max(h["outside"] for h in hosts), max(h["steal"] for h in hosts)
    reason = noise_reason(outside, steal)
    out = {keys.NOISE_OUTSIDE_CPU_CORES: outside, keys.NOISE_STEAL_PCT: steal,
           keys.QUALITY_NOISY: reason != "ok", keys.QUALITY_NOISE_REASON: reason}
    loads = [h["load"] for h in hosts if "load" in h]
    if loads:
        out[keys.NOISE_LOAD] = max(loads)
    return out


def drift(start: tuple[float, tuple[float, float]], end: tuple[float, tuple[float, float]]) -> dict:
    """Relative drift of a reference cell's median step between a study's start and end: `start` and `end` are
    (median, (ci_low, ci_high)). drift = end / start - 1; its interval is that of the ratio of the two
    independently measured medians (conservative: every value of one interval against every value of the other)."""
    if not start[0] > 0:
        return {"drift": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    low, high = ratio_interval(end[1], start[1])
    return {"drift": end[0] / start[0] - 1, "ci_low": low - 1, "ci_high": high - 1}


def drift_sentence(d: dict, start_ms: float, end_ms: float) -> str:
    """The noise floor in one line, e.g. "+4.1 % (95 % interval -2.0 .. +9.8 %): reference step 96.0 -> 100.0 ms"."""
    return (f"{100 * d['drift']:+.1f} % (95 % interval {100 * d['ci_low']:+.1f} .. {100 * d['ci_high']:+.1f} %): "
            f"reference step {start_ms:.1f} ms at the start, {end_ms:.1f} ms at the end")
