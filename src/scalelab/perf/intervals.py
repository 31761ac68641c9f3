"""A prediction's 95 % and 50 % intervals (docs/model.md, "Prediction intervals"): the sampling part from the
calibration's replicas (`uncertainty`), the model-error part from its in-calibration residuals (`modelerror`),
added in quadrature in log step around the point with its strategy's calibration bias (`modelerror.combine`)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from scalelab.perf.calibration import Calibration
from scalelab.perf.links import NodeLink
from scalelab.perf.modelerror import combine, error_term
from scalelab.perf.sharedhost import step_term


def step_quantiles(cal: Calibration, steps: Callable[[Calibration], Sequence[float]],
                   rows: int, replicas: Sequence[Calibration] | None = None) -> list[tuple[float, float, float, float]]:
    """Per row, the 2.5, 25, 75 and 97.5 percentiles of `steps(replica)` over the calibration's replicas
    (`perf/uncertainty.py`; `replicas`: those, made once by a caller that asks many times): the sampling part of
    the 95 % and 50 % intervals; NaN without replicas."""
    values = np.array([steps(r) for r in (cal.replicas() if replicas is None else replicas)], float).reshape(-1, rows)
    if len(values) < 2:
        return [(math.nan,) * 4] * rows
    return [tuple(q) for q in np.nanpercentile(values, [2.5, 25, 75, 97.5], axis=0).T.tolist()]


def intervals(cal: Calibration, points: Sequence[float], quantiles: Sequence[tuple[float, float, float, float]], *,
              strategy: str | None = None, link: NodeLink | None = None, launches: int = 1,
              in_flight: bool = False, bias: bool = True,
              step: Sequence[bool] | None = None) -> dict[str, list[float]]:
    """Per point of `strategy` (several collectives `in_flight`: `modelerror.concurrent`) over `link` (None: the
    calibrated one), whose target is the median of `launches` launches: the point with the strategy's calibration
    bias (`point`; `bias` False: none, for hardware the calibration did not measure), its 95 % (low, high) and 50 %
    (low50, high50) intervals, the bias and the 95 % half-widths of their sampling and model-error parts
    (`modelerror.combine`, `modelerror.error_term`). `step`: per point, whether it takes the step to more nodes
    sharing this host (`sharedhost.applies`), whose error term is `sharedhost.step_term`'s."""
    term = error_term(cal, strategy, link, launches, in_flight)
    if not bias:
        term = dataclasses.replace(term, bias=0.0)
    names = ("point", "low", "high", "low50", "high50", "bias(%)", "sampling_half_width(%)", "model_half_width(%)")
    out: dict[str, list[float]] = {k: [] for k in names}
    for point, q, shared in zip(points, quantiles, step if step is not None else [False] * len(points)):
        c = combine(point, q, step_term(term) if shared else term)
        for k, v in zip(names, (c["point"], *c[0.95], *c[0.5], c["bias(%)"], c["sampling_half_width(%)"],
                                c["model_half_width(%)"])):
            out[k].append(v)
    return out


def efficiency_interval(ideal: float, step: float, low: float, high: float) -> tuple[float, float, float]:
    """(efficiency, its 95 % low, high) of a predicted step of n ranks with its 95 % interval (low, high), against
    the `ideal` step: the per-rank batch at one lone rank's throughput (the one-worker step in weak scaling, it
    over n in strong), so efficiency = ideal / step and speedup = n · efficiency (docs/definitions.md).

    Each of n ranks does at least a lone rank's work for its samples and a step holds its compute, so the true
    efficiency is at most 1 (speedup at most n): physics, and the one bound applied here. The step's interval is
    log-normal around the point (`modelerror.combine`) and knows no such floor; with a wide model-error term (few
    residuals) its low end falls below the ideal and, divided into it, gave an efficiency interval of 66–143 %
    (issue 61). The efficiency's interval is the step's inverted, (ideal / high, ideal / low), cut at 1: an
    interval cut to the values its quantity can take keeps its coverage. The step's own interval is not cut at the
    ideal: that is a point estimate whose own uncertainty the step's interval carries (in the ratio it cancels).
    NaN ends stay NaN."""
    def ratio(s: float) -> float:
        return min(1.0, ideal / s) if math.isfinite(s) and s > 0 and math.isfinite(ideal) else math.nan

    return ratio(step), ratio(high), ratio(low)
