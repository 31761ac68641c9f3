"""What a figure drew, recorded as data beside its image, so that the report's audit reads a figure as it reads a
table (analysis.figure_checks) instead of trusting a constant.

`figures.save` writes `<stem>.figure.json` beside every PNG it saves:

    {"axes": [{"title": ..., "xlabel": ..., "ylabel": ..., "legend": [entries as drawn]}, ...],
     "series": [{"label": "exposed communication", "table": "scale_strong", "column": "exposed_comm(ms)",
                 "scale": 1.0, "axis": 0}, ...]}          # or null: the figure declares none

Titles, axis labels and legend entries are read from the drawn figure itself (matplotlib's own texts, what a reader
sees); the series are what the plotting code declares it read (`Series`): a plot reads its table and nothing else
(STYLE.md), so the table and column of each legend entry are known where it is drawn. The report copies these
records into report/figures.json (report.render) and its audit holds them to the tables (report.audit).
No matplotlib import here: `scalelab report` reads the records without drawing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from scalelab.errors import StoreError
from scalelab.store import read_json, write_json_atomic

SUFFIX = ".figure.json"


@dataclass(frozen=True)
class Series:
    """One plotted series: its legend `label`, the `table` (a result's table key) and `column` it reads (None: a
    reference line such as "ideal", which reads no table), the factor its values are multiplied by before they are
    drawn (`scale`: 1e-6 for bytes drawn as MB, 100 for a fraction drawn in %) and the index of its axes among the
    figure's (a twin axis is another axes; None: drawn on no value axis, a pie's wedge)."""
    label: str
    table: str | None = None
    column: str | None = None
    scale: float = 1.0
    axis: int | None = 0


def record_path(image: Path) -> Path:
    """The record of the figure saved as `image` (a.png -> a.figure.json, beside it)."""
    image = Path(image)
    return image.with_name(image.stem + SUFFIX)


def texts_of(fig) -> list[dict]:
    """Per axes of `fig` (in fig.axes order): its title, axis labels and legend entries as drawn; a legend drawn on
    the figure rather than an axes counts as the first axes'."""
    out = []
    for ax in fig.axes:
        legend = ax.get_legend()
        out.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                    "legend": [t.get_text() for t in legend.get_texts()] if legend else []})
    for legend in getattr(fig, "legends", []) or []:
        if out:
            out[0]["legend"] += [t.get_text() for t in legend.get_texts()]
    return out


def record_of(fig, series: list[Series] | None) -> dict:
    return {"axes": texts_of(fig), "series": None if series is None else [asdict(s) for s in series]}


def write_record(fig, image: Path, series: list[Series] | None) -> Path:
    path = record_path(image)
    write_json_atomic(path, record_of(fig, series))
    return path


def read_record(image: Path) -> dict | None:
    """The record saved beside `image`, or None (a figure drawn before records existed, or an unreadable one:
    the audit then says the figure has no record)."""
    path = record_path(image)
    try:
        return read_json(path) if path.is_file() else None
    except StoreError:
        return None
