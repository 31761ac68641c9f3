"""The study's time budget (lab/budget.py): its pace, its prediction and its cuts, on a fixed clock."""
from __future__ import annotations

import pytest

from scalelab.errors import ConfigError
from scalelab.lab.budget import REFERENCE_S, Budget, parse_duration


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


def test_the_pace_is_measured_time_over_reference_time_and_scales_the_rest():
    plan, clock = _budget(None, ["profile", "scale"])
    plan.finished("reference", 2 * REFERENCE_S["reference"][0])  # this machine at half the reference's speed
    assert plan.pace == 2.0
    expected = 2.0 * (REFERENCE_S["profile"][0] + REFERENCE_S["scale"][0] + REFERENCE_S["reference"][0])
    assert plan.predicted_s() == pytest.approx(expected)
    plan.finished("profile", 3 * REFERENCE_S["profile"][0])
    spent = 2 * REFERENCE_S["reference"][0] + 3 * REFERENCE_S["profile"][0]
    assert plan.pace == pytest.approx(spent / (REFERENCE_S["reference"][0] + REFERENCE_S["profile"][0]))


def test_within_budget_nothing_is_cut():
    plan, clock = _budget(600.0, ["profile", "scale", "strategies"], {"scale": {"launches": 3}})
    plan.finished("reference", REFERENCE_S["reference"][0])
    clock.now = REFERENCE_S["reference"][0]
    decision = plan.decide("profile")
    assert decision.action == "as planned" and plan.notes() == []


def test_a_slow_machine_first_launches_compared_cells_twice_then_leaves_out_the_least_central():
    experiments = ["profile", "scale", "strategies", "max_batch", "lr_scaling"]
    options = {"scale": {"launches": 3}, "strategies": {"launches": 3}, "max_batch": {}, "lr_scaling": {}}
    plan, clock = _budget(100.0, experiments, options)
    plan.finished("reference", 4 * REFERENCE_S["reference"][0])  # 4x slower than the reference machine
    clock.now = 4 * REFERENCE_S["reference"][0]
    plan.decide("profile")
    actions = {d.experiment: d.action for d in plan.decisions}
    assert actions["scale"] == actions["strategies"] == "reduced"
    assert plan.options["scale"]["launches"] == 2  # never below 2
    assert actions["max_batch"] == "left out"  # first in the leave-out order
    assert "profile" not in actions  # core experiments are never left out
    assert plan.predicted_s() <= plan.left_s() or actions.get("lr_scaling") == "left out"
    assert all("budget" in line for line in plan.notes() if "left out" in line)


def test_launches_never_go_below_two_and_a_quick_study_keeps_its_single_launch():
    plan, clock = _budget(1.0, ["scale", "strategies"], {"scale": {"launches": 1}, "strategies": {"launches": 2}},
                          quick=True)
    plan.finished("reference", 100.0)
    clock.now = 100.0
    plan.decide("scale")
    assert plan.options["scale"]["launches"] == 1 and plan.options["strategies"]["launches"] == 2
    assert not [d for d in plan.decisions if d.action == "reduced"]


def test_the_eta_tracks_the_pace():
    plan, clock = _budget(None, ["profile", "scale"])
    plan.finished("reference", REFERENCE_S["reference"][0])
    plan.finished("profile", 2 * REFERENCE_S["profile"][0])
    pace = plan.pace
    assert plan.eta_s() == pytest.approx(pace * (REFERENCE_S["scale"][0] + REFERENCE_S["reference"][0]))
