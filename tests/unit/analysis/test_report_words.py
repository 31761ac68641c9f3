"""The report's words held to its numbers on the stored fixture study (tests/fixtures/quick_study_results): every
recommending experiment's card is rendered from its decisions, no decision is worded as a winner the rule cannot
carry (checks.decision_faults), and every ratio sentence says the direction and size the tables give
(checks.ratio_faults, expected ratios computed here from the tables, not read from the words). Each check also
fails on a planted defect."""
from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd
import pytest
from conftest import FIXTURES

from scalelab.analysis import checks, keys
from scalelab.lab import registry
from scalelab.lab.base import Result
from scalelab.lab.decision import BETTER, Side, card, decide
from scalelab.lab.results import frame_of
from scalelab.store import read_json

STEP = keys.STEP_MEDIAN_MS


@pytest.fixture(scope="module")
def study() -> dict[str, Result]:
    out = {}
    for path in sorted((FIXTURES / "quick_study_results").glob("*.json")):
        if path.stem in registry.names():
            data = read_json(path)
            out[path.stem] = Result(data["name"], {k: frame_of(t) for k, t in data["tables"].items()},
                                    notes=data.get("notes", {}), meta=data.get("meta", {}))
    return out


def faster_ratios(name: str, result: Result) -> list[float]:
    """How many times faster each pair an experiment's sentences may compare is, from its tables alone."""
    t = next(iter(result.tables.values()))
    if name == "threads":
        return [t[STEP].iloc[0] / s for s in t[STEP]]
    if name == "loader":
        zero = t.loc[t["num_workers"] == 0, keys.THROUGHPUT].max()
        return [x / zero for x in t[keys.THROUGHPUT]]
    if name == "batch_sweep":
        s = t.sort_values("global_batch")[keys.THROUGHPUT]
        return [s.iloc[-1] / s.iloc[0]]
    if name == "amp":
        fp32 = t.loc[t["precision"] == "fp32", STEP].iloc[0]  # the decision's figure (issue 60)
        return [fp32 / s for s in t[STEP]]
    if name == "checkpointing":
        off = t.loc[t["checkpoint_segments"] == 0, STEP].iloc[0]
        return [off / s for s in t[STEP]]
    return []


def decision_ratios(decisions) -> list[float]:
    return [d.against.value / d.chosen.value if d.lower_is_better else d.chosen.value / d.against.value
            for d in decisions if d.speed]


def test_every_recommending_experiment_renders_its_card_from_its_decisions(study):
    decided = 0
    for name, result in study.items():
        experiment = registry.get(name)
        if experiment.decide is None:
            continue
        decisions = experiment.decide(result)
        _, rec = experiment.interpret(result)
        if decisions:
            decided += 1
            assert rec == card(decisions), name
    assert decided >= 5  # loader, threads, batch sweep, amp, strategies (one backend ran; no bucket sweep in quick)


def test_no_decision_of_the_fixture_study_is_worded_beyond_what_it_can_carry(study):
    records = [d.record() for name, r in study.items() if registry.get(name).decide
               for d in registry.get(name).decide(r)]
    assert len(records) >= 5
    assert checks.decision_faults(records) == []


def test_a_planted_within_noise_winner_fails_the_check():
    a, b = Side("a", 50.0, (45.0, 56.0), 3), Side("b", 55.0, (50.0, 60.0), 3)
    honest = decide(a, b, question="gradient sync")
    assert honest.verdict != BETTER and checks.decision_faults([honest.record()]) == []
    planted = replace(honest, verdict=BETTER, why="planted")
    faults = checks.decision_faults([planted.record()])
    assert len(faults) == 1 and faults[0].startswith("a winner whose intervals meet ((45.0, 56.0) against (50.0, "
                                                     "60.0)) and whose ratio interval (0.9")
    assert "gradient sync: Use a: a beats b: 1.10× faster than b" in faults[0]
    worded = {**honest.record(), "card": "Use a: " + honest.card()}
    assert any(f.startswith("worded as a winner, verdict 'undecided'") for f in checks.decision_faults([worded]))
    one_launch = replace(decide(Side("a", 50.0, (49.0, 51.0), 1), Side("b", 60.0, (59.0, 61.0), 1),
                                question="x"), verdict=BETTER)
    assert any("a winner from 1 launches" in f for f in checks.decision_faults([one_launch.record()]))
    hidden = {**honest.record(), "card": "Keep b."}
    assert any("does not state its comparison" in f for f in checks.decision_faults([hidden]))


def test_planted_disjoint_intervals_left_undecided_and_a_kept_setting_not_compared_fail_the_check():
    """The issue's scaling card: 50.7 ms (48.7–56.2) against 19.8 ms (16.3–33): disjoint, so beats or worse."""
    a, b = Side("2 workers", 50.7, (48.7, 56.2), 3), Side("1 worker", 19.8, (16.3, 33.0), 3)
    honest = decide(a, b, question="worker count")
    assert honest.verdict == "worse" and checks.decision_faults([honest.record()]) == []
    for verdict in ("undecided", "equivalent"):
        planted = replace(honest, verdict=verdict, why="planted")
        faults = checks.decision_faults([planted.record()])
        assert len(faults) == 1 and faults[0].startswith(f"disjoint 95 % intervals ((48.7, 56.2) against (16.3, 33.0)) "
                                                         f"with verdict {verdict!r}, not beats or worse")
    kept = replace(honest, keep="batch 16, the cheapest")
    assert any(f.startswith("a card that keeps 'batch 16', which it did not compare")
               for f in checks.decision_faults([kept.record()]))


def test_every_ratio_sentence_of_the_fixture_study_says_the_direction_its_numbers_give(study):
    seen = 0
    for name, result in study.items():
        experiment = registry.get(name)
        if experiment.interpret is None or not any(len(t) for t in result.tables.values()):
            continue
        sentences, rec = experiment.interpret(result)
        words = sentences + ([rec] if rec else [])
        expected = faster_ratios(name, result) + decision_ratios(experiment.decide(result) if experiment.decide
                                                                 else [])
        assert checks.ratio_faults(words, expected) == [], name
        seen += sum("×" in w and ("faster than" in w or "the speed of" in w) for w in words)
        assert not any(re.search(r"\dx (the|no) ", w) for w in words), name  # the old wording: "1.41x the 1-thread"
    assert seen >= 5


def test_a_ratio_worded_backwards_fails_the_check():
    expected = [100.0 / 71.0]  # 1 thread 100 ms, 2 threads 71 ms: 1.41 times faster
    assert checks.ratio_faults(["With 2 threads a step takes 71 ms, 1.41× faster than 1 thread."], expected) == []
    assert checks.ratio_faults(["With 2 threads a step takes 71 ms, 0.71× the speed of 1 thread (1.41× slower)."],
                               expected)[0].startswith("a ratio no figure gives")
    slower = [71.0 / 100.0]
    assert checks.ratio_faults(["bf16 runs 0.71× faster than fp32."], slower)[0].startswith(
        "a ratio worded the wrong way")
    assert checks.ratio_faults(["bf16 runs 0.71× the speed of fp32 (1.41× slower)."], slower) == []
    assert checks.ratio_faults(["bf16 runs 0.71× the speed of fp32."], slower) == [
        "a slower ratio without its inverse: bf16 runs 0.71× the speed of fp32."]


def test_a_table_without_its_fixture_columns_has_no_expected_ratio():
    assert faster_ratios("profile", Result("profile", {"profile": pd.DataFrame()})) == []


def test_every_card_of_the_fixture_report_links_its_evidence(study):
    from types import SimpleNamespace

    from scalelab.report.build import build_report

    answered = [(registry.get(name), result) for name, result in study.items()]
    spec = SimpleNamespace(quick=True, name="quick", experiments=list(study))
    report = build_report(spec, answered, {"host": "fixture"}, "scalelab study --quick")
    cards = [(r.text, r.section) for r in report.recommendations]
    assert len(cards) >= 5
    assert checks.card_faults(cards, {s.id for s in report.sections}) == []
    assert checks.card_faults([("Use x.", None)], {"loader"}) == ["a card without its evidence (section None): Use x."]
