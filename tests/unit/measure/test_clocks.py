"""The clock-offset estimator's arithmetic and its test hook (the ping-pong itself: tests/dist/test_clocks_dist.py)."""
import pytest

from scalelab.measure import clocks


def test_the_round_of_least_round_trip_gives_the_offset_and_its_bound():
    # rank 0 sent at t0 and heard back at t1; the peer read its clock at t_peer (its clock 10 s ahead)
    rounds = [(0.0, 10.7, 1.0), (2.0, 12.05, 2.1), (3.0, 13.3, 3.5)]
    found = clocks.offset_from_rounds(rounds)
    assert found["offset(s)"] == pytest.approx(10.0)
    assert found["bound(s)"] == pytest.approx(0.05) and found["rtt(s)"] == pytest.approx(0.1)


def test_no_rounds_or_a_round_ending_before_it_began_is_refused():
    with pytest.raises(ValueError, match="rounds: empty"):
        clocks.offset_from_rounds([])
    with pytest.raises(ValueError, match="before t0"):
        clocks.offset_from_rounds([(2.0, 1.0, 1.0)])


def test_the_injected_skew_applies_to_the_named_rank_only():
    env = {clocks.SKEW_ENV: "1:0.05, 3:-0.01"}
    assert clocks.injected_skew(1, env) == 0.05
    assert clocks.injected_skew(3, env) == -0.01
    assert clocks.injected_skew(0, env) == 0.0
    assert clocks.injected_skew(1, {}) == 0.0
    with pytest.raises(ValueError, match="not rank:seconds"):
        clocks.injected_skew(1, {clocks.SKEW_ENV: "0.05"})


def test_one_rank_or_no_process_group_estimates_nothing():
    assert clocks.estimate_in_run(0, 1) is None
    assert clocks.estimate_in_run(0, 2) is None  # no process group in this process
