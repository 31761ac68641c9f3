"""The scale experiment end to end on a tiny config: real 1- and 2-rank gloo runs, strong and weak, with the
no-sync ablation of each multi-rank cell."""
from __future__ import annotations

import pytest

from conftest import run_experiment
from scalelab.config import TrainConfig

pytestmark = pytest.mark.timeout(300)


def test_scale_strong_and_weak_with_no_sync_ablation(store, tmp_path):
    base = TrainConfig(model="mlp", samples=128, eval_samples=16, steps=4, warmup_steps=1)
    res = run_experiment("scale", base, store, "sc", tmp_path, workers=[1, 2], batches=[32])
    strong, weak = res.tables["scale_strong"], res.tables["scale_weak"]
    assert list(strong["workers"]) == [1, 2] and list(strong["global_batch"]) == [32, 32]
    assert list(weak["global_batch"]) == [32, 64]
    two = strong[strong["workers"] == 2].iloc[0]
    assert two["comm/bytes_per_step"] > 0 and two["step_no_sync(ms)"] > 0
    [nosync_id] = store.list_runs(study="sc/scale_strong_nosync")["run_id"]
    nosync = store.get(nosync_id)
    assert (nosync["config"]["sync"], nosync["config"]["ranks"], nosync["config"]["global_batch"]) == ("noop", 2, 32)
    assert two["step_no_sync(ms)"] == nosync["summary"]["time/step_median(ms)"]  # the ablation of this very cell
    assert len(store.list_runs(study="sc/scale_strong")) == 2
    assert any(p.name == "scale_strong.png" for p in res.files)
