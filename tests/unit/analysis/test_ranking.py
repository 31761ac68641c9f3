"""Honest small samples in sentences: an interval printed with its real coverage (scalelab.analysis.interpret), and
a finding between configurations that counts launches, not steps (scalelab.lab.decision.rank over such rows)."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import ratio_words, span, step_span
from scalelab.lab.decision import BETTER, NOT_ENOUGH_DATA, UNDECIDED, rank, step_side


def rows(launches=3, interleaved=False, **steps):
    """One row per name: median step t, interval t +- 1 ms, `launches` launches (None: no such column) whose
    medians span t +- 0.5 ms, or, `interleaved`, t -/+ 6 ms."""
    out = []
    for name, t in steps.items():
        spread = 6.0 if interleaved else 0.5
        row = {"sync": name, "step(ms)": t, "step_ci_low(ms)": t - 1, "step_ci_high(ms)": t + 1, "timed_steps": 18,
               "step_launch_min(ms)": t - spread, "step_launch_max(ms)": t + spread}
        if launches is not None:
            row["launches"] = launches
        out.append(row)
    return pd.DataFrame(out)


def test_an_interval_from_fewer_than_6_values_says_its_real_coverage():
    assert span((10.0, 12.0), n=4) == "87.5 % interval (range of 4) 10–12 ms"
    assert span((10.0, 12.0), n=2) == "50 % interval (range of 2) 10–12 ms"
    assert span((10.0, 12.0), n=6) == span((10.0, 12.0)) == "95 % interval 10–12 ms"
    assert span((10.0, 10.0), n=1) == "no interval (1 value)" and span(None) == "no interval"
    assert step_span({"step_ci_low(ms)": 10.0, "step_ci_high(ms)": 12.0, "n": 3}) == \
        "75 % interval (range of 3) 10–12 ms"


def test_one_launch_names_no_winner():
    lines, d = rank(rows(launches=1, ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert d.verdict == NOT_ENOUGH_DATA and d.chosen.label == "ddp"
    assert lines == [d.card()] and lines[0].startswith(
        "Undecided after 1 launch each: a comparison between configurations needs 2 or more launches each "
        "(`scalelab compare strategies --launches 2`). No gradient sync is recommended yet. Median step of ddp: "
        "50 ms (95 % interval 49–51 ms, n = 1 launch); of allreduce: 60 ms") is False  # rank alone: no command
    assert lines[0].startswith("Undecided after 1 launch each: a comparison between configurations needs 2 or "
                               "more launches each (--launches 2). No gradient sync is recommended yet. Median "
                               "step of ddp: 50 ms (95 % interval 49–51 ms, n = 1 launch); of allreduce: 60 ms")


def test_a_table_without_a_launches_column_counts_as_one_launch():
    _, d = rank(rows(launches=None, ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert d.verdict == NOT_ENOUGH_DATA and "1 launch each" in d.card()


def test_one_row_of_one_launch_keeps_every_row_unranked():
    table = rows(ddp=50.0, allreduce=60.0)
    table.loc[1, "launches"] = 1
    _, d = rank(table, "sync", "gradient sync")
    assert d.verdict == NOT_ENOUGH_DATA and "and allreduce has 1 launch" in d.card()


def test_three_launches_each_separated_make_a_finding_that_states_n():
    lines, d = rank(rows(ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert d.verdict == BETTER and d.chosen.label == "ddp" and d.against.label == "allreduce"
    assert lines == [d.card()] and lines[0].startswith("Use ddp: ddp beats allreduce: 1.20× faster than allreduce (")
    assert ("(the two sides' own intervals, corrected for 6 looks, n = 3 launches each). Median step of ddp: 50 ms "
            "(95 % interval 49–51 ms, n = 3 launches); of allreduce: 60 ms (95 % interval 59–61 ms, n = 3 "
            "launches).") in lines[0]


def test_intervals_that_meet_leave_the_choice_undecided_and_keep_the_default():
    table = rows(ddp=50.0, allreduce=51.5)
    table["step_ci_low(ms)"], table["step_ci_high(ms)"] = table["step(ms)"] - 8, table["step(ms)"] + 8
    lines, d = rank(table, "sync", "gradient sync", default="allreduce")
    assert d.verdict == UNDECIDED and d.keep == "allreduce, the default"
    assert "Keep allreduce, the default meanwhile" in lines[0] and "n = 3 launches each" in lines[0]


def test_a_side_reads_a_pooled_summary_s_keys_and_falls_back_to_the_step_interval():
    lo, hi, med = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS, keys.STEP_MEDIAN_MS
    a = {med: 50.0, lo: 49.0, hi: 51.0, "launches": 2, keys.STEP_LAUNCH_MEDIAN_MIN_MS: 49.5,
         keys.STEP_LAUNCH_MEDIAN_MAX_MS: 50.5}
    b = {med: 53.0, lo: 52.0, hi: 54.0, "launches": 2}  # no launch medians kept: its interval reaches them
    side = lambda row, name: step_side(row, name, value=med, low=lo, high=hi)  # noqa: E731
    assert side(a, "a").spread == (49.5, 50.5) and side(b, "b").spread == (52.0, 54.0)
    assert side(a, "a").n == 2 and side(b, "b").launch_values is None


def test_a_ratio_is_said_one_way():
    assert ratio_words(1.41, "1 thread") == "1.41× faster than 1 thread"
    assert ratio_words(0.38, "fp32") == "0.38× the speed of fp32 (2.63× slower)"
    assert ratio_words(float("nan"), "fp32") == "no ratio to fp32 (a figure is missing)"
