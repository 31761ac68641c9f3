"""The model-grid figures draw from the grid table alone: with memory by kind, without it, and when nothing fits."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.analysis.model_grid import grid_table
from scalelab.analysis.figure_checks import figure_faults
from scalelab.experiments import model_grid as figures
from scalelab.report.drawn import read_record

MIB = 2**20
BY_KIND = {keys.STEP_MEDIAN_MS: 10.0, keys.MEMORY_PARAMETERS_BYTES: 4 * MIB, keys.MEMORY_GRADIENTS_BYTES: 4 * MIB,
           keys.MEMORY_OPTIMIZER_BYTES: 4 * MIB, keys.MEMORY_ACTIVATIONS_BYTES: 20 * MIB,
           keys.MEMORY_ACTIVATIONS_PEAK_BYTES: 24 * MIB, keys.MEMORY_TRAIN_ADDED_BYTES: 40 * MIB}
OLD = {keys.STEP_MEDIAN_MS: 4.0, keys.MEMORY_TRAIN_ADDED_BYTES: 1e6}  # before memory by kind was recorded


def cell(depth, width, workers, summary=None, status="completed") -> dict:
    return {"depth": depth, "width": width, "workers": workers, "global_batch": 64, "parameters": 1000,
            "status": status, "reason": None if status == "completed" else "out of memory", "run_id": None,
            "summary": summary}


@pytest.mark.parametrize("cells", [
    [cell(2, 64, 1, BY_KIND), cell(2, 64, 2, BY_KIND), cell(4, 64, 1, status="does not fit"),
     cell(4, 64, 2, BY_KIND), cell(2, 128, 1, status="failed"), cell(4, 128, 2, BY_KIND)],
    [cell(2, 8, 1, OLD), cell(2, 16, 1, status="does not fit")],
    [cell(4, 8, 1, status="does not fit"), cell(4, 8, 2, status="does not fit")],
], ids=["by-kind", "not-recorded", "nothing-fits"])
def test_heatmaps_and_memory_bars_are_written(tmp_path, cells):
    grid = grid_table(cells)
    paths = [figures.model_grid_heatmaps(grid, tmp_path / "grid.png"),
             figures.model_grid_memory(grid, tmp_path / "memory.png")]
    for path in paths:
        assert path.exists() and path.read_bytes()[:4] == b"\x89PNG"
        # what each drew, as recorded beside it, holds to the table (no legend entry for a kind nobody recorded)
        assert figure_faults(path.name, read_record(path), "", {"model_grid": grid}) == []
