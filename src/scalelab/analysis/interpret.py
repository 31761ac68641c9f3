"""What every experiment's sentences share: numbers formatted, intervals read from a row, and a ranking by median
step that names a winner only beyond noise (`ranking`).

Each experiment's own sentences live in its module (its `interpret`: the result's tables -> sentences and, where
it has one, a recommendation), computed from the tables, never boilerplate.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis.compare import trusted
from scalelab.analysis.intervals import separated


def fmt(x: float, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}g}{unit}"


def interval(row, low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> tuple[float, float] | None:
    lo, hi = row.get(low), row.get(high)
    return None if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else (float(lo), float(hi))


def span(iv: tuple[float, float] | None, unit: str = " ms") -> str:
    return "no interval" if iv is None else f"95 % interval {fmt(iv[0])}–{fmt(iv[1], unit)}"


def fastest(table: pd.DataFrame, label: str, value: str = "step(ms)", low: str = "step_ci_low(ms)",
             high: str = "step_ci_high(ms)") -> tuple[dict, list[dict], bool]:
    """(the row with the lowest `value`, the rows within noise of it, whether intervals could tell): a row is
    within noise of the best when its interval meets the best's or either has none (nothing is concluded from a
    figure without its interval)."""
    rows = table.sort_values(value).to_dict("records")
    best, others = rows[0], rows[1:]
    b = interval(best, low, high)
    ties = [r for r in others if b is None or interval(r, low, high) is None
            or not separated(b, interval(r, low, high))]
    return best, ties, b is not None


def flagged(table: pd.DataFrame, label: str) -> tuple[pd.DataFrame, list[str]]:
    """(the rows that may make a finding, one sentence per row left out and why: compare.trusted)."""
    if "quality" not in table:
        return table, []
    keep = table["quality"].map(trusted)
    out = [f"{row[label]} is left out of the ranking: {row['quality']}." for row in table[~keep].to_dict("records")]
    return table[keep], out


def ranking(table: pd.DataFrame, label: str, what: str) -> tuple[list[str], dict | None]:
    """Sentences ranking `table`'s rows by median step, only as far as the intervals separate them; the winner
    when it is faster than every other row beyond noise (else None). Flagged rows are left out, with why."""
    table, left_out = flagged(table, label)
    if not len(table):
        return left_out + [f"Every {what} is flagged: no ranking is a finding."], None
    lines, best = _ranking_of(table, label, what)
    return left_out + lines, best


def _ranking_of(table: pd.DataFrame, label: str, what: str) -> tuple[list[str], dict | None]:
    best, ties, known = fastest(table, label)
    line = f"{best[label]} has the shortest median step: {fmt(best['step(ms)'], ' ms')} ({span(interval(best))})"
    if not known:
        return [line + "; without intervals no ranking is a finding."], None
    if ties:
        half = max((iv[1] - iv[0]) / 2 for iv in (interval(r) for r in [best, *ties]) if iv is not None)
        names = ", ".join(str(r[label]) for r in ties)
        return [line + f", but {names} {'is' if len(ties) == 1 else 'are'} within noise of it (the intervals "
                f"meet; noise here is about ±{fmt(half, ' ms')}): no {what} is faster than "
                f"{'it' if len(ties) == 1 else 'them'} beyond noise."], None
    rest = table[table[label] != best[label]].sort_values("step(ms)")
    nxt = rest.iloc[0] if len(rest) else None
    if nxt is not None:
        line += (f", faster than every other {what} beyond noise (next: {nxt[label]}, "
                 f"{fmt(nxt['step(ms)'], ' ms')}, {span(interval(nxt))})")
    return [line + "."], best


