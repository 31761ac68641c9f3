"""Streaming figures of a long run whose every step cannot be kept (pure): a quantile sketch and running sums.

`QuantileSketch` is a KLL sketch (Karnin, Lang, Liberty 2016, "Optimal quantile approximation in streams"):
values enter level 0; a level that reaches its capacity is sorted and every other value (from a random start)
moves up one level, where each value stands for twice as many. Capacities shrink by 2/3 per level below the
top (k at the top), so the sketch holds O(k) values whatever the count, and a quantile's rank error is about
1.7 / k in the worst case, much less in practice: with the default k = 400, p50 and p95 of a million values are
within 0.2 % rank of the exact quantiles (tests/unit/analysis/test_sketch.py; benchmarks/long_run.py prints it).
Sketches of several ranks merge into one. The random start is seeded, so a run's sketch is reproducible.

`Running` keeps count, sum, min, max and a sketch of one figure (a stage's seconds per step).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

DEFAULT_K = 400


class QuantileSketch:
    def __init__(self, k: int = DEFAULT_K, seed: int = 0):
        if k < 8:
            raise ValueError(f"k: {k} is not allowed; at least 8")
        self.k, self.n = k, 0
        self.levels: list[list[float]] = [[]]
        self._rng = random.Random(seed)
        self._cap0 = self._capacity(0)

    def _capacity(self, level: int) -> int:
        top = len(self.levels) - 1
        return max(2, math.ceil(self.k * (2 / 3) ** (top - level)))

    def add(self, value: float) -> None:
        level0 = self.levels[0]
        level0.append(value)
        self.n += 1
        if len(level0) >= self._cap0:
            self._compress()

    def extend(self, values: list[float]) -> None:
        """Add many values at once (a chunk of a run's steps): one compaction pass per chunk instead of one check
        per value. A level far over its capacity is halved level by level like any other, so the rank error stays
        that of the per-value path (each halving errs by at most the weight of its level)."""
        self.levels[0].extend(values)
        self.n += len(values)
        while any(len(v) >= self._capacity(i) for i, v in enumerate(self.levels)):
            self._compress()

    def _compress(self) -> None:
        """Halve every level over its capacity, from the bottom up (a promoted half may fill the next level)."""
        for level in range(len(self.levels)):
            if len(self.levels[level]) < self._capacity(level):
                continue
            if level + 1 == len(self.levels):
                self.levels.append([])
            values = sorted(self.levels[level])
            odd = len(values) % 2
            self.levels[level] = values[-1:] if odd else []  # an odd one out stays, unweighted change
            start = self._rng.randint(0, 1)
            self.levels[level + 1].extend(values[start:len(values) - odd:2])
        self._cap0 = self._capacity(0)

    def merge(self, other: "QuantileSketch") -> "QuantileSketch":
        """Add `other`'s values (as it summarised them) to this sketch; returns self."""
        while len(self.levels) < len(other.levels):
            self.levels.append([])
        for level, values in enumerate(other.levels):
            self.levels[level].extend(values)
        self.n += other.n
        self._compress()
        return self

    def weighted(self) -> list[tuple[float, int]]:
        """(value, weight) pairs in value order; the weights sum to about n."""
        return sorted((v, 1 << level) for level, values in enumerate(self.levels) for v in values)

    def quantile(self, q: float) -> float:
        """The value at fraction `q` of the ranks (0..1); NaN for an empty sketch."""
        pairs = self.weighted()
        if not pairs:
            return float("nan")
        total = sum(w for _, w in pairs)
        target, seen = q * total, 0
        for value, weight in pairs:
            seen += weight
            if seen >= target:
                return value
        return pairs[-1][0]

    def to_dict(self) -> dict:
        return {"k": self.k, "n": self.n, "levels": self.levels}

    @classmethod
    def from_dict(cls, data: dict) -> "QuantileSketch":
        out = cls(data["k"])
        out.n, out.levels = data["n"], [list(v) for v in data["levels"]] or [[]]
        out._cap0 = out._capacity(0)
        return out


@dataclass
class Running:
    """Count, sum, min, max and quantile sketch of one figure over a whole run."""

    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    sketch: QuantileSketch = field(default_factory=QuantileSketch)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        self.sketch.add(value)

    def extend(self, values) -> None:
        """Add a chunk of values (a numpy array)."""
        if not len(values):
            return
        self.count += len(values)
        self.total += float(values.sum())
        self.low, self.high = min(self.low, float(values.min())), max(self.high, float(values.max()))
        self.sketch.extend(values.tolist())

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")

    def merge(self, other: "Running") -> "Running":
        self.count += other.count
        self.total += other.total
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)
        self.sketch.merge(other.sketch)
        return self

    def to_dict(self) -> dict:
        return {"count": self.count, "sum": self.total, "min": self.low if self.count else None,
                "max": self.high if self.count else None, "sketch": self.sketch.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "Running":
        return cls(data["count"], data["sum"], math.inf if data["min"] is None else data["min"],
                   -math.inf if data["max"] is None else data["max"], QuantileSketch.from_dict(data["sketch"]))


def whole_run_figures(aggregates: list[dict]) -> dict:
    """Summary figures of a run over every timed step, from each rank's aggregates ({"steps", "timed", "samples",
    "figures": {"wall(s)": Running dict, "<stage>(s)": ...}}): step count, median and p95 step (the ranks'
    sketches merged: a rank's own step time, not the slowest rank's), the run's time as one epoch (mean step x
    steps), mean stage times (mean over ranks) and
    throughput (every rank's samples over the slowest rank's summed step time). Cost: O(ranks x k), not steps."""
    from scalelab.analysis import keys

    if not aggregates:
        return {}
    out = {keys.STEPS_TOTAL: max(a["steps"] for a in aggregates), keys.STEPS_TIMED: max(a["timed"] for a in aggregates)}
    merged: dict[str, Running] = {}
    for agg in aggregates:
        for name, data in agg["figures"].items():
            one = Running.from_dict(data)
            merged[name] = merged[name].merge(one) if name in merged else one
    wall = merged.get("wall(s)")
    if wall is None or not wall.count:
        return out
    out[keys.STEP_MEDIAN_MS] = 1e3 * wall.sketch.quantile(0.5)
    out[keys.STEP_P95_MS] = 1e3 * wall.sketch.quantile(0.95)
    out[keys.STEP_MIN_MS], out[keys.STEP_MAX_MS] = 1e3 * wall.low, 1e3 * wall.high
    out[keys.EPOCH_S] = wall.mean * out[keys.STEPS_TOTAL]  # the probe knows no epochs: the run is one
    for name, fig in merged.items():
        if name != "wall(s)" and fig.count:
            out[keys.stage_ms(name[:-3])] = 1e3 * fig.mean
    slowest = max(Running.from_dict(a["figures"]["wall(s)"]).total for a in aggregates if "wall(s)" in a["figures"])
    samples = sum(a["samples"] for a in aggregates)
    if slowest > 0:
        out[keys.THROUGHPUT] = samples / slowest
    return out
