"""A prediction's 95 % and 50 % intervals (docs/model.md, "Prediction intervals"): the sampling part from the
calibration's replicas (`uncertainty`), the model-error part from its in-calibration residuals (`modelerror`),
added in quadrature in log step (`modelerror.combine`)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from scalelab.perf.calibration import Calibration
from scalelab.perf.modelerror import combine, error_term


def step_quantiles(cal: Calibration, steps: Callable[[Calibration], Sequence[float]],
                   rows: int) -> list[tuple[float, float, float, float]]:
    """Per row, the 2.5, 25, 75 and 97.5 percentiles of `steps(replica)` over the calibration's replicas
    (`perf/uncertainty.py`): the sampling part of the 95 % and 50 % intervals; NaN without replicas."""
    values = np.array([steps(r) for r in cal.replicas()], float).reshape(-1, rows)
    if len(values) < 2:
        return [(math.nan,) * 4] * rows
    return [tuple(q) for q in np.nanpercentile(values, [2.5, 25, 75, 97.5], axis=0).T.tolist()]


def intervals(cal: Calibration, points: Sequence[float],
              quantiles: Sequence[tuple[float, float, float, float]]) -> dict[str, list[float]]:
    """Per point, its 95 % (low, high) and 50 % (low50, high50) intervals and the 95 % half-widths of their
    sampling and model-error parts (`modelerror.combine`, the calibration's `error_term`)."""
    term = error_term(cal)
    out: dict[str, list[float]] = {k: [] for k in ("low", "high", "low50", "high50", "sampling_half_width(%)",
                                                   "model_half_width(%)")}
    for point, q in zip(points, quantiles):
        c = combine(point, q, term)
        for k, v in zip(("low", "high", "low50", "high50"), (*c[0.95], *c[0.5])):
            out[k].append(v)
        out["sampling_half_width(%)"].append(c["sampling_half_width(%)"])
        out["model_half_width(%)"].append(c["model_half_width(%)"])
    return out
