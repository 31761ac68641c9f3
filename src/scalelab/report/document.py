"""The report as data: what a study found, in the order a reader wants it. Built by the study from analysis output;
read by `scalelab.report.render`, which only lays it out. Nothing here computes or formats a number.

Identifiers (section ids, table names) become file names (`tables/<section>_<name>.csv`) and HTML anchors, so they
are checked here, where a bad one is made, rather than when a file write fails later.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")


def _check_ident(kind: str, value: object) -> None:
    if not isinstance(value, str) or not _IDENT.match(value):
        raise ValueError(f"{kind}={value!r}: use letters, digits, '_' and '-', starting with a letter or digit "
                         "(it becomes a file name and an anchor)")


@dataclass
class TableBlock:
    """One table of a section. `frame` is written raw (CSV, JSON); the page shows `columns`, the ones that carry
    the answer (None: all of them), numbers formatted for reading, with the whole table one click away."""
    name: str
    frame: pd.DataFrame
    caption: str = ""
    columns: list[str] | None = None

    def __post_init__(self) -> None:
        _check_ident("table name", self.name)
        if not isinstance(self.frame, pd.DataFrame):
            raise ValueError(f"table {self.name!r}: frame is a {type(self.frame).__name__}, expected a DataFrame")
        # CSV/JSON records need one value per column name; a duplicate would silently shadow a column.
        dupes = sorted({str(c) for c in self.frame.columns[self.frame.columns.duplicated()]})
        if dupes:
            raise ValueError(f"table {self.name!r}: duplicate column names {dupes}; each column needs its own name")
        missing = [c for c in self.columns or () if c not in self.frame.columns]
        if missing:
            raise ValueError(f"table {self.name!r}: columns to show {missing} are not in the table")


@dataclass
class FigureBlock:
    """An image file already drawn by `scalelab.report.figures`; the renderer embeds or copies it. `drawn`: the
    record of what it drew (report.drawn; None: none found), which the report writes to figures.json and its
    audit reads."""
    path: Path
    caption: str = ""
    drawn: dict | None = None

    def __post_init__(self) -> None:
        self.path = Path(self.path)


@dataclass
class Section:
    """One question of the seeds and what the measurements say about it.

    `sentences` are the interpretation (computed by the analysis, not here); `notes` say what was skipped or
    limited and why (e.g. "fp16 skipped: needs CUDA"). A section with no sentence, table or figure renders a
    visible "no data" line.
    """
    id: str
    title: str
    question: str = ""
    sentences: list[str] = field(default_factory=list)
    tables: list[TableBlock] = field(default_factory=list)
    figures: list[FigureBlock] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _check_ident("section id", self.id)
        names = [t.name for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"section {self.id!r}: duplicate table names {dupes}; each table needs its own name")

    @property
    def is_empty(self) -> bool:
        """True when there is nothing measured to show (notes alone explain an absence, they are not data)."""
        return not (self.sentences or self.tables or self.figures)


@dataclass
class Recommendation:
    """One recommendation, and the section that holds its evidence (its first figure is shown beside it)."""
    text: str
    section: str | None = None


@dataclass
class Report:
    """A whole study report. `environment` is shown sorted by key so equal reports render identically."""
    title: str
    subtitle: str = ""
    recommendations: list[str | Recommendation] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    command: str = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError when two sections share an id or two tables a file name; the renderer calls this
        again because sections are often appended after construction."""
        ids = [s.id for s in self.sections]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"report: duplicate section ids {dupes}; each section needs its own id")
        # "a_b" + table "c" and "a" + table "b_c" would both write tables/a_b_c.csv.
        stems = [f"{s.id}_{t.name}" for s in self.sections for t in s.tables]
        clashes = sorted({x for x in stems if stems.count(x) > 1})
        if clashes:
            raise ValueError(f"report: tables {clashes} would share a file name; rename a section id or table")
