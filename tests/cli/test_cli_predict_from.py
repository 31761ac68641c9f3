"""`scalelab predict --from DIR` on runs copied into a fresh folder (tests/fixtures/store_v0's one-rank cnn runs at
per-rank batches 16, 32, 64, 256, its 2-rank ddp run and its `bench comm` run, host "vm"): it starts no process,
prints and writes the labelled table, and refuses with one line naming the run it lacks."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import subprocess

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.store import Store

from conftest import STORE_V0_BENCH as BENCH, STORE_V0_COMPUTE as COMPUTE, STORE_V0_DDP as DDP, as_gpu_box
from conftest import copied_runs as copied
from scalelab.perf.hardware import PRESETS

ALL = (*COMPUTE.values(), BENCH, DDP)
NVLINK = PRESETS["nvlink3"].name


@pytest.fixture
def no_process(monkeypatch):
    """Any process start (torchrun, a subprocess, a fork, multiprocessing) fails the test."""
    forbid_processes(monkeypatch)


def forbid_processes(monkeypatch) -> None:
    import scalelab.run.execute as execute
    import scalelab.run.launch as launch

    def refuse(*args, **kwargs):
        raise AssertionError("predict --from started a process")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.Process, "start", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    for module, name in ((launch, "torchrun_launch"), (launch, "run_torchrun"), (execute, "run_recorded")):
        monkeypatch.setattr(module, name, refuse)


def predict_from(folder, tmp_path, *args: str):
    main(["predict", "--from", str(folder), "--store", str(tmp_path / "store"), "--workers", "1,8,64,4096", *args])


def test_predict_from_copied_runs_starts_no_process_and_labels_every_row(tmp_path, capsys, no_process):
    folder = copied(tmp_path, *ALL)
    predict_from(folder, tmp_path)
    out = capsys.readouterr().out
    study = tmp_path / "store" / "studies" / "predict"
    table = pd.read_csv(study / "prediction.csv")
    origin = "compute of 2-core CPU (host vm) on"
    assert list(table["hardware"].unique()) == [  # default: the presets, and measured since a bench is there
        "measured (gloo, host vm)", f"{origin} 10 GbE, one rank per node",
        f"{origin} 200 Gb/s InfiniBand HDR, one rank per node", f"{origin} {NVLINK}"]
    assert sorted(table["workers"].unique()) == [1, 8, 64, 4096] and set(table["per_rank_batch"]) == {256}
    assert f"{origin} {NVLINK}" in out.replace("\n", "")
    assert "on 2-core CPU (host vm)" in out  # the validation's header: measured there, not here
    validation = pd.read_csv(study / "validation.csv")
    assert list(validation["run_id"]) == [DDP]
    cal = json.loads((study / "calibration-from.json").read_text())
    assert sorted(cal["compute_runs"]) == sorted(COMPUTE.values()) and cal["host"] == "vm"
    assert not (study / "calibration.json").exists()  # the study's own calibration is not touched
    assert Store(tmp_path / "store").list_runs().empty  # nothing ran
    assert (study / "prediction.png").exists()


def test_predict_from_fresh_runs_copied_into_a_fresh_folder(tmp_path, capsys, monkeypatch):
    """Runs of this version (one rank, in this process) made in one store, copied elsewhere, predicted from."""
    box = tmp_path / "box"
    for batch in (8, 32):
        main(["train", "--model", "mlp", "--dataset", "synthetic", "--samples", "64", "--eval-samples", "16",
              "-b", str(batch), "--steps", "4", "--warmup-steps", "1", "--store", str(box)])
    folder = tmp_path / "copied"
    shutil.copytree(box / "runs", folder)
    forbid_processes(monkeypatch)
    capsys.readouterr()
    predict_from(folder, tmp_path, "--hardware", "ib_hdr", "--per-rank-batch", "16")
    table = pd.read_csv(tmp_path / "store" / "studies" / "predict" / "prediction.csv")
    assert set(table["hardware"]) == {f"compute of {os.cpu_count()}-core CPU (host {socket.gethostname()}) on "
                                      "200 Gb/s InfiniBand HDR, one rank per node"}
    assert (table["compute(ms)"] > 0).all() and set(table["per_rank_batch"]) == {16}
    cal = json.loads((tmp_path / "store" / "studies" / "predict" / "calibration-from.json").read_text())
    assert [p["per_rank_batch"] for p in cal["points"]] == [8, 32] and cal["model"] == "mlp"
    assert Store(tmp_path / "store").list_runs().empty


def test_predict_from_runs_without_a_bench_defaults_to_the_presets(tmp_path, capsys, no_process):
    folder = copied(tmp_path, COMPUTE[16], COMPUTE[64], DDP)
    predict_from(folder, tmp_path)
    table = pd.read_csv(tmp_path / "store" / "studies" / "predict" / "prediction.csv")
    assert [h.split(" on ")[1] for h in table["hardware"].unique()] == [
        "10 GbE, one rank per node", "200 Gb/s InfiniBand HDR, one rank per node", NVLINK]
    assert set(table["per_rank_batch"]) == {64}  # the largest measured
    assert "validation: skipped: no `bench comm` run from host vm" in capsys.readouterr().out


def test_predict_from_uses_a_bench_for_validation_with_a_hardware_file(tmp_path, capsys, no_process):
    folder = copied(tmp_path, *ALL)
    hw = tmp_path / "hw.yaml"
    hw.write_text("preset: 100gbe\nname: my cluster\n")
    predict_from(folder, tmp_path, "--hardware-file", str(hw), "--mode", "strong", "--global-batch", "4096")
    study = tmp_path / "store" / "studies" / "predict"
    table = pd.read_csv(study / "prediction.csv")
    assert set(table["hardware"]) == {"compute of 2-core CPU (host vm) on my cluster"}
    assert list(table["per_rank_batch"]) == [4096, 512, 64, 1]
    assert list(pd.read_csv(study / "validation.csv")["run_id"]) == [DDP]


def test_predict_from_a_gpu_box_on_its_own_kind_of_hardware(tmp_path, capsys, no_process):
    folder = copied(tmp_path, *COMPUTE.values())
    as_gpu_box(folder)
    predict_from(folder, tmp_path, "--hardware", "nvlink3", "--hardware", "ib_hdr", "--per-rank-batch", "32")
    table = pd.read_csv(tmp_path / "store" / "studies" / "predict" / "prediction.csv")
    assert list(table["hardware"].unique()) == [
        NVLINK, "compute of NVIDIA A100-SXM4-80GB (host gpubox) on 200 Gb/s InfiniBand HDR, one rank per node"]
    assert set(table["per_rank_batch"]) == {32}
    assert "validation: skipped: no `bench comm` run from host gpubox" in capsys.readouterr().out


@pytest.mark.parametrize("runs, args, expected", [
    ((BENCH, DDP), (), "holds no completed run without gradient sync"),
    ((COMPUTE[64], BENCH), (), "cnn on synthetic at per-rank batch 64"),
    ((COMPUTE[16], COMPUTE[64]), ("--hardware", "measured"), "needs a completed `bench comm` run"),
    (ALL, ("--model", "mlp"), "holds no completed run without gradient sync (1 rank, --sync noop or "
                              "--noop-collectives) of mlp"),
    (ALL, ("--calibration-batches", "8,16"), "calibration_batches"),
    ((), (), "holds no stored run"),
    ("corrupt", (), f"{COMPUTE[256]}/summary.json: corrupt JSON"),
    ("corrupt status", (), f"{BENCH}/status.json: corrupt JSON"),
])
def test_predict_from_refuses_with_one_line(tmp_path, capsys, no_process, runs, args, expected):
    folder = copied(tmp_path, *(ALL if isinstance(runs, str) else runs))  # "corrupt ...": every run, one spoilt
    if runs == "corrupt":
        (folder / COMPUTE[256] / "summary.json").write_text('{"time/step_median(ms)": ')
    if runs == "corrupt status":
        (folder / BENCH / "status.json").write_text("{")
    with pytest.raises(SystemExit) as info:
        predict_from(folder, tmp_path, *args)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: ") and expected in err, err
    assert not (tmp_path / "store" / "studies" / "predict" / "prediction.csv").exists()


def test_the_prediction_fits_80_columns_and_wide_shows_every_column(tmp_path, capsys, no_process, monkeypatch):
    """At 80 columns what answers the question (workers, step and its 95 % interval, efficiency, extrapolation)
    fits, the other columns are named below it, and the notes are a short list; --wide prints every column."""
    from scalelab.cli.common import console

    monkeypatch.setattr(console, "width", 80)
    folder = copied(tmp_path, *ALL)
    predict_from(folder, tmp_path, "--hardware", "ib_hdr")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "workers" in line and "step(ms)" in line)
    assert all(col in header for col in ("95 % (ms)", "efficiency", "extrapolation"))
    assert "not shown, to fit 80 columns: " in out and "(--wide, and prediction.csv)" in out
    notes = lines[lines.index("notes (in full: --wide):") + 1:]
    bullets = [line for line in notes if line.startswith("- ")]
    assert 3 <= len(bullets) <= 8 and any("compute of one rank alone" in b for b in bullets)
    predict_from(folder, tmp_path, "--hardware", "ib_hdr", "--wide")
    wide = capsys.readouterr().out
    header = next(line for line in wide.splitlines() if "workers" in line and "step(ms)" in line)
    assert all(col in header for col in ("sampling ±%", "model ±%", "compute(ms)", "exposed_comm(ms)", "50 % (ms)"))
    assert "not shown" not in wide and "intervals: each predicted step" in wide.replace("\n", " ")
