"""Straggler attribution on synthetic step records with exact numbers (scalelab.analysis.stragglers)."""
import math
from types import SimpleNamespace

import pytest

from scalelab.analysis import stragglers as st
from scalelab.analysis.peers import step_split
from scalelab.store.rundir import RunDir


def rec(rank, step, starts, ends, *, warmup=False, wall=0.1, **stages):
    events = [["allreduce", "backward", s, e - s, 4096] for s, e in zip(starts, ends)]
    return {"rank": rank, "step": step, "warmup": warmup, "wall(s)": wall, "comm_events": events,
            **{f"{k}(s)": v for k, v in stages.items()}}


def late_rank_records(steps=8, late=0.010, jitter=1e-4):
    """Rank 1 enters each of 3 collectives `late` s (+ a little jitter) after rank 0; both leave 1 ms after it."""
    out = []
    for t in range(1, steps + 1):
        base = 10.0 * t
        d = late + jitter * (t % 3)
        r0 = [base, base + 0.020, base + 0.040]
        r1 = [s + d for s in r0]
        ends = [s + 0.001 for s in r1]
        out += [rec(0, t, r0, ends, forward=0.030, backward=0.040),
                rec(1, t, r1, ends, forward=0.030 + d, backward=0.040)]
    return out


def test_the_wait_a_late_rank_causes_is_the_others_time_inside_collectives_before_it_arrives():
    records = late_rank_records()
    table = st.arrival_table(records).set_index("rank")
    expected = [3 * (0.010 + 1e-4 * (t % 3)) for t in range(1, 9)]  # three disjoint waits per step
    assert table.loc[1, "caused(ms)"] == pytest.approx(1e3 * sum(expected) / 8)
    assert table.loc[0, "caused(ms)"] == 0.0
    assert (table.loc[1, "last"], table.loc[1, "collectives"], table.loc[1, "set_step"]) == (24, 24, 8)
    assert table.loc[1, "last(share)"] == 1.0
    assert table.loc[1, "caused_low(ms)"] < table.loc[1, "caused(ms)"] < table.loc[1, "caused_high(ms)"]


def test_overlapping_collectives_count_the_wait_once_not_per_collective():
    # rank 0 launches buckets at 0, 2, 4 ms; rank 1 at 10, 12, 14 ms: rank 0 waits from 0 to 10 ms (not 30, one per
    # bucket, and not 14: from 10 ms its first bucket is on the wire, communication in peers' split too)
    events = [[["allreduce", "backward", s, 0.02 - s, 1] for s in (0.0, 0.002, 0.004)],
              [["allreduce", "backward", s, 0.02 - s, 1] for s in (0.010, 0.012, 0.014)]]
    found = st.step_arrivals(events, [0, 1])
    assert found["caused"][1] == pytest.approx(0.010)
    assert found["last"] == [1, 1, 1]
    assert found["caused"][1] == pytest.approx(step_split(events)[1])  # the step's waiting for peers


def test_a_wait_that_holds_an_earlier_bucket_on_the_wire_is_wire_time_in_both_figures():
    # the case: 2 buckets, rank 1 late by d = 30 ms at each; bucket 1 takes 15 ms on the wire once both
    # are in, bucket 2 8 ms after it. Rank 0 waits d at bucket 1; at bucket 2 it is inside from 5 ms, but bucket 1
    # is on the wire from 30 to 45 ms and rank 1 reaches bucket 2 at 35 ms: no second wait
    d, wire1, wire2 = 0.030, 0.015, 0.008
    rank0 = [["allreduce", "backward", 0.0, d + wire1, 1], ["allreduce", "backward", 0.005, d + wire1 + wire2 - 0.005, 1]]
    rank1 = [["allreduce", "backward", d, wire1, 1], ["allreduce", "backward", d + 0.005, wire1 + wire2 - 0.005, 1]]
    found = st.step_arrivals([rank0, rank1], [0, 1])
    critical, waiting = step_split([rank0, rank1])
    assert found["caused"][1] == pytest.approx(d) == pytest.approx(waiting)
    assert critical == pytest.approx(wire1 + wire2)
    # a second wait where bucket 1 is done before the late rank reaches bucket 2: waiting for rank 1 again
    rank1_later = [["allreduce", "backward", d, wire1, 1], ["allreduce", "backward", d + 0.020, wire2, 1]]
    rank0_later = [rank0[0], ["allreduce", "backward", 0.005, d + 0.020 + wire2 - 0.005, 1]]
    found = st.step_arrivals([rank0_later, rank1_later], [0, 1])
    assert found["caused"][1] == pytest.approx(d + 0.005) == pytest.approx(step_split([rank0_later, rank1_later])[1])


def test_steps_whose_collectives_differ_are_not_compared():
    assert st.step_arrivals([[["allreduce", "backward", 0.0, 1.0, 1]], [["broadcast", "forward", 0.0, 1.0, 1]]],
                            [0, 1]) is None
    assert st.step_arrivals([[["allreduce", "backward", 0.0, 1.0, 1]]], [0]) is None


def test_a_late_rank_is_named_with_the_stage_it_loses_its_time_in():
    verdict = st.find_straggler(late_rank_records(), ranks_per_node=1)
    assert (verdict["rank"], verdict["node"], verdict["stage"]) == (1, 1, "forward")
    excess = verdict["excess"].set_index("stage")
    assert excess.loc["forward", "excess(ms)"] == pytest.approx(1e3 * sum(0.010 + 1e-4 * (t % 3)
                                                                          for t in range(1, 9)) / 8)
    assert excess.loc["backward", "excess(ms)"] == 0.0
    lines = st.straggler_lines(verdict)
    assert lines[0].startswith("Straggler: rank 1 (node 1), last to arrive at 100% of the collectives")
    assert "loses its time in forward" in lines[1]


def test_warmup_steps_are_left_out():
    records = late_rank_records(steps=4)
    for r in records:
        r["warmup"] = True
    assert st.arrival_table(records).empty
    assert st.straggler_lines(st.find_straggler(records))[0].startswith("Stragglers: no step")


def symmetric_slow_link(steps=10):
    """A slow link: every collective takes 300 ms on both ranks, arrivals alternate by 0.1 ms (noise)."""
    out = []
    for t in range(1, steps + 1):
        base = 10.0 * t
        first, second = (base, base + 1e-4) if t % 2 else (base + 1e-4, base)
        end = base + 0.3
        out += [rec(0, t, [first], [end], wall=0.35), rec(1, t, [second], [end], wall=0.35)]
    return out


def test_a_slow_link_that_every_rank_shares_names_no_straggler():
    verdict = st.find_straggler(symmetric_slow_link())
    assert verdict["rank"] is None
    table = verdict["table"].set_index("rank")
    assert table.loc[0, "last"] == table.loc[1, "last"] == 5
    assert st.straggler_lines(verdict)[0].startswith("No straggler beyond noise")


def test_a_rank_late_by_less_than_the_material_share_is_not_named():
    # rank 1 is last every time, by 0.5 ms on a 100 ms step: beyond noise, but 0.5 % of the step
    records = late_rank_records(late=0.0005 / 3, jitter=1e-6)
    table = st.arrival_table(records)
    assert table.set_index("rank").loc[1, "last"] == 24
    assert st.straggler(table, st.median_step_ms(records)) is None
    assert st.straggler(table, st.median_step_ms(records), material=0.001) == 1


def paired(own0, own1):
    """Two ranks that each work their own time (s) from the step's start, then meet at one collective that ends
    1 ms after the later arrives: the earlier waits the difference."""
    out = []
    for t, (a, b) in enumerate(zip(own0, own1), 1):
        base = 10.0 * t
        end = base + max(a, b) + 0.001
        out += [rec(0, t, [base + a], [end], wall=end - base), rec(1, t, [base + b], [end], wall=end - base)]
    return out


def test_a_steady_lateness_within_the_other_ranks_jitter_is_not_named():
    """Both ranks slowed alike from step to step (a loaded machine: rank 0's own work varies by ~7 ms), rank 1's
    own work 2 ms longer on every step: its cost is beyond noise (its interval is [2, 2]) and 4 % of the step, but
    its excess is within what rank 0's own work varies from step to step: the ranks' natural imbalance."""
    swing = [0.005 * (1 if t % 2 else -1) * (1 + t % 3) / 2 for t in range(24)]
    records = paired([0.050 + w for w in swing], [0.052 + w for w in swing])
    table = st.arrival_table(records).set_index("rank")
    assert table.loc[1, "caused(ms)"] == pytest.approx(2.0) and table.loc[1, "caused_low(ms)"] == pytest.approx(2.0)
    assert table.loc[1, "work_excess_low(ms)"] == pytest.approx(2.0) and table.loc[0, "jitter(ms)"] > 2.0
    verdict = st.find_straggler(records)
    assert verdict["rank"] is None
    assert "own work longer than theirs by their jitter" in st.straggler_lines(verdict)[0]
    quiet = paired([0.050 + w / 10 for w in swing], [0.052 + w / 10 for w in swing])  # the same, 10x steadier
    assert st.find_straggler(quiet)["rank"] == 1


def test_a_rank_late_without_longer_own_work_is_not_named():
    """The control's natural imbalance: rank 1 starts each step 3 ms after rank 0 (it left the last collective
    later) and works as long: it arrives 3 ms late on every step, beyond noise and 5 % of the step, but its own
    work is no longer than rank 0's: no straggler. The same lateness from 3 ms more own work is one."""
    out, longer = [], []
    for t in range(1, 25):
        base, own = 10.0 * t, 0.050 + 0.0003 * (t % 3)
        end = base + 0.003 + own + 0.001
        out += [rec(0, t, [base + own], [end], wall=end - base),
                rec(1, t, [base + 0.003 + own], [end], wall=end - base - 0.003)]
        longer += [rec(0, t, [base + own], [end], wall=end - base),
                   rec(1, t, [base + 0.003 + own], [end], wall=end - base)]
    late = st.find_straggler(out)
    table = late["table"].set_index("rank")
    assert table.loc[1, "caused_low(ms)"] == pytest.approx(3.0) and abs(table.loc[1, "work_excess(ms)"]) < 1e-6
    assert late["rank"] is None
    assert st.find_straggler(longer)["rank"] == 1


def test_a_rank_that_stalls_on_every_other_step_is_named_against_the_others_jitter():
    """Rank 1 stalls 80 ms every second step: its own work (and the step) varies by ~60 ms from step to step, rank
    0's by 0.2 ms: the others' jitter is the floor, so the stalls do not hide behind themselves."""
    own0 = [0.050 + 0.0002 * (t % 3) for t in range(24)]
    own1 = [0.0505 + (0.080 if t % 2 == 0 else 0.0) for t in range(24)]
    verdict = st.find_straggler(paired(own0, own1))
    table = verdict["table"].set_index("rank")
    assert verdict["rank"] == 1 and table.loc[1, "jitter(ms)"] > 40 > 1 > table.loc[0, "jitter(ms)"], table
    assert verdict["caused(ms)"] == pytest.approx(1e3 * sum(b - a for a, b in zip(own0, own1)) / 24)


def test_jitter_is_a_robust_spread_about_each_launchs_own_median():
    assert st.within_spread([[1.0, 2.0, 3.0], [11.0, 12.0, 13.0]]) == pytest.approx(st.MAD_SCALE)  # not 5 apart
    assert st.within_spread([[10.0] * 10 + [110.0]]) == 0.0  # one stall of the machine is no jitter
    assert math.isnan(st.within_spread([[4.0]]))


def test_clock_offsets_are_taken_off_before_arrivals_are_compared():
    records = symmetric_slow_link()
    for r in records:
        if r["rank"] == 1:
            r["comm_events"] = [[*e[:2], e[2] + 50.0, *e[3:]] for e in r["comm_events"]]  # its clock 50 s ahead
    assert st.find_straggler(records)["table"].set_index("rank").loc[1, "last"] == 10
    assert st.find_straggler(records, [0.0, 50.0])["rank"] is None


def test_aligned_records_put_every_enter_time_on_rank_0s_clock():
    records = late_rank_records(steps=2)
    assert st.aligned_records(records, None) is records
    moved = st.aligned_records(records, [0.0, 2.0])
    assert [e[2] for e in moved[1]["comm_events"]] == pytest.approx([e[2] - 2.0 for e in records[1]["comm_events"]])
    assert moved[0]["comm_events"] == records[0]["comm_events"] and records[1]["comm_events"][0][2] == pytest.approx(10.0101)


def test_offsets_are_needed_only_across_machines():
    assert st.offsets_of({"nnodes": 1}, None) == (True, None)
    assert st.offsets_of({"nnodes": 2, "local_nodes": 2}, None) == (True, None)
    assert st.offsets_of({"nnodes": 2}, None) == (False, None)
    assert st.offsets_of({"nnodes": 2}, {"offsets(s)": [0.0, 1.0]}) == (True, [0.0, 1.0])


def test_a_script_without_steps_is_read_from_its_metered_collectives():
    def result(starts, length):
        return {"comm_outside": {"comm_events": [["allreduce", "backward", s, length, 8] for s in starts]}}

    starts = [0.1 * k for k in range(10)]
    results = {0: result(starts, 0.021), 1: result([s + 0.02 for s in starts], 0.001)}
    records = st.collective_records(results, warmup=2)
    assert len(records) == 20 and sum(r["warmup"] for r in records) == 4
    assert records[0]["wall(s)"] == pytest.approx(0.1) and records[9]["wall(s)"] == pytest.approx(0.021)

    run = SimpleNamespace(config={"ranks": 2, "warmup_steps": 2}, clocks=None, all_steps=[], results=results)
    verdict = st.run_straggler(run)
    assert verdict["rank"] == 1 and verdict["stages"] is False and verdict["per"] == "collective"
    assert verdict["caused(ms)"] == pytest.approx(20.0)
    assert math.isnan(verdict["caused_low(ms)"]) is False
    assert "marks no steps" in st.straggler_lines(verdict)[1]


def test_a_run_across_machines_without_offsets_is_not_compared():
    run = SimpleNamespace(config={"ranks": 1, "nnodes": 2}, clocks=None, all_steps=late_rank_records(), results={})
    verdict = st.run_straggler(run)
    assert verdict["unaligned"] and verdict["rank"] is None
    assert "no clock offsets" in st.straggler_lines(verdict)[0]


def test_last_arrivals_are_each_collectives_latest_enter():
    records = late_rank_records(steps=2)
    records[0]["comm_events"][2][2] += 0.5  # rank 0 comes last to the third collective of step 1
    assert st.last_arrivals(records) == {(1, 1, 0), (1, 1, 1), (0, 1, 2), (1, 2, 0), (1, 2, 1), (1, 2, 2)}


# ---------------------------------------------------------------- stored runs (scalelab.lab.stragglers)

def stored(tmp_path, name, records, config):
    rundir = RunDir(tmp_path / name)
    rundir.path.mkdir()
    rundir.write_config(config)
    for rank in sorted({r["rank"] for r in records}):
        rundir.write_steps(rank, [r for r in records if r["rank"] == rank])
    rundir.write_clocks({"offsets(s)": [0.0, 0.0], "bounds(s)": [0.0, 1e-5]})
    return rundir


def test_explain_and_the_scaling_section_name_the_stored_runs_straggler(tmp_path):
    from scalelab.lab import stragglers as lab

    config = {"ranks": 1, "nnodes": 2, "local_nodes": 2, "global_batch": 32}
    late = stored(tmp_path, "late", late_rank_records(), config)
    lines = lab.explain_lines({"dir": str(late.path), "config": config})
    assert lines[0].startswith("Straggler: rank 1 (node 1)") and "forward" in lines[1]
    assert lab.explain_lines({"dir": str(late.path), "config": {"ranks": 1}}) == []  # one rank: nobody waits

    link = stored(tmp_path, "link", symmetric_slow_link(), config)
    rows = [{"run_id": "late", "config": config, "status": "completed", "files": late},
            {"run_id": "link", "config": config, "status": "completed", "files": link},
            {"run_id": "one", "config": {"ranks": 1}, "status": "completed", "files": link}]
    table = lab.straggler_table(rows).set_index("run_id")
    assert list(table.index) == ["late", "link"]
    assert (table.loc["late", "straggler_rank"], table.loc["late", "straggler_node"], table.loc["late", "stage"]) == (
        1, 1, "forward")
    assert table.loc["link", "straggler_rank"] is None or math.isnan(table.loc["link", "straggler_rank"])
    sentences = lab.straggler_sentences(table.reset_index())
    assert len(sentences) == 1 and sentences[0].startswith("2 workers at global batch 32: rank 1 on node 1 is the "
                                                           "straggler, losing its time in forward")
    none = lab.straggler_sentences(lab.straggler_table(rows[1:2]))
    assert none[0].startswith("No rank is a straggler beyond noise in the multi-worker cell")


def test_a_rank_slow_in_backward_is_named_there_although_the_others_wait_inside_their_backward():
    """DDP on gloo: the waiting rank's backward lasts until the straggler's bucket arrives; its own time there is
    the span less that wait, so the straggler's extra backward stands out."""
    records = []
    for t in range(1, 9):
        x = 0.015 + 1e-4 * (t % 3)  # rank 1's extra backward
        start = 10.0 * t
        arrive = {0: start + 0.068, 1: start + 0.068 + x}
        end = start + 0.069 + x
        for rank in (0, 1):
            records.append({"rank": rank, "step": t, "warmup": False, "wall(s)": 0.08 + x,
                            "t_end(perf_s)": start + 0.08 + x, "data(s)": 0.0, "h2d(s)": 0.0, "forward(s)": 0.03,
                            "backward(s)": 0.04 + x, "comm(s)": 0.0, "optimizer(s)": 0.01,
                            "comm_events": [["allreduce", "backward", arrive[rank], end - arrive[rank], 8]]})
    verdict = st.find_straggler(records)
    assert (verdict["rank"], verdict["stage"]) == (1, "backward")
    excess = verdict["excess"].set_index("stage")
    assert excess.loc["backward", "excess(ms)"] == pytest.approx(1e3 * sum(0.015 + 1e-4 * (t % 3)
                                                                           for t in range(1, 9)) / 8)
    # spans alone would show no excess: rank 0's backward is as long as rank 1's
    assert records[0]["backward(s)"] == records[1]["backward(s)"]


def test_a_cells_launches_are_pooled_into_one_verdict():
    """Two launches of one cell: their steps in one arrival table (numbered apart), each launch on its own clock
    moved onto rank 0's, so the cost to the others is the mean over every step of both."""
    first = late_rank_records(late=0.010)
    second = [{**r, "comm_events": [[e[0], e[1], e[2] + (0.5 if r["rank"] == 1 else 0.0), *e[3:]]
                                    for e in r["comm_events"]]} for r in late_rank_records(late=0.015)]
    launch = lambda records, offsets: SimpleNamespace(config={"ranks": 2}, clocks={"offsets(s)": offsets},
                                                      all_steps=records, results={})
    one = st.cell_straggler([launch(first, [0.0, 0.0])])
    both = st.cell_straggler([launch(first, [0.0, 0.0]), launch(second, [0.0, 0.5])])  # rank 1's clock 0.5 s ahead
    assert one["launches"] == 1 and both["launches"] == 2
    assert (one["rank"], one["steps"], both["rank"], both["steps"]) == (1, 8, 1, 16)
    expected = [3 * (d + 1e-4 * (t % 3)) for d in (0.010, 0.015) for t in range(1, 9)]
    assert both["caused(ms)"] == pytest.approx(1e3 * sum(expected) / 16)
    assert both["stage"] == "forward"
