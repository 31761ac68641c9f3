"""Scaling and LR-scaling experiments end to end on tiny configs (real runs, 1 and 2 gloo ranks)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from scalelab.config import TrainConfig
from scalelab.experiments.lrscaling import lr_scaling, lr_table
from scalelab.experiments.scaling import scale

pytestmark = pytest.mark.timeout(300)
quiet = {"say": lambda s: None}


def test_scale_strong_and_weak_with_no_sync_ablation(store, tmp_path):
    base = TrainConfig(model="mlp", samples=128, eval_samples=16, steps=4, warmup_steps=1)
    res = scale(base, [1, 2], [32], store, "sc", tmp_path, **quiet)
    strong, weak = res.tables["scale_strong"], res.tables["scale_weak"]
    assert list(strong["workers"]) == [1, 2] and list(strong["global_batch"]) == [32, 32]
    assert list(weak["global_batch"]) == [32, 64]
    assert strong["speedup"].iloc[0] == pytest.approx(1.0)
    two = strong[strong["workers"] == 2].iloc[0]
    assert two["comm/bytes_per_step"] > 0 and two["step_no_sync(ms)"] > 0 and two["exposed_comm(ms)"] >= 0
    assert len(store.list_runs(study="sc/scale_strong_nosync")) == 1
    assert any(p.name == "scale_strong.png" for p in res.files)


def test_lr_table_time_to_target_on_fixed_curves():
    curves = pd.DataFrame([
        {"lr_rule": "linear", "global_batch": 64, "workers": 1, "epoch": e, "step": 10 * e, "time(s)": 2.0 * e,
         "eval/acc": acc, "eval/loss": 1.0} for e, acc in [(1, 0.5), (2, 0.85), (3, 0.92), (4, 0.91)]])
    t = lr_table(curves, 0.9)
    row = t.iloc[0]
    assert row["final_acc"] == 0.91 and row["best_acc"] == 0.92
    assert row["time_to_90%(s)"] == 6.0 and row["epochs_to_90%"] == 3
    never = lr_table(curves, 0.95).iloc[0]
    assert math.isnan(never["time_to_95%(s)"])


def test_lr_scaling_runs_each_rule_and_shares_the_base_batch_run(store, tmp_path):
    base = TrainConfig(model="cnn", dataset="mnist1d", samples=256, eval_samples=64, global_batch=16, epochs=2,
                       lr=0.03, warmup_steps=1)
    res = lr_scaling(base, [16, 64], ["none", "linear", "lars"], [1], store, "lr", tmp_path, target=0.2, **quiet)
    table = res.tables["lr_scaling"]
    assert len(table) == 6  # 2 batches x 3 rules
    assert len(store.list_runs(study="lr/lr_scaling")) == 5  # linear at the base batch reuses the none run
    runs = {r["config"]["lr_rule"]: r for r in [store.get(i) for i in store.list_runs(study="lr/lr_scaling")["run_id"]]
            if r["config"]["global_batch"] == 64}
    assert runs["linear"]["config"]["base_batch"] == 16
    curves = res.tables["lr_curves"]
    assert set(curves["epoch"]) == {1, 2}
