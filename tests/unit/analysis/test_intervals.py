"""The median's 95 % interval against known truths: series drawn from known distributions with a fixed seed,
1000 trials each (the issue asks for 200; 1000 pin a coverage to about +-0.7 points). It must cover the true median in 92-98 % of them, also on a drifting (autocorrelated) series, where
an interval that treats steps as independent fails."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.analysis.intervals import (RANGE_MIN_N, difference_interval, lag1_autocorrelation,
                                         mean_interval, median_interval, ratio_interval, separated)
from scalelab.analysis.intervals import coverage as real_coverage

TRIALS = 1000
SEED = 2


def ar1(rng, n: int, phi: float, sd: float = 5.0, mu: float = 100.0) -> np.ndarray:
    """A stationary AR(1) series around mu (marginal sd `sd`): a machine whose speed drifts and comes back."""
    noise = rng.normal(0, sd * math.sqrt(1 - phi ** 2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return mu + x


def coverage(draw, true: float, interval=median_interval) -> float:
    hits = 0
    for _ in range(TRIALS):
        low, high = interval(draw())
        hits += low <= true <= high
    return hits / TRIALS


def iid_interval(values):
    """The interval that treats steps as independent (order statistics alone): what drift defeats."""
    from scipy import stats

    x = np.sort(values)
    k = int(stats.binom.ppf(0.025, len(x), 0.5))
    return x[k - 1], x[len(x) - k]


@pytest.mark.parametrize("name, draw", [
    ("normal, 40 steps", lambda rng: rng.normal(100, 5, 40)),
    ("lognormal (skewed, like step times), 40 steps", lambda rng: 100 * np.exp(rng.normal(0, 0.2, 40))),
    ("normal, 12 steps", lambda rng: rng.normal(100, 5, 12)),
    ("drifting: AR(1) 0.5, 60 steps", lambda rng: ar1(rng, 60, 0.5)),
    ("drifting: AR(1) 0.8, 60 steps", lambda rng: ar1(rng, 60, 0.8)),
])
def test_the_interval_covers_the_true_median_92_to_98_percent(name, draw):
    rng = np.random.default_rng(SEED)
    assert 0.92 <= coverage(lambda: draw(rng), 100.0) <= 0.98, name


@pytest.mark.parametrize("name, draw, true", [
    ("normal, 40 steps", lambda rng: rng.normal(100, 5, 40), 100.0),
    ("lognormal, 40 steps", lambda rng: 100 * np.exp(rng.normal(0, 0.2, 40)), 100 * math.exp(0.02)),
    ("drifting: AR(1) 0.5, 60 steps", lambda rng: ar1(rng, 60, 0.5), 100.0),
])
def test_the_mean_interval_covers_the_true_mean_92_to_98_percent(name, draw, true):
    """Epoch time, throughput and time inside collectives are means: their interval against known means."""
    rng = np.random.default_rng(SEED)
    assert 0.92 <= coverage(lambda: draw(rng), true, mean_interval) <= 0.98, name


def test_an_interval_that_treats_drifting_steps_as_independent_fails():
    rng = np.random.default_rng(SEED)
    assert coverage(lambda: ar1(rng, 60, 0.8), 100.0, iid_interval) < 0.8  # about 0.61


def test_short_series_and_edge_cases():
    assert median_interval([5.0, 6.0, 7.0]) == (5.0, 7.0)  # too few for order statistics: the whole range
    assert all(math.isnan(v) for v in median_interval([]))
    assert all(math.isnan(v) for v in mean_interval([4.0])) and all(math.isnan(v) for v in mean_interval([]))
    assert lag1_autocorrelation([1, 2, 3]) == 0.0  # too short to tell correlation from chance
    assert lag1_autocorrelation(list(range(50))) == pytest.approx(0.95)  # a trend: capped


def test_combined_intervals_are_conservative():
    assert difference_interval((38.0, 43.0), (29.0, 32.0)) == (6.0, 14.0)
    assert ratio_interval((90.0, 110.0), (45.0, 55.0)) == pytest.approx((90 / 55, 110 / 45))
    assert all(math.isnan(v) for v in ratio_interval((1.0, 2.0), (0.0, 1.0)))
    assert separated((1.0, 2.0), (2.5, 3.0)) and not separated((1.0, 2.6), (2.5, 3.0))


def test_below_six_values_the_range_covers_the_median_1_minus_2_half_to_the_n():
    # P(all n values on one side of the median) = 2 * 0.5^n: the range misses the median that often
    assert [real_coverage(n) for n in (2, 3, 4, 5)] == [0.5, 0.75, 0.875, 0.9375]
    assert RANGE_MIN_N == 6 and real_coverage(6) == real_coverage(40) == 0.95  # 1 - 2 / 64 = 96.9 % >= 95 %: order statistics
    assert math.isnan(real_coverage(1)) and math.isnan(real_coverage(0)) and real_coverage(None) == 0.95  # None: an old row
    # the range that median_interval returns below 6 values really has that coverage (1000 seeded trials of 4)
    rng = np.random.default_rng(SEED)
    hits = sum(lo <= 0.0 <= hi for lo, hi in (median_interval(rng.normal(size=4)) for _ in range(1000)))
    assert 0.85 <= hits / 1000 <= 0.90


def test_one_value_makes_no_interval_and_separates_nothing():
    assert all(math.isnan(v) for v in median_interval([5.0]))
    assert all(math.isnan(v) for v in mean_interval([5.0]))
    assert not separated((5.0, 5.0), (9.0, 9.0))  # two single values 4 ms apart: not a finding
    assert not separated((5.0, 5.0), (6.0, 7.0)) and not separated((6.0, 7.0), (5.0, 5.0))
    assert not separated((math.nan, math.nan), (6.0, 7.0)) and not separated(None, (6.0, 7.0))
    assert separated((4.0, 5.0), (6.0, 7.0))
