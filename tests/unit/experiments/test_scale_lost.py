"""The scale experiment's lost-speedup waterfall and sentences, from a breakdown table of exact synthetic numbers."""
from __future__ import annotations

from types import SimpleNamespace

from scalelab.analysis import keys
from scalelab.analysis.breakdown import breakdown
from scalelab.experiments.scale_lost import lost_speedup_sentences, waterfall


def summary(step, **figures):
    s = {keys.STEP_MEDIAN_MS: step, keys.STEP_MEDIAN_CI_LOW_MS: step - 1, keys.STEP_MEDIAN_CI_HIGH_MS: step + 1}
    for key, value in figures.items():
        k = {"fastest": keys.STEP_FASTEST_MEDIAN_MS, "data": keys.stage_ms("data"), "waiting": keys.COMM_PEERS_WAIT_MS,
             "wire": keys.COMM_CRITICAL_MS}[key]
        s[k] = value
        s.update(zip(keys.ci_keys(k), (value - 0.5, value + 0.5)))
    return s


def table(nosync=True):
    t = breakdown(summary(80.0, fastest=70.0, data=8.0, waiting=12.0, wire=6.0), one=summary(100.0, data=10.0),
                  nosync=summary(64.0, fastest=60.0, data=7.0) if nosync else None,
                  noop=summary(65.0, fastest=62.0, data=7.0), k=0.5, commands={"nosync": "scalelab scale ..."})
    t.insert(0, "global_batch", 64)
    t.insert(0, "workers", 2)
    return t


def test_the_sentence_names_the_largest_cause_with_its_interval_and_the_rest():
    result = SimpleNamespace(tables={"scale_strong_lost_speedup": table()})
    line, split = lost_speedup_sentences(result)
    assert line.startswith("strong scaling, 2 workers at global batch 64: ideal step 50 ms, measured 80 ms")
    assert split.startswith("Exposed communication 18 ms = waiting 12 + wire 6; overlap 0 % of the 18 ms")
    assert ("the largest cause is exposed communication: the real run against its no-op collectives, 18 ms (95 % "
            "interval 16.5–19.5 ms), mostly waiting for peers (12 ms of the time inside collectives)") in line
    assert "the rest -1 ms (-3 % of the gap)" in line and "not measured" not in line


def test_a_missing_variant_is_named_in_the_sentence_and_hatched_in_the_waterfall(tmp_path):
    t = table(nosync=False)
    line, _split = lost_speedup_sentences(SimpleNamespace(tables={"scale_weak_lost_speedup": t}))
    assert "not measured: compute, sync_work (needs scalelab scale ...)" in line
    path = waterfall(t, tmp_path / "lost.png")
    assert path.exists() and path.stat().st_size > 0


def test_the_straggler_table_is_said_in_words_and_drawn_by_no_speedup_plot(tmp_path):
    """The scaling section's straggler table (lab/stragglers.py) reaches the sentences; `_figures` draws the lost
    speedup's waterfall for it and no speedup plot (a straggler table has no speedup column)."""
    import pandas as pd

    from scalelab.experiments.scale import _figures, scale_result
    from scalelab.lab.stragglers import COLUMNS

    stragglers = pd.DataFrame([dict(dict.fromkeys(COLUMNS), run_id="r", workers=2, nodes=1, global_batch=64,
                                    straggler_rank=1, straggler_node=None, stage="forward", **{
                                        "caused(ms)": 20.0, "caused_low(ms)": 19.0, "caused_high(ms)": 21.0,
                                        "last(share)": 0.9, "steps": 12, "step(ms)": 60.0})], columns=list(COLUMNS))
    result = SimpleNamespace(tables={"scale_strong_lost_speedup": table(), "scale_strong_stragglers": stragglers})
    files = _figures(result, tmp_path)
    assert [f.name for f in files] == ["scale_strong_lost_speedup.png"]
    lines, _ = scale_result(result)
    assert any(line.startswith("Strong scaling, 2 workers") and "rank 1 is the straggler, losing its time in forward" in line and "20.00 ms" in line for line in lines)


def test_the_waterfall_records_the_table_and_column_it_draws(tmp_path):
    from scalelab.analysis.figure_checks import figure_faults
    from scalelab.report.drawn import read_record

    t = table()
    path = waterfall(t, tmp_path / "lost.png", name="scale_strong_lost_speedup")
    record = read_record(path)
    assert [(s["table"], s["column"]) for s in record["series"]] == [("scale_strong_lost_speedup", "value(ms)")]
    assert figure_faults("scaling/lost.png", record, "", {"scale_strong_lost_speedup": t}) == []
