"""The model-grid experiment end to end: real runs on 1 and 2 ranks (gloo), each in processes of its own under a
memory cap, and a cell that does not fit reported as such. Memory by kind is recorded by the train loop; its
values are checked on synthetic runs in tests/unit/analysis/test_model_grid_tables.py, not here."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import run_experiment
from scalelab.config import TrainConfig

pytestmark = pytest.mark.timeout(300)

MIB = 2**20
# 3x32x32 synthetic images, 10 classes, depth 1: Linear(3072, w) + Linear(w, 10)
PARAMS = {16: 3072 * 16 + 16 + 16 * 10 + 10, 32: 3072 * 32 + 32 + 32 * 10 + 10}


def tiny(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(model="mlp", samples=64, eval_samples=16, global_batch=16, steps=3,
                                 warmup_steps=1, hang_timeout_s=60), **kw})


def test_a_tiny_grid_on_one_and_two_workers(store, tmp_path):
    res = run_experiment("model_grid", tiny(), store, "mg", tmp_path, depths=[1], widths=[16, 32], workers=[1, 2],
                         memory_limit="256MiB")
    grid = res.tables["model_grid"]
    assert list(zip(grid["workers"], grid["depth"], grid["width"])) == [(1, 1, 16), (1, 1, 32), (2, 1, 16),
                                                                       (2, 1, 32)]
    assert list(grid["per_worker_batch"]) == [16, 16, 8, 8]  # the global batch is kept
    assert list(grid["parameters"]) == [PARAMS[16], PARAMS[32]] * 2
    assert list(grid["fits"]) == [True] * 4 and list(grid["status"]) == ["completed"] * 4
    assert (grid["step(ms)"] > 0).all() and (grid["step_min(ms)"] <= grid["step_max(ms)"]).all()
    assert grid["peak_added(bytes)"].notna().all()
    for column in ("parameters(bytes)", "gradients(bytes)", "optimizer_state(bytes)", "activations_saved(bytes)",
                   "activations_backward_peak(bytes)"):
        assert column in grid  # filled once the train loop records memory by kind; NaN until then
    stored = [store.get(run_id) for run_id in grid["run_id"]]
    assert [(r["config"]["ranks"], r["config"]["model_options"], r["config"]["memory_limit"]) for r in stored] == \
        [(1, "depth=1,width=16", 256 * MIB), (1, "depth=1,width=32", 256 * MIB),
         (2, "depth=1,width=16", 256 * MIB), (2, "depth=1,width=32", 256 * MIB)]

    workers = res.tables["model_grid_workers"]
    assert list(workers["width"]) == [16, 32] and list(workers["fit"]) == ["fits on both"] * 2
    assert (workers["step(ratio)"] > 0).all()
    names = {p.name for p in res.files}
    assert {"model_grid.csv", "model_grid_workers.json", "model_grid.png", "model_grid_memory.png"} <= names
    assert list(pd.read_csv(tmp_path / "model_grid.csv")["width"]) == [16, 32, 16, 32]

    n_runs = len(store.list_runs(study="mg/model_grid"))
    again = run_experiment("model_grid", tiny(), store, "mg", tmp_path, depths=[1], widths=[16, 32],
                           workers=[1, 2], memory_limit="256MiB")
    assert len(store.list_runs(study="mg/model_grid")) == n_runs == 4  # resumed: nothing measured twice
    assert list(again.tables["model_grid"]["run_id"]) == list(grid["run_id"])


def test_a_cell_over_the_cap_is_a_row_that_does_not_fit(store, tmp_path):
    """Width 4096 on 3072 inputs: 50 MB of gradients and 50 MB of momentum on top of the model, which a 64 MiB
    cap cannot hold whatever the batch; width 16 adds under 1 MiB."""
    res = run_experiment("model_grid", tiny(), store, "oom", tmp_path, depths=[1], widths=[16, 4096], workers=[1],
                         memory_limit="64MiB")
    grid = res.tables["model_grid"].set_index("width")
    assert grid.loc[16, "fits"] is True and grid.loc[4096, "fits"] is False
    assert grid.loc[4096, "status"] == "does not fit" and "memory" in grid.loc[4096, "reason"]
    assert pd.isna(grid.loc[4096, "step(ms)"]) and grid.loc[4096, "parameters"] == 3072 * 4096 + 4096 + 40970
    heat = next(p for p in res.files if p.name == "model_grid.png")
    assert heat.exists()
