"""gloo's segmented ring allreduce (analysis/hardware.py `segmented_ring_allreduce`): hand-computed costs at 2, 3
and 4 ranks in both regimes, and the closed form against the send/receive schedule it summarises, simulated
rank by rank."""
import math

import pytest

from scalelab.analysis.hardware import (GLOO_MAX_SEGMENT_BYTES, collective_cost, cost_terms,
                                        segmented_ring_allreduce)

S, MS = 1e6, 1e-3  # bytes; seconds per ms


@pytest.mark.parametrize("n, alpha, beta, expected_ms", [
    # 2 ranks: nothing to hide behind, the α-β ring 2α + S·β in either regime
    (2, 10e-6, 1e-9, 0.020 + 1.0),
    (2, 1e-3, 1e-9, 2.0 + 1.0),
    # 3 ranks, bandwidth-bound: a segment (S/6) is 0.167 ms on the wire, α 10 µs: one α per phase, 2α + 4/3·S·β
    (3, 10e-6, 1e-9, 0.020 + 4 / 3),
    # 3 ranks, latency-bound: α 1 ms > 0.167 ms; 2α + 4/3·S·β + 2·(α − S·β/6) = 4α + S·β
    (3, 1e-3, 1e-9, 4.0 + 1.0),
    # 4 ranks: S/8 is 0.125 ms; bandwidth-bound 2α + 3/2·S·β, latency-bound 2α + 3/2·S·β + 4·(α − S·β/8) = 6α + S·β
    (4, 10e-6, 1e-9, 0.020 + 1.5),
    (4, 1e-3, 1e-9, 6.0 + 1.0),
    # the protocol's held-out regime: 789 288 B over 0.5 Gbit/s (16.7 ns/B), α 1 ms at 3 and 4 nodes
    (3, 1e-3, 1.673e-8, 2.0 + 4 / 3 * 789_288 * 1.673e-8 / MS),
    (4, 1e-3, 1.673e-8, 2.0 + 3 / 2 * 789_288 * 1.673e-8 / MS),
])
def test_hand_computed_costs_at_two_three_and_four_ranks(n, alpha, beta, expected_ms):
    nbytes = 789_288 if beta > 1e-8 else S
    assert segmented_ring_allreduce(nbytes, n, alpha, beta) == pytest.approx(expected_ms * MS, rel=1e-12)
    assert collective_cost("allreduce", nbytes, n, alpha, beta) == pytest.approx(expected_ms * MS, rel=1e-12)


def test_it_is_the_alpha_beta_ring_less_the_hidden_latency_and_equal_to_it_at_two_ranks():
    """With two segments per rank: 2(n−1)α + 2(n−1)/n·S·β − 2(n−2)·min(α, S·β/(2n)); at n = 2 the α-β ring that
    the bench's α and β are fitted on (`cost_terms`), for every size up to 4 MiB."""
    for n in (2, 3, 4, 6):
        for alpha, beta in ((10e-6, 1e-9), (1e-3, 1e-9), (3e-4, 8e-9)):
            a, b = cost_terms("allreduce", n)
            hidden = 2 * (n - 2) * min(alpha, S * beta / (2 * n))
            assert segmented_ring_allreduce(S, n, alpha, beta) == pytest.approx(a * alpha + b * S * beta - hidden)
    a, b = cost_terms("allreduce", 2)
    for size in (1024, 65536, 1e6, 4 * 1024 * 1024):
        assert segmented_ring_allreduce(size, 2, 5e-4, 1e-9) == pytest.approx(a * 5e-4 + b * size * 1e-9)
    assert segmented_ring_allreduce(S, 1, 1e-3, 1e-9) == 0.0


def simulated(nbytes: float, n: int, alpha: float, beta: float, max_segment: float = GLOO_MAX_SEGMENT_BYTES) -> float:
    """gloo's ring (allreduce.cc) played out on n ranks: p segments per rank, each phase (reduce-scatter, then
    allgather) m = (n−1)·p sends per rank; send i is issued once the rank has waited for its send and receive
    i − 2 (two in flight) and, from i = p on, received the segment it forwards (receive i − p); it reaches the wire
    α after it is issued, behind the rank's earlier sends, and takes c there. A phase ends when the rank has its
    last receive and its last send done; the allgather starts there."""
    p = max(2, math.ceil(math.ceil(nbytes / max_segment) / n))
    m, c = (n - 1) * p, nbytes * beta / (n * p)
    start = [0.0] * n
    for _phase in range(2):
        done = [[0.0] * m for _ in range(n)]  # done[r][i]: rank r's send i has reached rank r − 1
        wire = list(start)
        for i in range(m):
            for r in range(n):
                issue = start[r]
                if i >= 2:  # rank r receives iteration i's segment from rank r + 1 (its send i)
                    issue = max(issue, done[(r + 1) % n][i - 2], done[r][i - 2])
                if i >= p:
                    issue = max(issue, done[(r + 1) % n][i - p])
                done[r][i] = max(issue + alpha, wire[r]) + c
                wire[r] = done[r][i]
        start = [max(done[(r + 1) % n][m - 1], done[r][m - 1]) for r in range(n)]
    return max(start)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("nbytes", [40.0, 2560.0, 789_288.0, 3 * 1024 * 1024.0, 20 * 1024 * 1024.0])
@pytest.mark.parametrize("alpha, beta", [(1e-3, 1.673e-8), (3e-4, 8e-9), (1e-4, 1e-11), (20e-6, 8e-11)])
def test_the_closed_form_is_the_schedule_it_summarises(n, nbytes, alpha, beta):
    assert segmented_ring_allreduce(nbytes, n, alpha, beta) == pytest.approx(simulated(nbytes, n, alpha, beta),
                                                                               rel=1e-9)


def test_large_buffers_take_more_segments_per_rank():
    """Above 2n MiB gloo cuts 1 MiB segments: 8 MiB on 2 ranks is 4 per rank (m = 4), latency-bound at α 100 µs
    and S·β 84 µs: 2α + S·β + 2·(α − S·β/8) per the closed form, 463 µs, more than the α-β ring's 284 µs."""
    size, alpha, beta = 8 * 1024 * 1024, 1e-4, 1e-11
    expected = 2 * alpha + size * beta + 2 * (alpha - size * beta / 8)
    assert segmented_ring_allreduce(size, 2, alpha, beta) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(462.9e-6, rel=1e-3)
