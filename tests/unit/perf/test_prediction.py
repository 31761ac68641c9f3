"""The performance-model experiment on a synthetic calibration with round numbers: prediction tables, hardware,
emulation, in-situ scales, overlap fits, and `scalelab predict` input errors (the calibration from a real 2-rank
study is in tests/dist/test_prediction_dist.py)."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.errors import ConfigError, StoreError
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import Calibration
from scalelab.perf.fit import fit_overlap, insitu_scales
from scalelab.perf.hardware import PRESETS, hardware_from_fit
from scalelab.perf.prediction import efficiency_threshold, options_for_efficiency, predict_table, resolve_hardware
from scalelab.store import Store


def synthetic_calibration(**changes) -> Calibration:
    """A calibration with round numbers: compute(b) = 2 + 0.1·b ms per stage pair, 10 tensors of 4 MB."""
    fields = dict(model="m", dataset="d", ranks=2, threads=None, backend="gloo", accumulate=1,
                  compute={"forward": [1.0, 0.05], "backward": [1.0, 0.05], "optimizer": [0.5, 0.0],
                           "other": [0.0, 0.0]},
                  points=[], alpha_s=1e-5, beta_s_per_byte=1e-9, param_bytes=[4_000_000] * 10,
                  parameters=10_000_000, compute_runs=[], bench_run="b", key="k")
    fields.update(changes)
    return Calibration(**fields)


# ---------------------------------------------------------------- prediction (pure)

def test_predict_table_has_the_columns_and_is_monotone():
    cal = synthetic_calibration()
    hws = [cal.hardware(), PRESETS["10gbe"], PRESETS["nvlink3"]]
    workers = [1, 2, 4, 16, 128, 1024]
    table = predict_table(cal, hws, workers, mode="weak", batch=32, strategy="bucketed", bucket_mb=8)
    assert set(pm.COLUMNS + ["hardware", "strategy", "mode", "compression"]) <= set(table.columns)
    assert len(table) == len(hws) * len(workers)
    for _, g in table.groupby("hardware"):
        assert g["step(ms)"].is_monotonic_increasing
        assert g["efficiency"].is_monotonic_decreasing and g["efficiency"].iloc[0] == 1
        assert (g["speedup"] <= g["workers"] + 1e-9).all()
    strong = predict_table(cal, PRESETS["10gbe"], [1, 2, 4], mode="strong", batch=64)
    assert list(strong["per_rank_batch"]) == [64, 32, 16]


def test_predict_table_allreduce_is_exact_on_fitted_hardware():
    cal = synthetic_calibration()
    row = predict_table(cal, cal.hardware(), [2], batch=10, strategy="allreduce").iloc[0]
    compute = 2 * (1.0 + 0.05 * 10) + 0.5
    comm = 10 * (2 * 1e-5 + 4e6 * 1e-9) * 1e3  # ring on 2 ranks: 2α + S·β per tensor, in ms
    assert row["compute(ms)"] == pytest.approx(compute) and row["exposed_comm(ms)"] == pytest.approx(comm)
    assert row["step(ms)"] == pytest.approx(compute + comm)


def test_efficiency_threshold_and_options():
    cal = synthetic_calibration()
    table = predict_table(cal, [cal.hardware(), PRESETS["nvlink3"]], [1, 2, 4, 8, 64, 4096], batch=8,
                          strategy="allreduce")
    below = efficiency_threshold(table, 0.5)
    for hw, g in table.groupby("hardware"):
        first = g[g["efficiency"] < 0.5]["workers"].min()
        assert below[hw] == (None if math.isnan(first) else first)
    opts = options_for_efficiency(cal, PRESETS["10gbe"], 64, target=0.5, per_rank_batches=[8, 64, 512, 4096],
                                  strategies=["allreduce", "ddp"])
    assert len(opts) == 8 and (opts["meets_target"] == (opts["efficiency"] >= 0.5)).all()
    assert not opts["meets_target"].iloc[-1] or opts["meets_target"].all()  # those meeting it come first
    with pytest.raises(ConfigError, match="target_efficiency"):
        options_for_efficiency(cal, PRESETS["10gbe"], 64, target=0, per_rank_batches=[8])


def test_resolve_hardware_presets_measured_file_and_node_size():
    cal = synthetic_calibration()
    hws = resolve_hardware(["measured", "10gbe"], cal, file={"preset": "ib_hdr", "name": "mine"}, gpus_per_node=4)
    assert [h.gpus_per_node for h in hws] == [4, 4, 4] and hws[-1].name == "mine"
    assert hws[0].alpha_intra == cal.alpha_s and hws[0].beta_inter == cal.beta_s_per_byte
    with pytest.raises(ConfigError, match="hardware"):
        resolve_hardware(["nope"], cal)


def test_calibration_json_round_trip_and_missing_field(tmp_path):
    cal = synthetic_calibration()
    assert Calibration.load(cal.save(tmp_path / "c.json")) == cal
    data = cal.to_dict()
    del data["alpha_s"]
    with pytest.raises(StoreError, match="alpha_s"):
        Calibration.from_dict(data)


def test_emulation_pads_each_collective_and_floors_run_in_parallel():
    hw = hardware_from_fit(1e-4, 1e-9)
    emu = pm.Emulation.from_config(20.0, 1.0)  # 20 ms, 1 Gbit/s = 1.25e8 B/s
    assert emu.floor_s(1.25e6) == pytest.approx(0.020 + 0.010)
    cost = pm.sync_cost("allreduce", param_bytes=[1000.0] * 3, n=2, hardware=hw, backward_s=0.01, emulation=emu)
    assert cost.comm_s == pytest.approx(3 * emu.floor_s(1000)) and cost.exposed_s == cost.comm_s
    # floors start at each launch and overlap each other; the real collectives are served one at a time
    assert pm.completion_with_floors([0, 1, 2], [0.5, 0.5, 0.5], [5, 0, 0]) == [5, 1.5, 2.5]
    assert pm.completion_with_floors([0, 0.1], [1, 1], [0, 0])[-1] == pytest.approx(
        pm.exposed_after_overlap([0, 0.1], [1, 1], 0.0))
    plain = pm.sync_cost("bucketed", param_bytes=[1000.0] * 3, n=2, hardware=hw, backward_s=0.01)
    none = pm.sync_cost("bucketed", param_bytes=[1000.0] * 3, n=2, hardware=hw, backward_s=0.01,
                        emulation=pm.Emulation())
    assert none == plain  # no emulation: the unchanged model


def test_insitu_scales_recover_known_compute_and_comm_factors():
    cal = synthetic_calibration(param_bytes=[1_000_000] * 4)
    bench = 4 * (2 * 1e-5 + 1e6 * 1e-9) * 1e3  # ms: 4 blocking ring allreduces on 2 ranks
    points = pd.DataFrame([{"per_rank_batch": float(b), "forward(ms)": b, "backward(ms)": 2.0 * b,
                            "optimizer(ms)": 1.0, "step(ms)": 3.0 * b + 1.0} for b in (8, 16, 32)])
    runs = [{"run_id": f"r{b}", "config": {"global_batch": 2 * b, "ranks": 2},
             "summary": {"stage/forward(ms)": 1.5 * b, "stage/backward(ms)": 3.0 * b, "stage/optimizer(ms)": 1.5,
                         "time/step_median(ms)": 1.5 * (3.0 * b + 1.0) + 3.0 * bench}} for b in (8, 16, 32)]
    compute, comm, rows = insitu_scales(points, runs, cal)
    assert compute == pytest.approx(1.5) and comm == pytest.approx(3.0) and len(rows) == 3
    # both are at least 1: the run without communication and the bench are the best case
    slower = [{**r, "summary": {**r["summary"], "time/step_median(ms)": 1.0}} for r in runs]
    assert insitu_scales(points, slower, cal)[1] == 1.0
    # predictions on this machine use both; presets neither; one worker and noop never scale compute
    cal = dataclasses.replace(cal, compute_scale=compute, comm_scale=comm)
    here = predict_table(cal, [cal.hardware(), PRESETS["10gbe"]], [1, 2], batch=8, strategy="allreduce")
    one, two = here.iloc[0], here.iloc[1]
    assert two["compute(ms)"] == pytest.approx(1.5 * one["compute(ms)"])
    assert two["comm(ms)"] == pytest.approx(3.0 * bench)
    assert here.iloc[3]["compute(ms)"] == pytest.approx(one["compute(ms)"])
    noop = predict_table(cal, cal.hardware(), [2], batch=8, strategy="noop").iloc[0]
    assert noop["compute(ms)"] == pytest.approx(one["compute(ms)"])


def test_fit_overlap_recovers_a_known_overlap():
    """Bucketed runs whose measured step is compute × compute_scale plus the model's exposed comm at overlap 0.3:
    the fit finds 0.3; a run with a single bucket (nothing to hide) says nothing and is left out."""
    cal = synthetic_calibration(compute_scale=1.2, comm_scale=2.0)
    points = pd.DataFrame([{"per_rank_batch": float(b), "step(ms)": 10.0 + b} for b in (8, 32)])
    truth = dataclasses.replace(cal.hardware(), overlap=0.3)

    def run(b: int, bucket_mb: float) -> dict:
        exposed = pm.sync_cost("bucketed", param_bytes=cal.param_bytes, n=2, hardware=truth,
                               backward_s=1.2 * cal.compute_model().backward(b) / 1e3,
                               bucket_bytes=bucket_mb * pm.MIB).exposed_s
        return {"run_id": f"r{b}-{bucket_mb}", "config": {"global_batch": 2 * b, "ranks": 2, "bucket_mb": bucket_mb},
                "summary": {"time/step_median(ms)": 1.2 * (10.0 + b) + 1e3 * exposed}}

    overlap, rows = fit_overlap(points, [run(8, 8.0), run(32, 8.0), run(32, 100.0)], cal)
    assert overlap == pytest.approx(0.3, abs=1e-6) and [r["run_id"] for r in rows] == ["r8-8.0", "r32-8.0"]
    # measured beyond the model's ends clips to them; no informative run keeps 1 (hide what the model hides)
    slow = run(8, 8.0)
    slow["summary"]["time/step_median(ms)"] += 1e3
    assert fit_overlap(points, [slow], cal)[0] == 0.0
    assert fit_overlap(points, [run(32, 100.0)], cal) == (1.0, [])


# ---------------------------------------------------------------- CLI

@pytest.mark.parametrize("args, field", [
    (["--hardware", "nope"], "hardware"),
    (["--mode", "sideways"], "mode"),
    (["--sync", "ring"], "sync"),
    (["--strategy", "ddp"], "use --sync"),
    (["--compression", "int8"], "compression"),
    (["--target-efficiency", "0"], "target_efficiency"),
    (["--workers", "0,2"], "workers"),
    (["--mode", "strong", "--per-rank-batch", "8"], "per_rank_batch"),
    (["--mode", "strong", "--global-batch", "8", "--workers", "1,16"], "workers"),
    (["--global-batch", "64"], "global_batch"),
    (["--gpus-per-node", "0"], "gpus_per_node"),
    (["--set", "ranks=0"], "ranks"),
    (["--hardware-file", "HWFILE"], "hardware.bogus"),
])
def test_bad_predict_input_is_one_line_and_exit_code_2(tmp_path, capsys, args, field):
    hw = tmp_path / "hw.yaml"
    hw.write_text("preset: 10gbe\nbogus: 1\n")
    store = tmp_path / "store"
    with pytest.raises(SystemExit) as info:
        main(["predict", *[str(hw) if a == "HWFILE" else a for a in args], "--store", str(store)])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and field in err, err
    assert not store.exists() or Store(store).list_runs().empty  # nothing ran
