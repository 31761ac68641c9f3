"""The auto-length stop rule on known step times: precision, budget, the minimum, agreement between ranks."""
from __future__ import annotations

import math

import pytest

from scalelab.analysis import keys
from scalelab.analysis.precision import NOT_REACHED, precision_summary, relative_half_width
from scalelab.train.length import AutoLength


def feed(rule: AutoLength, walls: list[float]) -> int:
    """Timed steps taken until the rule stops (or all of them)."""
    for n, wall in enumerate(walls, 1):
        if rule.after_step(wall):
            return n
    return len(walls)


def test_relative_half_width_is_the_wider_side_of_the_median_interval():
    # 5 values (too few for order statistics at 95 %): the interval is the whole range, median 10
    assert relative_half_width([9.0, 10.0, 10.0, 10.0, 12.0]) == pytest.approx(0.2)
    assert relative_half_width([]) == math.inf
    assert relative_half_width([0.0, 0.0]) == math.inf


def test_equal_steps_stop_at_the_minimum_for_precision():
    rule = AutoLength(target=0.03, budget_s=100, min_steps=5)
    assert feed(rule, [0.1] * 50) == 5
    assert rule.reason == "precision" and rule.result()["stopped_by"] == "precision"


def test_spread_steps_stop_when_the_budget_is_spent():
    walls = [0.1, 0.3] * 50  # half-width stays far above 3 %; 0.2 s per step on average
    rule = AutoLength(target=0.03, budget_s=2.0, min_steps=5)
    assert feed(rule, walls) == 10  # 10 steps add up to 2.0 s
    assert rule.reason == "budget"


def test_steps_after_the_minimum_narrow_the_interval_until_the_target():
    walls = [1.0, 1.04, 0.96] * 40  # +-4 % spread: the full range of 5 steps is too wide; order statistics narrow it
    rule = AutoLength(target=0.03, budget_s=1000, min_steps=5)
    n = feed(rule, walls)
    assert 5 < n < len(walls) and rule.reason == "precision"
    assert relative_half_width(walls[:n]) <= 0.03 < relative_half_width(walls[:n - 1])


def test_ranks_decide_on_the_max_of_their_step_times_every_few_steps():
    """Two ranks, one steady and one with spread: both stop at the same step, judged on the slowest times."""
    seen = []
    fast, slow = [0.1] * 40, [0.1, 0.2] * 20

    def reduce_for(rank):
        def reduce(values):
            seen.append((rank, len(values)))
            other = slow if rank == 0 else fast
            start = len([s for s in seen if s[0] == rank]) * 4 - 4
            return [max(v, o) for v, o in zip(values, other[start:start + len(values)])]
        return reduce

    rules = [AutoLength(0.03, 1.0, 5, reduce=reduce_for(r), every=4) for r in (0, 1)]
    stops = [feed(rule, walls) for rule, walls in zip(rules, (fast, slow))]
    assert stops[0] == stops[1] == 8  # 8 slowest-rank steps of 0.1/0.2 s: 1.2 s >= the 1 s budget
    assert rules[0].walls == rules[1].walls == [0.1, 0.2] * 4
    assert {n for _, n in seen} == {4}  # one reduction per 4 steps


def test_precision_summary_reports_target_reached_and_quality():
    steady = precision_summary([0.1] * 10, 0.03)
    assert steady == {keys.PRECISION_HALF_WIDTH_PCT: 0.0, keys.PRECISION_TARGET_PCT: 3.0, keys.PRECISION_REACHED: True}
    noisy = precision_summary([0.1, 0.3] * 5, 0.03)
    assert noisy[keys.PRECISION_REACHED] is False and noisy[keys.QUALITY] == NOT_REACHED
    assert precision_summary([0.1, 0.3] * 5, None).keys() == {keys.PRECISION_HALF_WIDTH_PCT}  # fixed length
