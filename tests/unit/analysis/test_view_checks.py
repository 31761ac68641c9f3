"""One quantity, one number (issue 57): a scale cell's views agree when built from one definition, and each
cross-view check fails on a planted disagreement."""
from __future__ import annotations

import pandas as pd
import pytest

from scalelab.analysis import keys
from scalelab.analysis.breakdown import exposed_sum, scaling_breakdown
from scalelab.analysis.checks import contradictions, run_failures
from scalelab.analysis.scaling import add_exposed_comm, scaling_table
from scalelab.analysis.view_checks import (
    cell_view_faults,
    explain_faults,
    straggler_over_waiting,
    straggler_steps_over_waiting,
)
from scalelab.lab.pooled import cell_lines


def summary(step, *, fastest=None, waiting=None, wire=None, half=1.0):
    s = {keys.STEP_MEDIAN_MS: step, keys.STEP_MEDIAN_CI_LOW_MS: step - half, keys.STEP_MEDIAN_CI_HIGH_MS: step + half,
         keys.EPOCH_S: step / 10, **dict(zip(keys.ci_keys(keys.EPOCH_S), (step / 11, step / 9))),
         keys.THROUGHPUT: 1e3 / step, keys.stage_ms("data"): 1.0, keys.STEPS_TIMED: 20}
    for key, value in ((keys.STEP_FASTEST_MEDIAN_MS, fastest), (keys.COMM_PEERS_WAIT_MS, waiting),
                       (keys.COMM_CRITICAL_MS, wire)):
        if value is not None:
            s[key] = value
            s.update(zip(keys.ci_keys(key), (value - half / 2, value + half / 2)))
    return s


def run(rid, ranks, summary_, **config):
    return {"run_id": rid, "config": {"ranks": ranks, "nnodes": 1, "global_batch": 64, "sync": "ddp", **config},
            "summary": summary_, "status": "completed"}


def cell_tables() -> dict[str, pd.DataFrame]:
    """The issue's 2-worker cell: 63.3 ms step; no-op 49 ms at its slowest rank, 39.4 at its fastest; waiting 3.4,
    wire 33.4 ms: exposed 23.9 ms = 3.4 + 33.4 - 12.9 under compute."""
    runs = [run("one", 1, summary(100.0)), run("two", 2, summary(63.3, fastest=60.0, waiting=3.4, wire=33.4))]
    noop = [run("noop", 2, summary(49.0, fastest=39.4), noop_collectives=True)]
    nosync = [run("nosync", 2, summary(45.0, fastest=38.0), sync="noop")]
    table = add_exposed_comm(scaling_table(runs, "strong"), runs, noop)
    lost = scaling_breakdown(table, runs, noop, nosync)
    stragglers = pd.DataFrame([{"run_id": "two", "workers": 2, "global_batch": 64, "straggler_rank": 1,
                                "caused(ms)": 3.3, "caused_low(ms)": 2.9, "caused_high(ms)": 3.8,
                                "waiting(ms)": 3.4}])
    return {"scale_strong": table, "scale_strong_lost_speedup": lost, "scale_strong_stragglers": stragglers}


def test_a_cells_views_read_one_value_of_each_quantity():
    tables = cell_tables()
    row = tables["scale_strong"].set_index("workers").loc[2]
    part = tables["scale_strong_lost_speedup"].set_index("part")
    # the fastest rank of the no-op baseline, in the table as in the breakdown
    assert row["exposed_comm(ms)"] == pytest.approx(23.9) == part.loc["exposed", "value(ms)"]
    assert row["hidden(ms)"] == pytest.approx(12.9) == -part.loc["hidden", "value(ms)"]
    assert row["overlap"] == pytest.approx(12.9 / 36.8)
    assert (row["overlap_ci_low"] * 36.8, row["overlap_ci_high"] * 36.8) == pytest.approx(
        (-part.loc["hidden", "value_ci_high(ms)"], -part.loc["hidden", "value_ci_low(ms)"]))
    assert exposed_sum(tables["scale_strong_lost_speedup"]).startswith(
        "exposed communication 23.9 ms = waiting 3.4 + wire 33.4 − 12.9 ran under compute; overlap 35 %")
    assert cell_view_faults(tables) == []
    assert contradictions(tables, [], None) == []


def test_a_table_whose_exposed_is_not_the_breakdowns_fails():
    tables = cell_tables()
    tables["scale_strong"].loc[tables["scale_strong"]["workers"] == 2, "exposed_comm(ms)"] = 17.5  # slowest rank
    faults = cell_view_faults(tables)
    assert any("exposed communication 17.5 ms in the table, 23.9 ms in the breakdown" in f for f in faults), faults
    assert any("exposed communication 17.5" in f for f in contradictions(tables, [], None))  # the study's audit


def test_an_overlap_whose_interval_is_not_the_hidden_parts_fails():
    tables = cell_tables()
    two = tables["scale_strong"]["workers"] == 2
    tables["scale_strong"].loc[two, ["overlap_ci_low", "overlap_ci_high"]] = (0.04, 0.67)  # from exposed alone
    lost = tables["scale_strong_lost_speedup"]
    lost.loc[lost["part"] == "hidden", ["value_ci_low(ms)", "value_ci_high(ms)"]] = (-28.6, 0.72)
    faults = cell_view_faults(tables)
    assert any("disagree on whether it is beyond noise" in f for f in faults), faults
    tables = cell_tables()
    tables["scale_strong"].loc[tables["scale_strong"]["workers"] == 2, "overlap"] = 0.44
    assert any("the breakdown's part under compute" in f for f in cell_view_faults(tables))


def test_a_straggler_that_cost_more_than_the_waiting_fails():
    stragglers = cell_tables()["scale_strong_stragglers"]
    assert straggler_over_waiting(stragglers) == []
    stragglers.loc[0, ["caused(ms)", "caused_low(ms)", "caused_high(ms)"]] = (17.97, 15.0, 21.0)  # the issue's
    (fault,) = straggler_over_waiting(stragglers)
    assert "rank 1 cost the others 18 ms (from 15), above the cell's waiting for peers 3.4 ms" in fault


def step_records(late_start: float, stretch: float = 0.0) -> list[dict]:
    """Two ranks, two buckets; rank 1 arrives 30 ms late at each; bucket 1 takes 15 ms on the wire."""
    out = []
    for step in (1, 2, 3):
        t = step * 1.0
        rank0 = [["allreduce", "backward", t, 0.045, 1], ["allreduce", "backward", t + 0.005, 0.048, 1]]
        rank1 = [["allreduce", "backward", t + late_start, 0.015, 1],
                 ["allreduce", "backward", t + late_start + 0.005 + stretch, 0.018 - stretch, 1]]
        out += [{"step": step, "rank": 0, "warmup": False, "comm_events": rank0},
                {"step": step, "rank": 1, "warmup": False, "comm_events": rank1}]
    return out


def test_every_stored_steps_straggler_cost_is_within_its_waiting():
    assert straggler_steps_over_waiting(step_records(0.030)) == []


def test_a_planted_straggler_cost_above_the_waiting_fails(monkeypatch):
    from scalelab.analysis import view_checks

    real = view_checks.step_arrivals

    def old_rule(events, ranks, offsets=None):  # the rule before issue 57: a wait holding bucket 1 on the wire
        found = real(events, ranks, offsets)
        return {**found, "caused": {r: c + 0.015 for r, c in found["caused"].items()}}

    monkeypatch.setattr(view_checks, "step_arrivals", old_rule)
    faults = straggler_steps_over_waiting(step_records(0.030))
    assert len(faults) == 3 and "rank 1 cost the others 45.0000 ms, above the step's largest waiting" in faults[0]


def test_run_failures_holds_a_stored_run_to_it():
    class Parsed:  # a ParsedRun's fields run_failures reads
        summary = {keys.STEP_MEDIAN_MS: 50.0}
        config: dict = {}
        all_steps = step_records(0.030)

    assert run_failures(Parsed()) == []


def test_explain_gives_the_cells_pooled_value_and_a_different_one_fails():
    tables = cell_tables()
    row = tables["scale_strong"].set_index("workers").loc[2].to_dict()
    lost = tables["scale_strong_lost_speedup"].drop(columns=["workers", "global_batch"])
    cell = {"study": "s", "mode": "strong", "workers": 2, "global_batch": 64, "launches": 3,
            "run_ids": ["a", "two", "c"], "lost": lost, "straggler": tables["scale_strong_stragglers"].iloc[0].to_dict()}
    lines = cell_lines(cell, "two")
    assert lines[0].startswith("this run is launch 2 of 3 of study s's cell (strong scaling, 2 workers at global "
                               "batch 64): the table above is this launch alone")
    assert "the cell: exposed communication 23.9 ms = waiting 3.4 + wire 33.4" in lines[1]
    assert "the cell's straggler: rank 1, cost to the others 3.30 ms" in lines[2]
    assert explain_faults(lines, row) == []
    planted = [lines[0], lines[1].replace("23.9 ms", "22.2 ms")]
    assert explain_faults(planted, row) == ["explain says exposed communication 22.2 ms, the cell's table 23.9 ms"]
    assert explain_faults(lines[:1], row)  # no pooled value at all
