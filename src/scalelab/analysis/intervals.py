"""95 % intervals for the figures scalelab reports (pure).

- `median_interval`: the median of a series of timings (a run's steps). The distribution-free interval from order
  statistics assumes independent values; consecutive steps are not (the machine drifts, caches warm, a neighbour
  starts), and then that interval is too narrow: on an AR(1) series with lag-1 correlation 0.8 it covered the true
  median 61 % of the time. So its half-widths are widened by sqrt((1 + r) / (1 - r)), the AR(1) variance factor,
  with r the lag-1 autocorrelation of the series (bias-corrected, 0 when negative). Coverage of the true median
  (tests/unit/analysis/test_intervals.py, 1000 seeded trials each): 95.7 % on independent normal and lognormal
  series of 40 steps, 97.0 % on 12 steps, 97.4 % and 93.9 % on AR(1) series of 60 steps with correlation 0.5 and
  0.8; slightly under at correlation 0.9 (91.9 % on 100 steps), where r is underestimated more often.
- `mean_interval`: the mean of such a series (epoch time, throughput, time inside collectives, a stage's mean
  time are means): Student's t interval with the standard error widened by the same AR(1) factor. Coverage of the
  true mean (tests/unit/analysis/test_intervals.py, 1000 trials): 95.1 % and 94.3 % on independent normal and
  lognormal series of 40 steps, 92.4 % on AR(1) series of 60 steps with correlation 0.5 (89.3 % at 0.8: the mean
  of a drifting series is harder to pin than its median).
- A quantity that cannot be below 0 (a time, a byte count, a rate over a time) takes `positive=True`: its
  interval is built on a log scale, so it never reaches below 0. The mean's is the delta method on log(mean):
  mean * exp(+-h / mean), h the half-width above, which is h itself when h is small against the mean and turns
  right-skewed (as such a series is) when it is not: 12 steps of 5 ms with two of 80 ms (steps 3 and 8) give
  6.1-50.5 ms where the normal approximation gave -1.0 to 36.0 ms. The median's order-statistic ends are
  widened on the log scale too: median * (end / median) ** factor, the same ends as above when the factor is 1.
  Coverage (tests/unit/analysis/test_intervals.py, 1000 trials): of the true mean 94.5 % on lognormal series of
  40 steps and 92.4 % on AR(1) series of 60 steps with correlation 0.5, as the linear interval; on 12 steps of a
  skewed mixture (90 % at 5 ms, 10 % at 80 ms) both cover only 72-74 % (28 % of such samples hold no slow step:
  no interval sees what was never drawn), but the linear one reached below 0 in 66 % of the trials, this one in
  none; of the true median: the linear interval's coverage on every series above.
- `difference_interval` / `ratio_interval`: figures computed from two independently measured ones (exposed =
  step - baseline, speedup = T1 / TN): the conservative combination of their intervals (every value in one with
  every value in the other).

Small samples. With fewer than RANGE_MIN_N = 6 values, order statistics cannot make a 95 % interval for a median:
the best they give is the whole range, which covers the true median with probability 1 - 2 * 0.5^n (50 % at n = 2,
75 % at 3, 87.5 % at 4, 93.75 % at 5). `median_interval` still returns that range, and `coverage(n)` says what it
is; a sentence prints it with its coverage ("range of 4, 87.5 %"), never as a 95 % interval. One value makes no
interval at all: both functions return NaN, and `separated` says False for a missing, NaN or zero-width interval,
so a single value can never make a difference look like a finding.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_CORRELATION = 0.95  # beyond this a series is a trend, not noise: the factor is capped (sqrt(39) = 6.2)
CONFIDENCE = 0.95
RANGE_MIN_N = 6  # the fewest values whose range covers the median with >= 95 %: 1 - 2 * 0.5^6 = 96.9 %


def coverage(n: int | None, confidence: float = CONFIDENCE) -> float:
    """The probability that `median_interval` over n independent values covers the true median: `confidence`
    from RANGE_MIN_N values on (order statistics chosen for it), below that the range's 1 - 2 * 0.5^n, and NaN
    for n < 2 (no interval). n None (not known: an old stored row) is taken as `confidence`."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return confidence
    n = int(n)
    if n < 2:
        return math.nan
    return confidence if n >= RANGE_MIN_N else 1 - 2 * 0.5 ** n


def lag1_autocorrelation(values: Sequence[float]) -> float:
    """Lag-1 autocorrelation, bias-corrected for short series (r + (1 + 4r) / n), clamped to [0, MAX_CORRELATION]."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 8:
        return 0.0  # too short to tell correlation from chance
    x = x - x.mean()
    denom = float(np.dot(x, x))
    if denom <= 0:
        return 0.0
    r = float(np.dot(x[:-1], x[1:])) / denom
    return min(MAX_CORRELATION, max(0.0, r + (1 + 4 * r) / n))


def _nonnegative(x: np.ndarray, what: str) -> None:
    if len(x) and float(np.min(x)) < 0:
        raise ValueError(f"{what}: a value below 0 ({float(np.min(x)):g}) for a quantity that cannot be negative "
                         "(positive=True is for times, byte counts and rates; a difference takes positive=False)")


def median_interval(values: Sequence[float], confidence: float = 0.95, *,
                    positive: bool = False) -> tuple[float, float]:
    """A 95 % interval for the median of a series of timings, robust to correlation between consecutive values.

    Order statistics give [x_(k), x_(n-k+1)] (1-based), k the largest rank with P(Binomial(n, 1/2) <= k-1) within
    (1 - confidence) / 2; with too few values for that (n < 6 at 95 %) their whole range, whose real coverage is
    `coverage(n)`; one value or none: NaN (no interval). Each half-width is then widened by sqrt((1 + r) / (1 - r))
    for the series' lag-1 autocorrelation r (module docstring); with `positive` (a quantity >= 0) on a log
    scale, so that the interval stays >= 0."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if positive:
        _nonnegative(x, "median_interval")
    if n < 2:
        return math.nan, math.nan
    from scipy import stats  # here, not at the top: ranks import this module and scipy.stats costs them ~1 s

    k = int(stats.binom.ppf((1 - confidence) / 2, n, 0.5))  # P(Bin <= k-1) <= alpha/2 < P(Bin <= k)
    low, high = (x[0], x[-1]) if k < 1 else (x[k - 1], x[n - k])
    median = float(np.median(x))
    r = lag1_autocorrelation(values)  # in the order measured, not sorted
    factor = math.sqrt((1 + r) / (1 - r))
    if positive and median > 0:
        return median * (float(low) / median) ** factor, median * (float(high) / median) ** factor
    if positive:  # a median of 0: nothing below it, the upper side widened as usual
        return 0.0, factor * float(high)
    return median - factor * (median - float(low)), median + factor * (float(high) - median)


def mean_interval(values: Sequence[float], confidence: float = 0.95, *,
                  positive: bool = False) -> tuple[float, float]:
    """A 95 % interval for the mean of a series of timings: mean +- h, h = t * sd / sqrt(n) with the standard
    error widened by sqrt((1 + r) / (1 - r)) for the lag-1 autocorrelation r; with `positive` (a quantity >= 0)
    on a log scale instead: mean * exp(+-h / mean) ((0, 0) when every value is 0). One value or none: NaN."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if positive:
        _nonnegative(x, "mean_interval")
    if n < 2:
        return math.nan, math.nan
    mean = float(x.mean())
    r = lag1_autocorrelation(values)
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    half *= math.sqrt((1 + r) / (1 - r))
    if positive:
        return (mean * math.exp(-half / mean), mean * math.exp(half / mean)) if mean > 0 else (0.0, 0.0)
    return mean - half, mean + half


def difference_interval(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Interval of a - b from intervals of a and b measured independently: [a_low - b_high, a_high - b_low]."""
    return a[0] - b[1], a[1] - b[0]


def ratio_interval(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """Interval of a / b (both positive) from their intervals: [a_low / b_high, a_high / b_low]; NaN where b's
    interval reaches 0."""
    if not b[0] > 0:
        return math.nan, math.nan
    return a[0] / b[1], a[1] / b[0]


def known(iv: tuple[float, float] | None) -> bool:
    """An interval that can tell anything: present, finite and of positive width (one value makes none)."""
    try:
        low, high = float(iv[0]), float(iv[1])
    except (TypeError, ValueError, IndexError):
        return False
    return math.isfinite(low) and math.isfinite(high) and high > low


def separated_95(a: tuple[float, float] | None, n_a: int | None, b: tuple[float, float] | None,
                 n_b: int | None) -> bool:
    """Two 95 % intervals that do not meet: `separated`, and each really a 95 % one (`coverage` of the n values
    it is over; n None: a 95 % interval). Two ranges of 2 seeds (50 % intervals) that do not meet are no finding."""
    return separated(a, b) and all(coverage(n) >= CONFIDENCE for n in (n_a, n_b))


def separated(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """The two intervals do not meet: a difference between them is a finding, not noise. False when either is
    missing, NaN or of zero width (one value): nothing is separated from a single value."""
    return known(a) and known(b) and (a[1] < b[0] or b[1] < a[0])
