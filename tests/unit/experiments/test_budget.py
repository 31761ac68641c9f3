"""The study's time budget (lab/budget.py): its pace, its prediction and its cuts, on a fixed clock."""
from __future__ import annotations

import pytest

from scalelab.errors import ConfigError
from scalelab.lab.budget import PRIOR_S, REFERENCE_S, Budget, parse_duration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _budget(seconds, experiments, options=None, quick=False):
    clock = Clock()
    return Budget(seconds, experiments, options or {}, quick=quick, clock=clock), clock


@pytest.mark.parametrize("text,seconds", [("10m", 600.0), ("150s", 150.0), ("90", 90.0), ("1h", 3600.0),
                                          ("2.5m", 150.0)])
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5m", "ten", "m", "", "nan"])
def test_a_bad_duration_is_refused_in_one_line(text):
    with pytest.raises(ConfigError, match="allowed: a duration > 0"):
        parse_duration(text)


def test_the_pace_is_measured_time_over_reference_time_with_a_small_prior():
    plan, clock = _budget(None, ["profile", "scale"])
    ref = REFERENCE_S["reference"][0]
    plan.finished("reference", 3 * ref)  # this machine at a third of the reference's speed
    assert plan.pace == pytest.approx((3 * ref + PRIOR_S) / (ref + PRIOR_S))
    expected = plan.pace * (REFERENCE_S["profile"][0] + REFERENCE_S["scale"][0] + ref + REFERENCE_S["report"][0])
    assert plan.predicted_s() == pytest.approx(expected)
    plan.finished("profile", 3 * REFERENCE_S["profile"][0])
    spent, spent_ref = 3 * ref + 3 * REFERENCE_S["profile"][0], ref + REFERENCE_S["profile"][0]
    assert plan.pace == pytest.approx((spent + PRIOR_S) / (spent_ref + PRIOR_S))


def test_within_budget_nothing_is_cut():
    plan, clock = _budget(600.0, ["profile", "scale", "strategies"], {"scale": {"launches": 3}})
    plan.finished("reference", REFERENCE_S["reference"][0])
    clock.now = REFERENCE_S["reference"][0]
    for name in ("profile", "scale", "strategies"):
        assert plan.decide(name).action == "as planned"
        plan.finished(name, REFERENCE_S[name][0])
    assert plan.notes() == []


def _walk(plan, clock, slowdown: float) -> dict[str, str]:
    """Every experiment decided in order, each taking `slowdown` times its reference seconds."""
    ref = REFERENCE_S["reference"][0]
    plan.finished("reference", slowdown * ref)
    clock.now = slowdown * ref
    actions = {}
    for name in list(plan.remaining):
        decision = plan.decide(name)
        actions[name] = decision.action
        took = 0.0 if decision.action == "left out" else slowdown * plan.reference_s(name)
        clock.now += took
        plan.finished(name, took)
    return actions


def test_a_slow_machine_launches_compared_cells_twice_then_leaves_out_the_least_central():
    experiments = ["profile", "scale", "strategies", "max_batch", "lr_scaling"]
    options = {"scale": {"launches": 3}, "strategies": {"launches": 3}}
    reference_total = sum(REFERENCE_S[n][0] for n in (*experiments, "report")) + 2 * REFERENCE_S["reference"][0]
    plan, clock = _budget(1.5 * reference_total, experiments, options)
    actions = _walk(plan, clock, slowdown=3.0)  # three times slower: the plan cannot fit as it is
    assert actions["scale"] == actions["strategies"] == "reduced"
    assert plan.options["scale"]["launches"] == 2  # never below 2
    assert actions["max_batch"] == "left out"  # first in the leave-out order
    assert actions["profile"] == "as planned"  # core experiments are never left out
    assert [line.split(":")[0] for line in plan.notes()] == [n for n, a in actions.items() if a != "as planned"]
    assert all("budget left" in line for line in plan.notes())


def test_a_machine_at_the_reference_pace_cuts_nothing_with_the_default_budget():
    experiments = [n for n in REFERENCE_S if n not in ("reference", "report")]
    options = {n: {"launches": 3} for n in ("scale", "strategies", "bucket_sweep", "backends")}
    plan, clock = _budget(600.0, experiments, options)
    actions = _walk(plan, clock, slowdown=1.0)
    assert set(actions.values()) == {"as planned"}
    assert clock.now + REFERENCE_S["reference"][0] + REFERENCE_S["report"][0] <= 600.0


def test_launches_never_go_below_two_and_a_quick_study_keeps_its_single_launch():
    plan, clock = _budget(1.0, ["scale", "strategies"], {"scale": {"launches": 1}, "strategies": {"launches": 2}},
                          quick=True)
    plan.finished("reference", 100.0)
    clock.now = 100.0
    plan.decide("scale")
    plan.decide("strategies")
    assert plan.options["scale"]["launches"] == 1 and plan.options["strategies"]["launches"] == 2
    assert not [d for d in plan.decisions if d.action == "reduced"]


def test_the_eta_tracks_the_pace():
    plan, clock = _budget(None, ["profile", "scale"])
    plan.finished("reference", REFERENCE_S["reference"][0])
    plan.finished("profile", 2 * REFERENCE_S["profile"][0])
    rest = REFERENCE_S["scale"][0] + REFERENCE_S["reference"][0] + REFERENCE_S["report"][0]
    assert plan.eta_s() == pytest.approx(plan.pace * rest)
