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
- A run is noisy when outside CPU exceeds OUTSIDE_CPU_THRESHOLD cores by more than the counters' resolution, or
  steal exceeds STEAL_THRESHOLD. The resolution (`resolution`): /proc counts CPU in ticks of 10 ms; each of the two
  counters (the machine's busy time, the run's) is off by up to a tick over the span its window delta is read
  from, the window or, when the window lies inside one sampling interval, that interval: 2 ticks / max(window,
  interval). A 2 s window resolves 0.01 cores; a quick study's threads cell (six 4 ms steps inside a 0.126 s
  sampling interval) 0.16 cores: there "0.25 cores busy outside the run" flagged a threads cell on one tick.
- Noise floor of a study: drift = (end median step - start median step) / start median step of one reference
  cell measured before the first experiment and after the last; its 95 % interval is the ratio interval of the
  two medians' intervals (scalelab.analysis.intervals.ratio_interval) minus 1.
- The study's noise model (`fit`, `model_of_tables`): the launch-to-launch variance of ln(launch median step) pooled
  over the study's cells, with its degrees of freedom, the step-to-step component beside it, heterogeneous cells
  kept apart; `contrast` turns it into the standard error of one comparison (unpaired or paired by round) and
  `launches_needed` into the launches that would decide it (docs/definitions.md, "Noise model and decisions").
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.intervals import ratio_interval

OUTSIDE_CPU_THRESHOLD = 0.25  # cores busy outside the run, averaged over the timed window
TICK_S = 0.01  # USER_HZ: /proc/stat and /proc/PID/stat count CPU in 1/100 s whatever the kernel's own HZ
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


def resolution(window_s: float, sample_s: float = 0.0) -> float:
    """The outside CPU (cores) that the tick-counted counters can tell from none over a window of `window_s` read
    from samples `sample_s` apart: a tick of each of the two counters over the longer of the two."""
    span = max(window_s, sample_s)
    return 2 * TICK_S / span if span > 0 else math.inf


def noise_reason(outside_cores: float, steal_pct: float, resolution_cores: float = 0.0) -> str:
    """The verdict in words: "ok" or "noisy: ..." naming what crossed its threshold (outside CPU beyond the
    threshold by more than the counters' resolution)."""
    why = []
    if outside_cores > OUTSIDE_CPU_THRESHOLD + resolution_cores:
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
    gaps = [float(np.median(np.diff(sorted(s["time"] for s in rows if "time" in s))))
            for rows in by_rank.values() if len(rows) > 1]
    tick = resolution(window[1] - window[0], min(gaps) if gaps else 0.0)
    reason = noise_reason(outside, steal, tick)
    out = {keys.NOISE_OUTSIDE_CPU_CORES: outside, keys.NOISE_STEAL_PCT: steal, keys.NOISE_RESOLUTION_CORES: tick,
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


# ---------------------------------------------------------------- the study's pooled noise model
#
# Two variance components of ln(step time), as in Kalibera & Jones ("Rigorous benchmarking in reasonable time",
# 2013): step to step within one launch, and launch to launch (each launch's median around its cell's mean). On a
# log scale both are relative, so cells of 5 ms and of 500 ms share them. The launch component is what a
# comparison between configurations rests on; it is pooled over every cell of the study that has two launches or
# more (sum of squares over sum of degrees of freedom), so that a comparison of two cells of 2 launches each rests
# on tens of degrees of freedom, not one. The pooling is checked, not assumed: a cell whose own launch variance
# exceeds the pool of the others beyond an F test at HETEROGENEITY_ALPHA (Bonferroni over the cells) is kept apart
# and keeps its own estimate and degrees of freedom (docs/definitions.md, "Noise model and decisions").

HETEROGENEITY_ALPHA = 0.05  # family-wise over the cells tested


@dataclass(frozen=True)
class NoiseModel:
    """The pooled launch-to-launch variance of ln(launch median) and its degrees of freedom, the step-to-step
    variance of ln(step) within launches beside it, the cells pooled, and the cells kept apart with their own
    (variance, dof), keyed by their launch medians (a cell shared by two experiments is one cell)."""
    launch_var: float
    dof: int
    within_var: float = math.nan
    within_dof: int = 0
    cells: int = 0
    apart: dict = field(default_factory=dict)  # tuple of launch medians -> (variance, dof, label)
    steps: float = math.nan  # timed steps per launch, the median over the cells

    def step_share(self) -> float:
        """The share of one launch median's variance that is step-to-step noise, which longer launches would
        shrink: (pi / 2) s_w^2 / steps (a median of `steps` values) over the launch-to-launch variance, at most 1.
        The rest moves only with more launches, so when it is under half, more launches buy more precision per
        second than longer ones (the study's top-ups add launches: lab.study.top_up)."""
        if not (self.dof and self.within_dof and self.steps > 0 and self.launch_var > 0):
            return math.nan
        return min(1.0, math.pi / 2 * self.within_var / self.steps / self.launch_var)

    def variance(self, launches: Sequence[float]) -> tuple[float, int]:
        """(variance of one launch's ln median, its dof) for a cell with these launch medians: its own when it
        was kept apart, else the pool's."""
        own = self.apart.get(_key(launches))
        return (own[0], own[1]) if own else (self.launch_var, self.dof)

    def kept_apart(self, launches: Sequence[float]) -> bool:
        return _key(launches) in self.apart

    def words(self) -> str:
        """The model in one line, for the report and the cards' notes."""
        if not self.dof:
            return "no cell with two launches or more: no launch-to-launch noise estimate"
        text = (f"launch-to-launch noise {100 * math.sqrt(self.launch_var):.1f} % (standard deviation of ln "
                f"launch median, {self.dof} degrees of freedom, pooled over {self.cells} cells)")
        if self.within_dof:
            text += (f"; step-to-step within a launch {100 * math.sqrt(self.within_var):.1f} % "
                     f"({self.within_dof} degrees of freedom)")
        share = self.step_share()
        if share == share:
            buy = "more launches buy more precision than longer ones" if share < 0.5 else \
                "longer launches would buy as much precision as more launches"
            text += (f"; at {self.steps:.0f} timed steps a launch, step-to-step noise is {100 * share:.0f} % of a "
                     f"launch median's variance: {buy}")
        if self.apart:
            text += "; kept apart (their own launch spread beyond the pool's): " + ", ".join(
                f"{label} ({100 * math.sqrt(v):.1f} %, {d} dof)" for v, d, label in self.apart.values())
        return text


def _key(launches: Sequence[float]) -> tuple:
    return tuple(round(float(x), 9) for x in launches)


def fit(cells: Sequence[tuple[str, Sequence[float], float, int]], *, log: bool = True) -> NoiseModel:
    """The model from the study's cells: (label, launch medians in ms, within-launch variance of ln step, its dof)
    each. Cells with identical launch medians are one cell (shared across experiments); cells of one launch add
    to the within component only. `log` False: the values' own scale (an accuracy per seed, in points: its
    seed-to-seed variance pooled over the cells alike)."""
    from scipy.stats import f as f_dist

    seen, launch, within, steps = set(), [], [], []
    for label, medians, wvar, wdof in cells:
        values = [float(x) for x in medians or () if x is not None and float(x) > 0]
        if not values or _key(values) in seen:
            continue
        seen.add(_key(values))
        if wdof and not math.isnan(wvar):
            within.append((wvar * wdof, wdof))
            steps.append(wdof / len(values) + 1)  # each launch's dof is its timed steps - 1
        if len(values) >= 2:
            logs = np.log(values) if log else np.asarray(values)
            launch.append((label, tuple(values), float(((logs - logs.mean()) ** 2).sum()), len(values) - 1))
    ss, dof = sum(c[2] for c in launch), sum(c[3] for c in launch)
    apart = {}
    for label, values, squares, d in launch:
        rest_ss, rest_dof = ss - squares, dof - d
        if rest_dof < 1 or rest_ss <= 0:
            continue
        ratio = (squares / d) / (rest_ss / rest_dof)
        if f_dist.sf(ratio, d, rest_dof) < HETEROGENEITY_ALPHA / len(launch):
            apart[_key(values)] = (squares / d, d, label)
    kept = [c for c in launch if _key(c[1]) not in apart]
    pool_ss, pool_dof = sum(c[2] for c in kept), sum(c[3] for c in kept)
    wss, wdof = sum(w[0] for w in within), sum(w[1] for w in within)
    return NoiseModel(pool_ss / pool_dof if pool_dof else math.nan, pool_dof, wss / wdof if wdof else math.nan,
                      wdof, len(kept), apart, float(np.median(steps)) if steps else math.nan)


def model_of_tables(tables: Sequence) -> NoiseModel:
    """The model fitted to every trusted row of `tables` (DataFrames) that keeps its launch medians
    (analysis.repeats)."""
    from scalelab.analysis.compare import trusted
    from scalelab.analysis.repeats import LAUNCH_MEDIANS, WITHIN_DOF, WITHIN_VAR

    cells = []
    for table in tables:
        if LAUNCH_MEDIANS not in getattr(table, "columns", ()):
            continue
        label = table.columns[1] if table.columns[0] == "run_id" else table.columns[0]
        for row in table.to_dict("records"):
            medians = row.get(LAUNCH_MEDIANS)
            if not trusted(row.get("quality")):  # a flagged row (noisy, implausible) says nothing of the machine's
                continue                         # usual launch noise: left out of the pool, as of the decisions
            if isinstance(medians, (list, tuple)) and medians:
                wvar, wdof = row.get(WITHIN_VAR), row.get(WITHIN_DOF)
                cells.append((str(row.get(label)), medians, float(wvar) if _number(wvar) else math.nan,
                              int(wdof) if _number(wdof) else 0))
    return fit(cells)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


@dataclass(frozen=True)
class Contrast:
    """ln(a / b) of two cells' figures with its standard error and degrees of freedom; `paired`: from the
    per-round differences (drift between rounds cancels) rather than from the two sets of launches."""
    estimate: float
    se: float
    dof: float
    paired: bool = False
    chosen_of_two: bool = False  # the narrower of the paired and the unpaired interval: each at alpha / 2

    def interval(self, alpha: float) -> tuple[float, float]:
        """The two-sided 1 - alpha interval of ln(a / b) (Student's t; normal for infinite dof); when it was chosen
        as the narrower of two, at alpha / 2 (Bonferroni over the two: choosing cannot inflate the error rate)."""
        from scipy.stats import t

        alpha = alpha / 2 if self.chosen_of_two else alpha
        q = t.ppf(1 - alpha / 2, self.dof) if math.isfinite(self.dof) else t.ppf(1 - alpha / 2, 1e9)
        return self.estimate - q * self.se, self.estimate + q * self.se


def contrast(estimate: float, a: Sequence[float], b: Sequence[float], model: NoiseModel,
             alpha: float) -> Contrast | None:
    """ln(a / b) = `estimate` (from the cells' headline figures) with the standard error of the launch component:
    unpaired, each side's variance from the model (pooled, or its own where kept apart; Welch-Satterthwaite dof
    when they differ); paired, the per-round differences of ln launch medians (n - 1 dof), used where its
    interval is the narrower; where both exist, each is judged at alpha / 2 (`Contrast.chosen_of_two`). None when
    a side has fewer than 2 launches or the model no estimate."""
    if len(a) < 2 or len(b) < 2:
        return None
    (va, da), (vb, db) = model.variance(a), model.variance(b)
    out = _unpaired(estimate, (va, da, len(a)), (vb, db, len(b))) if da and db and va == va and vb == vb else None
    if len(a) == len(b) >= 3:
        d = np.log(np.asarray(a, dtype=float)) - np.log(np.asarray(b, dtype=float))
        out = _narrower(out, _paired(estimate, d), alpha)
    return out


def _unpaired(estimate: float, a: tuple[float, int, int], b: tuple[float, int, int]) -> Contrast:
    """The unpaired contrast from each side's (variance of one value, its dof, n): the dof of a shared variance,
    else Welch-Satterthwaite's."""
    (va, da, na), (vb, db, nb) = a, b
    wa, wb = va / na, vb / nb
    dof = da if (va, da) == (vb, db) else (wa + wb) ** 2 / (wa ** 2 / da + wb ** 2 / db)
    return Contrast(estimate, math.sqrt(wa + wb), dof)


def _paired(estimate: float, differences: np.ndarray) -> Contrast:
    """The paired contrast from the per-round (per-seed) differences: their sd / sqrt(n), n - 1 dof."""
    n = len(differences)
    return Contrast(estimate, float(np.std(differences, ddof=1) / math.sqrt(n)), n - 1, paired=True)


def _narrower(unpaired: Contrast | None, paired: Contrast, alpha: float) -> Contrast | None:
    """The paired contrast where the unpaired is missing; else the narrower of the two, each judged at alpha / 2
    (`Contrast.chosen_of_two`: choosing cannot inflate the error rate)."""
    from scipy.stats import t

    if not paired.se > 0:
        return unpaired
    if unpaired is None:
        return paired
    two = alpha / 2
    narrower = t.ppf(1 - two / 2, paired.dof) * paired.se < t.ppf(1 - two / 2, unpaired.dof) * unpaired.se
    return dataclasses.replace(paired if narrower else unpaired, chosen_of_two=True)


def difference_contrast(a: Sequence[float], b: Sequence[float], lower: bool, alpha: float,
                        pool: NoiseModel | None = None) -> Contrast | None:
    """mean(a) - mean(b) (the other way round when `lower` is better) of two figures measured once per seed, in
    points: unpaired, from `pool` (the seed-to-seed variance pooled over the experiment's cells, `fit(log=False)`,
    a side's own where kept apart) or, without one, Welch's from each side's own seed spread; paired, when
    both have the same n >= 3 seeds in seed order, the per-seed differences (n - 1 dof: a seed's initial weights and
    data order are shared by both sides, so what they move cancels); where both exist, the narrower is used, each
    judged at alpha / 2 (as `contrast`). None below 2 seeds a side."""
    x, y = (np.asarray(v, dtype=float) for v in ((b, a) if lower else (a, b)))
    if len(x) < 2 or len(y) < 2:
        return None
    (va, da), (vb, db) = ((pool.variance(v) for v in (x, y)) if pool is not None and pool.dof else
                          ((float(v.var(ddof=1)), len(v) - 1) for v in (x, y)))
    est = float(x.mean() - y.mean())
    out = _unpaired(est, (va, da, len(x)), (vb, db, len(y))) if va + vb > 0 and da and db else None
    if len(x) == len(y) >= 3:
        out = _narrower(out, _paired(est, x - y), alpha)
    return out


def launches_needed(c: Contrast, n: int, delta: float, alpha: float, power: float = 0.8) -> int:
    """Launches per side for a two-sided 1 - alpha interval to exclude 0 with probability `power` when the true
    |ln ratio| is `delta` (and, at a true ratio of 1, to lie within +-delta about as often): n se^2 scaled. The
    normal quantile: by then the pooled degrees of freedom are many (an estimate, "about k more")."""
    from scipy.stats import norm

    per_launch = c.se * math.sqrt(n)  # the standard error of one launch per side
    q = norm.ppf(1 - alpha / 2)
    return max(n + 1, math.ceil((per_launch * (q + norm.ppf(power)) / delta) ** 2))


def geometric_shift(launches: Sequence[float]) -> float:
    """ln(geometric mean) - ln(median) of launch medians: what moves a headline median to the estimator whose
    variance the model gives (a median of 4 or 8 launch medians varies more than their mean of logs)."""
    ordered = sorted(float(v) for v in launches)
    k = len(ordered)
    median = ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2
    return float(np.mean(np.log(ordered))) - math.log(median)


def figure_interval(value: float, launches: Sequence[float], model: NoiseModel,
                    time: bool = True) -> tuple[float, float] | None:
    """A cell's 95 % interval from the model: G x exp(+-t(dof) sqrt(s^2 / n)), G the figure `value` moved to the
    geometric mean of its launch medians (`time`: a time; else a rate, ln rate = ln work - ln step), s^2 the
    pool's or the cell's own. None without an estimate."""
    from scipy.stats import t

    var, dof = model.variance(launches)
    if not dof or not var == var:
        return None
    half = t.ppf(0.975, dof) * math.sqrt(var / len(launches))
    centre = value * math.exp(geometric_shift(launches) if time else -geometric_shift(launches))
    return centre * math.exp(-half), centre * math.exp(half)
