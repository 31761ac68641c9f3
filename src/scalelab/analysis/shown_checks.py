"""The report's tables held to their own figures, as a reader sees them (pure; the audit of analysis.checks for
what a report shows rather than what a run measured). Each check reads one table (its whole frame, the columns the
page shows, its caption and the section's sentences) and returns one line per fault, none when it holds:
- `interval_faults`: every interval column names its figure (analysis.tables.figure_of: "x_ci_low(u)" belongs to
  "x(u)"; a bare "ci_low" belongs to nothing), is shown only beside it, and contains it in every row;
- `unit_faults`: an interval's unit is its figure's ("throughput_ci_low(ms)" beside "throughput(samples/s)" is a
  step's interval set beside a rate);
- `share_faults`: the shares of a table of additive parts (a `share(%)` column, per run) sum to 100 % within
  rounding: an extra row beside its whole counts the same time twice;
- `row_faults`: the columns shown tell the rows apart (no two rows alike in the describing columns shown: text,
  integers, flags; a measured real number does not say which case a row is), and include every column the caption
  or a sentence names;
- `band_faults`: a headline figure lies within its own min–max band (`x_min(u)` .. `x_max(u)` beside `x(u)`);
- `part_faults`: a split part is not larger than its whole beyond their intervals, for the pairs PARTS (listed in
  docs/definitions.md, "Parts and their wholes");
- `coverage_faults`: an interval the caption calls a 95 % interval is one: its row's n reaches RANGE_MIN_N.
`table_faults` applies them all to one table; report.audit applies that to every table of a built report.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable

import pandas as pd

from scalelab.analysis.intervals import RANGE_MIN_N, coverage
from scalelab.analysis.tables import figure_of, interval_parts

SHARE_COLUMN = "share(%)"
SHARE_ROUNDING = 0.5  # percentage points: shares printed to 0.1 % may sum to 99.9 or 100.1
GROUP_COLUMNS = ("run_id", "section", "level")  # a table of parts holds one set of parts per value of these
REL = 1e-9  # float rounding when an interval's end is its point


def _num(value) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(float(value)) else float(value)


def _label(frame: pd.DataFrame, i: int) -> str:
    first = frame.columns[0]
    return f"{first} {frame[first].iloc[i]}"


def interval_faults(name: str, frame: pd.DataFrame, shown: Iterable[str] | None = None) -> list[str]:
    shown = list(frame.columns if shown is None else shown)
    out = []
    for column in (c for c in map(str, frame.columns) if interval_parts(c)):
        figure = figure_of(column, frame.columns)
        if figure is None:
            out.append(f"{name}: interval {column!r} names no figure of the table")
            continue
        if column in shown and figure not in shown:
            out.append(f"{name}: interval {column!r} is shown without its figure {figure!r}")
        low_side = interval_parts(column)[1] == "low"
        for i, (point, end) in enumerate(zip(frame[figure], frame[column])):
            p, e = _num(point), _num(end)
            if p is None or e is None:
                continue
            slack = REL * max(abs(p), abs(e), 1.0)
            if (low_side and e > p + slack) or (not low_side and e < p - slack):
                out.append(f"{name} ({_label(frame, i)}): {figure} {p:.4g} lies outside its interval "
                           f"({column} {e:.4g})")
    return out


def unit_faults(name: str, frame: pd.DataFrame) -> list[str]:
    out = []
    columns = list(map(str, frame.columns))
    for column in (c for c in columns if interval_parts(c)):
        stem, _, unit = interval_parts(column)
        for other in columns:
            o_stem, paren, o_unit = other.partition("(")
            if o_stem == stem and not interval_parts(other) and (paren + o_unit) != unit:
                out.append(f"{name}: interval {column!r} is in {unit or 'no unit'}, its figure {other!r} in "
                           f"{paren + o_unit or 'no unit'}")
    return out


def share_faults(name: str, frame: pd.DataFrame) -> list[str]:
    if SHARE_COLUMN not in frame or not len(frame):
        return []
    keys = [c for c in GROUP_COLUMNS if c in frame.columns]
    groups = frame.groupby(keys, sort=False, dropna=False) if keys else [((), frame)]
    out = []
    for key, part in groups:
        shares = part[SHARE_COLUMN].dropna()
        if len(shares) and abs(shares.sum() - 100.0) > SHARE_ROUNDING:
            which = f" ({', '.join(map(str, key if isinstance(key, tuple) else (key,)))})" if keys else ""
            out.append(f"{name}{which}: the shares of its parts sum to {shares.sum():.1f} %, not 100 %")
    return out


_WORD = r"(?<![\w/(]){}(?![\w(])"


def named_columns(frame: pd.DataFrame, texts: Iterable[str]) -> list[str]:
    """The table's columns that a text names verbatim (a column name with '_', '(' or '/': plain words such as
    'step' are words, not column names)."""
    joined = "\n".join(texts)
    return [c for c in map(str, frame.columns) if re.search(r"[_(/]", c)
            and re.search(_WORD.format(re.escape(c)), joined)]


NOT_DESCRIBING = ("run_id", "quality", "reason", "status")


def describing(frame: pd.DataFrame, columns: Iterable[str]) -> list[str]:
    """The columns among `columns` that say which case a row is (a rule, a batch, a setting: text, integers,
    flags), not what was measured in it (a real number) nor its run, status or quality."""
    return [c for c in columns if c in frame.columns and c not in NOT_DESCRIBING
            and not pd.api.types.is_float_dtype(frame[c])]


def alike(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    """Rows that read alike in the describing columns among `columns` (all rows of a table of one row: none)."""
    keys = describing(frame, columns)
    if not keys:
        return pd.Series(False, index=frame.index)
    return frame[keys].astype(str).duplicated(keep=False)


def row_faults(name: str, frame: pd.DataFrame, shown: Iterable[str] | None, caption: str = "",
               sentences: Iterable[str] = ()) -> list[str]:
    shown = list(frame.columns if shown is None else shown)
    out = [f"{name}: the caption or a sentence names {c!r}, which the table does not show"
           for c in named_columns(frame, [caption, *sentences]) if c not in shown]
    twins = alike(frame, shown)
    # only a fault where the whole table tells those rows apart: a column it shows is missing from the page
    if twins.any() and not alike(frame, list(frame.columns))[twins].all():
        out.append(f"{name}: rows {', '.join(str(i) for i in frame.index[twins][:4])} read alike in the columns "
                   f"shown ({', '.join(describing(frame, shown))}); the column that tells them apart is not shown")
    return out


def band_faults(name: str, frame: pd.DataFrame) -> list[str]:
    out = []
    for column in map(str, frame.columns):
        stem, paren, unit = column.partition("(")
        low, high = f"{stem}_min{paren}{unit}", f"{stem}_max{paren}{unit}"
        if low not in frame or high not in frame or stem.endswith(("_min", "_max")):
            continue
        for i, (p, lo, hi) in enumerate(zip(frame[column], frame[low], frame[high])):
            p, lo, hi = _num(p), _num(lo), _num(hi)
            if None not in (p, lo, hi) and not lo * (1 - REL) <= p <= hi * (1 + REL):
                out.append(f"{name} ({_label(frame, i)}): {column} {p:.4g} lies outside its own min–max "
                           f"{lo:.4g}–{hi:.4g}")
    return out


# (part, whole) column pairs of one row, as docs/definitions.md lists them ("Parts and their wholes")
PARTS = (("comm_critical(ms)", "step(ms)"), ("waiting_for_peers(ms)", "step(ms)"), ("comm(ms)", "step(ms)"),
         ("exposed_comm(ms)", "step(ms)"))


def part_faults(name: str, frame: pd.DataFrame, pairs=PARTS) -> list[str]:
    """A split part larger than its whole beyond their intervals (the part's low end above the whole's high end;
    a figure without an interval counts as its own ends)."""
    out = []
    columns = list(frame.columns)
    for part, whole in pairs:
        if part not in frame or whole not in frame:
            continue
        p_low = next(iter(c for c in columns if figure_of(c, columns) == part and interval_parts(c)[1] == "low"), part)
        w_high = next(iter(c for c in columns if figure_of(c, columns) == whole and interval_parts(c)[1] == "high"),
                      whole)
        for i, (p, w) in enumerate(zip(frame[p_low], frame[w_high])):
            p, w = _num(p), _num(w)
            if p is not None and w is not None and p > w * (1 + REL) + REL:
                out.append(f"{name} ({_label(frame, i)}): {part} {frame[part].iloc[i]:.4g} is larger than its whole "
                           f"{whole} {frame[whole].iloc[i]:.4g} beyond their intervals")
    return out


CALLED_95 = r"95 % intervals?\b"  # how a caption calls its intervals 95 % ones


def few_values(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows whose interval rests on fewer values (their `n`) than make a 95 % one (RANGE_MIN_N); none
    without an `n` column."""
    if "n" not in frame:
        return frame.iloc[0:0]
    with_interval = frame[[c for c in frame.columns if interval_parts(str(c))]].notna().any(axis=1)
    return frame[with_interval & (pd.to_numeric(frame["n"], errors="coerce") < RANGE_MIN_N)]


def honest_caption(caption: str, frame: pd.DataFrame) -> str:
    """`caption` as it may stand above `frame`: where a row's interval rests on fewer than RANGE_MIN_N values, the
    caption's "95 % interval" says what it is there (the range of the values, and what that covers at the fewest),
    so coverage_faults holds; unchanged otherwise."""
    few = few_values(frame)
    if not len(few) or not re.search(CALLED_95, caption):
        return caption
    n = int(pd.to_numeric(few["n"], errors="coerce").min())
    return re.sub(r"95 % interval(s?)\b", lambda m: (
        f"interval{m[1]} (95 % from n = {RANGE_MIN_N} values up; with fewer, the range of the n values, which "
        f"covers {100 * coverage(n):.1f} % at n = {n})"), caption, count=1).replace("95 % interval", "interval")


def coverage_faults(name: str, frame: pd.DataFrame, caption: str = "") -> list[str]:
    """A caption that calls a table's intervals "95 % interval(s)" while a row's interval rests on fewer values
    (its `n`) than make one (analysis.intervals.RANGE_MIN_N: below it the range covers less, 50 % for 2)."""
    if not re.search(CALLED_95, caption):
        return []
    few = few_values(frame)
    return [f"{name} ({_label(frame, i)}): the caption calls its interval a 95 % interval, but it rests on n = "
            f"{int(frame['n'].iloc[i])} (the range of {int(frame['n'].iloc[i])} values covers "
            f"{100 * coverage(int(frame['n'].iloc[i])):.1f} %)" for i in (frame.index.get_loc(j) for j in few.index)]


def table_faults(name: str, frame: pd.DataFrame, shown: Iterable[str] | None = None, caption: str = "",
                 sentences: Iterable[str] = ()) -> list[str]:
    """Every fault of one table as a reader sees it (module docstring)."""
    return (interval_faults(name, frame, shown) + unit_faults(name, frame) + share_faults(name, frame)
            + row_faults(name, frame, shown, caption, sentences) + band_faults(name, frame)
            + part_faults(name, frame) + coverage_faults(name, frame, caption))
