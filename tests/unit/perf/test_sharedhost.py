"""The step to more namespace nodes sharing this host (perf/sharedhost.py): its figures from the development runs,
where it applies, its error term on exact inputs, and a prediction table's rows that take it."""
from __future__ import annotations

import math
import statistics

import pytest

from scalelab.perf import sharedhost
from scalelab.perf.modelerror import NONE, ErrorTerm
from scalelab.perf.prediction import predict_table, shared_step_text

from test_prediction import synthetic_calibration


def two_nodes(**changes):
    """A calibration over 2 namespace nodes of a 2-core host, one rank each, with 6 leave-one-batch-out residuals
    of allreduce around 0 (no bias moved): s = 5 % on 6 d.f."""
    residuals = [{"check": "leave batch out", "link": "0.5 Gbit/s", "sync": "allreduce", "per_rank_batch": float(b),
                  "residual": r, "comm_share": 0.5} for b, r in enumerate([0.05, -0.05] * 3)]
    return synthetic_calibration(**{"nodes": 2, "device": "2-core CPU", "residuals": residuals, **changes})


def test_the_rule_is_the_development_runs_mean_offset_and_its_spread():
    logs = [-math.log1p(e / 100) for _, e in sharedhost.DEVELOPMENT]
    assert len(logs) == 12 and sharedhost.BIAS == pytest.approx(statistics.mean(logs))
    assert sharedhost.BIAS == pytest.approx(0.02155, abs=1e-5)  # +2.2 %: the step under-predicts
    assert sharedhost.TAU == pytest.approx(0.03297, abs=1e-5) and sharedhost.BIAS_SE == pytest.approx(0.03297 / 12**0.5,
                                                                                                   abs=1e-5)


def test_it_applies_only_to_the_step_into_a_shared_hosts_cores():
    cal = two_nodes()
    assert sharedhost.applies(cal, 3, 3) and sharedhost.applies(cal, 4, 4)
    assert not sharedhost.applies(cal, 2, 2)  # the calibrated count
    assert not sharedhost.applies(two_nodes(device="16-core CPU"), 4, 4)  # cores to spare: no development run
    assert not sharedhost.applies(two_nodes(nodes_launcher="slurm"), 4, 4)  # machines of their own
    assert not sharedhost.applies(two_nodes(nodes=1), 4, 4)  # one host's loopback
    assert not sharedhost.applies(two_nodes(device="NVIDIA H200", host="elsewhere"), 4, 4)  # cores unknown


def test_the_step_term_on_exact_inputs():
    term = sharedhost.step_term(ErrorTerm(0.01, 0.068, 6, 6))
    pooled = (12 * 0.04**2 + 6 * 0.068**2) / 18
    assert term.bias == pytest.approx(0.01 + sharedhost.BIAS) and term.dof == 18 and term.n == 6
    assert term.sigma == pytest.approx(math.sqrt(pooled + sharedhost.TAU**2 + sharedhost.BIAS_SE**2))
    # the development calibration (s = 6.8 %, 6 d.f.): a narrower model-error half-width than t(6)·s
    assert term.half(0.95) < ErrorTerm(0.0, 0.068, 6, 6).half(0.95)
    # a noisy calibration stays wider than a quiet one, though narrower than its own σ̂ (a third of the weight)
    noisy = sharedhost.step_term(ErrorTerm(0.0, 0.20, 6, 6))
    assert noisy.sigma == pytest.approx(math.sqrt((12 * 0.0016 + 6 * 0.04) / 18 + sharedhost.TAU**2
                                                  + sharedhost.BIAS_SE**2)) and noisy.sigma > term.sigma
    # no residuals: no interval, the bias alone
    bare = sharedhost.step_term(NONE)
    assert bare.bias == sharedhost.BIAS and math.isnan(bare.sigma)


def test_prediction_rows_past_the_cores_take_the_step_and_the_calibration_line_says_so():
    cal = two_nodes()
    table = predict_table(cal, cal.hardware(), [1, 2, 3, 4], mode="weak", batch=32, strategy="allreduce")
    model = predict_table(cal, cal.hardware(), [1, 2, 3, 4], mode="weak", batch=32, strategy="allreduce")
    plain = two_nodes(device="16-core CPU")  # the same figures where the rule does not apply
    without = predict_table(plain, plain.hardware(), [1, 2, 3, 4], mode="weak", batch=32, strategy="allreduce")
    ratio = (table["step(ms)"] / without["step(ms)"]).tolist()
    assert ratio[:2] == [1.0, 1.0] and ratio[2:] == pytest.approx([math.exp(sharedhost.BIAS)] * 2)
    assert (model["step(ms)"] == table["step(ms)"]).all()
    assert "the step from 2 to 4 nodes sharing this host: bias +2.2 %" in shared_step_text(cal, table)
    assert shared_step_text(plain, without) == ""
