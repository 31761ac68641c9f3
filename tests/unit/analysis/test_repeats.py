"""A cell launched several times is one figure: pooled steps, an interval that covers the launches' spread."""
from __future__ import annotations

import math

import numpy as np
import pytest

from scalelab.analysis import keys
from scalelab.analysis.repeats import LAUNCH_MEDIANS, LAUNCHES, SET_ASIDE, WITHIN_DOF, WITHIN_VAR, pool


def summary(median, comm):
    return {keys.STEP_MEDIAN_MS: median, keys.COMM_TIME_MS: comm, "quality/noisy": False}


def test_one_launch_is_its_own_summary():
    s = summary(10.0, 2.0)
    within = float(np.var(np.log([9.0, 10.0, 11.0]), ddof=1))
    assert pool([s], [[9.0, 10.0, 11.0]]) == {**s, LAUNCHES: 1, LAUNCH_MEDIANS: [10.0],
                                              WITHIN_VAR: pytest.approx(within), WITHIN_DOF: 2}


def test_launches_pool_their_steps_and_the_interval_covers_the_drift_between_them():
    # three launches, the second on a busier machine: its steps sit 40 % higher
    steps = [[100.0 + i % 3 for i in range(10)], [140.0 + i % 3 for i in range(10)], [101.0 + i % 3 for i in range(10)]]
    out = pool([summary(101.0, 20.0), summary(141.0, 30.0), summary(102.0, 22.0)], steps)
    assert out[LAUNCHES] == 3 and out[keys.STEPS_TIMED] == 30
    assert out[keys.STEP_MEDIAN_MS] == pytest.approx(102.0)
    # the interval reaches every launch's median: a level shift between launches is not noise to average away
    assert out[keys.STEP_MEDIAN_CI_LOW_MS] <= 101.0 and out[keys.STEP_MEDIAN_CI_HIGH_MS] >= 141.0
    assert (out[keys.STEP_MIN_MS], out[keys.STEP_MAX_MS]) == (100.0, 142.0)
    assert out[keys.COMM_TIME_MS] == 22.0  # other figures: the median over launches
    assert out["quality/noisy"] is False  # non-numeric values: the last launch's


def test_other_intervals_reach_every_launch_and_doubts_carry_over():
    lo, hi = keys.ci_keys(keys.THROUGHPUT)
    launches = [{keys.THROUGHPUT: 100.0, lo: 98.0, hi: 102.0, keys.QUALITY_NOISY: False},
                {keys.THROUGHPUT: 70.0, lo: 69.0, hi: 71.0, keys.QUALITY_NOISY: False},
                {keys.THROUGHPUT: 101.0, lo: 99.0, hi: 103.0, keys.QUALITY_NOISY: False}]
    out = pool(launches, [[10.0] * 5] * 3)
    assert out[keys.THROUGHPUT] == 100.0
    assert (out[lo], out[hi]) == (70.0, 102.0)  # the median launch's interval, reaching the slow launch
    # 2 clean launches against 1 noisy: the noisy one is set aside (next test); 1 clean against 2: doubts carry over
    launches[1].update({keys.QUALITY_NOISY: True, keys.QUALITY_NOISE_REASON: "noisy: 0.50 cores busy outside"})
    launches[2].update({keys.QUALITY_NOISY: True, keys.QUALITY_NOISE_REASON: "noisy: 0.90 cores busy outside"})
    out = pool(launches, [[10.0] * 5] * 3)
    assert out[keys.QUALITY_NOISY] is True and out[keys.QUALITY_NOISE_REASON].startswith("noisy: 0.90")
    assert out[LAUNCHES] == 3 and SET_ASIDE not in out


def test_a_noisy_launch_among_enough_clean_ones_is_set_aside_and_said_so():
    """One launch of four ran beside a neighbour (flagged noisy, its steps 40 % slower): the figures are the three
    clean launches', the row is not flagged (it may decide), and its quality says what was left out and why."""
    steps = [[100.0, 101.0, 102.0], [140.0, 141.0, 142.0], [99.0, 100.0, 101.0], [101.0, 102.0, 103.0]]
    launches = [summary(101.0, 2.0), {**summary(141.0, 9.0), keys.QUALITY_NOISY: True,
                                      keys.QUALITY_NOISE_REASON: "noisy: 0.60 cores busy outside the run"},
                summary(100.0, 2.0), summary(102.0, 2.0)]
    out = pool(launches, steps)
    assert out[LAUNCHES] == 3 and out[SET_ASIDE] == 1 and out[LAUNCH_MEDIANS] == [101.0, 100.0, 102.0]
    assert out[keys.STEP_MEDIAN_MS] == 101.0 and out[keys.STEP_MEDIAN_CI_HIGH_MS] < 140.0
    assert out[keys.COMM_TIME_MS] == 2.0 and out["quality/noisy"] is False
    assert out[keys.QUALITY] == "1 of 4 launches set aside (noisy: 0.60 cores busy outside the run)"
    from scalelab.analysis.compare import run_quality, trusted
    assert trusted(run_quality(out))


def test_steady_launches_give_a_narrow_interval():
    steps = [[100.0 + (i % 5) * 0.1 for i in range(20)] for _ in range(3)]
    out = pool([summary(100.2, 1.0)] * 3, steps)
    assert out[keys.STEP_MEDIAN_CI_HIGH_MS] - out[keys.STEP_MEDIAN_CI_LOW_MS] < 1.0


def test_the_launches_own_medians_are_kept_so_a_finding_can_ask_that_they_do_not_interleave():
    steps = [[100.0, 101.0, 102.0], [140.0, 141.0, 142.0], [99.0, 100.0, 104.0]]  # launch medians 101, 141, 100
    out = pool([summary(101.0, 1.0), summary(141.0, 1.0), summary(100.0, 1.0)], steps)
    assert (out[keys.STEP_LAUNCH_MEDIAN_MIN_MS], out[keys.STEP_LAUNCH_MEDIAN_MAX_MS]) == (100.0, 141.0)


def test_two_launches_of_one_step_each_make_an_interval_one_step_makes_none():
    out = pool([summary(10.0, 1.0), summary(12.0, 1.0)], [[10.0], [12.0]])
    assert (out[keys.STEP_MEDIAN_CI_LOW_MS], out[keys.STEP_MEDIAN_CI_HIGH_MS]) == (10.0, 12.0)
    out = pool([summary(10.0, 1.0), summary(12.0, 1.0)], [[10.0], []])
    assert out[keys.STEP_MEDIAN_CI_LOW_MS] != out[keys.STEP_MEDIAN_CI_LOW_MS]  # NaN: one value, no interval
