"""Mixed precision's sentences: accuracy is compared, and a precision recommended, only between runs that learned
(their loss fell); a faster precision whose runs stayed at chance is said to be faster, nothing more."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.experiments.amp import precision


def table(acc_fp32: float, acc_bf16: float) -> pd.DataFrame:
    row = {"quality": "ok", keys.STEP_MEDIAN_MS: 0.0, keys.STEP_MEDIAN_CI_LOW_MS: 0.0, keys.STEP_MEDIAN_CI_HIGH_MS: 0.0}
    return pd.DataFrame([
        {**row, "precision": "fp32", keys.EVAL_ACC: acc_fp32, keys.THROUGHPUT: 100.0, keys.STEP_MEDIAN_MS: 4.5,
         keys.STEP_MEDIAN_CI_LOW_MS: 4.4, keys.STEP_MEDIAN_CI_HIGH_MS: 4.6},
        {**row, "precision": "bf16", keys.EVAL_ACC: acc_bf16, keys.THROUGHPUT: 118.0, keys.STEP_MEDIAN_MS: 3.9,
         keys.STEP_MEDIAN_CI_LOW_MS: 3.8, keys.STEP_MEDIAN_CI_HIGH_MS: 4.0}])


def curves(end: float) -> pd.DataFrame:
    """Loss from 2.31 (chance for 10 classes: ln 10 = 2.30) falling linearly to `end` over 40 steps."""
    return pd.DataFrame([{"precision": p, "step": s, "loss": 2.31 + (end - 2.31) * (s - 1) / 39}
                         for p in ("fp32", "bf16") for s in range(1, 41)])


def test_runs_that_did_not_learn_give_no_recommendation():
    lines, rec = precision(table(0.109, 0.102), curves(end=2.29))  # the default study's 40 steps: at chance
    assert rec is None
    assert any("Accuracy is not compared: the fp32 run did not learn" in line for line in lines)


def test_runs_that_learned_are_compared():
    lines, rec = precision(table(0.91, 0.905), curves(end=0.4))
    assert rec is not None and rec.startswith("Train in bf16") and "with accuracy within 1 point" in rec
    lines, rec = precision(table(0.91, 0.85), curves(end=0.4))  # faster, but 6 points less accurate
    assert rec.startswith("Keep fp32")
