"""`predict --from`: the calibration from stored runs measured elsewhere (copies of tests/fixtures/store_v0's runs:
four one-rank cnn runs at per-rank batches 16, 32, 64, 256 and a 2-rank `bench comm` run, host "vm", a 2-core
CPU), what it refuses, and the labels of rows pairing compute of one device with other hardware's links."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from conftest import FIXTURES, STORE_V0_BENCH, STORE_V0_COMPUTE, STORE_V0_DDP, STORE_V0_MLP_NOOP, as_gpu_box
from conftest import copied_runs as copied
from scalelab.errors import ConfigError, StoreError
from scalelab.experiments import predict as interpret
from scalelab.perf.calibrate import gradient_sizes
from scalelab.perf.calibration import device_name
from scalelab.perf.fit import bench_means, compute_points
from scalelab.perf.elsewhere import (calibrate_from, largest_batch, model_config, run_dirs, stored_runs,
                                     validation_runs, without_communication)
from scalelab.perf.hardware import PRESETS, fit_alpha_beta, hardware_from_dict
from scalelab.perf.prediction import prediction_result
from scalelab.perf.table import compute_origin, predict_table, resolve_hardware, row_label, same_device
from scalelab.store import RunDir
from test_prediction import synthetic_calibration  # round numbers: compute(b) = 2 + 0.1·b ms a stage pair

STORE = FIXTURES / "store_v0"
COMPUTE, BENCH, DDP, MLP_NOOP = STORE_V0_COMPUTE, STORE_V0_BENCH, STORE_V0_DDP, STORE_V0_MLP_NOOP
NVLINK = PRESETS["nvlink3"].name  # "NVLink 3 (A100) ×8/node + 8× 200 Gb/s InfiniBand HDR"


# ---------------------------------------------------------------- labels (pure)

def test_same_device_matches_the_accelerator_named_by_the_hardware():
    assert same_device("NVIDIA A100-SXM4-80GB", PRESETS["nvlink3"])
    assert not same_device("NVIDIA H100 80GB HBM3", PRESETS["nvlink3"])
    assert same_device("NVIDIA H100 80GB HBM3", hardware_from_dict({"preset": "ib_hdr", "name": "H100 pod"}))
    assert not same_device("2-core CPU", PRESETS["10gbe"]) and not same_device("", PRESETS["nvlink3"])
    assert not same_device("NVIDIA A100-SXM4-80GB", PRESETS["ib_hdr"])  # a network names no device


def test_rows_of_this_machine_on_presets_say_whose_compute_they_use():
    cal = synthetic_calibration(device="2-core CPU")
    assert compute_origin(cal) == "this machine"
    assert row_label(cal, cal.hardware()) == cal.hardware().name == "measured (gloo loopback, this machine)"
    assert row_label(cal, PRESETS["nvlink3"]) == f"compute of this machine on {NVLINK}"
    assert row_label(cal, PRESETS["10gbe"]) == "compute of this machine on 10 GbE, one rank per node"
    # the default study's sentence (issue 14): no longer reads as a GPU cluster that was measured
    table = predict_table(cal, [cal.hardware(), PRESETS["nvlink3"]], [1, 8, 4096], batch=32)
    assert list(table["hardware"].unique()) == [cal.hardware().name, f"compute of this machine on {NVLINK}"]
    result = prediction_result(cal, [PRESETS["nvlink3"]], workers=[1, 4096], mode="weak", batch=32,
                               strategy="ddp", bucket_mb=25, compression="none", target=0.5,
                               validation=pd.DataFrame(), skipped=None, calibration="c.json")
    lines, _ = interpret.predict_result(result)
    assert lines[0].startswith(f"compute of this machine on {NVLINK}: predicted efficiency ")
    assert set(result.tables["options"]["hardware"]) == {f"compute of this machine on {NVLINK}"}


def test_rows_from_another_host_name_its_device_unless_the_hardware_is_of_that_kind():
    cal = synthetic_calibration(device="NVIDIA A100-SXM4-80GB", host="gpubox")
    assert compute_origin(cal) == "NVIDIA A100-SXM4-80GB (host gpubox)"
    assert row_label(cal, cal.hardware()) == "measured (gloo, host gpubox)"
    assert row_label(cal, PRESETS["nvlink3"]) == NVLINK  # compute of an A100 on A100 links: the target's own kind
    assert row_label(cal, PRESETS["ib_hdr"]) == ("compute of NVIDIA A100-SXM4-80GB (host gpubox) on 200 Gb/s "
                                                 "InfiniBand HDR, one rank per node")
    h100 = synthetic_calibration(device="NVIDIA H100 80GB HBM3", host="h")
    assert row_label(h100, PRESETS["nvlink3"]) == f"compute of NVIDIA H100 80GB HBM3 (host h) on {NVLINK}"


def test_measured_hardware_needs_a_bench():
    with pytest.raises(ConfigError, match="bench comm"):
        resolve_hardware(["measured"], synthetic_calibration(bench_run="", host="h"))


# ---------------------------------------------------------------- calibration from stored runs

def test_calibrate_from_copied_runs_uses_the_compute_runs_and_the_bench(tmp_path):
    folder = copied(tmp_path, *COMPUTE.values(), BENCH, DDP, MLP_NOOP)
    runs = stored_runs(folder)
    cal = calibrate_from(runs, source=folder)
    assert sorted(cal.compute_runs) == sorted(COMPUTE.values()) and cal.bench_run == BENCH
    assert [p["per_rank_batch"] for p in cal.points] == [16, 32, 64, 256] and largest_batch(cal) == 256
    assert (cal.model, cal.dataset, cal.host, cal.device, cal.backend) == ("cnn", "synthetic", "vm", "2-core CPU",
                                                                           "gloo")
    # the fit of the stored numbers, exactly as a calibration here would make it
    used = [{"run_id": r, "config": RunDir(folder / r).read_config(), "summary": RunDir(folder / r).read_summary()}
            for r in COMPUTE.values()]
    assert cal.points == json.loads(compute_points(used).to_json(orient="records"))
    assert (cal.alpha_s, cal.beta_s_per_byte) == fit_alpha_beta(*bench_means(RunDir(folder / BENCH)),
                                                                op="allreduce")
    assert (cal.param_bytes, cal.parameters) == gradient_sizes(model_config(used[0]["config"]))
    assert (cal.compute_scale, cal.comm_scale, cal.overlap) == (1.0, 1.0, 1.0)
    assert calibrate_from(runs, source=folder, links=False).bench_run == ""
    chosen, why = validation_runs(runs, cal, "ddp")
    assert [r["run_id"] for r in chosen] == [DDP] and why is None
    assert validation_runs(runs, cal, "allreduce")[0] == []


def test_sources_a_run_a_store_a_study_and_a_folder(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    assert [d.run_id for d in run_dirs(store / "runs" / BENCH)] == [BENCH]
    assert len(run_dirs(store)) == len(list((store / "runs").iterdir())) == len(run_dirs(store / "runs"))
    study = {d.run_id for d in run_dirs(store / "studies" / "fixture")}
    assert {COMPUTE[16], COMPUTE[64], COMPUTE[256], BENCH} <= study and COMPUTE[32] not in study  # not the study's
    with pytest.raises(ConfigError, match="not a directory"):
        run_dirs(tmp_path / "nope")


def refusal(tmp_path, *run_ids: str, **kw) -> str:
    folder = copied(tmp_path, *run_ids)
    with pytest.raises((ConfigError, StoreError)) as info:
        calibrate_from(stored_runs(folder), source=folder, **kw)
    text = str(info.value)
    assert len(text.splitlines()) == 1
    return text


def test_refuses_without_compute_runs(tmp_path):
    text = refusal(tmp_path, BENCH, DDP)
    assert "no completed run without gradient sync" in text and "copied" in text


def test_refuses_compute_at_one_batch(tmp_path):
    text = refusal(tmp_path, COMPUTE[64], BENCH)
    assert "cnn on synthetic at per-rank batch 64" in text and "two or more" in text


def test_refuses_measured_links_without_a_bench(tmp_path):
    text = refusal(tmp_path, COMPUTE[16], COMPUTE[64], links=True)
    assert "bench comm" in text and "host vm" in text


def test_refuses_a_model_it_has_no_fit_for(tmp_path):
    text = refusal(tmp_path, *COMPUTE.values(), MLP_NOOP, model="mlp")
    assert "mlp on synthetic at per-rank batch 32" in text


def test_refuses_a_corrupt_summary_naming_it(tmp_path):
    folder = copied(tmp_path, *COMPUTE.values())
    (folder / COMPUTE[32] / "summary.json").write_text("{not json")
    with pytest.raises(StoreError) as info:
        calibrate_from(stored_runs(folder), source=folder)
    assert f"{COMPUTE[32]}/summary.json" in str(info.value) and len(str(info.value).splitlines()) == 1


def test_refuses_a_summary_without_stage_times(tmp_path):
    folder = copied(tmp_path, *COMPUTE.values())
    files = RunDir(folder / COMPUTE[16])
    summary = files.read_summary()
    del summary["stage/backward(ms)"]
    files.write_summary(summary)
    with pytest.raises(StoreError, match=f"{COMPUTE[16]}/summary.json: no number for 'stage/backward"):
        calibrate_from(stored_runs(folder), source=folder)


def test_gpu_box_runs_name_the_device_and_host(tmp_path):
    folder = copied(tmp_path, *COMPUTE.values(), BENCH)
    as_gpu_box(folder)
    cal = calibrate_from(stored_runs(folder), source=folder)
    assert (cal.device, cal.host, cal.bench_run) == ("NVIDIA A100-SXM4-80GB", "gpubox", BENCH)
    table = predict_table(cal, resolve_hardware(["measured", "ib_hdr", "nvlink3"], cal), [1, 64], batch=64)
    assert list(table["hardware"].unique()) == [
        "measured (gloo, host gpubox)",
        "compute of NVIDIA A100-SXM4-80GB (host gpubox) on 200 Gb/s InfiniBand HDR, one rank per node", NVLINK]


def test_prediction_plot_says_whose_compute_in_title_and_legend(tmp_path, monkeypatch):
    from matplotlib import pyplot as plt

    from scalelab.experiments import predict
    from scalelab.experiments.predict import prediction_figures

    shown = {}
    monkeypatch.setattr(predict, "save", lambda fig, path, *series: shown.setdefault("fig", fig) and path)
    cal = synthetic_calibration(device="NVIDIA H100 80GB HBM3", host="gpubox")
    result = prediction_result(cal, [cal.hardware(), PRESETS["nvlink3"]], workers=[1, 8], mode="weak", batch=32,
                               strategy="ddp", bucket_mb=25, compression="none", target=0.5,
                               validation=pd.DataFrame(), skipped=None, calibration="c.json")
    prediction_figures(result, tmp_path)
    fig = shown["fig"]
    assert fig.axes[0].get_title().endswith("\ncompute of NVIDIA H100 80GB HBM3 (host gpubox)")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "ideal", "measured (gloo, host gpubox)", f"compute of NVIDIA H100 80GB HBM3 (host gpubox) on {NVLINK}"]
    plt.close(fig)


def test_device_name_from_config_and_provenance(tmp_path):
    files = RunDir(tmp_path)
    assert device_name({"device": "cpu"}, files) == "CPU"  # no provenance: the core count is unknown
    files.write_provenance({"cpu_count": 8, "cuda_devices": ["NVIDIA L40S"]})
    assert device_name({"device": "cpu"}, files) == "8-core CPU"  # a GPU in the box, the run on the CPU
    assert device_name({"device": "cuda"}, files) == device_name({"device": "auto"}, files) == "NVIDIA L40S"
    files.write_provenance({"cpu_count": 8, "cuda_devices": []})
    assert device_name({"device": "cuda"}, files) == "CUDA device" and device_name({"device": "auto"}, files) == \
        "8-core CPU"


def test_runs_without_communication():
    assert without_communication({"ranks": 1, "nnodes": 1, "sync": "auto"})
    assert without_communication({"ranks": 2, "sync": "noop"})
    assert without_communication({"ranks": 2, "sync": "ddp", "noop_collectives": True})
    assert not without_communication({"ranks": 2, "sync": "ddp"})
    assert not without_communication({"ranks": 1, "nnodes": 2, "sync": "auto"})
    assert not without_communication({"ranks": 2, "sync": "noop", "net_latency_ms": 5.0})  # emulation pads
