"""The scale experiment end to end on a tiny config: real 1- and 2-rank gloo runs, strong and weak, with the
baseline (the same config with no-op collectives) of each multi-rank cell."""
from __future__ import annotations

import pytest

from conftest import run_experiment
from scalelab.config import TrainConfig

pytestmark = pytest.mark.timeout(300)


def test_scale_strong_and_weak_with_a_no_op_collectives_baseline(store, tmp_path):
    base = TrainConfig(model="mlp", samples=128, eval_samples=16, steps=4, warmup_steps=1)
    res = run_experiment("scale", base, store, "sc", tmp_path, workers=[1, 2], batches=[32])
    strong, weak = res.tables["scale_strong"], res.tables["scale_weak"]
    assert list(strong["workers"]) == [1, 2] and list(strong["global_batch"]) == [32, 32]
    assert list(weak["global_batch"]) == [32, 64]
    two = strong[strong["workers"] == 2].iloc[0]
    assert two["comm/bytes_per_step"] > 0 and two["compute(ms)"] > 0
    [nosync_id] = store.list_runs(study="sc/scale_strong_nosync")["run_id"]
    nosync = store.get(nosync_id)
    run = store.get(two["run_id"])
    assert {k for k in run["config"] if run["config"][k] != nosync["config"].get(k)} == {"noop_collectives"}
    assert two["compute(ms)"] == nosync["summary"]["time/step_median(ms)"]  # the baseline of this very cell
    assert two["baseline_run_id"] == nosync_id
    assert two["exposed_comm(ms)"] == pytest.approx(two["step(ms)"] - two["compute(ms)"])
    assert two["comm/wait(ms)"] > 0
    assert two["quality"] == "ok" or two["quality"].startswith("implausible")
    assert len(store.list_runs(study="sc/scale_strong")) == 2
    assert any(p.name == "scale_strong.png" for p in res.files)
