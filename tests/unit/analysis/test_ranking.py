"""Honest small samples in sentences: an interval printed with its real coverage, and a finding between
configurations that counts launches, not steps (scalelab.analysis.interpret)."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import beats, ranking, span, step_span


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


def test_one_launch_is_named_as_the_shortest_but_not_ranked():
    lines, best = ranking(rows(launches=1, ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert best is None
    assert lines == ["ddp has the shortest median step: 50 ms (95 % interval 49–51 ms); indicative: 1 launch, not "
                     "ranked (a difference between configurations counts only when each was launched at least 2 "
                     "times and every launch agrees)."]


def test_a_table_without_a_launches_column_counts_as_one_launch():
    lines, best = ranking(rows(launches=None, ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert best is None and "indicative: 1 launch, not ranked" in lines[0]


def test_one_row_of_one_launch_keeps_every_row_unranked():
    table = rows(ddp=50.0, allreduce=60.0)
    table.loc[1, "launches"] = 1
    lines, best = ranking(table, "sync", "gradient sync")
    assert best is None and "indicative: 1 launch" in lines[0]


def test_three_launches_each_separated_and_not_interleaved_make_a_finding_that_states_n():
    lines, best = ranking(rows(ddp=50.0, allreduce=60.0), "sync", "gradient sync")
    assert best["sync"] == "ddp"
    assert lines == ["ddp has the shortest median step: 50 ms (95 % interval 49–51 ms), faster than every other "
                     "gradient sync beyond noise in every launch (n = 3 launches each; next: allreduce, 60 ms, "
                     "95 % interval 59–61 ms)."]


def test_separated_intervals_whose_launches_interleave_are_within_noise():
    # 50 +- 1 vs 60 +- 1 ms, but a launch of ddp took 56 ms and one of allreduce 54 ms
    table = rows(interleaved=True, ddp=50.0, allreduce=60.0)
    assert not beats(table.iloc[0], table.iloc[1])
    lines, best = ranking(table, "sync", "gradient sync")
    assert best is None and "the launches interleave" in lines[0] and "n = 3 launches each" in lines[0]


def test_beats_reads_a_pooled_summary_s_keys_and_falls_back_to_the_step_interval():
    lo, hi = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    a = {lo: 49.0, hi: 51.0, "launches": 2, keys.STEP_LAUNCH_MEDIAN_MIN_MS: 49.5, keys.STEP_LAUNCH_MEDIAN_MAX_MS: 50.5}
    b = {lo: 52.0, hi: 54.0, "launches": 2}  # no launch medians kept: its interval reaches them (repeats.pool)
    assert beats(a, b, lo, hi) and not beats(b, a, lo, hi)
    assert not beats({**a, "launches": 1}, b, lo, hi)
    assert not beats({**a, lo: 50.0, hi: 50.0}, b, lo, hi)  # zero width: one value
