"""A report's figures held to their tables, read from what each figure recorded it drew (report.drawn: per axes
its title, axis labels and legend entries as drawn; per series the table and column it reads). Pure: each check
reads one figure's record, its caption and its section's tables and returns one line per fault, none when it holds:
- `legend_faults`: every legend entry is a declared series, and each series reads a column that exists in its
  table, with a value where the series has a legend entry (a reference line such as "ideal" reads none); a
  figure with no record is a fault, one whose record declares no series (`series` null) is held to its texts
  only (the two checks below);
- `axis_unit_faults`: an axis label names its unit, and it is the unit of the columns plotted on that axis, after
  the factor they were drawn at (bytes x 1e-6 -> MB, a fraction x 100 -> %, s x 1000 -> ms: CONVERSIONS); a pie's
  wedges are on no axis;
- `figure_coverage_faults`: a caption, legend entry or axis label that calls an interval a "95 % interval" is
  one: no row of a table it plots rests on fewer values (`n`) than make one (shown_checks.coverage_faults);
- `compute_faults`: every text of a figure that defines compute ("compute (...)", "compute, the ...") uses the
  one definition, COMPUTE_LABEL (docs/definitions.md, "Exposed communication"): a caption and its legend cannot
  disagree.
`figure_faults` applies them all; report.audit applies it to every figure of a built report.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

import pandas as pd

from scalelab.analysis.shown_checks import CALLED_95, coverage_faults

# compute in every legend and caption that splits a step: the same config with no-op collectives, at its fastest
# rank (docs/definitions.md); one wording, so a caption and its legend cannot disagree
COMPUTE_LABEL = "compute (median step with no-op collectives, at its fastest rank)"

# (unit of the column, factor it is drawn at) -> the unit its axis shows
CONVERSIONS = {("bytes", 1e-6): "MB", ("bytes", 2.0 ** -20): "MiB", ("bytes", 2.0 ** -30): "GiB",
               ("GiB", 2.0 ** 10): "MiB", ("s", 1e3): "ms", ("ms", 1e-3): "s", ("", 100.0): "%"}
DIMENSIONLESS = ("", "x")  # how an axis of a ratio (speedup, a count) may name its unit


def column_unit(column: str) -> str:
    """A column's unit: its parenthesised suffix ("step(ms)" -> "ms"); "bytes" for a byte count named without
    one ("bytes_backward_per_step"); "" for a ratio or a count."""
    match = re.search(r"\(([^()]*)\)\s*$", column)
    if match:
        return match[1]
    return "bytes" if "bytes" in column else ""


def axis_unit(label: str) -> str | None:
    """The unit an axis label names: the first word of its first parenthesised group ("time per step (ms)" ->
    "ms"; "speedup (x, epoch times)" -> "x"; "data wait (% of step)" -> "%"); None when it names none."""
    match = re.search(r"\(([^()]*)\)", label)
    if not match:
        return None
    words = re.split(r"[,;=\s]+", match[1].strip(), maxsplit=1)
    return words[0] if words else ""


def drawn_unit(unit: str, scale: float) -> str | None:
    """The unit of a column in `unit` drawn at `scale` (None: no unit known for that factor)."""
    if math.isclose(scale, 1.0):
        return unit
    return next((shown for (u, f), shown in CONVERSIONS.items() if u == unit and math.isclose(f, scale)), None)


def _series(drawn: Mapping) -> list[Mapping]:
    return list(drawn.get("series") or [])


def legend_faults(name: str, drawn: Mapping | None, tables: Mapping[str, pd.DataFrame]) -> list[str]:
    if drawn is None:
        return [f"{name}: the figure has no record of what it drew"]
    if drawn.get("series") is None:  # declares none: held to its texts only (coverage, compute)
        return []
    series = _series(drawn)
    declared = {s["label"] for s in series}
    out = [f"{name}: legend entry {entry!r} is no series the figure declares it read"
           for ax in drawn.get("axes", []) for entry in ax.get("legend", []) if entry not in declared]
    for s in series:
        if s.get("column") is None:
            continue
        frame = tables.get(s.get("table"))
        if frame is None:
            out.append(f"{name}: series {s['label']!r} reads table {s.get('table')!r}, which its section does not "
                       "hold")
        elif s["column"] not in frame.columns:
            out.append(f"{name}: series {s['label']!r} reads {s['column']!r}, which table {s['table']!r} does not "
                       "have")
        elif s["label"] and not pd.to_numeric(frame[s["column"]], errors="coerce").notna().any():  # a legend entry
            out.append(f"{name}: series {s['label']!r} reads {s['column']!r}, which has no value in table "
                       f"{s['table']!r}")
    return out


def axis_unit_faults(name: str, drawn: Mapping | None) -> list[str]:
    if drawn is None:
        return []
    axes = drawn.get("axes", [])
    out = []
    for s in (s for s in _series(drawn) if s.get("column") is not None and s.get("axis", 0) is not None):
        i = int(s.get("axis", 0))
        if i >= len(axes):
            out.append(f"{name}: series {s['label']!r} is on axes {i}, which the figure does not have")
            continue
        label = axes[i].get("ylabel", "")
        named = axis_unit(label)
        plotted = drawn_unit(column_unit(s["column"]), float(s.get("scale", 1.0)))
        if named is None:
            out.append(f"{name}: the axis of {s['label']!r} ({label!r}) names no unit")
        elif plotted is None:
            out.append(f"{name}: series {s['label']!r} draws {s['column']!r} at x{s.get('scale')}, which has no "
                       "known unit")
        elif named != plotted and not (named in DIMENSIONLESS and plotted in DIMENSIONLESS):
            out.append(f"{name}: the axis of {s['label']!r} is in {named or 'no unit'} ({label!r}), its column "
                       f"{s['column']!r} drawn in {plotted or 'no unit'}")
    return out


def texts(drawn: Mapping | None, caption: str) -> list[str]:
    """Every text a reader sees with a figure: its caption, titles, axis labels and legend entries."""
    out = [caption]
    for ax in (drawn or {}).get("axes", []):
        out += [ax.get("title", ""), ax.get("xlabel", ""), ax.get("ylabel", ""), *ax.get("legend", [])]
    return [t for t in out if t]


def figure_coverage_faults(name: str, drawn: Mapping | None, caption: str,
                           tables: Mapping[str, pd.DataFrame]) -> list[str]:
    said = [t for t in texts(drawn, caption) if re.search(CALLED_95, t)]
    if not said:
        return []
    read = dict.fromkeys(s.get("table") for s in _series(drawn or {}) if s.get("column") is not None)
    return [f for table in read if table in tables
            for f in coverage_faults(f"{name} ({table})", tables[table], said[0])]


def compute_faults(name: str, drawn: Mapping | None, caption: str) -> list[str]:
    out = []
    for text in texts(drawn, caption):
        # "compute (...)" or "compute, the ...": compute defined in place, which must be the one definition
        for match in re.finditer(r"\bcompute(?: \(|, the )", text, flags=re.IGNORECASE):
            if not text[match.start():].lower().startswith(COMPUTE_LABEL.lower()):
                said = re.split(r"[);]", text[match.start():])[0].rstrip(".") + (")" if "(" in match[0] else "")
                out.append(f"{name}: {said!r} is not the one definition of compute ({COMPUTE_LABEL!r})")
    return out


def figure_faults(name: str, drawn: Mapping | None, caption: str = "",
                  tables: Mapping[str, pd.DataFrame] | None = None) -> list[str]:
    """Every fault of one figure as its record and caption show it (module docstring)."""
    tables = tables or {}
    return (legend_faults(name, drawn, tables) + axis_unit_faults(name, drawn)
            + figure_coverage_faults(name, drawn, caption, tables) + compute_faults(name, drawn, caption))
