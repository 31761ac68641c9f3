"""The model-error term (perf/modelerror.py) against known truths: residuals of a known normal spread give its
quantile, residuals ±0.1 give t·0.1 exactly, a leave-one-batch-out residual computable by hand, a link whose
in-calibration runs miss beyond the bound is refused (and one that does not is not), and the shares seen mark
extrapolation."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t

from scalelab.perf.fit import BenchTimes, Measured, fit
from scalelab.perf.hardware import cost_terms
from scalelab.perf.horizon import unseen_share
from scalelab.perf.links import NodeLink
from scalelab.perf.modelerror import (LEAVE_BATCH_OUT, OTHER_LINK, ErrorTerm, combine, describe, error_term, refusal,
                                      residuals, seen_shares)
from scalelab.perf.runmodel import predict_run

from test_prediction import synthetic_calibration


def test_residuals_of_a_known_normal_spread_give_its_quantiles():
    """2000 residuals from N(0, 0.05²): the 95 % half-width is 1.96 × 0.05 and the 50 % one 0.674 × 0.05 (within
    3 %), and new draws from the same law fall inside them 95 % and 50 % of the time."""
    rng = np.random.default_rng(0)
    term = ErrorTerm(tuple(rng.normal(0.0, 0.05, 2000)))
    assert term.half(0.95) == pytest.approx(1.95996 * 0.05, rel=0.03)
    assert term.half(0.5) == pytest.approx(0.67449 * 0.05, rel=0.03)
    new = rng.normal(0.0, 0.05, 20_000)
    assert np.mean(np.abs(new) <= term.half(0.95)) == pytest.approx(0.95, abs=0.01)
    assert np.mean(np.abs(new) <= term.half(0.5)) == pytest.approx(0.50, abs=0.02)
    assert term.normality_p > 0.05


def test_few_residuals_widen_by_student_t_and_a_bias_counts_as_error():
    term = ErrorTerm((0.1, -0.1, 0.1, -0.1))
    assert term.sigma == pytest.approx(0.1)
    assert term.half(0.95) == pytest.approx(t.ppf(0.975, 4) * 0.1)  # 2.776 × σ, not 1.96 ×
    assert ErrorTerm((0.1, 0.1, 0.1)).sigma == pytest.approx(0.1)  # all alike: a bias of 10 %, not a spread of 0
    assert math.isnan(ErrorTerm((0.1,)).half(0.95))  # one residual estimates nothing


def test_normality_is_tested_on_the_residuals():
    skewed = ErrorTerm(tuple(np.random.default_rng(1).exponential(0.05, 40)))
    assert skewed.normality_p < 0.01
    assert "REJECTED" in describe(synthetic_calibration(residuals=[
        {"check": LEAVE_BATCH_OUT, "link": "loopback", "residual": r, "comm_share": 0.2} for r in skewed.residuals]))


def test_combine_adds_the_parts_in_quadrature_in_log_step():
    term = ErrorTerm((0.1, -0.1, 0.1, -0.1))
    s = math.log(1.1 / 0.9) / 2
    out = combine(10.0, (9.0, 9.5, 10.5, 11.0), term)
    h = math.hypot(s, t.ppf(0.975, 4) * 0.1)
    assert out[0.95] == pytest.approx((10 * math.exp(-h), 10 * math.exp(h)))
    assert out["model_half_width(%)"] == pytest.approx(100 * math.sinh(t.ppf(0.975, 4) * 0.1))
    assert all(math.isnan(v) for v in combine(10.0, (math.nan,) * 4, term)[0.95])


def launch(run_id: str, b: int, sync: str, stages: tuple[float, float, float], step: float) -> dict:
    return {"run_id": run_id, "config": {"model": "m", "dataset": "d", "global_batch": 2 * b, "ranks": 2, "sync": sync},
            "summary": {"stage/forward(ms)": stages[0], "stage/backward(ms)": stages[1],
                        "stage/optimizer(ms)": stages[2], "time/step_median(ms)": step}}


def test_leave_one_batch_out_residuals_by_hand():
    """Compute c(b) = 0.3 b + 1.5 ms, an exact bench (α = 10 µs, β = 1 ns/B), allreduce runs measured at the
    model's step at batch 16 and 10 % over it at batch 32. Left out, batch 32 is predicted by the fit on batch 16
    (scale 1): r = ln 1.1. Batch 16 is predicted with the scale k that batch 32 needs, c(32) + k·comm = 1.1·P(32)."""
    template = synthetic_calibration(param_bytes=[1_000_000] * 4, compute={}, points=[])
    sizes = [1024.0 * 4**i for i in range(6)]
    a, b_ = cost_terms("allreduce", 2, None)
    bench = BenchTimes(sizes, [1e-5 * a + 1e-9 * s * b_ for s in sizes], [[] for _ in sizes], 2)
    stages = {b: (0.1 * b, 0.2 * b, 1.0) for b in (16, 32)}
    compute = [[launch(f"c{b}", b, "noop", stages[b], 0.3 * b + 1.5)] for b in (16, 32)]
    exact = fit(template, Measured(compute=compute, insitu={}, bench=bench))
    step = {b: float(predict_run(exact, launch("x", b, "allreduce", stages[b], 0)["config"])["step(ms)"])
            for b in (16, 32)}
    comm = step[16] - (0.3 * 16 + 1.5)
    insitu = {"allreduce": [[launch("a16", 16, "allreduce", stages[16], step[16])],
                            [launch("a32", 32, "allreduce", stages[32], 1.1 * step[32])]]}
    measured = Measured(compute=compute, insitu=insitu, bench=bench)
    rows = {r["run_id"]: r for r in residuals(template, measured, fit(template, measured))}
    assert rows["a32"]["residual"] == pytest.approx(math.log(1.1), rel=1e-6)
    k = (1.1 * step[32] - (0.3 * 32 + 1.5)) / comm
    assert rows["a16"]["residual"] == pytest.approx(math.log(step[16] / (0.3 * 16 + 1.5 + k * comm)), rel=1e-5)
    assert {r["check"] for r in rows.values()} == {LEAVE_BATCH_OUT}
    assert rows["a16"]["comm_share"] == pytest.approx(
        (k * comm) / (0.3 * 16 + 1.5 + k * comm), rel=1e-5)  # no overlap for blocking allreduce


def rows(lobo, other, share=0.3):
    return ([{"check": LEAVE_BATCH_OUT, "link": "a 1 Gbit/s link (tbf)", "residual": r, "comm_share": share}
             for r in lobo] + [{"check": OTHER_LINK, "link": "an unshaped link", "residual": r, "comm_share": 0.1}
                               for r in other])


def test_a_link_whose_own_runs_miss_beyond_the_bound_is_refused_and_left_out():
    lobo = [0.02, -0.02, 0.03, -0.01]
    bound = ErrorTerm(tuple(lobo)).half(0.95)
    missed = synthetic_calibration(residuals=rows(lobo, [0.5, 0.45, 0.55]))  # measured 65 % slower
    line = refusal(missed, NodeLink(True, None))
    assert line.startswith("refused over an unshaped link") and "\n" not in line
    assert f"{100 * (math.exp(-0.5) - 1):+.0f} % off" in line and f"{100 * (math.exp(-bound) - 1):+.0f} % that" in line
    assert refusal(missed, NodeLink(True, 0.5)) is None  # a shaped link has no such check: not refused
    assert error_term(missed).n == 4 and seen_shares(missed) == (0.3, 0.3)
    held = synthetic_calibration(residuals=rows(lobo, [bound * 0.9] * 3))
    assert refusal(held, NodeLink(True, None)) is None
    assert error_term(held).n == 7 and seen_shares(held) == (0.1, 0.3)


def test_a_share_outside_the_seen_range_is_extrapolation():
    assert not unseen_share(0.2, (0.1, 0.3)) and unseen_share(0.5, (0.1, 0.3))
    assert not unseen_share(0.0, (0.1, 0.3))  # less communication than checked (one worker): not extrapolation
    assert not unseen_share(0.9, None)  # nothing seen: no interval to qualify


def test_validation_refuses_a_refused_link_without_an_interval():
    from scalelab.perf.validation import validate_measured

    cal = synthetic_calibration(nodes=2, link_gbps=1.0, host_alpha_s=1e-5, host_beta_s_per_byte=1e-9,
                                veth_alpha_s=1e-5, veth_beta_s_per_byte=1e-9,
                                residuals=rows([0.02, -0.02, 0.03, -0.01], [0.5, 0.45, 0.55]))
    cal.replicates = [{"compute": cal.compute}] * 3
    cfg = {"model": "m", "dataset": "d", "ranks": 1, "nnodes": 3, "local_nodes": 3, "global_batch": 60,
           "sync": "allreduce"}
    runs = [{"run_id": "u", "config": cfg, "summary": {"time/step_median(ms)": 10.0}},
            {"run_id": "s", "config": {**cfg, "link_gbps": 0.5}, "summary": {"time/step_median(ms)": 10.0}}]
    table = validate_measured(cal, runs, say=lambda _: None).set_index("run_id")
    assert table.loc["u", "refused"].startswith("refused over an unshaped link") and table.loc["u", "inside"] is None
    assert pd.isna(table.loc["s", "refused"]) and table.loc["s", "inside"] in (True, False)
    assert table.loc["s", "model_half_width(%)"] == pytest.approx(100 * math.sinh(error_term(cal).half(0.95)))
