"""The one decision rule (scalelab.lab.decision) on exact synthetic data: its four answers (beats, worse beyond
noise, equivalent within the margin, undecided with the launches that would decide), a heterogeneous cell, pairing
by round, the family and looks correction, the batch rule, and the one module that decides."""
from __future__ import annotations

import ast
from dataclasses import replace
import math
from pathlib import Path

import pandas as pd
import pytest

from scalelab.analysis.checks import decision_faults
from scalelab.analysis.noise import fit
from scalelab.lab import decision as dec
from scalelab.lab.decision import (BETTER, EQUIVALENT, UNDECIDED, WORSE, Side, decide, pick, pooled, rank)

SRC = Path(__file__).resolve().parents[3] / "src" / "scalelab"


def side(label, launches, quality="ok", half=None):
    """A median step from launch medians (ms): the value their median, the interval their range (or value ± half)."""
    value = sorted(launches)[len(launches) // 2] if len(launches) % 2 else sum(sorted(launches)[len(launches) // 2 - 1:
                                                                                  len(launches) // 2 + 1]) / 2
    iv = (min(launches), max(launches)) if half is None else (value - half, value + half)
    return Side(label, float(value), iv, len(launches), (min(launches), max(launches)), quality, 18,
                tuple(float(x) for x in launches))


def spread(center, pct, n, turn=0):
    """n launch medians around `center`, evenly from -pct to +pct (a known sample variance), in launch order
    rotated by `turn` (cells whose rounds do not move together: pairing gains nothing)."""
    out = [center * (1 + pct * (2 * i / (n - 1) - 1)) for i in range(n)]
    return out[turn:] + out[:turn]


def test_a_clear_win_beats_with_its_ratio_interval_and_both_sides():
    d = decide(side("2 workers", [30.0, 30.6, 29.7]), side("0 workers", [40.0, 40.4, 39.2]), question="loader")
    assert d.verdict == BETTER and d.recommends
    assert d.card().startswith("Use 2 workers: 2 workers beats 0 workers: 1.33× faster than 0 workers (99.2 % "
                               "interval of the speed ratio 1.26–1.39×)")
    assert "n = 3 launches each" in d.card() and "of 0 workers: 40 ms" in d.card()
    assert d.interval[0] > 1.0 and d.confidence == pytest.approx(1 - 0.05 / dec.MAX_LOOKS)


def test_worse_beyond_noise_is_said_as_worse_never_within_noise():
    """The issue's scaling card: 2 workers 50.7 ms against 1 worker 19.8 ms, disjoint intervals."""
    d = decide(side("2 workers", [50.7, 48.7, 56.2]), side("1 worker", [19.8, 16.3, 33.0]), question="worker count")
    assert d.verdict == WORSE and not d.recommends
    assert d.card().startswith("Keep 1 worker: 2 workers is worse than 1 worker beyond noise: 0.39× the speed of "
                               "1 worker (2.56× slower)")
    assert "within noise" not in d.card() and decision_faults([d.record()]) == []


def test_a_win_on_disjoint_sides_whose_ratio_interval_reaches_1_says_what_decided_it():
    """Disjoint 95 % intervals of the two sides decide (the rule's floor), while the ratio's interval, corrected for
    six looks, may still reach 1: a quick study printed "beats … (99.6 % interval 0.999–1.13×), beyond noise (paired
    by round, …)", a card against its own number. The card now says which test decided."""
    d = decide(side("a", spread(100.0, 0.03, 3)), side("b", spread(112.0, 0.03, 3, turn=1)), question="x")
    assert d.verdict == BETTER and d.interval[0] < 1 < d.interval[1]
    assert "beyond noise (the two sides' own 95 % intervals below do not meet; the ratio's interval (" in d.card()
    assert "reaches 1)" in d.card() and decision_faults([d.record()]) == []
    clear = decide(side("a", spread(100.0, 0.03, 3)), side("b", spread(120.0, 0.03, 3, turn=1)), question="x")
    assert clear.verdict == BETTER and clear.interval[0] > 1 and "do not meet" not in clear.card()


def test_equivalent_within_the_margin_when_the_whole_interval_is_inside_it():
    a, b = side("a", spread(100.0, 0.01, 4)), side("b", spread(101.0, 0.01, 4))
    d = decide(a, b, question="x")
    assert d.verdict == EQUIVALENT
    lo, hi = d.interval
    assert 1 / 1.1 < lo < 1 < hi < 1.1
    assert "a and b are equivalent within ±10 %" in d.card() and d.card().startswith("Keep a:")


def test_undecided_says_how_many_more_launches_would_decide_and_the_command():
    a, b = side("a", [80.0, 120.0]), side("b", [90.0, 130.0])
    d = decide(a, b, question="thread count", command="scalelab threads")
    assert d.verdict == UNDECIDED and d.more > 2
    # the model: ln-variance of one launch s^2 pooled from the two cells (1 dof each)
    s2 = ((math.log(80) - math.log(120)) ** 2 / 2 + (math.log(90) - math.log(130)) ** 2 / 2) / 2
    assert fit([("a", [80.0, 120.0], math.nan, 0), ("b", [90.0, 130.0], math.nan, 0)]).launch_var == \
        pytest.approx(s2)
    assert (f"Undecided after 2 launches each: the 99.2 % interval of the speed ratio reaches both sides of 1"
            in d.card())
    # (z(1 - 0.05 / 6 / 2) + z(0.8))^2 x 2 s^2 / ln(1.1)^2 launches each, rounded up (6 looks)
    assert d.more == math.ceil((2.638 + 0.8416) ** 2 * 2 * s2 / math.log(1.1) ** 2)
    assert f"about {d.more - 2} more launches each would decide a difference of 10 % " \
           f"(`scalelab threads --launches {d.more}`). No thread count is recommended yet." in d.card()


def test_too_few_launches_or_a_flagged_side_are_undecided_with_the_reason():
    d = decide(side("a", [30.0]), side("b", [40.0]), question="loader setting")
    assert d.verdict == UNDECIDED and "Undecided after 1 launch each: a comparison between configurations needs 2 " \
        "or more launches each (--launches 2)." in d.card()
    d = decide(side("a", [30.0, 30.1]), side("b", [40.0, 40.1], quality="noisy: 0.4 cores busy"), question="x")
    assert d.verdict == UNDECIDED and "b is flagged (noisy: 0.4 cores busy)" in d.card()


def test_a_heterogeneous_cell_keeps_its_own_launch_spread():
    """Ten cells whose launches spread 1 %, one whose spread 40 %: the F test keeps it apart, its own estimate
    (1 dof) leaves its comparison undecided where the pool would have decided it."""
    cells = [(f"c{i}", spread(50.0 + i, 0.01, 3), math.nan, 0) for i in range(10)]
    wild = [60.0, 100.0, 140.0]
    model = fit([*cells, ("wild", wild, math.nan, 0)])
    assert model.kept_apart(wild) and model.dof == 20 and model.cells == 10
    assert "kept apart" in model.words() and "wild" in model.words()
    assert model.variance(wild)[1] == 2 and model.variance(cells[0][1]) == (model.launch_var, 20)
    a, b = side("wild", wild), side("c", spread(130.0, 0.01, 3))
    with pooled(model):
        assert decide(a, b, question="x").verdict == UNDECIDED
    tame = fit(cells)  # the same sides read with the pool alone would be told apart
    with pooled(tame):
        assert decide(a, b, question="x").verdict in (BETTER, WORSE)


def test_pairing_by_round_cancels_drift_between_rounds():
    """Each round a is 10 % faster than b, while the machine drifts 60 % between rounds: unpaired undecided,
    paired a clear win."""
    b = [110.0, 143.0, 176.0, 150.0]
    a = [x / 1.1 for x in b]
    d = decide(side("a", a), side("b", b), question="x")
    assert d.verdict == BETTER and "paired by round" in d.card()


def test_many_alternatives_and_looks_tighten_the_level():
    assert dec.level(1) == pytest.approx(0.05 / 6) and dec.level(4) == pytest.approx(0.05 / 24)
    # sides without launch medians (their own intervals give the standard error), whose intervals meet
    a, b = Side("a", 100.0, (96.5, 103.5), 3), Side("b", 107.0, (103.3, 110.7), 3)
    assert decide(a, b, question="x", family=1).verdict == BETTER
    assert decide(a, b, question="x", family=30).verdict == UNDECIDED


def test_disjoint_intervals_are_always_decided():
    """30 alternatives: the family-wise interval of the ratio alone would not decide; the two sides' own 95 %
    intervals are disjoint: beats or worse."""
    a, b = Side("a", 100.0, (96.5, 103.1), 3), Side("b", 107.0, (103.3, 110.7), 3)
    d = decide(a, b, question="x", family=30)
    assert d.verdict == BETTER and decision_faults([d.record()]) == []
    assert decide(b, a, question="x", family=30).verdict == WORSE
    # undecided with disjoint sides is a fault, unless another figure withholds the recommendation on purpose
    # (amp: accuracy not compared between runs that did not learn; the tiny dist study's audit met it)
    held_back = replace(d, verdict=UNDECIDED, why="a is faster beyond noise, but accuracy is not compared")
    assert len(decision_faults([held_back.record()])) == 1
    assert decision_faults([replace(held_back, withheld="accuracy").record()]) == []


def test_the_batch_question_keeps_the_highest_or_the_smallest_equivalent_never_a_worse_one():
    from scalelab.experiments.batch_sweep import batch_decisions

    def row(batch, step_ms, launches):
        thr = batch / step_ms * 1000
        return {"global_batch": batch, "throughput(samples/s)": thr, "throughput_ci_low(samples/s)": thr * 0.97,
                "throughput_ci_high(samples/s)": thr * 1.03,
                "launches": len(launches), "quality": "ok", "step_launch_medians(ms)": launches}
    # the case: batch 16 has the lowest throughput; 256 the highest, 64 equivalent to it within 10 %
    table = pd.DataFrame([row(16, 10.0, spread(10.0, 0.01, 3)), row(64, 20.5, spread(20.5, 0.01, 3, turn=1)),
                          row(256, 80.0, spread(80.0, 0.01, 3))])
    [d] = batch_decisions(table)
    assert d.verdict == EQUIVALENT and d.chosen.label == "batch 64" and d.against.label == "batch 256"
    assert d.keep == "batch 64, the smallest batch equivalent to the highest throughput (batch 256)"
    assert d.card().startswith("Keep batch 64, the smallest batch equivalent to the highest throughput (batch 256): "
                               "batch 64 and batch 256 are equivalent within ±10 %")
    # no equivalent: the highest beats the rest
    table = pd.DataFrame([row(16, 10.0, spread(10.0, 0.01, 3)), row(256, 80.0, spread(80.0, 0.01, 3))])
    [d] = batch_decisions(table)
    assert d.verdict == BETTER and d.chosen.label == "batch 256"
    # the smallest equivalent is beaten beyond noise by a middle batch: the next one is kept
    table = pd.DataFrame([row(64, 21.0, spread(21.0, 0.002, 3, turn=1)), row(128, 40.0, spread(40.0, 0.002, 3, 2)),
                          row(256, 79.0, spread(79.0, 0.002, 3))])
    [d] = batch_decisions(table)
    assert d.keep.startswith("batch 128") and decision_faults([d.record()]) == []


def test_a_pick_keeps_only_a_compared_side():
    sides = [side("a", [30.0, 45.0]), side("b", [33.0, 50.0])]
    d = pick(sides, question="x", default="z")
    assert d.verdict == UNDECIDED and d.keep is None and "No x is recommended yet" in d.card()
    d = pick(sides, question="x", default="b")
    assert d.keep == "b, the default" and "Keep b, the default meanwhile" in d.card()


def test_rank_sets_flagged_rows_aside_and_renders_the_card():
    def row(sync, step, q="ok"):
        return {"sync": sync, "step(ms)": step, "step_ci_low(ms)": step - 1, "step_ci_high(ms)": step + 1,
                "launches": 3, "timed_steps": 18, "quality": q, "step_launch_medians(ms)": spread(step, 0.01, 3)}
    table = pd.DataFrame([row("ddp", 50.0), row("allreduce", 60.0), row("gather", 10.0, "implausible: x")])
    lines, d = rank(table, "sync", "gradient sync", action=lambda s: f"the {s} gradient sync")
    assert lines[0] == "gather is left out of the ranking: implausible: x."
    assert d.verdict == BETTER and d.chosen.label == "ddp" and lines[1] == d.card()
    assert d.card().startswith("Use the ddp gradient sync: ddp beats allreduce: 1.20× faster than allreduce")


RULE_CALLS = ("separated", "beats", "ranking", "fastest", "beyond_noise")  # the rule and its old spellings


def rule_callers(sources: dict[str, str]) -> list[str]:
    """"path:line name" for every call of the rule in `sources` (path -> text)."""
    out = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in RULE_CALLS:
                    out.append(f"{path}:{node.lineno} {name}")
    return out


def test_only_the_decision_module_decides_beyond_noise():
    """`separated` (and the old `beats` / `ranking`) are called by scalelab.lab.decision alone; the intervals module
    defines it. Any other caller would be a second rule."""
    own = {SRC / "lab" / "decision.py", SRC / "analysis" / "intervals.py"}
    sources = {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py") if p not in own}
    assert len(sources) > 150 and rule_callers(sources) == []
    planted = "from scalelab.analysis.intervals import separated\nok = separated((1, 2), (3, 4))\n"
    assert rule_callers({"experiments/loader.py": planted}) == ["experiments/loader.py:2 separated"]
    assert dec.MATERIAL == 0.02


def test_the_model_says_whether_more_or_longer_launches_buy_precision():
    """Two cells of 3 launches, 11 timed steps each (10 dof a launch): launch medians spread 10 % (ln variance
    s_L^2), steps within a launch 20 % (s_w^2 = 0.04): a median of 11 steps varies (pi / 2) 0.04 / 11 = 0.0057,
    s_L^2 about 0.0101 (exactly below): the step part is 57 % of it; with 2 % within-launch noise, 0.6 %."""
    cells = [("a", spread(100.0, 0.1, 3), 0.04, 30), ("b", spread(50.0, 0.1, 3), 0.04, 30)]
    model = fit(cells)
    s2 = float(pd.Series([math.log(v) for v in spread(100.0, 0.1, 3)]).var())
    assert model.steps == 11 and model.launch_var == pytest.approx(s2)
    assert model.step_share() == pytest.approx(math.pi / 2 * 0.04 / 11 / s2)
    assert "longer launches would buy as much precision" in model.words()
    quiet = fit([(label, values, 0.0004, dof) for label, values, _, dof in cells])
    assert quiet.step_share() == pytest.approx(math.pi / 2 * 0.0004 / 11 / s2)
    assert "more launches buy more precision than longer ones" in quiet.words()


def test_pick_names_the_settings_the_best_beats_beyond_noise():
    """Racing reads `Decision.worse`: here the best (a) beats c beyond noise while b is still open."""
    sides = [side("a", [10.0, 10.1, 9.9]), side("b", [10.4, 9.6, 10.9]), side("c", [20.0, 20.2, 19.8])]
    d = pick(sides, question="x")
    assert d.verdict == UNDECIDED and d.worse == ("c",)
