"""How precisely a run measured its step time (pure): the half-width of the median step's 95 % interval relative
to the median, and, for runs whose length was chosen for a target precision (`steps: auto`), whether they got there.

The half-width is the wider side of the interval (scalelab.analysis.intervals.median_interval, which can be
asymmetric): |interval - median| <= half-width x median on both sides. The loop's stop rule (scalelab.train.length)
and the summary use this same function on the same numbers (the slowest rank's wall time of each timed step).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.intervals import median_interval

NOT_REACHED = "precision not reached"  # the quality reason tables show for a run that stopped short of its target


def relative_half_width(walls: Sequence[float]) -> float:
    """The wider side of the median's 95 % interval as a fraction of the median (inf without steps or at a 0
    median)."""
    if not len(walls):
        return math.inf
    median = float(np.median(np.asarray(walls, dtype=float)))
    if not median > 0:
        return math.inf
    low, high = median_interval(walls, positive=True)  # the summary's interval of the median step
    return max(median - low, high - median) / median


def precision_summary(walls: Sequence[float], target: float | None) -> dict:
    """Summary keys: the half-width in % for every run; with a target (auto-length runs) also the target in %,
    whether it was reached and, when not, the quality reason."""
    width = relative_half_width(walls)
    out = {keys.PRECISION_HALF_WIDTH_PCT: 100 * width} if math.isfinite(width) else {}
    if target is not None:
        reached = bool(width <= target)
        out.update({keys.PRECISION_TARGET_PCT: 100 * target, keys.PRECISION_REACHED: reached})
        if not reached:
            out[keys.QUALITY] = NOT_REACHED
    return out
