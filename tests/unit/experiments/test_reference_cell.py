"""The study's reference cell: one rank of the base config, a cell of its own, and the switch that turns it off."""
from __future__ import annotations

import pytest

from scalelab.errors import ConfigError
from scalelab.lab.cells import Cell
from scalelab.lab.study import StudySpec, default_spec, noise_floor, reference_cell


def test_reference_is_one_rank_of_the_base_and_never_an_experiments_cell():
    spec = default_spec(quick=True)
    cell = reference_cell(spec, 2)
    assert cell.repeats == 2 and cell.config.ranks == 1 and cell.config.model == spec.base["model"]
    assert cell.key != Cell("base", spec.config("batch_sweep", ranks=1)).key
    assert cell.key == reference_cell(spec, 1).key  # start and end are one cell: the end is its second repeat


def test_reference_switch_is_validated_and_off_means_no_floor(store):
    with pytest.raises(ConfigError, match="study.reference"):
        StudySpec(reference="yes")
    assert noise_floor(StudySpec(reference=False), store) is None
    assert noise_floor(StudySpec(), store) is None  # nothing stored yet: no floor, nothing run
    assert not (store.root / "runs").exists() or not any((store.root / "runs").iterdir())
