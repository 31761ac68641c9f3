"""`predict` calibrated on Slurm cells (docs/model.md, "Calibrated on a Slurm allocation's nodes"), without a
Slurm: the calibration's cells and its bench are job steps over the base's Slurm nodes (the cluster's own link,
no loopback or unshaped-link bench), the validation runs over the base's nodes and once more across the whole
allocation, and that run is held out in node count."""
from __future__ import annotations

import pytest

from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.measure.commbench import CommBenchConfig
from scalelab.perf import calibrate as calibrate_module
from scalelab.perf import prediction
from scalelab.perf.calibrate import bench_config, calibration_cells, cross_link_cells, insitu_cells
from scalelab.perf.calibration import Calibration
from scalelab.perf.validation import sample_of
from scalelab.run.slurmnodes import Allocation

from test_prediction import synthetic_calibration

THREE = Allocation("7", ("n0", "n1", "n2"))


def slurm_base(nodes: int = 2, **more) -> TrainConfig:
    fields = dict(model="mlp", dataset="synthetic", ranks=1, local_nodes=nodes, nodes_launcher="slurm",
                  global_batch=24 * nodes)
    return TrainConfig(**{**fields, **more})


def test_the_calibrations_cells_and_bench_are_job_steps_over_the_bases_slurm_nodes():
    base = slurm_base()
    cells = calibration_cells(base, [8, 16]) + insitu_cells(base, [8, 16], [4_000] * 4)
    assert {(c.config.local_nodes, c.config.nodes_launcher, c.config.link_gbps) for c in cells} == {(2, "slurm", None)}
    assert [c.config.per_rank_batch for c in cells[:2]] == [8, 16]
    bench = bench_config(base, [4_000] * 4)
    assert (bench.local_nodes, bench.ranks, bench.nodes_launcher, bench.link_gbps) == (2, 1, "slurm", None)
    # the cluster's link is measured as it is: no unshaped-link cells, which only a shaped namespace link has
    assert cross_link_cells(base, cells) == []


def test_a_slurm_bench_names_its_launcher_and_a_namespace_bench_keeps_its_identity():
    slurm = CommBenchConfig(ops="allreduce", ranks=1, local_nodes=2, nodes_launcher="slurm")
    assert slurm.to_dict()["nodes_launcher"] == "slurm"
    assert CommBenchConfig.from_dict(slurm.to_dict()).nodes_launcher == "slurm"
    assert "nodes_launcher" not in CommBenchConfig(ops="allreduce", ranks=1, local_nodes=2).to_dict()
    with pytest.raises(ConfigError, match="link_gbps"):
        CommBenchConfig(ops="allreduce", ranks=1, local_nodes=2, nodes_launcher="slurm", link_gbps=0.5)
    with pytest.raises(ConfigError, match="nodes_launcher"):
        CommBenchConfig(ops="allreduce", ranks=1, local_nodes=2, nodes_launcher="mpi")


def test_the_validation_runs_over_the_bases_nodes_at_their_per_rank_batches():
    cells, why = prediction.validation_cells(slurm_base(), [8, 16], "ddp", 4.0, "none")
    assert why is None
    assert [(c.config.local_nodes, c.config.per_rank_batch) for c in cells] == [(2, 8), (2, 16), (2, 24)]


def test_the_allocations_largest_node_count_is_validated_once_more_held_out(monkeypatch):
    monkeypatch.setattr(prediction, "allocation", lambda: THREE)
    cells, _ = prediction.validation_cells(slurm_base(), [8, 16], "ddp", 4.0, "none")
    (held,) = prediction.held_out_nodes(slurm_base(), cells)
    assert (held.config.local_nodes, held.config.nnodes, held.config.per_rank_batch) == (3, 3, 24)
    assert held.config.sync == "ddp" and held.config.nodes_launcher == "slurm"
    # nothing more to hold out when the calibration spans the allocation; namespace nodes are not an allocation's
    three = slurm_base(3)
    assert prediction.held_out_nodes(three, prediction.validation_cells(three, [8, 16], "ddp", 4.0, "none")[0]) == []
    spaces = slurm_base(nodes_launcher="namespaces")
    assert prediction.held_out_nodes(spaces, prediction.validation_cells(spaces, [8, 16], "ddp", 4.0, "none")[0]) == []


def test_a_run_across_more_slurm_nodes_than_the_calibration_is_held_out_in_node_count():
    cal = synthetic_calibration(ranks=2, nodes=2, nodes_launcher="slurm", batches=[8.0, 16.0])
    run = lambda nodes, batch: slurm_base(nodes, global_batch=batch * nodes).to_dict()  # noqa: E731
    assert sample_of(cal, run(2, 8)) == "in-sample"
    assert sample_of(cal, run(3, 24)) == "held out: nodes, batch"
    assert sample_of(cal, run(3, 16)) == "held out: nodes"


def test_compute_at_other_node_counts_stops_at_the_allocations_nodes(monkeypatch):
    seen = []
    monkeypatch.setattr(calibrate_module, "allocation", lambda: THREE)
    monkeypatch.setattr(calibrate_module, "calibrate_compute",
                        lambda cal, base, cells, **kw: seen.append((base.local_nodes, base.nodes_launcher)) or cal)

    class Cells:
        study = "s"

    cal = synthetic_calibration(ranks=2, nodes=2, nodes_launcher="slurm")
    at = calibrate_module.compute_at_nodes(cal, slurm_base(), Cells(), [1, 2, 3, 4, 8], batches=[8, 16],
                                           horizon=64, say=lambda _: None)
    assert sorted(at) == [3] and seen == [(3, "slurm")]  # 4 and 8 nodes: more than the allocation's 3


def test_the_calibrated_hardware_names_the_slurm_nodes_and_older_files_load_as_namespaces():
    cal = synthetic_calibration(ranks=2, nodes=2, nodes_launcher="slurm")
    assert cal.hardware().name == "measured (gloo, 2 Slurm nodes over the cluster's link)"
    data = cal.to_dict()
    del data["nodes_launcher"]
    assert Calibration.from_dict(data).nodes_launcher == "namespaces"


def test_one_rank_alone_is_a_job_step_on_one_slurm_node():
    (small, _) = calibrate_module.lone_cells(slurm_base(threads=1), [8, 16])
    assert (small.config.local_nodes, small.config.nnodes, small.config.nodes_launcher) == (1, 1, "slurm")
    assert (small.config.ranks, small.config.threads, small.config.per_rank_batch) == (1, None, 8)


def test_the_validation_reports_the_run_held_out_in_node_count_apart():
    import pandas as pd

    from scalelab.perf.validation import validation_text

    val = pd.DataFrame([
        {"sample": "in-sample", "error(%)": 2.0, "workers": 2, "predicted": 102.0, "measured": 100.0},
        {"sample": "held out: batch", "error(%)": -4.0, "workers": 2, "predicted": 96.0, "measured": 100.0},
        {"sample": "held out: nodes, batch", "error(%)": 12.5, "workers": 3, "predicted": 180.0, "measured": 160.0}])
    text = validation_text(val, "this machine")
    assert "held out: 2 run(s), median |error| 8.2 %" in text
    assert "across 3 workers (a node count no calibration run used): error +12.5 % (predicted 180.0 ms, measured " \
           "160.0 ms)" in text
    assert "node count" not in validation_text(val[val["workers"] == 2], "this machine")


def test_a_slurm_runs_network_is_the_clusters_link():
    from scalelab.perf.links import network_label

    assert network_label(slurm_base(3).to_dict()) == "3 Slurm nodes over the cluster's link"
    assert network_label(slurm_base(3, nodes_launcher="namespaces").to_dict()) == "3 nodes over an unshaped link"
