"""Bus factors and the ceiling a kernel-shaped link puts on a run's busbw, with exact numbers; a run faster than
its links is implausible in the comparison and scaling tables."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.analysis.bandwidth import bus_factor, busbw_ceiling, link_bound, tbf_burst_bytes
from scalelab.analysis.compare import faster_than_link


def test_bus_factors_are_the_nccl_tests_ones():
    assert bus_factor("allreduce", 4) == pytest.approx(1.5)
    assert bus_factor("allgather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("gather", 2) == bus_factor("scatter", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError):
        bus_factor("alltoall", 2)


def test_the_link_bound_over_nodes():
    assert link_bound(2, 2) == 1.0  # one rank per node: busbw is what crosses the link
    assert link_bound(4, 2) == pytest.approx(1.5)  # (4-1) x 2 / (4 x (2-1)): half the ring stays inside a node
    assert link_bound(4, 4) == 1.0
    assert link_bound(2, 1) == float("inf")  # nothing crosses a link


def test_tbf_bursts_raise_the_ceiling_and_small_steps_have_none():
    # room for two GSO segments at 0.5 and 1 Gbit/s; one at 0.2 Gbit/s, where it takes 2.6 ms to refill; 1 ms of
    # the rate above 1.05 Gbit/s
    assert tbf_burst_bytes(1.0) == tbf_burst_bytes(0.5) == 128 * 1024 and tbf_burst_bytes(0.2) == 64 * 1024
    assert tbf_burst_bytes(0.3) == 93_750 and tbf_burst_bytes(10.0) == 1_250_000
    # 1 Gbit/s = 0.125 GB/s; 1 MB a step in one collective, 128 KiB of it may pass as a burst
    assert busbw_ceiling(1.0, world=2, nodes=2, bus_bytes_per_step=1e6, collectives_per_step=1) == \
        pytest.approx(0.125 * 1e6 / (1e6 - 131_072))
    assert busbw_ceiling(1.0, world=2, nodes=2, bus_bytes_per_step=100_000, collectives_per_step=1) is None
    assert busbw_ceiling(1.0, world=2, nodes=1, bus_bytes_per_step=1e9, collectives_per_step=1) is None


def shaped_run(busbw: float, *, ci_low: float | None = None, gbps=1.0, nodes=2) -> dict:
    """A 2-node run over `gbps` links moving 4 MiB a step in one allreduce at `busbw` GB/s (world 2: algbw =
    busbw)."""
    summary = {keys.COMM_BUSBW: busbw, keys.COMM_ALGBW: busbw, keys.COMM_BYTES_PER_STEP: 4 * 2**20,
               keys.COMM_COLLECTIVES_PER_STEP: 1}
    if ci_low is not None:
        summary[keys.ci_keys(keys.COMM_BUSBW)[0]] = ci_low
    return {"config": {"ranks": 1, "local_nodes": nodes, "link_gbps": gbps}, "summary": summary}


def test_a_run_faster_than_its_links_is_implausible():
    assert faster_than_link(shaped_run(0.117)) is None  # measured here: 1 Gbit/s tbf, 4 MiB allreduce, n = 3
    why = faster_than_link(shaped_run(0.4))
    assert why.startswith("implausible: collectives faster than the 1 Gbit/s links")
    assert faster_than_link(shaped_run(0.4, ci_low=0.12)) is None  # its interval reaches the ceiling: noise
    assert faster_than_link(shaped_run(0.4, nodes=1)) is None  # one node: no link between ranks
    assert faster_than_link({"config": {"ranks": 2}, "summary": {keys.COMM_BUSBW: 9.0}}) is None  # loopback


def test_the_comparison_table_flags_it():
    from scalelab.analysis.compare import with_baseline

    run = {**shaped_run(0.4), "run_id": "r1"}
    row = with_baseline({"comm(ms)": 10.0}, run, None)
    assert row["quality"].startswith("implausible: collectives faster than")
