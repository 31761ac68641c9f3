"""An experiment's tables in the terminal, as `runs list` prints its own: the columns that fit the terminal's width,
chosen in the order the report shows them (its answer columns, the ones that tell rows apart first), the rest named
below the table; `--wide` prints every column, however wide. The CSV and JSON files always hold every column."""
from __future__ import annotations

import textwrap

import pandas as pd

from scalelab.analysis.tables import interval_parts, intervals_of
from scalelab.report.build import answer_columns, named_by, telling_rows_apart
from scalelab.report.render import format_value

GAP = 2  # spaces between two columns


def _text(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.apply(lambda col: col.map(format_value)) if len(frame) else frame.astype(str)


def _width(text: pd.DataFrame, column: str) -> int:
    return max([len(str(column)), *(len(v) for v in text[column])])


def fitting_columns(frame: pd.DataFrame, width: int, declared: list[str] | None = None,
                    texts: list[str] = ()) -> tuple[list[str], list[str]]:
    """(the columns shown, the columns left out): the report's answer columns first (report.build), then the
    table's others, each while the table still fits in `width` characters; the first column always."""
    preferred = telling_rows_apart(named_by(answer_columns(frame, declared, most=len(frame.columns)) or
                                            list(frame.columns), frame, list(texts)), frame) or list(frame.columns)
    order = [*preferred, *(c for c in frame.columns if c not in preferred)]
    text = _text(frame)
    # an interval's two ends go with their figure or not at all: half an interval would read as a figure
    ends = {c: intervals_of(c, frame.columns) for c in order if interval_parts(str(c)) is None}
    paired = {e for group in ends.values() if len(group) == 2 for e in group}
    shown, used = [], -GAP
    for column in (c for c in order if c not in paired):
        for group in ([column, *ends.get(column, [])], [column]) if len(ends.get(column, [])) == 2 else ([column],):
            need = sum(_width(text, c) + GAP for c in group)
            if not shown or used + need <= width:
                shown += group
                used += need
                break
    return [c for c in order if c in shown], [c for c in order if c not in shown]


def render(frame: pd.DataFrame, width: int | None, declared: list[str] | None = None,
           texts: list[str] = ()) -> list[str]:
    """The table as lines no wider than `width` (None: every column), then one line naming what was left out."""
    if width is None:
        shown, left = list(frame.columns), []
    else:
        shown, left = fitting_columns(frame, width, declared, texts)
    text = _text(frame[shown])
    widths = {c: _width(text, c) for c in shown}
    numeric = {c: pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in shown}

    def line(cells) -> str:
        out = (" " * GAP).join(v.rjust(widths[c]) if numeric[c] else v.ljust(widths[c]) for c, v in zip(shown, cells))
        return out.rstrip()[:width] if width else out.rstrip()

    lines = [line([str(c) for c in shown]), *(line(list(row)) for row in text.itertuples(index=False))]
    if left:
        lines.append(_wrapped(f"not shown, to fit {width} columns: {', '.join(map(str, left))} (--wide shows every "
                              "column; the CSV and JSON hold them all)", width))
    return lines


def _wrapped(text: str, width: int | None) -> str:
    """A sentence broken into lines of at most `width` characters (a word longer than that stands whole)."""
    return textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False) if width else text
