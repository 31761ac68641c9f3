"""The one decision rule (scalelab.lab.decision) on exact synthetic tables: clearly better, overlapping, n too
small, a flagged cell, a material but tiny win, many alternatives; and the one module that decides."""
from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from scalelab.lab import decision as dec
from scalelab.lab.decision import (BETTER, NOT_ENOUGH_DATA, NOT_MATERIAL, WITHIN_NOISE, Side, beyond_noise, decide,
                                   pick, rank, widen)

SRC = Path(__file__).resolve().parents[3] / "src" / "scalelab"


def side(label, value, half=1.0, n=3, spread=0.5, quality="ok"):
    """A median step `value` ms with interval value ± half, n launches whose medians span value ± spread."""
    return Side(label, value, (value - half, value + half), n, (value - spread, value + spread), quality, 18)


def test_clearly_better_is_recommended_with_both_sides_and_the_ratio():
    d = decide(side("2 workers", 30.0), side("0 workers", 40.0), question="loader setting", keep="0 workers")
    assert d.verdict == BETTER and d.recommends
    assert d.card() == ("Use 2 workers: 1.33× faster than 0 workers, beyond noise (intervals separated and every one "
                        "of the launches agrees, n = 3 launches each). Median step of 2 workers: 30 ms (95 % interval "
                        "29–31 ms, n = 3 launches); of 0 workers: 40 ms (95 % interval 39–41 ms, n = 3 launches).")


def test_overlapping_intervals_keep_the_default_and_say_so():
    d = decide(side("2 workers", 34.7, half=5), side("0 workers", 36.0, half=5), question="loader setting",
               keep="0 workers")
    assert d.verdict == WITHIN_NOISE and not d.recommends
    assert d.card().startswith("Keep 0 workers: 2 workers is within noise of 0 workers (the intervals meet")


def test_interleaved_launches_are_within_noise_although_the_intervals_separate():
    a, b = side("a", 30.0, spread=6.0), side("b", 40.0, spread=6.0)
    assert not beyond_noise(a, b) and decide(a, b, question="x").verdict == WITHIN_NOISE


def test_n_too_small_recommends_nothing():
    d = decide(side("2 workers", 30.0, n=1), side("0 workers", 40.0, n=1), question="loader setting")
    assert d.verdict == NOT_ENOUGH_DATA
    assert d.card().startswith("No loader setting is recommended: 1 launch each; a comparison between configurations "
                              "needs 2 or more launches each. Median step of 2 workers: 30 ms")


def test_a_flagged_cell_recommends_nothing_and_is_left_out_of_a_pick():
    d = decide(side("a", 30.0), side("b", 40.0, quality="noisy: 0.4 cores busy"), question="x")
    assert d.verdict == NOT_ENOUGH_DATA and "b is flagged (noisy: 0.4 cores busy)" in d.card()
    # among three, the flagged one is set aside: a beats c, and the family is 1
    p = pick([side("a", 30.0), side("b", 20.0, quality="implausible: x"), side("c", 40.0)], question="x")
    assert p.verdict == BETTER and p.chosen.label == "a" and p.against.label == "c" and p.family == 1


def test_a_win_beyond_noise_but_under_two_percent_does_not_move_a_default():
    a, b = side("a", 99.0, half=0.1, spread=0.05), side("b", 100.0, half=0.1, spread=0.05)
    assert beyond_noise(a, b)
    d = decide(a, b, question="x", keep="b")
    assert d.verdict == NOT_MATERIAL and "by 1.0 %, under the 2 % that changes a default" in d.card()
    assert decide(side("a", 97.0, half=0.1, spread=0.05), b, question="x").verdict == BETTER


def test_many_alternatives_widen_the_intervals_bonferroni():
    a = side("a", 10.0, half=1.0)
    assert widen(a, 1) == (9.0, 11.0)
    lo, hi = widen(a, 3)  # z(1 - 0.05/6) / z(0.975) = 2.394 / 1.960
    assert hi - 10.0 == pytest.approx(1.2217, abs=1e-3) and 10.0 - lo == pytest.approx(1.2217, abs=1e-3)
    # a gap of 0.3 ms between the 95 % intervals: beyond noise for one alternative, not for three
    b = side("b", 12.3, half=1.0)
    assert beyond_noise(a, b, family=1) and not beyond_noise(a, b, family=3)
    many = pick([a, b, side("c", 30.0), side("d", 31.0)], question="thread count", default="d")
    assert many.family == 3 and many.verdict == WITHIN_NOISE and many.against.label == "b"
    assert many.keep == "d, the default"
    assert "corrected for 3 alternatives" in many.card()


def test_higher_is_better_for_a_throughput():
    a = Side("fp16", 100.0, (95.0, 105.0), 2)
    b = Side("fp32", 50.0, (45.0, 55.0), 2)
    d = decide(a, b, question="precision", figure="throughput", unit=" samples/s", lower_is_better=False)
    assert d.verdict == BETTER and "2.00× faster than fp32" in d.card()
    assert decide(b, a, question="p", lower_is_better=False).verdict == WITHIN_NOISE


def test_the_cheaper_choice_within_noise_is_kept():
    sides = [side("batch 16", 50.0, half=3), side("batch 64", 49.0, half=3), side("batch 256", 80.0)]
    d = pick(sides, question="batch", cheaper=lambda s: int(s.label.split()[1]))
    assert d.chosen.label == "batch 64" and d.verdict == WITHIN_NOISE
    assert d.keep == "batch 16, the cheapest within noise"


def test_rank_sets_flagged_rows_aside_and_renders_the_card():
    table = pd.DataFrame([
        {"sync": "ddp", "step(ms)": 50.0, "step_ci_low(ms)": 49.0, "step_ci_high(ms)": 51.0, "launches": 3,
         "step_launch_min(ms)": 49.5, "step_launch_max(ms)": 50.5, "timed_steps": 18, "quality": "ok"},
        {"sync": "allreduce", "step(ms)": 60.0, "step_ci_low(ms)": 59.0, "step_ci_high(ms)": 61.0, "launches": 3,
         "step_launch_min(ms)": 59.5, "step_launch_max(ms)": 60.5, "timed_steps": 18, "quality": "ok"},
        {"sync": "gather", "step(ms)": 10.0, "step_ci_low(ms)": 9.0, "step_ci_high(ms)": 11.0, "launches": 3,
         "quality": "implausible: faster than its link"}])
    lines, d = rank(table, "sync", "gradient sync", action=lambda s: f"the {s} gradient sync")
    assert lines[0] == "gather is left out of the ranking: implausible: faster than its link."
    assert d.verdict == BETTER and d.chosen.label == "ddp" and lines[1] == d.card()
    assert d.card().startswith("Use the ddp gradient sync: 1.20× faster than allreduce, beyond noise")


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
