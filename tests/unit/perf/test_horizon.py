"""The prediction horizon on exact numbers: a one-host loopback calibration is never predicted past the host's
cores, and beyond 8x the largest measured scale a prediction is marked as extrapolation and carries no
recommendation."""
from __future__ import annotations

import os

import pandas as pd

from scalelab.experiments.predict import caveat, predict_result
from scalelab.perf.hardware import PRESETS
from scalelab.perf.horizon import HORIZON, extrapolated, host_cores, measured_scale, reach
from scalelab.perf.prediction import prediction_result
from scalelab.perf.validation import VALIDATION_COLUMNS

from test_prediction import synthetic_calibration  # tests/unit/perf is on the path (rootdir conftest)

WORKERS = [1, 2, 4, 8, 16, 64, 4096]
LOOPBACK = "measured (gloo loopback, this machine)"
TEN_GBE = "compute of this machine on 10 GbE, one rank per node"


def test_the_horizon_in_numbers():
    assert HORIZON == 8
    assert measured_scale(2) == 2 and measured_scale(2, [2, 4]) == 4 and measured_scale(0) == 1
    assert not extrapolated(16, 2) and extrapolated(17, 2)
    assert host_cores("16-core CPU", here=False) == 16
    assert host_cores("NVIDIA A100-SXM4-80GB", here=False) is None  # a GPU host measured elsewhere: unknown
    assert host_cores("", here=True) == os.cpu_count()
    assert reach(WORKERS, 2) == 16 and reach(WORKERS, 2, cores=4) == 4 and reach([64, 4096], 2) is None


def result(presets=("10gbe",), **changes):
    cal = synthetic_calibration(**{"device": "4-core CPU", **changes})
    return prediction_result(cal, [cal.hardware(), *(PRESETS[p] for p in presets)], workers=WORKERS, mode="weak", batch=32,
                             strategy="ddp", bucket_mb=25, compression="none", target=0.5,
                             validation=pd.DataFrame(columns=VALIDATION_COLUMNS), skipped=None, calibration="c.json")


def test_a_loopback_calibration_stops_at_the_host_cores_and_marks_extrapolation():
    r = result()  # calibrated on 2 ranks over a 4-core host's loopback
    t = r.tables["prediction"]
    assert list(t.loc[t["hardware"] == LOOPBACK, "workers"]) == [1, 2, 4]
    assert list(t.loc[t["hardware"] == TEN_GBE, "workers"]) == WORKERS
    assert list(t.loc[t["extrapolation"], "workers"]) == [64, 4096]  # beyond 8 x 2
    # what keeps the target is asked inside the horizon: 4 workers (the cores) and 16 (8 x 2), never 4096
    assert dict(zip(r.tables["options"]["hardware"], r.tables["options"]["workers"])) == {LOOPBACK: 4, TEN_GBE: 16}
    lines, rec = predict_result(r)
    assert "Predictions beyond 16 workers (8× the largest measured scale, 2 workers) are extrapolation." in lines
    assert (f"{LOOPBACK} is not predicted beyond 4 workers: its calibration ran over one host's loopback, which "
            "says nothing about more ranks than that host's 4 cores.") in lines
    assert any(line.startswith(f"{TEN_GBE}: predicted efficiency") and "at 16 workers" in line
               and "Extrapolated from 64 workers (beyond 16 workers" in line
               and "at 4096 workers: an extrapolation." in line for line in lines)
    # no refits, so no interval: nothing can be told better than the default, which is kept (perf/choice.py)
    assert rec.startswith(f"For larger clusters ({LOOPBACK}): keep the default, ddp with per-rank batch 32 (") and \
        "on 4 workers" in rec and rec.endswith("no option can be told better. Caveat: the model's prediction for "
                                               "more workers than the 2 measured here.")
    assert "4096" not in rec
    # a preset is never checked against a measurement here: its card says so
    assert caveat(TEN_GBE, {"own": LOOPBACK, "scale": 2}) == (
        f"{TEN_GBE}: a hardware preset, not checked against a measurement; the model's prediction for more workers "
        "than the 2 measured here")


def test_no_larger_cluster_inside_the_horizon_recommends_nothing():
    r = result(presets=(), device="2-core CPU")  # the loopback rows end at the 2 measured workers
    assert list(r.tables["prediction"]["workers"]) == [1, 2]
    lines, rec = predict_result(r)
    assert rec is None
    assert lines[-1] == ("No recommendation for larger clusters: no worker count above the measured 2 is inside the "
                         "horizon here.")


def test_namespace_nodes_are_not_capped_at_the_cores():
    t = result(nodes=2).tables["prediction"]  # a calibration across namespace nodes is not one host's loopback
    own = t["hardware"].iloc[0]
    assert list(t.loc[t["hardware"] == own, "workers"]) == WORKERS


def test_a_communication_share_above_the_residual_runs_is_extrapolation_too():
    """Residual runs whose exposed communication was at most 1 % of the step: the calibrated hardware's rows with
    more (2 and 4 workers of a 4 x 4 MB gradient) are marked, the one-worker row (compute only) is not."""
    rows = [{"check": "leave batch out", "link": "loopback", "sync": "allreduce", "per_rank_batch": b, "residual": r,
             "comm_share": 0.01} for b, r in ((16, 0.1), (32, -0.1))]
    t = result(presets=(), residuals=rows).tables["prediction"]
    shares = t["exposed_comm(ms)"] / t["step(ms)"]
    assert list(t["extrapolation"]) == [bool(s > 0.01) for s in shares] == [False, True, True]
