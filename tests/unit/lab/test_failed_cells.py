"""A cell that failed (issue 60 item 9): its experiment's section says which cell, why and how to re-measure it;
the study counts such cells (lab.base.failed_cells) and `scalelab study` exits with EXIT_FAILED_CELLS (not 2);
a failure accepted as an outcome (a batch that does not fit) is not a failed cell."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.cli.study import EXIT_FAILED_CELLS
from scalelab.lab.base import FAILED_CELLS, REMEASURE, Context, Experiment, Result, failed_cells
from scalelab.lab.cells import Cell, CellResult
from scalelab.report.build import section_for


class Engine:
    def __init__(self, results):
        self.results = results

    def run(self, cells, group, interleave=False):
        return self.results

    def rows(self, results):
        return [{"run_id": r.run_ids[0] if r.run_ids else None, "config": {}, "summary": {}, "status": r.status,
                 "reason": r.reason, "label": r.label} for r in results]


def test_a_failed_cell_is_named_with_its_reason_and_how_to_re_measure_it(tmp_path: Path):
    ok, killed = Cell("profile", {}), Cell("profile 2", {})
    fits_not = Cell("batch 4096", {}, outcome_failure=lambda reason: "memory" in reason)
    results = [CellResult(ok, ("r1",), "completed"), CellResult(killed, ("r2",), "failed", "rank 1 killed by signal SIGKILL"),
               CellResult(fits_not, ("r3",), "failed", "out of memory")]
    experiment = Experiment(name="profile", command=None, section="profile", title="Where a step's time goes", question="q", help="h",
                            cells=lambda base, opts: [ok, killed, fits_not],
                            analyse=lambda runs, base, opts: Result("profile", {"profile": pd.DataFrame()}))
    result = experiment.execute(Context(Engine(results), tmp_path, print, tables=False), None, {})
    assert result.notes[FAILED_CELLS] == {"profile 2": f"rank 1 killed by signal SIGKILL; {REMEASURE}"}
    section, _ = section_for(experiment, result)
    assert section.notes == [f"failed cells: profile 2: rank 1 killed by signal SIGKILL; {REMEASURE}"]
    whole = Result("comm", {}, notes={"failed": "bench comm: rank 0 exited 1"})
    assert failed_cells([(experiment, result), (Experiment(name="comm", command=None, section="comm", title="c", question="q", help="h",
                                                           run=lambda c, b, o: whole), whole)]) == [
        "profile: profile 2", "comm"]
    assert EXIT_FAILED_CELLS not in (0, 1, 2)
