"""Experiments on tiny configs: real runs, resume skips finished cells, tables computed from stored runs."""
from __future__ import annotations

import pandas as pd
import pytest

from scalelab.config import TrainConfig
from scalelab.experiments import basic
from scalelab.experiments.grid import Cell, cell_key, run_grid
from scalelab.run.execute import execute

pytestmark = pytest.mark.timeout(240)
quiet = {"say": lambda s: None}


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", dataset="synthetic", samples=64, eval_samples=16, global_batch=16, steps=3,
                warmup_steps=1)
    return TrainConfig(**{**base, **kw})


def test_interrupted_study_resumes_running_only_missing_cells(store):
    cells = [Cell(f"b{b}", tiny(global_batch=b)) for b in (8, 16, 32)]
    calls = []

    def crash_on_third(cfg, st, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the study is stopped while the third cell is starting
        calls.append(cfg.global_batch)
        return execute(cfg, st, **kw)

    with pytest.raises(KeyboardInterrupt):
        run_grid("s", cells, store, execute=crash_on_third, **quiet)
    ran = []

    def counting(cfg, st, **kw):
        ran.append(cfg.global_batch)
        return execute(cfg, st, **kw)

    results = run_grid("s", cells, store, execute=counting, **quiet)
    assert ran == [32]  # only the missing cell
    assert [r.status for r in results] == ["skipped", "skipped", "completed"]
    assert len(store.list_runs(study="s", status="completed")) == 3


def test_cell_key_ignores_run_id_and_resolves_auto():
    assert cell_key(tiny()) == cell_key(tiny(run_id="x", device="cpu", backend="gloo", strategy="single"))
    assert cell_key(tiny()) != cell_key(tiny(global_batch=8))
    # how a run is operated (watchdog, checkpoints) is not what it measures
    assert cell_key(tiny()) == cell_key(tiny(hang_timeout_s=30, checkpoint_every=5))


def test_failed_cell_is_recorded_and_the_grid_goes_on(store, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from torch import nn\nclass M(nn.Module):\n    def forward(self, x):\n        raise ValueError('x')\n"
                   "    def __init__(self, spec):\n        super().__init__()\n        self.l = nn.Linear(1, 1)\n"
                   "def make(spec):\n    return M(spec)\n")
    results = run_grid("g", [Cell("bad", tiny(model=f"{bad}:make")), Cell("good", tiny())], store, **quiet)
    assert [r.status for r in results] == ["failed", "completed"]
    assert "ValueError" in results[0].reason


def test_batch_sweep_table_has_one_row_per_batch_and_files(store, tmp_path):
    res = basic.batch_sweep(tiny(), [8, 16, 32], store, "study", tmp_path / "out", **quiet)
    table = res.tables["batch_sweep"]
    assert list(table["global_batch"]) == [8, 16, 32]
    assert (table["time/epoch(s)"] >= table["time/epoch_no_data(s)"]).all()
    assert all(p.exists() for p in res.files) and any(p.suffix == ".png" for p in res.files)
    again = pd.read_csv(tmp_path / "out" / "batch_sweep.csv")
    assert list(again["global_batch"]) == [8, 16, 32]


def test_profile_amp_checkpointing_loader(store, tmp_path):
    out = tmp_path / "out"
    prof = basic.profile(tiny(model="cnn"), store, "st", out, **quiet).tables["profile"]
    assert prof["share(%)"].sum() == pytest.approx(100.0)
    amp = basic.precision(tiny(model="cnn"), store, "st", out, **quiet)
    assert set(amp.tables["amp"]["precision"]) == {"fp32", "bf16"}
    assert "fp16" in amp.notes["skipped"]
    assert len(amp.tables["amp_curves"]) == 6
    ck = basic.checkpointing(tiny(model="cnn"), [0, 1, 3], store, "st", out, **quiet).tables["checkpointing"]
    assert list(ck["checkpoint_segments"]) == [0, 1, 3]
    loader = basic.loader_sweep(tiny(dataset="synthetic_jpeg"), [0, 1], store, "st", out, **quiet)
    table = loader.tables["loader_sweep"]
    assert list(table["num_workers"]) == [0, 1]
    assert (table["epoch_iteration(s)"] > 0).all() and (table["data_wait(%)"] >= 0).all()
    assert loader.notes["recommended"]["num_workers"] in (0, 1)
    n_loader_runs = len(store.list_runs(kind="loader"))
    basic.loader_sweep(tiny(dataset="synthetic_jpeg"), [0, 1], store, "st", out, **quiet)
    assert len(store.list_runs(kind="loader")) == n_loader_runs  # resumed: nothing measured twice
