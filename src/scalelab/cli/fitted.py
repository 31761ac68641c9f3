"""A table fitted to the terminal, as `runs list` and `predict` print theirs: the columns a person reads first
are kept while the boxed table still fits the width, the rest dropped and named below it (`--wide`: all)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

BORDER = 3  # what a column of rich's boxed table adds to its text: a rule and a space either side


def column_width(frame, col: str, text: Callable[[str, object], str] = lambda c, v: str(v)) -> int:
    """Characters a column takes in the table: its widest text and its borders."""
    return max([len(col), *(len(text(col, v)) for v in frame[col])]) + BORDER


def fitting_columns(frame, width: int, *, order: Sequence[str], wanted: Sequence[str], keep: Sequence[str] = (),
                    text: Callable[[str, object], str] = lambda c, v: str(v)) -> tuple[list[str], list[str]]:
    """(the columns shown in `order`, the columns dropped): those of `keep` always, whole; then each column in
    `wanted`'s order while the table still fits in `width` characters."""
    shown, dropped, used = set(), [], 1  # the table's closing rule
    for col in (c for c in wanted if c in frame):
        need = column_width(frame, col, text)
        if col in keep or used + need <= width:
            shown.add(col)
            used += need
        else:
            dropped.append(col)
    return [c for c in order if c in shown], dropped


def print_fitted(console: Console, frame, *, order: Sequence[str], wanted: Sequence[str], wide: bool,
                 keep: Sequence[str] = (), text: Callable[[str, object], str] = lambda c, v: str(v),
                 elsewhere: str = "--wide shows every column") -> None:
    """`frame` as a boxed table in `console`'s width (every column with `wide`), and a line naming what was left
    out and where it is (`elsewhere`)."""
    shown, dropped = fitting_columns(frame, 10**6 if wide else console.width, order=order, wanted=wanted, keep=keep,
                                     text=text)
    table = Table(show_header=True)
    for c in shown:
        table.add_column(c, no_wrap=True, overflow="ignore")
    for row in frame[shown].itertuples(index=False):
        table.add_row(*[text(c, v) for c, v in zip(shown, row)])
    out = console if not wide else Console(width=max(console.width, 1 + sum(column_width(frame, c, text)
                                                                            for c in shown)))
    out.print(table, markup=False, highlight=False)
    if dropped:
        console.print(f"not shown, to fit {console.width} columns: {', '.join(dropped)} ({elsewhere})",
                      markup=False, highlight=False)
