"""Recommendations among predictions (perf/choice.py): the default is kept unless another option reaches the
target and is better beyond both 95 % intervals (widened for the family) by a material effect."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from scalelab.perf.choice import recommendation
from scalelab.perf.hardware import PRESETS
from scalelab.perf.prediction import options_for_efficiency

from test_prediction import synthetic_calibration


def options(*rows) -> pd.DataFrame:
    """(strategy, per-rank batch, efficiency, low, high) rows; meets_target at 0.5."""
    return pd.DataFrame([{"strategy": s, "per_rank_batch": b, "efficiency": e, "efficiency_ci_low": lo,
                          "efficiency_ci_high": hi, "meets_target": e >= 0.5} for s, b, e, lo, hi in rows])


def test_equal_options_keep_the_default():
    """bucketed and ddp at the same 0.5752 (the issue's tie): the first of equals is no longer taken."""
    table = options(("bucketed", 32, 0.5752, 0.52, 0.63), ("ddp", 32, 0.5752, 0.52, 0.63))
    text = recommendation(table, 16, 0.5, strategy="ddp", batch=32)
    assert text.startswith("the default, ddp with per-rank batch 32, keeps efficiency 58 % (95 %: 52–63 %)")


def test_a_better_option_beyond_both_intervals_is_recommended_and_one_within_them_is_not():
    apart = options(("ddp", 32, 0.30, 0.28, 0.32), ("ddp", 64, 0.60, 0.57, 0.63), ("bucketed", 64, 0.62, 0.58, 0.66))
    text = recommendation(apart, 16, 0.5, strategy="ddp", batch=32)
    # at batch 64 the default strategy passes too: the strategy is not changed
    assert text.startswith("ddp with per-rank batch 64 keeps efficiency 60 % (95 %: 57–63 %) (>= 50%) on 16 workers")
    assert "against efficiency 30 % (95 %: 28–32 %) for the default" in text and "widened for 2 alternatives" in text
    close = options(("ddp", 32, 0.45, 0.30, 0.60), ("ddp", 64, 0.55, 0.50, 0.70))
    kept = recommendation(close, 16, 0.5, strategy="ddp", batch=32)
    assert kept.startswith("keep the default, ddp with per-rank batch 32 (efficiency 45 %")
    assert "the 1 option(s) that reach it are not better beyond the 95 % intervals" in kept
    # widening: 0.40–0.50 and 0.51–0.61 are apart alone, not once each is widened ×1.22 for 3 alternatives
    family = options(("ddp", 32, 0.45, 0.40, 0.50), ("ddp", 64, 0.56, 0.51, 0.61),
                     ("ddp", 128, 0.2, 0.1, 0.3), ("ddp", 256, 0.2, 0.1, 0.3))
    assert recommendation(family.iloc[:2], 16, 0.5, strategy="ddp", batch=32).startswith("ddp with per-rank batch 64")
    assert recommendation(family, 16, 0.5, strategy="ddp", batch=32).startswith("keep the default")


def test_options_carry_an_efficiency_interval_from_the_step_interval():
    """Replicas ×0.8..×1.2 on compute, residuals of mean 0: each option's efficiency interval is the inverse of its
    step's (the one-worker baseline held at its point); without replicas there is none."""
    residuals = [{"check": "leave batch out", "link": "loopback", "sync": s, "per_rank_batch": float(b),
                  "residual": r, "comm_share": 0.0} for s in ("ddp", "allreduce") for b, r in
                 enumerate([0.05, -0.05, 0.05, -0.05])]
    cal = synthetic_calibration(residuals=residuals)
    cal.replicates = [{"compute": {s: [c0 * f, c1 * f] for s, (c0, c1) in cal.compute.items()}}
                      for f in np.linspace(0.8, 1.2, 21)]
    table = options_for_efficiency(cal, PRESETS["10gbe"], 16, per_rank_batches=[8, 64], strategies=["ddp"])
    for row in table.to_dict("records"):
        assert row["efficiency_ci_low"] < row["efficiency"] < row["efficiency_ci_high"]
    cal.replicates = []
    bare = options_for_efficiency(cal, PRESETS["10gbe"], 16, per_rank_batches=[8, 64], strategies=["ddp"])
    assert bare["efficiency_ci_low"].isna().all() and all(not math.isnan(e) for e in bare["efficiency"])
    target = float(bare["efficiency"].mean())  # batch 64 reaches it, batch 8 does not
    bare = options_for_efficiency(cal, PRESETS["10gbe"], 16, per_rank_batches=[8, 64], strategies=["ddp"],
                                  target=target)
    assert recommendation(bare, 16, target, strategy="ddp", batch=8).endswith("no option can be told better")


def test_a_default_that_was_not_predicted_recommends_nothing():
    table = options(("ddp", 64, 0.6, 0.5, 0.7))
    assert "was not predicted; nothing is recommended" in recommendation(table, 8, 0.5, strategy="ddp", batch=32)
