"""One compute baseline per layout (docs/model.md, "One compute baseline per layout"): one rank alone is the
compute of every rank with a node of its own (presets, hardware files) and the one-worker baseline of speedup and
efficiency everywhere; ranks sharing this host compute slower, and only this machine's own rows get that."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.config import TrainConfig
from scalelab.perf.calibrate import lone_cells, lone_text
from scalelab.perf.hardware import PRESETS
from scalelab.perf.prediction import predict_table
from scalelab.perf.validation import validate_measured

from test_prediction import synthetic_calibration

# one rank alone: 1 + 0.025·b ms forward and backward (half the shared calibration's per sample), so the shared
# compute of the calibration's ranks is 2 + 0.1·b + 0.5 and the lone 2 + 0.05·b + 0.5 in all
LONE = {"forward": [1.0, 0.025], "backward": [1.0, 0.025], "optimizer": [0.5, 0.0], "other": [0.0, 0.0]}


def point(b: float, step: float) -> dict:
    return {"per_rank_batch": b, "accumulate": 1, "step(ms)": step}


def shared_and_lone(**changes):
    return synthetic_calibration(lone=LONE, points=[point(16, 4.1), point(64, 8.9)],
                                 lone_points=[point(16, 3.3), point(64, 5.7)], **changes)


def test_a_preset_computes_as_one_rank_alone_and_this_machine_as_its_ranks_sharing_the_host():
    cal = shared_and_lone()
    table = predict_table(cal, [cal.hardware(), PRESETS["10gbe"]], [1, 2], batch=10, strategy="allreduce")
    own, preset = (table[table["hardware"] == h].set_index("workers") for h in table["hardware"].unique())
    lone, shared = 2 + 0.05 * 10 + 0.5, 2 + 0.1 * 10 + 0.5
    assert preset["compute(ms)"].tolist() == pytest.approx([lone, lone])  # one rank per node: alone
    assert own.loc[1, "compute(ms)"] == pytest.approx(lone)  # one worker is one rank alone
    assert own.loc[2, "compute(ms)"] == pytest.approx(shared)  # two ranks share this host
    # one definition of efficiency: X(2) / (2·X(1)) with X(1) one rank alone, = lone step / step at 2
    assert own.loc[2, "efficiency"] == pytest.approx(lone / own.loc[2, "step(ms)"])
    assert preset.loc[2, "efficiency"] == pytest.approx(lone / preset.loc[2, "step(ms)"])


def test_without_lone_runs_the_compute_runs_are_the_baseline():
    cal = synthetic_calibration()
    assert cal.lone_model() == cal.compute_model() and cal.host_slowdown == 1.0


def test_the_host_slowdown_is_the_median_ratio_of_shared_to_lone_steps_and_is_printed():
    cal = shared_and_lone()
    assert cal.host_slowdown == pytest.approx((4.1 / 3.3 + 8.9 / 5.7) / 2)
    text = lone_text(cal)
    assert "0.05 ms per sample" in text and f"2 ranks sharing this host ×{cal.host_slowdown:.2f}" in text


def test_validation_efficiency_divides_one_rank_alone_at_the_runs_batch_by_the_measured_step():
    """At a batch the lone runs measured, their median step; elsewhere the lone fit; never the shared compute."""
    cal = shared_and_lone()
    runs = [{"run_id": f"b{b}", "config": {"model": "m", "dataset": "d", "ranks": 2, "sync": "allreduce",
                                           "bucket_mb": 25.0, "global_batch": 2 * b},
             "summary": {keys.STEP_MEDIAN_MS: 20.0}} for b in (16, 32)]
    table = validate_measured(cal, runs, say=lambda _: None).set_index("run_id")
    assert table.loc["b16", "measured_efficiency"] == pytest.approx(3.3 / 20)
    assert table.loc["b32", "measured_efficiency"] == pytest.approx((2 + 0.05 * 32 + 0.5) / 20)
    assert table.loc["b32", "measured_speedup"] == pytest.approx(2 * (2 + 0.05 * 32 + 0.5) / 20)


def test_lone_cells_are_one_rank_alone_at_its_default_threads_without_namespace_nodes():
    base = TrainConfig(model="mlp", dataset="synthetic", ranks=2, global_batch=64, threads=1)
    cells = lone_cells(base, [16, 64])
    assert [(c.config.world_size, c.config.per_rank_batch) for c in cells] == [(1, 16), (1, 64)]
    assert all(c.config.threads is None and not c.config.local_nodes for c in cells)
    assert all(c.label.startswith("compute of one rank alone") for c in cells)
    nodes = TrainConfig(model="mlp", dataset="synthetic", local_nodes=2, link_gbps=0.5, global_batch=64)
    assert all(c.config.link_gbps is None and c.config.world_size == 1 for c in lone_cells(nodes, [16, 64]))
    alone = TrainConfig(model="mlp", dataset="synthetic", ranks=1, global_batch=64)
    assert lone_cells(alone, [16, 64]) == []  # its compute runs are one rank alone already


def test_namespace_rows_use_compute_measured_at_their_node_count_and_unmeasured_counts_are_extrapolation():
    """The user's path as the protocol's: compute at 3 nodes measured (slower: 3 nodes share the host) is what the
    3-worker row computes with; 4 nodes, unmeasured, keeps the calibration's and is marked extrapolation."""
    import dataclasses

    import pandas as pd

    from scalelab.perf.prediction import apply_horizon

    cal = synthetic_calibration(nodes=2, link_gbps=0.5, lone=LONE)
    slower = {s: [c0 * 1.5, c1 * 1.5] for s, (c0, c1) in cal.compute.items()}
    at3 = dataclasses.replace(cal, compute=slower, compute_nodes=3)
    table = predict_table(cal, cal.hardware(), [1, 2, 3, 4], batch=10, strategy="allreduce", at={3: at3})
    rows = table.set_index("workers")
    assert rows.loc[3, "compute(ms)"] == pytest.approx(1.5 * (2 + 0.1 * 10 + 0.5))
    assert rows.loc[4, "compute(ms)"] == pytest.approx(2 + 0.1 * 10 + 0.5)
    assert rows["compute_nodes"].tolist() == [2, 2, 3, 2]
    marked, _ = apply_horizon(table, cal, pd.DataFrame())
    assert marked.set_index("workers")["extrapolation"].to_dict() == {1: False, 2: False, 3: False, 4: True}


def test_compute_at_nodes_measures_each_whole_node_count_within_the_horizon_and_the_cap(monkeypatch):
    from scalelab.perf import calibrate as calibrate_module

    seen = []
    monkeypatch.setattr(calibrate_module, "calibrate_compute",
                        lambda cal, base, cells, **kw: seen.append((base.local_nodes, base.world_size)) or cal)

    class Cells:
        study = "s"

    cal = synthetic_calibration(nodes=2, link_gbps=0.5)
    base = TrainConfig(model="mlp", dataset="synthetic", local_nodes=2, link_gbps=0.5, global_batch=32)
    at = calibrate_module.compute_at_nodes(cal, base, Cells(), [1, 2, 3, 4, 12, 16, 64], batches=[8, 16],
                                           horizon=16, say=lambda _: None)
    assert sorted(at) == [3, 4] and seen == [(3, 3), (4, 4)]  # 1: alone; 2: calibrated; 12, 16 > 8 nodes; 64 > 16
    alone = TrainConfig(model="mlp", dataset="synthetic", ranks=2, global_batch=32)
    assert calibrate_module.compute_at_nodes(cal, alone, Cells(), [4], batches=[8, 16], horizon=16) == {}
