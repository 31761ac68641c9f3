"""The calibrated hosts over another link (perf/links.py): β per byte is the slower of the hosts and the
wire, the wire scaling with the shaped rate; known numbers in, exact numbers out. A real calibration over
namespace nodes is in tests/dist/test_local_nodes.py."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from scalelab.errors import ConfigError
from scalelab.perf.calibration import Calibration, link_hardware
from scalelab.perf.fit import insitu_scales, own_scale, scale_to_match
from scalelab.perf.links import NodeLink, network_label, wire_beta
from scalelab.perf.runmodel import predict_run

ONE_GBIT = 8e-9  # s per byte at 1 Gbit/s


def calibration(**changes) -> Calibration:
    """Compute of 1 ms whatever the batch; one tensor of 1 MB; a bench over a 1 Gbit/s tbf link that ran at
    0.95 Gbit/s; the hosts' own cost per byte 1.25 ns (6.4 Gbit/s)."""
    fields = dict(model="m", dataset="d", ranks=3, threads=None, backend="gloo", accumulate=1,
                  compute={"forward": [1.0, 0.0], "backward": [0.0, 0.0], "optimizer": [0.0, 0.0],
                           "other": [0.0, 0.0]},
                  points=[], alpha_s=1e-4, beta_s_per_byte=ONE_GBIT / 0.95, param_bytes=[1_000_000],
                  parameters=250_000, compute_runs=[], bench_run="b", key="k", nodes=3, link_gbps=1.0,
                  host_alpha_s=5e-5, host_beta_s_per_byte=1.25e-9)
    return Calibration(**{**fields, **changes})


def test_a_slower_shaped_link_scales_the_wire_and_keeps_the_calibrated_latency():
    cal = calibration()
    for gbps in (0.5, 0.2):
        hw = cal.hardware(link=NodeLink(True, gbps))
        assert hw.beta_inter == pytest.approx(ONE_GBIT / 0.95 / gbps) and hw.alpha_inter == 1e-4
        assert (hw.alpha_intra, hw.beta_intra) == (5e-5, 1.25e-9)  # ranks of one node: the host's loopback
        assert "0.5" in cal.hardware(link=NodeLink(True, 0.5)).name


def test_an_unshaped_or_fast_link_runs_at_the_hosts_pace():
    cal = calibration()
    unshaped = cal.hardware(link=NodeLink(True, None))
    # per byte the hosts' loopback cost; per message the namespace path's, which the shaped bench measured
    assert (unshaped.alpha_inter, unshaped.beta_inter) == (1e-4, 1.25e-9)
    loopback = cal.hardware(link=NodeLink(False, None))
    assert (loopback.alpha_inter, loopback.beta_inter) == (5e-5, 1.25e-9)
    fast = cal.hardware(link=NodeLink(True, 100.0))  # wire 0.084 ns per byte: the hosts are slower
    assert fast.beta_inter == 1.25e-9 and fast.alpha_inter == 1e-4
    assert cal.hardware(link=NodeLink(False, None)).beta_inter == 1.25e-9  # one host's loopback


def test_the_in_training_scale_applies_to_the_hosts_part_not_to_the_shaped_wire():
    cal = calibration(comm_scale=2.0)
    same = cal.hardware(link=NodeLink(True, 1.0))
    # α and the hosts' β are scaled; the wire (the bench's 0.95 Gbit/s) still runs at its rate
    assert (same.alpha_inter, same.beta_inter) == (2e-4, ONE_GBIT / 0.95)
    assert (same.alpha_intra, same.beta_intra) == (1e-4, 2 * 1.25e-9)
    assert cal.hardware() == same  # the calibrated link is the default
    slow = cal.hardware(link=NodeLink(True, 0.5))
    assert slow.beta_inter == pytest.approx(ONE_GBIT / 0.95 / 0.5) and slow.beta_intra == 2 * 1.25e-9
    # hosts slowed 8x by training are slower than a 1 Gbit/s wire: they set the pace
    busy = calibration(comm_scale=8.0).hardware(link=NodeLink(True, 1.0))
    assert busy.beta_inter == 8 * 1.25e-9


def test_no_link_is_predicted_faster_than_its_shaped_rate_with_tcp_headers():
    """A bench fit whose β beat the wire (an α-β line through latency-bound small sizes) is held to the rate tbf
    enforces: 1448 payload bytes in every 1514 it counts."""
    cal = calibration(beta_s_per_byte=ONE_GBIT / 1.4)
    wire = ONE_GBIT * 1514 / 1448
    assert wire_beta(1.0) == pytest.approx(wire)
    assert cal.hardware().beta_inter == pytest.approx(wire)
    assert cal.hardware(link=NodeLink(True, 0.2)).beta_inter == pytest.approx(wire / 0.2)


def test_the_in_training_scale_over_a_shaped_link_is_fitted_on_the_hosts_part():
    """In-situ allreduce runs over the calibrated 1 Gbit/s link whose communication is the model's with the hosts'
    part × 3: the fit finds 3 (the ratio to the unscaled model, 1.07, would blame the wire for the hosts)."""
    cal = calibration()
    # ms: gloo's segmented ring on 3 ranks, the wire unscaled; bandwidth-bound (a segment, 1e6/6 bytes, takes 1.4 ms
    # on the wire, more than α), so one latency per phase shows (analysis/hardware.py segmented_ring_allreduce)
    truth = 1e3 * (2 * 3e-4 + 4 / 3 * 1_000_000 * ONE_GBIT / 0.95)
    points = pd.DataFrame([{"per_rank_batch": float(b), "forward(ms)": 1.0, "backward(ms)": 1.0,
                            "optimizer(ms)": 1.0, "step(ms)": 3.0} for b in (4, 8)])
    runs = [{"run_id": f"r{b}", "config": {"global_batch": 3 * b, "ranks": 1, "nnodes": 3},
             "summary": {f"stage/{s}(ms)": 1.0 for s in ("forward", "backward", "optimizer")}
             | {"time/step_median(ms)": 3.0 + truth}} for b in (4, 8)]
    compute, comm, rows = insitu_scales(points, runs, cal)
    assert compute == 1.0 and comm == pytest.approx(3.0, rel=1e-5)
    assert rows[0]["bench_comm(ms)"] == pytest.approx(truth - 1e3 * 2 * 2e-4)  # the model at scale 1
    assert scale_to_match(lambda k: 5.0 + k, 4.0) == 0.0  # the unscaled part alone is longer


def test_a_loopback_calibration_takes_the_shaped_rate_as_the_wire():
    cal = calibration(nodes=1, link_gbps=None, host_alpha_s=None, host_beta_s_per_byte=None, beta_s_per_byte=1e-9)
    hw = cal.hardware(link=NodeLink(True, 0.5))
    assert hw.beta_inter == pytest.approx(wire_beta(0.5)) and hw.alpha_inter == 1e-4 and hw.beta_intra == 1e-9
    assert cal.hardware().beta_inter == 1e-9  # the calibrated loopback: unchanged


def test_a_shaped_calibration_without_the_hosts_bench_cannot_predict_another_link():
    cal = calibration(host_alpha_s=None, host_beta_s_per_byte=None)
    with pytest.raises(ConfigError, match="loopback bench"):
        link_hardware(cal, NodeLink(True, None))


def test_a_run_over_a_slower_link_is_predicted_with_the_ring_over_that_link():
    """3 nodes of one rank, per-parameter allreduce of one 1 MB tensor over 0.2 Gbit/s: the step is compute plus
    gloo's segmented ring, bandwidth-bound here (a segment of S/6 takes 7 ms on the wire, α 0.1 ms), so
    2α + 2(n−1)/n·S·β, β the calibrated wire × 1/0.2."""
    cal = calibration()
    config = {"ranks": 1, "nnodes": 3, "local_nodes": 3, "link_gbps": 0.2, "global_batch": 3, "sync": "allreduce",
              "bucket_mb": 25.0}
    beta = ONE_GBIT / 0.95 / 0.2
    ring_ms = 1e3 * (2 * 1e-4 + 4 / 3 * 1_000_000 * beta)
    row = predict_run(cal, config)
    assert row["comm(ms)"] == pytest.approx(ring_ms)
    assert row["step(ms)"] == pytest.approx(1.0 + ring_ms)  # blocking: nothing hidden
    loopback = predict_run(cal, {**config, "local_nodes": 0, "nnodes": 1, "ranks": 3, "link_gbps": None})
    # loopback: a segment takes 0.21 ms, above the host's α of 0.05 ms: bandwidth-bound as well
    assert loopback["comm(ms)"] == pytest.approx(1e3 * (2 * 5e-5 + 4 / 3 * 1_000_000 * 1.25e-9))


def test_the_network_label_names_the_link_and_marks_padding_approximate():
    assert network_label({"ranks": 2}) == "loopback"
    assert network_label({"local_nodes": 3, "nnodes": 3, "link_gbps": 0.5}) == "3 nodes over a 0.5 Gbit/s link (tbf)"
    assert network_label({"local_nodes": 2, "nnodes": 2}) == "2 nodes over an unshaped link"
    padded = network_label({"ranks": 2, "net_latency_ms": 5.0, "net_bandwidth_gbps": 1.0})
    assert padded == "loopback + padded 5 ms, 1 Gbit/s (approximate)"


def test_gather_scatter_gets_its_own_in_training_scale_without_a_floor():
    """In-situ gather/scatter runs over the calibrated 1 Gbit/s link whose communication is the model's with the
    hosts' part × 0.5 (its collectives cost less inside training than the allreduce bench's α says): the fit finds
    0.5, below the floor of 1 that allreduce's scale keeps; predictions of gather/scatter use it, over any link,
    and every allreduce-based strategy keeps comm_scale."""
    cal = calibration(comm_scale=2.0)
    # 3 ranks, one 1 MB tensor: gather and scatter each α + (n−1)·S·β, α × 0.5, the wire unscaled
    truth = 1e3 * 2 * (0.5 * 1e-4 + 2 * 1_000_000 * ONE_GBIT / 0.95)
    points = pd.DataFrame([{"per_rank_batch": float(b), "forward(ms)": 1.0, "backward(ms)": 1.0,
                            "optimizer(ms)": 1.0, "step(ms)": 3.0} for b in (4, 8)])
    runs = [{"run_id": f"g{b}", "config": {"global_batch": 3 * b, "ranks": 1, "nnodes": 3},
             "summary": {f"stage/{s}(ms)": 1.0 for s in ("forward", "backward", "optimizer")}
             | {"time/step_median(ms)": 1.2 * 3.0 + truth}} for b in (4, 8)]
    own, rows = own_scale(points, runs, dataclasses.replace(cal, compute_scale=1.2), "gather_scatter")
    assert own == pytest.approx(0.5, rel=1e-5)
    assert {r["sync"] for r in rows} == {"gather_scatter"}
    assert own_scale(points, [], cal, "gather_scatter") == (None, [])  # no run: it keeps comm_scale
    cal = calibration(comm_scale=2.0, sync_scales={"gather_scatter": own})
    assert cal.scale_for("gather_scatter") == own and cal.scale_for("ddp") == 2.0 and cal.scale_for(None) == 2.0
    assert cal.hardware(strategy="gather_scatter").alpha_inter == pytest.approx(0.5e-4)
    assert cal.hardware(strategy="allreduce").alpha_inter == pytest.approx(2e-4)
    config = {"ranks": 1, "nnodes": 3, "local_nodes": 3, "link_gbps": None, "global_batch": 3, "bucket_mb": 25.0}
    gs = predict_run(cal, {**config, "sync": "gather_scatter"})
    assert gs["comm(ms)"] == pytest.approx(1e3 * 2 * (0.5 * 1e-4 + 2 * 1_000_000 * 0.5 * 1.25e-9))
    ring = predict_run(cal, {**config, "sync": "allreduce"})
    # the segmented ring, bandwidth-bound (a segment 0.42 ms on the wire, α 0.2 ms): one latency per phase
    assert ring["comm(ms)"] == pytest.approx(1e3 * (2 * 2e-4 + 4 / 3 * 1_000_000 * 2 * 1.25e-9))
    # a calibration file written before strategies had their own scale reads back with none
    old = {k: v for k, v in cal.to_dict().items() if k != "sync_scales"}
    assert Calibration.from_dict(old).scale_for("gather_scatter") == 2.0


def test_in_situ_gather_scatter_runs_only_when_it_will_be_predicted():
    from scalelab.config import TrainConfig
    from scalelab.perf.calibrate import insitu_cells

    base = TrainConfig(model="mlp", dataset="synthetic", ranks=2, global_batch=16)
    plain = insitu_cells(base, [8, 16], [1000, 10])
    assert sorted({c.config.sync for c in plain}) == ["allreduce", "bucketed"] and len(plain) == 4
    both = insitu_cells(base, [8, 16], [1000, 10], strategies=["ddp", "gather_scatter"])
    assert [c.config.sync for c in both if c.config.sync == "gather_scatter"] == ["gather_scatter"] * 2
    assert [c.key for c in both if c.config.sync != "gather_scatter"] == [c.key for c in plain]


def test_tables_and_options_give_each_strategy_its_scale_on_the_measured_hardware_only():
    from scalelab.perf.hardware import PRESETS
    from scalelab.perf.prediction import options_for_efficiency, predict_table

    cal = calibration(comm_scale=2.0, sync_scales={"gather_scatter": 0.5})
    low = calibration(comm_scale=0.5)  # the same hardware with every collective at gather/scatter's scale
    table = predict_table(cal, [cal.hardware(), PRESETS["10gbe"]], [3], batch=4, strategy="gather_scatter")
    assert table.iloc[0]["comm(ms)"] == pytest.approx(
        predict_table(low, low.hardware(), [3], batch=4, strategy="gather_scatter").iloc[0]["comm(ms)"])
    assert table.iloc[1]["comm(ms)"] == pytest.approx(  # a preset has no in-training scale
        predict_table(low, PRESETS["10gbe"], [3], batch=4, strategy="gather_scatter").iloc[0]["comm(ms)"])
    opts = options_for_efficiency(cal, cal.hardware(), 3, per_rank_batches=[4],
                                  strategies=["gather_scatter", "allreduce"]).set_index("strategy")
    assert opts.loc["gather_scatter", "step(ms)"] == pytest.approx(table.iloc[0]["step(ms)"])
    assert opts.loc["allreduce", "step(ms)"] == pytest.approx(
        predict_table(cal, cal.hardware(), [3], batch=4, strategy="allreduce").iloc[0]["step(ms)"])
