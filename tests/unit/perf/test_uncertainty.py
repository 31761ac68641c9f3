"""Prediction intervals (perf/uncertainty.py) against known truths: resampling identical steps changes nothing, a
replicate's compute ×k moves the predicted step by ×k, the interval is the replicas' 2.5-97.5 percentiles, and the
validation says in-sample or held out and whether the measured step lies inside."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from scalelab.analysis import keys
from scalelab.perf import uncertainty
from scalelab.perf.fit import BenchTimes
from scalelab.perf.intervals import step_quantiles
from scalelab.perf.prediction import predict_table
from scalelab.perf.validation import sample_of, validate_measured

from test_prediction import synthetic_calibration


class Files:
    """A run's files with fixed step records (what `resampled_run` reads)."""

    def __init__(self, walls_s, forward_s):
        self.records = [{"rank": 0, "step": i, "warmup": False, "samples": 8, "wall(s)": w, "eval(s)": 0.0,
                         "forward(s)": f, "backward(s)": 2 * f, "optimizer(s)": 0.001, "data(s)": 0.0}
                        for i, (w, f) in enumerate(zip(walls_s, forward_s))]

    def read_steps(self):
        return self.records


def launch(run_id, walls_s, forward_s):
    return {"run_id": run_id, "config": {}, "summary": {"x": 1}, "files": Files(walls_s, forward_s)}


def test_identical_steps_resample_to_the_same_summary():
    runs = [launch("a", [0.010] * 20, [0.002] * 20), launch("b", [0.010] * 20, [0.002] * 20)]
    drawn = uncertainty.resampled_run(runs, np.random.default_rng(0), {})
    assert drawn["summary"][keys.STEP_MEDIAN_MS] == pytest.approx(10.0)
    assert drawn["summary"][keys.stage_ms("forward")] == pytest.approx(2.0)
    assert drawn["summary"][keys.stage_ms("backward")] == pytest.approx(4.0)
    assert drawn["summary"]["x"] == 1  # the rest of the summary is kept


def test_resampled_medians_spread_like_the_steps():
    """Two launches of different speeds: drawn medians range between them, never outside."""
    runs = [launch("a", [0.010] * 15, [0.002] * 15), launch("b", [0.020] * 15, [0.004] * 15)]
    rng, cache = np.random.default_rng(1), {}
    medians = {uncertainty.resampled_run(runs, rng, cache)["summary"][keys.STEP_MEDIAN_MS] for _ in range(60)}
    assert min(medians) == pytest.approx(10.0) and max(medians) == pytest.approx(20.0)


def test_a_resampled_bench_keeps_the_loop_mean_scaled_by_the_drawn_iterations():
    bench = BenchTimes([1024.0, 4096.0], [1e-3, 2e-3], [[1e-3] * 10, [1e-3, 3e-3] * 5], 2)
    drawn = uncertainty.resampled_bench(bench, np.random.default_rng(2))
    assert drawn.means[0] == pytest.approx(1e-3)  # identical iterations: unchanged
    assert 1e-3 <= drawn.means[1] <= 3e-3 and drawn.sizes == bench.sizes


def residual_rows(values, share=0.0):
    """allreduce residuals, one launch per cell (each at its own batch)."""
    return [{"check": "leave batch out", "link": "loopback", "sync": "allreduce", "per_rank_batch": float(b),
             "residual": r, "comm_share": share} for b, r in enumerate(values)]


def test_the_interval_is_the_replicas_percentiles_and_the_model_error_in_quadrature():
    """Replicas whose compute is ×0.8 ... ×1.2 the point's, no communication (1 worker): the sampling part is the
    2.5 and 97.5 (25 and 75) percentiles of those steps; residuals ±0.1 of one strategy (mean 0: no bias moved,
    one launch per cell) give σ² = s² = 0.04/4 over 4 d.f., the model-error part t(0.975, 4)·σ = 0.27764 (t(0.75,
    4)·σ = 0.07407) in log step; the two add in quadrature, by hand."""
    cal = synthetic_calibration(residuals=residual_rows([0.1, -0.1, 0.1, -0.1]))
    factors = np.linspace(0.8, 1.2, 41)
    cal.replicates = [{"compute": {s: [c0 * f, c1 * f] for s, (c0, c1) in cal.compute.items()}} for f in factors]
    table = predict_table(cal, cal.hardware(), [1], mode="weak", batch=10, strategy="allreduce")
    step = table["step(ms)"].iloc[0]
    q025, q25, q75, q975 = np.percentile(step * factors, [2.5, 25, 75, 97.5])
    s95, s50 = np.log(q975 / q025) / 2, np.log(q75 / q25) / 2
    sigma = np.sqrt(0.04 / 4)
    m95, m50 = 2.776445105 * sigma, 0.7406971100 * sigma
    h95, h50 = np.hypot(s95, m95), np.hypot(s50, m50)
    assert table["step_ci_low(ms)"].iloc[0] == pytest.approx(step * np.exp(-h95), rel=1e-5)
    assert table["step_ci_high(ms)"].iloc[0] == pytest.approx(step * np.exp(h95), rel=1e-5)
    assert table["step_ci50_low(ms)"].iloc[0] == pytest.approx(step * np.exp(-h50), rel=1e-4)
    assert table["sampling_half_width(%)"].iloc[0] == pytest.approx(100 * np.sinh(s95))
    assert table["model_half_width(%)"].iloc[0] == pytest.approx(100 * np.sinh(m95), rel=1e-6)
    assert table["checked"].iloc[0] == "calibrated here"
    no_replicates = predict_table(dataclasses.replace(cal, replicates=[]), cal.hardware(), [1], batch=10)
    assert no_replicates["step_ci_low(ms)"].isna().all()  # never a made-up interval
    no_residuals = predict_table(dataclasses.replace(cal, residuals=[]), cal.hardware(), [1], batch=10)
    assert no_residuals["step_ci_low(ms)"].isna().all()  # the sampling part alone is not a 95 % interval
    assert no_residuals["sampling_half_width(%)"].iloc[0] == pytest.approx(100 * np.sinh(s95))
    assert step_quantiles(cal, lambda c: [1.0, 2.0], 2)[0] == (1.0, 1.0, 1.0, 1.0)


def test_validation_labels_the_sample_and_says_whether_the_measured_step_is_inside():
    cal = synthetic_calibration(batches=[16.0, 64.0], residuals=residual_rows([0.01, -0.01, 0.02]))
    cal.replicates = [{"compute": {s: [c0 * f, c1 * f] for s, (c0, c1) in cal.compute.items()}}
                      for f in np.linspace(0.9, 1.1, 21)]
    base = {"model": "m", "dataset": "d", "ranks": 2, "sync": "allreduce", "bucket_mb": 25.0}
    runs = []
    for batch, measured in ((16, 1e6), (32, None)):
        cfg = {**base, "global_batch": 2 * batch}
        predicted = validate_measured(cal, [{"run_id": "p", "config": cfg, "summary": {keys.STEP_MEDIAN_MS: 1.0}}],
                                      say=lambda _: None)["predicted"].iloc[0]
        runs.append({"run_id": f"b{batch}", "config": cfg,
                     "summary": {keys.STEP_MEDIAN_MS: measured or predicted}})
    table = validate_measured(cal, runs, say=lambda _: None).set_index("run_id")
    assert table.loc["b16", "sample"] == "in-sample" and not table.loc["b16", "inside"]
    assert table.loc["b32", "sample"] == "held out: batch" and table.loc["b32", "inside"]
    assert table.loc["b32", "half_width(%)"] > 0 and table.loc["b32", "inside50"]
    assert table.loc["b32", "model_half_width(%)"] > 0 and table.loc["b32", "sampling_half_width(%)"] > 0


def test_sample_names_what_differs_from_the_calibration():
    cal = synthetic_calibration(batches=[16.0, 32.0], nodes=2, link_gbps=1.0, compute_nodes=3)
    run = {"ranks": 1, "nnodes": 3, "local_nodes": 3, "link_gbps": 0.5, "global_batch": 72}
    assert sample_of(cal, run) == "held out: nodes, link, batch; compute in-sample"
    assert sample_of(cal, {**run, "nnodes": 2, "local_nodes": 2, "link_gbps": 1.0, "global_batch": 32}) == "in-sample"
    unshaped = {**run, "link_gbps": None}
    assert sample_of(cal, unshaped) == "held out: nodes, link, batch; compute in-sample"  # no unshaped bench
    measured = dataclasses.replace(cal, veth_alpha_s=1e-4, veth_beta_s_per_byte=1e-8)
    assert sample_of(measured, unshaped) == "held out: nodes, batch; compute in-sample"
