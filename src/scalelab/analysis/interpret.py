"""What every experiment's sentences share: numbers formatted, intervals read from a row and printed with their
real coverage (`span`), and a ranking by median step that names a winner only beyond noise (`ranking`).

A finding between configurations ("A is faster than B beyond noise", `beats`) counts launches, not steps: the
steps of one launch cannot see drift between launches (scalelab.analysis.repeats). So a row measured in fewer
than MIN_LAUNCHES launches (a table without a `launches` column counts as 1) is never ranked: it may be named as
the shortest, "indicative: 1 launch, not ranked". With MIN_LAUNCHES or more each, the faster row's step interval
must lie below the slower's AND every launch median of the faster below every launch median of the slower.

Each experiment's own sentences live in its module (its `interpret`: the result's tables -> sentences and, where
it has one, a recommendation), computed from the tables, never boilerplate.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import trusted
from scalelab.analysis.intervals import coverage, separated
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


def beats(a, b, low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> bool:
    """Whether row `a`'s median step is shorter than row `b`'s beyond noise, as a finding between configurations:
    each measured in at least MIN_LAUNCHES launches, a's step interval below b's (separated), and a's slowest
    launch median below b's fastest (the launches do not interleave)."""
    if min(launches(a), launches(b)) < MIN_LAUNCHES:
        return False
    ia, ib = interval(a, low, high), interval(b, low, high)
    if not separated(ia, ib) or not ia[1] < ib[0]:
        return False
    la, lb = launch_range(a, low, high), launch_range(b, low, high)
    return la is not None and lb is not None and la[1] < lb[0]


def fastest(table: pd.DataFrame, label: str, value: str = "step(ms)", low: str = "step_ci_low(ms)",
             high: str = "step_ci_high(ms)") -> tuple[dict, list[dict], bool]:
    """(the row with the lowest `value`, the rows it does not beat beyond noise, whether intervals could tell): a
    row is within noise of the best unless the best `beats` it (intervals separated, launches not interleaved,
    enough launches of each); nothing is concluded from a figure without its interval."""
    rows = table.sort_values(value).to_dict("records")
    best, others = rows[0], rows[1:]
    b = interval(best, low, high)
    ties = [r for r in others if not beats(best, r, low, high)]
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
    when it `beats` every other row (else None): at least MIN_LAUNCHES launches each, intervals separated, launches
    not interleaved; the sentence states n (launches). Fewer launches: the shortest is named, "indicative", not
    ranked. Flagged rows are left out, with why."""
    table, left_out = flagged(table, label)
    if not len(table):
        return left_out + [f"Every {what} is flagged: no ranking is a finding."], None
    lines, best = _ranking_of(table, label, what)
    return left_out + lines, best


def _ranking_of(table: pd.DataFrame, label: str, what: str) -> tuple[list[str], dict | None]:
    best, ties, known = fastest(table, label)
    line = f"{best[label]} has the shortest median step: {fmt(best['step(ms)'], ' ms')} ({step_span(best)})"
    if not known:
        return [line + "; without intervals no ranking is a finding."], None
    n = min(launches(r) for r in table.to_dict("records"))
    if n < MIN_LAUNCHES:
        return [line + f"; {not_ranked(n)}."], None
    each = f"n = {n} launches{' each' if len(table) > 1 else ''}"
    if ties:
        half = max((iv[1] - iv[0]) / 2 for iv in (interval(r) for r in [best, *ties]) if iv is not None)
        names = ", ".join(str(r[label]) for r in ties)
        return [line + f", but {names} {'is' if len(ties) == 1 else 'are'} within noise of it (the intervals "
                f"meet or the launches interleave; noise here is about ±{fmt(half, ' ms')}, {each}): no {what} is "
                f"faster than {'it' if len(ties) == 1 else 'them'} beyond noise."], None
    rest = table[table[label] != best[label]].sort_values("step(ms)")
    nxt = rest.iloc[0] if len(rest) else None
    if nxt is not None:
        line += (f", faster than every other {what} beyond noise in every launch ({each}; next: {nxt[label]}, "
                 f"{fmt(nxt['step(ms)'], ' ms')}, {step_span(nxt)})")
    return [line + "."], best


