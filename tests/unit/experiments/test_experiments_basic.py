"""Experiments on tiny configs: real runs, resume skips finished cells, tables computed from stored runs."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from conftest import quiet_cells, run_experiment
from scalelab.analysis import keys
from scalelab.config import TrainConfig
from scalelab.lab import cells as engine
from scalelab.lab import registry
from scalelab.lab.cells import Cell, cell_key

pytestmark = pytest.mark.timeout(240)


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", dataset="synthetic", samples=64, eval_samples=16, global_batch=16, steps=3,
                warmup_steps=1)
    return TrainConfig(**{**base, **kw})


def test_interrupted_study_resumes_running_only_missing_cells(store, monkeypatch):
    cells = [Cell(f"b{b}", tiny(global_batch=b)) for b in (8, 16, 32)]
    calls = []
    real = engine._execute_train

    def crash_on_third(cell, st, study, say):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the study is stopped while the third cell is starting
        calls.append(cell.config.global_batch)
        return real(cell, st, study, say)

    monkeypatch.setitem(engine._KINDS, "train", dataclasses.replace(engine._KINDS["train"], execute=crash_on_third))
    with pytest.raises(KeyboardInterrupt):
        quiet_cells(store, "s").run(cells, group="g")
    ran = []

    def counting(cell, st, study, say):
        ran.append(cell.config.global_batch)
        return real(cell, st, study, say)

    monkeypatch.setitem(engine._KINDS, "train", dataclasses.replace(engine._KINDS["train"], execute=counting))
    results = quiet_cells(store, "s").run(cells, group="g")
    assert ran == [32]  # only the missing cell
    assert [r.status for r in results] == ["completed", "completed", "completed"]
    assert [r.reused for r in results] == [True, True, False]
    assert len(store.list_runs(study="s/g", status="completed")) == 3


def test_cell_key_ignores_run_id_and_resolves_auto():
    assert cell_key(tiny()) == cell_key(tiny(run_id="x", device="cpu", backend="gloo", wrapper="single"))
    assert cell_key(tiny()) != cell_key(tiny(global_batch=8))
    # how a run is operated (watchdog, checkpoints) is not what it measures
    assert cell_key(tiny()) == cell_key(tiny(hang_timeout_s=30, checkpoint_every=5))


def test_batch_sweep_table_has_one_row_per_batch_and_files(store, tmp_path):
    res = run_experiment("batch_sweep", tiny(), store, "study", tmp_path / "out", batches=[8, 16, 32], launches=1)
    table = res.tables["batch_sweep"]
    assert list(table["global_batch"]) == [8, 16, 32]
    assert (table["time/epoch(s)"] >= table["time/epoch_no_data(s)"]).all()
    assert all(p.exists() for p in res.files) and any(p.suffix == ".png" for p in res.files)
    again = pd.read_csv(tmp_path / "out" / "batch_sweep.csv")
    assert list(again["global_batch"]) == [8, 16, 32]


def test_profile_amp_checkpointing_loader(store, tmp_path):
    out = tmp_path / "out"
    prof = run_experiment("profile", tiny(model="cnn"), store, "st", out).tables["profile"]
    assert prof["share(%)"].sum() == pytest.approx(100.0)
    amp = run_experiment("amp", tiny(model="cnn"), store, "st", out)
    assert set(amp.tables["amp"]["precision"]) == {"fp32", "bf16"}
    assert "fp16" in amp.notes["skipped"]
    assert len(amp.tables["amp_curves"]) == 12  # 2 precisions x 2 seeds (the default) x 3 steps
    ck = run_experiment("checkpointing", tiny(model="cnn"), store, "st", out,
                        segments=[0, 1, 3]).tables["checkpointing"]
    assert list(ck["checkpoint_segments"]) == [0, 1, 3]
    saved = dict(zip(ck["checkpoint_segments"], ck[keys.MEMORY_ACTIVATIONS_BYTES]))
    assert saved[1] < saved[0]  # one segment keeps only the blocks' input (and what the head and loss save)
    # one conv+ReLU block per segment keeps each block's input, which is the previous ReLU's saved output anyway
    assert saved[3] == saved[0]
    assert (ck[keys.MEMORY_ACTIVATIONS_PEAK_BYTES] >= ck[keys.MEMORY_ACTIVATIONS_BYTES]).all()
    loader = run_experiment("loader", tiny(dataset="synthetic_jpeg"), store, "st", out, workers=[0, 1])
    table = loader.tables["loader_sweep"]
    assert list(table["num_workers"]) == [0, 1]
    assert (table["epoch_iteration(s)"] > 0).all() and (table["data_wait(%)"] >= 0).all()
    [decision] = registry.get("loader").decide(loader)  # between the two settings, on the median step
    assert {decision.chosen.label, decision.against.label} == {"num_workers=0 (pin_memory=False)",
                                                               "num_workers=1 (pin_memory=False, prefetch_factor=2)"}
    assert decision.recommends or decision.keep == "num_workers=0 (pin_memory=False), the default"
    n_loader_runs = len(store.list_runs(kind="loader"))
    run_experiment("loader", tiny(dataset="synthetic_jpeg"), store, "st", out, workers=[0, 1])
    assert len(store.list_runs(kind="loader")) == n_loader_runs  # resumed: nothing measured twice
