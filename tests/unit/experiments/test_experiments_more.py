"""The LR-scaling experiment end to end on a tiny config (real 1-rank runs), and the scaling and LR
arithmetic on runs with known times."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from conftest import run_experiment
from scalelab.analysis.scaling import add_exposed_comm, scaling_table
from scalelab.config import TrainConfig
from scalelab.experiments.lr_scaling import lr_table

pytestmark = pytest.mark.timeout(300)


def _run(run_id, workers, global_batch, epoch_s, throughput, step_ms=None, comm_ms=0.0):
    return {"run_id": run_id, "config": {"ranks": workers, "nnodes": 1, "global_batch": global_batch},
            "summary": {"time/epoch(s)": epoch_s, "throughput(samples/s)": throughput,
                        "time/step_median(ms)": step_ms, "comm/time(ms)": comm_ms}}


def test_strong_speedup_and_efficiency_on_known_epoch_times():
    runs = [_run("a2", 2, 32, 6.0, 150.0), _run("a1", 1, 32, 10.0, 100.0), _run("a4", 4, 32, 4.0, 250.0)]
    t = scaling_table(runs, "strong")
    assert list(t["workers"]) == [1, 2, 4]
    assert list(t["speedup"]) == pytest.approx([1.0, 10 / 6, 2.5])
    assert list(t["efficiency"]) == pytest.approx([1.0, 10 / 12, 0.625])
    # no 1-worker run of that global batch: no baseline, no speedup
    alone = scaling_table([_run("b2", 2, 64, 5.0, 200.0)], "strong")
    assert alone["speedup"].isna().all() and alone["efficiency"].isna().all()


def test_weak_speedup_and_efficiency_on_known_throughputs():
    runs = [_run("w1", 1, 16, 8.0, 100.0), _run("w2", 2, 32, 9.0, 150.0), _run("w4", 4, 64, 11.0, 360.0)]
    t = scaling_table(runs, "weak")
    assert list(t["per_worker_batch"]) == [16, 16, 16]
    assert list(t["speedup"]) == pytest.approx([1.0, 1.5, 3.6])
    assert list(t["efficiency"]) == pytest.approx([1.0, 0.75, 0.9])


def test_exposed_comm_is_the_step_minus_the_no_sync_step_clipped_at_zero():
    runs = [_run("s2", 2, 32, 6.0, 150.0, step_ms=30.0, comm_ms=10.0),
            _run("s4", 4, 32, 4.0, 250.0, step_ms=20.0, comm_ms=8.0)]
    ablation = [_run("n2", 2, 32, 5.0, 160.0, step_ms=25.0), _run("n4", 4, 32, 3.0, 300.0, step_ms=22.0)]
    t = add_exposed_comm(scaling_table(runs, "strong"), ablation)
    assert list(t["step_no_sync(ms)"]) == [25.0, 22.0]
    assert list(t["exposed_comm(ms)"]) == [5.0, 0.0]  # 20 - 22 is noise, not negative communication
    assert list(t["overlap"]) == [0.5, 1.0]


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
    res = run_experiment("lr_scaling", base, store, "lr", tmp_path, batches=[16, 64],
                         rules=["none", "linear", "lars"], workers=[1], target=0.2)
    table = res.tables["lr_scaling"]
    assert len(table) == 6  # 2 batches x 3 rules
    assert len(store.list_runs(study="lr/lr_scaling")) == 5  # linear at the base batch reuses the none run
    runs = {r["config"]["lr_rule"]: r for r in [store.get(i) for i in store.list_runs(study="lr/lr_scaling")["run_id"]]
            if r["config"]["global_batch"] == 64}
    assert runs["linear"]["config"]["base_batch"] == 16
    curves = res.tables["lr_curves"]
    assert set(curves["epoch"]) == {1, 2}
