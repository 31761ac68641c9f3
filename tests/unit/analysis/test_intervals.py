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


# Issue 43: a time, a byte count or a rate is never below 0, and neither is its interval (positive=True).
SKEWED_STEPS = [5.0, 5.0, 80.0, 5.0, 5.0, 5.0, 5.0, 80.0, 5.0, 5.0, 5.0, 5.0]  # two slow steps of twelve


def test_a_positive_mean_interval_is_the_linear_half_width_on_a_log_scale():
    from scipy import stats

    x = np.array(SKEWED_STEPS)
    mean = x.mean()  # 17.5; no lag-1 correlation (r = 0 after the bias correction's clamp)
    assert lag1_autocorrelation(SKEWED_STEPS) == 0.0
    half = stats.t.ppf(0.975, 11) * x.std(ddof=1) / math.sqrt(12)
    assert mean_interval(SKEWED_STEPS) == pytest.approx((mean - half, mean + half))  # the normal approximation ...
    assert mean_interval(SKEWED_STEPS)[0] < 0  # ... says the time might be negative
    low, high = mean_interval(SKEWED_STEPS, positive=True)
    assert (low, high) == pytest.approx((mean * math.exp(-half / mean), mean * math.exp(half / mean)))
    assert (low, high) == pytest.approx((6.063, 50.51), abs=0.01) and low > 0
    assert mean_interval([0.0, 0.0, 0.0], positive=True) == (0.0, 0.0)  # a step with no collectives at all
    assert all(math.isnan(v) for v in mean_interval([4.0], positive=True))
    # a narrow interval is the linear one (exp(+-d) ~ 1 +- d): nothing changes where nothing was wrong
    steady = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0, 100.2, 99.8]
    assert mean_interval(steady, positive=True) == pytest.approx(mean_interval(steady), abs=0.01)


def test_a_positive_median_interval_widens_on_a_log_scale():
    drifting = [1.0] * 10 + [50.0] * 10  # a shift half-way: r at its cap, the factor sqrt(1.95 / 0.05)
    factor = math.sqrt((1 + 0.95) / (1 - 0.95))
    assert lag1_autocorrelation(drifting) == pytest.approx(0.95)
    assert median_interval(drifting)[0] == pytest.approx(25.5 - factor * 24.5)  # -127: linear widening
    low, high = median_interval(drifting, positive=True)
    assert (low, high) == pytest.approx((25.5 * (1 / 25.5) ** factor, 25.5 * (50 / 25.5) ** factor))
    assert 0 < low < 1.0
    # factor 1 (independent steps): the order-statistic ends themselves, as the linear interval gives
    assert median_interval([5.0, 6.0, 7.0], positive=True) == median_interval([5.0, 6.0, 7.0]) == (5.0, 7.0)
    assert median_interval([0.0, 0.0, 3.0], positive=True) == (0.0, 3.0)  # a median of 0: nothing below it


def test_a_negative_value_of_a_positive_quantity_is_refused():
    with pytest.raises(ValueError, match="below 0 .*cannot be negative"):
        mean_interval([1.0, -0.5, 2.0], positive=True)
    with pytest.raises(ValueError, match="below 0"):
        median_interval([1.0, -0.5, 2.0], positive=True)


@pytest.mark.parametrize("name, draw, true", [
    ("lognormal, 40 steps", lambda rng: 100 * np.exp(rng.normal(0, 0.2, 40)), 100 * math.exp(0.02)),
    ("drifting: AR(1) 0.5, 60 steps", lambda rng: ar1(rng, 60, 0.5), 100.0),
])
def test_the_positive_mean_interval_covers_the_true_mean_92_to_98_percent(name, draw, true):
    rng = np.random.default_rng(SEED)
    assert 0.92 <= coverage(lambda: draw(rng), true, lambda v: mean_interval(v, positive=True)) <= 0.98, name


def test_on_few_skewed_steps_the_positive_interval_never_reaches_below_0():
    """12 steps, 10 % of them 16 times slower: the normal approximation reached below 0 in most trials."""
    def draw(rng):
        return np.where(rng.random(12) < 0.1, 80.0, 5.0) * np.exp(rng.normal(0, 0.05, 12))

    rng = np.random.default_rng(SEED)
    linear = [mean_interval(draw(rng)) for _ in range(TRIALS)]
    rng = np.random.default_rng(SEED)
    positive = [mean_interval(draw(rng), positive=True) for _ in range(TRIALS)]
    assert sum(lo < 0 for lo, _ in linear) / TRIALS > 0.5  # 66 %
    assert all(lo >= 0 for lo, _ in positive)
    true = (0.9 * 5 + 0.1 * 80) * math.exp(0.05 ** 2 / 2)
    # no worse at covering the true mean than the linear interval (both miss the samples without a slow step)
    hits = [sum(lo <= true <= hi for lo, hi in ivs) / TRIALS for ivs in (linear, positive)]
    assert hits[1] >= hits[0] - 0.05
