"""Waiting for peers and critical communication from the ranks' collective stamps, on exact numbers."""
from __future__ import annotations

import pytest

from scalelab.analysis.peers import rank_split, step_split, union_seconds
from scalelab.analysis.summary import summarize


def ev(op, start, seconds):
    return [op, "backward", start, seconds, 100]


def test_gather_scatter_the_non_root_waits_for_rank_0s_averaging():
    """Both ranks reach gather at 10.0 s; it takes 2 ms. Rank 0 then averages for 5 ms and starts scatter at
    10.007; rank 1 enters scatter at 10.002 and leaves with rank 0 at 10.010. Rank 0 arrives last at the final
    collective: it sets the step. Critical: 2 + 3 ms. Waiting: rank 1's 5 ms inside scatter before rank 0 came."""
    rank0 = [ev("gather", 10.000, 0.002), ev("scatter", 10.007, 0.003)]
    rank1 = [ev("gather", 10.000, 0.002), ev("scatter", 10.002, 0.008)]
    critical, waiting = step_split([rank0, rank1])
    assert critical == pytest.approx(0.005) and waiting == pytest.approx(0.005)


def test_a_straggler_makes_the_others_wait_and_sets_the_step():
    """Rank 1 computes 40 ms longer: rank 0 enters the allreduce at 1.00, rank 1 at 1.04, both leave at 1.05."""
    critical, waiting = step_split([[ev("allreduce", 1.00, 0.05)], [ev("allreduce", 1.04, 0.01)]])
    assert critical == pytest.approx(0.01) and waiting == pytest.approx(0.04)


def test_overlapping_async_buckets_are_counted_once():
    """Two buckets in flight at once on each rank (DDP): unions, not sums. Rank 1 launches each 1 ms later."""
    rank0 = [ev("allreduce", 0.000, 0.004), ev("allreduce", 0.002, 0.004)]
    rank1 = [ev("allreduce", 0.001, 0.003), ev("allreduce", 0.003, 0.003)]
    critical, waiting = step_split([rank0, rank1])
    assert critical == pytest.approx(0.005)  # rank 1 sets the step: [0.001, 0.004] U [0.003, 0.006]
    # rank 0 waits in bucket 1 over [0.000, 0.001]; in bucket 2 over [0.002, 0.003] too, but then bucket 1 is on the
    # wire (its peer arrived at 0.001): communication, not waiting. Its 6 ms inside = 5 critical + 1 waiting.
    assert waiting == pytest.approx(0.001)
    split = rank_split([rank0, rank1])
    assert split == [pytest.approx((0.005, 0.001, 0.006)), pytest.approx((0.005, 0.0, 0.005))]
    assert all(c + w == pytest.approx(inside) for c, w, inside in split)


def test_nothing_is_split_without_peers_or_when_the_ranks_collectives_differ():
    assert step_split([[ev("allreduce", 0.0, 0.1)]]) is None
    assert step_split([[ev("allreduce", 0.0, 0.1)], [ev("broadcast", 0.0, 0.1)]]) is None
    assert step_split([[ev("allreduce", 0.0, 0.1)], []]) is None


def test_union_ignores_empty_intervals():
    assert union_seconds([(0.0, 1.0), (2.0, 1.5), (0.5, 2.0)]) == 2.0


def _record(rank, step, events, warmup=False):
    return {"rank": rank, "step": step, "epoch": 0, "warmup": warmup, "samples": 4, "wall(s)": 0.1,
            "eval(s)": 0.0, "data(s)": 0.0, "comm(s)": 0.0, "comm_total(s)": union_seconds(
                (e[2], e[2] + e[3]) for e in events), "comm_sum(s)": sum(e[3] for e in events),
            "collectives": len(events), "comm_bytes": 100 * len(events), "comm_bytes_forward": 0,
            "comm_bytes_backward": 100 * len(events), "comm_bytes_optimizer": 0, "comm_alg_bytes": 100,
            "comm_bus_bytes": 100, "comm_events": events}


def test_the_summary_carries_both_figures_only_where_the_ranks_share_a_clock():
    """Two timed steps, 10 and 30 ms of waiting (rank 0 early), 5 ms critical each: means 20 and 5 ms."""
    records = [_record(0, 1, [ev("allreduce", 0.0, 0.1)], warmup=True),
               _record(1, 1, [ev("allreduce", 0.0, 0.1)], warmup=True)]
    for step, late in ((2, 0.010), (3, 0.030)):
        records += [_record(0, step, [ev("allreduce", step, late + 0.005)]),
                    _record(1, step, [ev("allreduce", step + late, 0.005)])]
    summary = summarize(records, steps_per_epoch=10)
    assert summary["comm/critical(ms)"] == pytest.approx(5.0)
    assert summary["comm/waiting_for_peers(ms)"] == pytest.approx(20.0)
    assert summary["comm/waiting_for_peers_ci_low(ms)"] < 20.0 < summary["comm/waiting_for_peers_ci_high(ms)"]
    apart = summarize(records, steps_per_epoch=10, one_clock=False)  # two hosts: their clocks do not compare
    assert "comm/critical(ms)" not in apart and "comm/waiting_for_peers(ms)" not in apart
