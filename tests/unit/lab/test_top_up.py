"""Spending the budget left on the questions still open (scalelab.lab.study.top_up): most promising first, at most
MAX_LOOKS - 1 top-ups, each growing to what the card needs and a fifth more, at most tripling the launches and at
most MAX_LAUNCHES (decision.next_launches), only while the time measured per launch fits, the grown
launch counts kept in the spec (what a re-derived report reads) and a note on each grown result."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from scalelab.lab import results
from scalelab.lab.base import Context, Experiment, Result, launches_option
from scalelab.lab.budget import Budget
from scalelab.lab.decision import BETTER, MAX_LAUNCHES, MAX_LOOKS, UNDECIDED, Decision, Side
from scalelab.lab.study import top_up

QUIET = SimpleNamespace(say=lambda line: None)


def experiment(name: str, needs: int, calls: list, now: list | None = None, per_launch_s: float = 0.0) -> Experiment:
    """An experiment whose one question is undecided until it has `needs` launches per cell; each new launch moves
    the clock `now` on by `per_launch_s`."""
    have = {"n": 0}

    def run(ctx, base, opts):
        calls.append((name, opts["launches"]))
        if now is not None:
            now[0] += per_launch_s * max(0, opts["launches"] - have["n"])
        have["n"] = opts["launches"]
        return Result(name, {name: pd.DataFrame({"launches": [opts["launches"]]})})

    def decide(result):
        n = int(result.tables[name]["launches"].iloc[0])
        a, b = Side("a", 10.0, (9.0, 11.0), n), Side("b", 11.0, (10.0, 12.0), n)
        done = n >= needs
        return [Decision(name, "median step", " ms", a, b, BETTER if done else UNDECIDED, "why",
                         more=None if done else needs)]
    return Experiment(name=name, command=name, base=False, title=name, question="?", help="", section=name,
                      options=(launches_option(),), run=run, decide=decide)


def setup(tmp_path, seconds: float, took: float):
    calls: list = []
    now = [0.0]
    near, far = (experiment(name, needs, calls, now, took / 2) for name, needs in (("near", 6), ("far", 20)))
    spec = SimpleNamespace(options={"near": {"launches": 2}, "far": {"launches": 2}}, quick=True,
                           config=lambda name: None, held={})
    ctx = Context(cells=None, out_dir=tmp_path, say=lambda line: None, tables=False)
    answered = [(far, far.run(ctx, None, {"launches": 2})), (near, near.run(ctx, None, {"launches": 2}))]
    calls.clear()
    now[0] = 0.0
    plan = Budget(seconds, [], {}, quick=True, clock=lambda: now[0])
    plan.took = {"near": took, "far": took}
    return spec, ctx, answered, plan, calls


def test_top_ups_go_most_promising_first_grow_to_what_is_needed_and_stop_when_decided(tmp_path):
    spec, ctx, answered, plan, calls = setup(tmp_path, seconds=10_000, took=1.0)
    assert top_up(spec, ctx, answered, plan, QUIET)
    # look 2: near (4 more needed) before far (18 more): near 2 -> 6 (needs 6, x 1.2 = 8, at most 3 x 2), far 2 -> 6;
    # look 3: far 6 -> 18 (at most 3 x 6); look 4: far 18 -> 24 (20 x 1.2); then both are decided
    assert calls == [("near", 6), ("far", 6), ("far", 18), ("far", 24)]
    assert spec.options == {"near": {"launches": 6}, "far": {"launches": 24}}
    saved = results.load(answered[1][0], tmp_path)
    assert saved is not None and "look 2: 2 -> 6 launches per cell" in saved.notes["topped up"]
    assert all(e.decide(r)[0].verdict == BETTER for e, r in answered)


def test_top_ups_stop_at_the_launch_cap_and_after_the_last_look(tmp_path):
    spec, ctx, answered, plan, calls = setup(tmp_path, seconds=10_000, took=1.0)
    far, _ = answered[0]
    answered[0] = (experiment("far", 1000, calls), answered[0][1])  # never decided: it needs 1,000 launches
    assert top_up(spec, ctx, answered, plan, QUIET)
    grown = [n for name, n in calls if name == "far"]
    assert grown == [6, 18, MAX_LAUNCHES] and len(grown) <= MAX_LOOKS - 1


def test_no_top_up_beyond_the_time_left(tmp_path):
    # 2 launches took 40 s: 20 s a launch; 61.6 s of budget, 60 of them before the reference cell and the report
    spec, ctx, answered, plan, calls = setup(tmp_path, seconds=61.6, took=40.0)
    assert top_up(spec, ctx, answered, plan, QUIET)
    assert calls == [("near", 5)]  # 3 more launches of near (60 s, it asks for 6): nothing is left for far
    assert spec.options == {"near": {"launches": 5}, "far": {"launches": 2}}
    spec, ctx, answered, plan, calls = setup(tmp_path, seconds=10.0, took=40.0)
    assert not top_up(spec, ctx, answered, plan, QUIET) and calls == []


def alone(tmp_path, experiment: Experiment, options: dict):
    """A full study of `experiment` alone with these options: its first result in, 1 s spent on it, 10,000 s of
    budget left; (spec, ctx, answered, plan) as top_up takes them."""
    spec = SimpleNamespace(options={experiment.name: dict(options)}, quick=False, config=lambda name: None, held={})
    ctx = Context(cells=None, out_dir=tmp_path, say=lambda line: None, tables=False)
    answered = [(experiment, experiment.run(ctx, None, dict(options)))]
    plan = Budget(10_000, [], {}, quick=False, clock=lambda: 0.0)
    plan.took = {experiment.name: 1.0}
    return spec, ctx, answered, plan


def test_a_question_over_seeds_grows_the_seeds(tmp_path):
    """The learning-rate rules count seeds: their top-up asks for more seeds per cell, not launches."""
    from scalelab.lab.base import Option, number

    calls: list = []

    def run(ctx, base, opts):
        calls.append(("lr", opts["seeds"]))
        return Result("lr", {"lr": pd.DataFrame({"n": [opts["seeds"]]})})

    def decide(result):
        n = int(result.tables["lr"]["n"].iloc[0])
        a, b = Side("lars", 90.0, (89.0, 91.0), n), Side("linear", 88.0, (87.0, 89.0), n)
        done = n >= 5
        return [Decision("lr rule", "final test accuracy", " %", a, b, BETTER if done else UNDECIDED, "why",
                         count="seeds", speed=False, more=None if done else 5)]
    seeds = Option(name="seeds", default=1, help="", parse=number(1, 40, integer=True))
    lr = Experiment(name="lr", command="lr", base=False, title="lr", question="?", help="", section="lr",
                    options=(seeds,), run=run, decide=decide)
    spec, ctx, answered, plan = alone(tmp_path, lr, {"seeds": 3})
    calls.clear()
    assert top_up(spec, ctx, answered, plan, QUIET)
    assert calls == [("lr", 6)] and spec.options == {"lr": {"seeds": 6}}  # 5 x 1.2, at least one more
    assert "look 2: 3 -> 6 seeds per cell" in results.load(lr, tmp_path).notes["topped up"]


def test_a_setting_worse_beyond_noise_is_held_while_the_question_stays_open(tmp_path):
    """Racing: the card's best already beats "slow" beyond noise; another side is still open: the top-up runs under
    `held({"slow": 2})` and the study's spec keeps the hold (what a re-derived report asks the store for)."""
    from scalelab.lab import cells as engine

    seen: list = []

    def run(ctx, base, opts):
        seen.append((opts["launches"], engine._HELD.get()))
        return Result("race", {"race": pd.DataFrame({"launches": [opts["launches"]]})})

    def decide(result):
        n = int(result.tables["race"]["launches"].iloc[0])
        a, b = Side("best", 10.0, (9.0, 11.0), n), Side("close", 10.5, (9.5, 11.5), n)
        return [Decision("setting", "median step", " ms", a, b, UNDECIDED if n < 6 else BETTER, "why",
                         more=None if n >= 6 else 6, worse=("slow",))]
    race = Experiment(name="race", command="race", base=False, title="race", question="?", help="", section="race",
                      options=(launches_option(),), run=run, decide=decide)
    spec, ctx, answered, plan = alone(tmp_path, race, {"launches": 2})
    seen.clear()
    assert top_up(spec, ctx, answered, plan, QUIET)
    assert seen == [(6, {"slow": 2})] and spec.held == {"race": {"slow": 2}}
    assert "held (worse beyond noise): slow at 2" in results.load(race, tmp_path).notes["topped up"]


def test_a_held_setting_no_longer_worse_at_a_later_look_grows_again(tmp_path):
    """At look 2 the best beats "slow" beyond noise: held at 2. At look 3 the pool says otherwise (it is no longer
    worse, the question is still open): "slow" is released and grows with the others, and the spec drops the hold,
    so that the card's comparison with it can be decided (before, a hold lasted for good)."""
    from scalelab.lab import cells as engine

    seen: list = []

    def run(ctx, base, opts):
        seen.append((opts["launches"], dict(engine._HELD.get())))
        return Result("race", {"race": pd.DataFrame({"launches": [opts["launches"]]})})

    def decide(result):
        n = int(result.tables["race"]["launches"].iloc[0])
        a, b = Side("best", 10.0, (9.0, 11.0), n), Side("slow", 10.5, (9.5, 11.5), n)
        return [Decision("setting", "median step", " ms", a, b, UNDECIDED if n < 20 else BETTER, "why",
                         more=None if n >= 20 else 20, worse=("slow",) if n < 6 else ())]
    race = Experiment(name="race", command="race", base=False, title="race", question="?", help="", section="race",
                      options=(launches_option(),), run=run, decide=decide)
    spec, ctx, answered, plan = alone(tmp_path, race, {"launches": 2})
    seen.clear()
    said: list = []
    assert top_up(spec, ctx, answered, plan, SimpleNamespace(say=said.append))
    assert seen[:2] == [(6, {"slow": 2}), (18, {})] and "race" not in spec.held
    assert said[1] == ("== look 3 at race: 1 question(s) open (setting): 6 -> 18 launches per cell; released (no "
                       "longer worse beyond noise): slow")


def test_a_study_file_with_a_bad_hold_is_one_config_error():
    from scalelab.errors import ConfigError
    from scalelab.lab.study import StudySpec

    for bad in ("batch 16", {"batch_sweep": {"batch 16": 0}}, {"batch_sweep": ["batch 16"]}):
        with pytest.raises(ConfigError, match="study.held"):
            StudySpec(held=bad)
    assert StudySpec(held={"batch_sweep": {"batch 16": 2}}).held == {"batch_sweep": {"batch 16": 2}}
