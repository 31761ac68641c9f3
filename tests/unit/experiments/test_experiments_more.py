"""The LR-scaling experiment end to end on a tiny config (real 1-rank runs), and its arithmetic on fixed curves.
(The scaling arithmetic on runs with known times is in tests/unit/analysis/test_scaling_math.py.)"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from conftest import run_experiment
from scalelab.config import TrainConfig
from scalelab.experiments.lr_scaling import lr_table

pytestmark = pytest.mark.timeout(300)


def test_lr_table_time_to_target_on_fixed_curves():
    curves = pd.DataFrame([
        {"lr_rule": "linear", "global_batch": 64, "workers": 1, "epoch": e, "step": 10 * e, "time(s)": 2.0 * e,
         "eval/acc": acc, "eval/loss": 1.0} for e, acc in [(1, 0.5), (2, 0.85), (3, 0.92), (4, 0.91)]])
    t = lr_table(curves, 0.9)
    row = t.iloc[0]
    assert row["final_acc"] == 0.91 and row["best_acc"] == 0.92
    assert row["time_to_90%(s)"] == 6.0 and row["epochs_to_90%"] == 3
    assert row["n"] == 1 and math.isnan(row["final_acc_ci_low"])  # one seed: no interval
    never = lr_table(curves, 0.95).iloc[0]
    assert math.isnan(never["time_to_95%(s)"])


def test_seeds_give_accuracy_and_time_to_accuracy_their_interval():
    """Three seeds of one cell: the median over seeds, the range as the interval (n < 6); a seed that never
    reaches the target leaves time-to-target unreached rather than a flattering median of the others."""
    def curve(seed, accs):
        return [{"lr_rule": "linear", "global_batch": 64, "workers": 1, "seed": seed, "epoch": e, "step": 10 * e,
                 "time(s)": 2.0 * e, "eval/acc": a, "eval/loss": 1.0} for e, a in enumerate(accs, 1)]
    rows = curve(0, [0.5, 0.91, 0.93]) + curve(1, [0.6, 0.8, 0.92]) + curve(2, [0.95, 0.96, 0.97])
    row = lr_table(pd.DataFrame(rows), 0.9).iloc[0]
    assert (row["n"], row["final_acc"], row["final_acc_ci_low"], row["final_acc_ci_high"]) == (3, 0.93, 0.92, 0.97)
    assert (row["time_to_90%(s)"], row["time_to_90%_ci_low(s)"], row["time_to_90%_ci_high(s)"]) == (4.0, 2.0, 6.0)
    slow = lr_table(pd.DataFrame(curve(0, [0.5, 0.91]) + curve(1, [0.5, 0.6])), 0.9).iloc[0]
    assert math.isnan(slow["time_to_90%(s)"]) and slow["seeds_reaching"] == 1


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
