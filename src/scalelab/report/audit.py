"""The built report held to its own figures (analysis.shown_checks) table by table, as a reader sees it: the
columns each table shows, its caption and its section's sentences are data here, not only the CSVs.

    faults = report_faults(report)   # [] is the bar: tests/unit/report/test_audit.py, tests/cli/test_store_fixture.py
"""
from __future__ import annotations

from scalelab.analysis.shown_checks import table_faults
from scalelab.report.document import Report


def report_faults(report: Report) -> list[str]:
    """One line per fault of every table of the report (analysis.shown_checks.table_faults)."""
    out = []
    for section in report.sections:
        for table in section.tables:
            out += table_faults(f"{section.id}/{table.name}", table.frame, table.columns, table.caption,
                                section.sentences)
    return out
