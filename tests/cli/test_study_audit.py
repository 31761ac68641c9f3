"""Issue 60: `scalelab study` and `scalelab report` hold the built report to its own figures (report.audit) besides
its words (lab.study.audit): each fault one line in the terminal (cut to its width, whole in report/audit.txt),
and a report with faults did not finish clean (EXIT_AUDIT_FAULTS, not 0, not 2, not the failed cells' 3)."""
from __future__ import annotations

import io
import json
import shutil

import pandas as pd
from rich.console import Console

from conftest import FIXTURES
from scalelab.cli import main, study
from scalelab.cli.study import AUDIT_FILE, EXIT_AUDIT_FAULTS, EXIT_FAILED_CELLS, clipped, print_audit, study_audit
from scalelab.report.document import Report, Section, TableBlock


def exit_code(argv) -> int:
    try:
        main(argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def fixture_study(tmp_path):
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "store_v0", root)
    spec = root / "studies" / "fixture" / "study.json"
    spec.write_text(spec.read_text().replace("/FIXTURE_STORE", str(root)))
    return root / "studies" / "fixture"


def test_the_study_audit_counts_the_built_reports_faults():
    planted = pd.DataFrame({"segments": [0], "throughput(samples/s)": [51.71], "ci_low": [289.7], "ci_high": [352.9]})
    report = Report(title="t", sections=[Section(id="checkpointing", title="c", question="q",
                                                 tables=[TableBlock("c", planted)])])
    assert study_audit([], report) == ["checkpointing/c: interval 'ci_low' names no figure of the table",
                                       "checkpointing/c: interval 'ci_high' names no figure of the table"]
    assert EXIT_AUDIT_FAULTS not in (0, 1, 2, EXIT_FAILED_CELLS)


def test_each_fault_is_one_line_no_wider_than_the_terminal(monkeypatch, tmp_path):
    out = io.StringIO()
    monkeypatch.setattr(study, "console", Console(file=out, width=80))
    faults = ["scaling/scale_strong (workers 2): efficiency 0.8 lies outside its interval " + "x" * 100, "short"]
    print_audit(faults, tmp_path / AUDIT_FILE)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("audit: 2 fault(s)") and max(map(len, lines)) <= 80
    assert lines[-2].startswith("  scaling/scale_strong (workers 2)") and lines[-2].endswith("…")
    assert lines[-1] == "  short"
    assert clipped("abc", 3) == "abc" and clipped("abcd", 3) == "ab…"


def test_report_passes_its_audit_and_fails_on_a_planted_fault(tmp_path, capsys):
    folder = fixture_study(tmp_path)
    assert exit_code(["report", str(folder)]) == 0
    assert "audit: passed" in capsys.readouterr().out
    assert (folder / "report" / AUDIT_FILE).read_text() == ""
    # the saved profile table's first share raised by 20 points: its shares no longer sum to 100 %
    path = folder / "results" / "profile.json"
    data = json.loads(path.read_text())
    table = data["tables"]["profile"]
    table["data"][0][table["columns"].index("share(%)")] += 20.0
    path.write_text(json.dumps(data))
    assert exit_code(["report", str(folder)]) == EXIT_AUDIT_FAULTS
    printed = capsys.readouterr().out
    assert "audit: 1 fault(s)" in printed and "sum to 120.0 %, not 100 %" in printed
    assert "sum to 120.0 %" in (folder / "report" / AUDIT_FILE).read_text()
