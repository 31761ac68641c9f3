"""The progress's ETA: from finished cells, and before any has finished from an auto-length run's budget."""
from __future__ import annotations

import pytest

from scalelab.lab.progress import PlainProgress, auto_budget
from scalelab.store.rundir import RunDir


def run_files(tmp_path, config: dict) -> RunDir:
    files = RunDir(tmp_path / "run")
    files.path.mkdir(parents=True, exist_ok=True)
    files.write_config(config)
    return files


def test_an_auto_length_run_estimates_cells_by_warm_up_plus_budget_until_one_finishes(tmp_path):
    lines = []
    progress = PlainProgress(lines.append)
    progress.group("strategies", 3)
    progress.cell_started("ddp")
    progress.run_started(run_files(tmp_path, {"steps": "auto", "time_budget_s": 10.0, "warmup_steps": 2}))
    assert progress.eta() == 30.0  # 3 cells of at most 10 s of timed steps each
    progress.warmup_s = 2.0  # what a live display saw: the run passed its warm-up 2 s after the cell began
    assert progress.eta() == 36.0
    progress.cell_done("ddp", "done", seconds=4.0)  # finished cells win: they took 4 s each
    assert progress.eta() == 8.0 and "ETA 0:08" in lines[-1]


def test_a_fixed_length_run_gives_no_estimate_before_a_cell_finishes(tmp_path):
    progress = PlainProgress(lambda line: None)
    progress.group("scale", 2)
    progress.run_started(run_files(tmp_path, {"steps": 20, "time_budget_s": 10.0}))
    assert progress.eta() is None
    assert auto_budget(RunDir(tmp_path / "missing")) is None  # no readable config: no estimate


@pytest.mark.parametrize("config,budget", [({"steps": "auto"}, 30.0), ({"steps": "auto", "time_budget_s": 5}, 5.0),
                                           ({"steps": None}, None)])
def test_auto_budget_reads_the_stored_config(tmp_path, config, budget):
    assert auto_budget(run_files(tmp_path, config)) == budget
