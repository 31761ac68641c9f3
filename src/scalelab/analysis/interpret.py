"""What every experiment's sentences share: numbers formatted, intervals read from a row and printed with their
real coverage (`span`), a row's launches and launch medians, and a ratio said one way (`ratio_words`).

Whether one configuration is better than another beyond noise is decided in one place, scalelab.lab.decision
(launches, not steps: a row measured in fewer than MIN_LAUNCHES launches, or a table without a `launches` column,
counts as too few); this module only reads the rows it decides on and words what it found.

Each experiment's own sentences live in its module (its `interpret`: the result's tables -> sentences and, where
it has one, a recommendation), computed from the tables, never boilerplate.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import trusted
from scalelab.analysis.intervals import coverage
from scalelab.analysis.repeats import LAUNCHES

MIN_LAUNCHES = 2  # the fewest launches of each row for a finding between configurations
# where a table keeps the lowest / highest launch median step (a summary's keys, or a comparison table's columns)
LAUNCH_MIN_COLUMNS = (keys.STEP_LAUNCH_MEDIAN_MIN_MS, "step_launch_min(ms)")
LAUNCH_MAX_COLUMNS = (keys.STEP_LAUNCH_MEDIAN_MAX_MS, "step_launch_max(ms)")
STEP_COUNT_COLUMNS = ("timed_steps", keys.STEPS_TIMED, "n")  # the values a row's median step interval comes from


def fmt(x: float, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}g}{unit}"


def interval(row, low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> tuple[float, float] | None:
    lo, hi = row.get(low), row.get(high)
    return None if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else (float(lo), float(hi))


def span(iv: tuple[float, float] | None, unit: str = " ms", n: int | None = None) -> str:
    """An interval in words, with its real coverage: "95 % interval 10–12 ms"; for a median interval from n < 6
    values (`n` given), the range it is: "87.5 % interval (range of 4) 10–12 ms"; "no interval" without one or
    from one value. `n` None: a 95 % interval (mean intervals, or a row that does not say its n)."""
    if iv is None or not all(math.isfinite(v) for v in iv) or (n is not None and int(n) < 2):
        return "no interval" + (" (1 value)" if n is not None and int(n) == 1 else "")
    c = coverage(int(n) if n is not None else None)
    label = "95 % interval" if c >= 0.95 else f"{100 * c:g} % interval (range of {int(n)})"
    return f"{label} {fmt(iv[0])}–{fmt(iv[1], unit)}"


def step_span(row, unit: str = " ms", low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> str:
    """A row's median step interval in words (`span`), its coverage from the row's timed steps."""
    return span(interval(row, low, high), unit, steps(row))


def steps(row) -> int | None:
    """The timed steps behind a row's median step (None when the row does not say)."""
    for col in STEP_COUNT_COLUMNS:
        v = row.get(col)
        if v is not None and not pd.isna(v):
            return int(v)
    return None


def launches(row) -> int:
    """How many launches a row pools; 1 for a row that does not say (an old table)."""
    v = row.get(LAUNCHES)
    return 1 if v is None or pd.isna(v) else int(v)


def not_ranked(n: int) -> str:
    """Why a comparison of rows from too few launches names no winner, in words."""
    return (f"indicative: {n} launch{'es' if n != 1 else ''}, not ranked (a difference between configurations "
            f"counts only when each was launched at least {MIN_LAUNCHES} times and every launch agrees)")


def launch_range(row, low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> tuple[float, float] | None:
    """(lowest, highest) launch median step of a row; where the row does not keep them, its step interval, which
    reaches every launch median (scalelab.analysis.repeats)."""
    lo = next((row.get(c) for c in LAUNCH_MIN_COLUMNS if row.get(c) is not None and not pd.isna(row.get(c))), None)
    hi = next((row.get(c) for c in LAUNCH_MAX_COLUMNS if row.get(c) is not None and not pd.isna(row.get(c))), None)
    return (float(lo), float(hi)) if lo is not None and hi is not None else interval(row, low, high)


def flagged(table: pd.DataFrame, label: str) -> tuple[pd.DataFrame, list[str]]:
    """(the rows that may make a finding, one sentence per row left out and why: compare.trusted)."""
    if "quality" not in table:
        return table, []
    keep = table["quality"].map(trusted)
    out = [f"{row[label]} is left out of the ranking: {row['quality']}." for row in table[~keep].to_dict("records")]
    return table[keep], out


def ratio_words(faster: float, than: str) -> str:
    """A ratio said one way, from how many times faster one thing is than `than` (a step-time ratio old / new, or
    a throughput ratio new / old): "1.41× faster than 1 thread"; below 1, "0.38× the speed of fp32 (2.63× slower)".
    Never a ratio of a thing with itself: the caller names the other side."""
    if faster is None or not math.isfinite(faster) or faster <= 0:
        return f"no ratio to {than} (a figure is missing)"
    if faster >= 1:
        return f"{faster:.2f}× faster than {than}"
    return f"{faster:.2f}× the speed of {than} ({1 / faster:.2f}× slower)"
