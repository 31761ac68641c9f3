"""Tables in the terminal, fitted to its width: the columns a person reads first are kept while the table still
fits, the rest dropped and named below it; `--wide` prints every column, however wide. The CSV and JSON files
always hold every column. One rule (`fitting_columns`) for both shapes:

- plain (`render`): an experiment's tables, its columns in the order the report shows them (its answer columns, the
  ones that tell rows apart first: report.build);
- boxed (`print_fitted`): `runs list` and `predict`, in an order of their own, some columns kept whatever the width.

In both, an interval's two ends go with their figure or not at all (half an interval would read as a figure).
"""
from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table

from scalelab.analysis.tables import interval_parts, intervals_of
from scalelab.report.build import answer_columns, named_by, telling_rows_apart
from scalelab.report.render import format_value

GAP = 2  # plain: spaces between two columns
BORDER = 3  # boxed: what a column of rich's boxed table adds to its text, a rule and a space either side
Text = Callable[[str, object], str]


def plain_text(col: str, value) -> str:
    return format_value(value)


def column_width(frame: pd.DataFrame, col: str, text: Text = plain_text) -> int:
    """Characters a column's text takes: its name or its widest value."""
    return max([len(str(col)), *(len(text(col, v)) for v in frame[col])])


def fitting_columns(frame: pd.DataFrame, width: int | None, *, wanted: Sequence[str],
                    order: Sequence[str] | None = None, keep: Sequence[str] = (), boxed: bool = False,
                    text: Text = plain_text) -> tuple[list[str], list[str]]:
    """(the columns shown, in `order` (default: `wanted`'s), the columns left out, in `wanted`'s): those of `keep`
    always; then each column of `wanted` (an interval with its figure: both ends or neither) while the table still
    fits in `width` characters (None: every column); never an empty table (its first column at least). `boxed`:
    the widths of rich's boxed table (BORDER per column and a closing rule), else plain columns GAP apart."""
    wanted = [c for c in wanted if c in frame]
    per_column, used = (BORDER, 1) if boxed else (GAP, -GAP)
    ends = {c: [e for e in intervals_of(c, frame.columns) if e in wanted] for c in wanted
            if interval_parts(str(c)) is None}
    paired = {e for group in ends.values() if len(group) == 2 for e in group}
    shown: list[str] = []
    for column in (c for c in wanted if c not in paired):
        whole = [column, *ends.get(column, [])]
        for group in (whole, [column]) if len(whole) == 3 else ([column],):
            need = sum(column_width(frame, c, text) + per_column for c in group)
            if width is None or column in keep or not shown or used + need <= width:
                shown += group
                used += need
                break
    return ([c for c in (order or wanted) if c in shown],
            [c for c in wanted if c not in shown])


def left_out(left: Sequence[str], width: int, elsewhere: str) -> str:
    """The line naming the columns left out and where they are, broken to `width` (a long name stands whole)."""
    return textwrap.fill(f"not shown, to fit {width} columns: {', '.join(map(str, left))} ({elsewhere})", width,
                         break_long_words=False, break_on_hyphens=False)


EVERY_COLUMN = "--wide shows every column; the CSV and JSON hold them all"


def render(frame: pd.DataFrame, width: int | None, declared: list[str] | None = None,
           texts: list[str] = ()) -> list[str]:
    """An experiment's table as plain lines no wider than `width` (None: every column), its columns in the order
    the report shows them (`declared`: the experiment's answer columns; `texts`: its caption, which may name
    more), then one line naming what was left out."""
    preferred = telling_rows_apart(named_by(answer_columns(frame, declared, most=len(frame.columns)) or
                                            list(frame.columns), frame, list(texts)), frame) or list(frame.columns)
    order = [*preferred, *(c for c in frame.columns if c not in preferred)]
    shown, left = fitting_columns(frame, width, wanted=order)
    text = {c: [plain_text(c, v) for v in frame[c]] for c in shown}
    widths = {c: column_width(frame, c) for c in shown}
    numeric = {c: pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in shown}

    def line(cells) -> str:
        out = (" " * GAP).join(v.rjust(widths[c]) if numeric[c] else v.ljust(widths[c]) for c, v in zip(shown, cells))
        return out.rstrip()[:width] if width else out.rstrip()

    lines = [line([str(c) for c in shown]), *(line([text[c][i] for c in shown]) for i in range(len(frame)))]
    return lines + ([left_out(left, width, EVERY_COLUMN)] if left else [])


def print_fitted(console: Console, frame: pd.DataFrame, *, order: Sequence[str], wanted: Sequence[str], wide: bool,
                 keep: Sequence[str] = (), text: Text = lambda c, v: str(v),
                 elsewhere: str = "--wide shows every column") -> None:
    """`frame` as a boxed table in `console`'s width (every column with `wide`), and a line naming what was left
    out and where it is (`elsewhere`)."""
    shown, left = fitting_columns(frame, None if wide else console.width, order=order, wanted=wanted, keep=keep,
                                  boxed=True, text=text)
    table = Table(show_header=True)
    for c in shown:
        table.add_column(c, no_wrap=True, overflow="ignore")
    for row in frame[shown].itertuples(index=False):
        table.add_row(*[text(c, v) for c, v in zip(shown, row)])
    out = console if not wide else Console(width=max(console.width, 1 + sum(column_width(frame, c, text) + BORDER
                                                                            for c in shown)))
    out.print(table, markup=False, highlight=False)
    if left:
        console.print(left_out(left, console.width, elsewhere), markup=False, highlight=False, soft_wrap=True)
