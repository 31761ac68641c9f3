"""One quantity, one number (issue 57), on a real quick study's scale section: the scaling table, the breakdown, the
straggler table and `scalelab explain` of the 2-worker cell give one exposed communication, one overlap and one
waiting (scalelab.analysis.view_checks), and the straggler table shows who, where and the cost."""
from __future__ import annotations

import pytest
from conftest import run_cli

from scalelab.analysis.view_checks import cell_view_faults, explain_faults
from scalelab.lab.results import frame_of, results_dir
from scalelab.store.files import read_json

pytestmark = pytest.mark.timeout(600)


def test_a_quick_studys_scale_cell_has_one_value_in_every_view(tmp_path):
    store = tmp_path / "store"
    done = run_cli(["study", "--quick", "--only", "scale", "--store", str(store), "--name", "one"], timeout=560)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    tables = {k: frame_of(v) for k, v in read_json(results_dir(store / "studies" / "one") / "scale.json")["tables"].items()}
    faults = cell_view_faults(tables)
    assert faults == [], faults
    strong = tables["scale_strong"]
    row = strong[strong["workers"] == 2].iloc[0].to_dict()
    shown = run_cli(["explain", row["run_id"], "--store", str(store)], timeout=120)
    assert shown.returncode == 0, shown.stderr
    print("\n" + shown.stdout)
    cell = [line for line in shown.stdout.splitlines() if line.startswith(("this run is", "  the cell"))]
    assert cell and "one's cell (strong scaling, 2 workers at global batch 64)" in cell[0], shown.stdout
    assert explain_faults(cell, row) == []
    md = (store / "studies" / "one" / "report" / "report.md").read_text()
    assert "| workers | global_batch | straggler_rank | straggler_node | stage | caused(ms)" in md
