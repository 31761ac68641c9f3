"""The built report held to its own figures (analysis.shown_checks) table by table, and its figures to their
tables (analysis.figure_checks) as each recorded what it drew (report.drawn), as a reader sees them: the columns
each table shows, its caption, its section's sentences, a figure's legend, axis labels and caption are data here,
not only the CSVs.

    faults = report_faults(report)   # [] is the bar: tests/unit/report/test_audit.py, tests/cli/test_store_fixture.py
"""
from __future__ import annotations

from scalelab.analysis.figure_checks import figure_faults
from scalelab.analysis.shown_checks import table_faults
from scalelab.report.document import Report


def report_faults(report: Report) -> list[str]:
    """One line per fault of every table (analysis.shown_checks.table_faults) and every figure
    (analysis.figure_checks.figure_faults, against its section's tables) of the report."""
    out = []
    for section in report.sections:
        for table in section.tables:
            out += table_faults(f"{section.id}/{table.name}", table.frame, table.columns, table.caption,
                                section.sentences)
        tables = {table.name: table.frame for table in section.tables}
        for figure in section.figures:
            out += figure_faults(f"{section.id}/{figure.path.name}", figure.drawn, figure.caption, tables)
    return out
