"""Recommendations among predictions: the default configuration is kept unless another option is better beyond
the intervals of both (docs/model.md, "Recommendations among predictions").

The rule is the study's (`lab.decision`) applied to predicted efficiencies at one worker count: rule 1 (the 95 %
intervals apart after widening each for the family of alternatives compared with the default, Bonferroni) and
rule 3 (a material effect, 2 % of the default's figure); rule 2 (launches that do not interleave) has no launches
to read here. Among the options that pass, the smallest per-rank batch, with the default strategy where it is one
of them: a strategy is not changed at a batch where the default strategy also passes.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import pandas as pd

from scalelab.lab.decision import ALPHA, MATERIAL


def recommendation(options: pd.DataFrame, workers: int, target: float, *, strategy: str, batch: float) -> str:
    """One sentence from an `options_for_efficiency` table: the default (`strategy` at per-rank `batch`) is kept
    unless another option meets the target and is better than it beyond both 95 % intervals, widened for the
    family of alternatives, by a material effect (`lab.decision`'s rules 1 and 3, applied to predicted
    efficiencies; rule 2, launches that do not interleave, has no launches here); then the smallest such batch,
    with the default strategy where it is one of them."""
    rows = options.to_dict("records")
    default = next((r for r in rows if r["strategy"] == strategy and abs(r["per_rank_batch"] - batch) < 1e-9), None)
    if default is None:
        return f"{strategy} with per-rank batch {batch:g} was not predicted; nothing is recommended"
    family = max(1, len(rows) - 1)
    mine = option_side(default, family)
    better = [r for r in rows if r is not default and r["meets_target"]
              and beyond_intervals(option_side(r, family), mine)]
    if default["meets_target"]:
        return (f"the default, {strategy} with per-rank batch {batch:g}, keeps {efficiency_text(default)} "
                f"(>= {target:.0%}) on {workers} workers")
    if not better:
        met = [r for r in rows if r is not default and r["meets_target"]]
        why = (f"no option reaches {target:.0%}" if not met else
               "without intervals (a calibration without refits) no option can be told better" if mine[1] is None
               else f"the {len(met)} option(s) that reach it are not better beyond the 95 % intervals, widened for "
                    f"{family} alternatives (the best: {met_best(met)})")
        return (f"keep the default, {strategy} with per-rank batch {batch:g} ({efficiency_text(default)} on "
                f"{workers} workers, below {target:.0%}): {why}")
    least = min(r["per_rank_batch"] for r in better)
    at = [r for r in better if r["per_rank_batch"] == least]
    best = next((r for r in at if r["strategy"] == strategy), max(at, key=lambda r: r["efficiency"]))
    return (f"{best['strategy']} with per-rank batch {best['per_rank_batch']:g} keeps {efficiency_text(best)} "
            f"(>= {target:.0%}) on {workers} workers, against {efficiency_text(default)} for the default ({strategy}, "
            f"per-rank batch {batch:g}): apart beyond both 95 % intervals, widened for {family} alternatives")


def met_best(rows: list[dict]) -> str:
    """"ddp with per-rank batch 64 at efficiency 58 % (95 %: ...)": the most efficient of `rows`."""
    top = max(rows, key=lambda r: r["efficiency"])
    return f"{top['strategy']} with per-rank batch {top['per_rank_batch']:g} at {efficiency_text(top)}"


def efficiency_text(row: dict) -> str:
    """"efficiency 58 % (95 %: 52–63 %)"; without an interval the point alone."""
    low, high = row.get("efficiency_ci_low", math.nan), row.get("efficiency_ci_high", math.nan)
    span = f" (95 %: {100 * low:.0f}–{100 * high:.0f} %)" if math.isfinite(low) and math.isfinite(high) else ""
    return f"efficiency {100 * row['efficiency']:.0f} %{span}"


def option_side(row: dict, family: int) -> tuple[float, tuple[float, float] | None]:
    """(efficiency, its 95 % interval widened for `family` comparisons: each half-width in log efficiency times
    z(1 - ALPHA / 2 family) / z(1 - ALPHA / 2), Bonferroni on the normal approximation; a prediction has one look).
    The interval is the step's inverted (`intervals.efficiency_interval`), normal in log step, so it is widened in
    log; the high end is cut at 1 again after widening, as efficiency cannot exceed 1 (docs/definitions.md): no
    comparison rests on an interval past that bound. Widening the cut interval and cutting again gives what
    widening the uncut one would (the point is at most 1 and the widening moves every end away from it)."""
    low, high = row.get("efficiency_ci_low", math.nan), row.get("efficiency_ci_high", math.nan)
    value = row["efficiency"]
    if not (math.isfinite(low) and math.isfinite(high)) or min(low, value) <= 0:
        return value, None
    z = NormalDist().inv_cdf
    factor = z(1 - ALPHA / (2 * max(1, family))) / z(1 - ALPHA / 2)
    return value, (value * (low / value) ** factor, min(1.0, value * (high / value) ** factor))


def beyond_intervals(a: tuple[float, tuple[float, float] | None], b: tuple[float, tuple[float, float] | None]) -> bool:
    """Whether efficiency `a` is above `b` with the intervals apart and by a material effect (`lab.decision`)."""
    (va, ia), (vb, ib) = a, b
    if ia is None or ib is None:
        return False
    return ia[0] > ib[1] and abs(va - vb) >= MATERIAL * abs(vb)
