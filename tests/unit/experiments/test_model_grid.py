"""The model-grid experiment without running cells: its options, its cells (the global batch kept, one size per
cell, the memory cap on each), exact parameter counts, and bad input as one line. Real runs on 1 and 2 ranks,
and a cell that does not fit, are in tests/dist/test_model_grid_dist.py."""
from __future__ import annotations

import pytest

from scalelab.cli import main
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Context
from scalelab.lab.cells import CellResult
from scalelab.experiments.model_grid import EXPERIMENT, cell_status, grid_configs, parameter_counts, run_cells

pytestmark = pytest.mark.timeout(120)

MIB = 2**20


def base(**kw) -> TrainConfig:
    return TrainConfig(**{**dict(model="mlp", samples=16, eval_samples=8, global_batch=12, steps=3), **kw})


def test_cells_keep_the_global_batch_and_carry_size_and_cap():
    opts = EXPERIMENT.option_values({"depths": "2", "widths": [8, 16], "workers": "1,2", "memory_limit": "64MiB"})
    assert opts == {"depths": [2], "widths": [8, 16], "workers": [1, 2], "memory_limit": 64 * MIB}
    chosen = grid_configs(base(model_options="embed=32"), opts)
    assert [where for where, _ in chosen] == [{"depth": 2, "width": 8, "workers": 1},
                                             {"depth": 2, "width": 16, "workers": 1},
                                             {"depth": 2, "width": 8, "workers": 2},
                                             {"depth": 2, "width": 16, "workers": 2}]
    cfgs = [cfg for _, cfg in chosen]
    assert [c.ranks for c in cfgs] == [1, 1, 2, 2] and {c.global_batch for c in cfgs} == {12}
    assert [c.per_rank_batch for c in cfgs] == [12, 12, 6, 6]
    assert [c.model_options for c in cfgs] == ["depth=2,embed=32,width=8", "depth=2,embed=32,width=16"] * 2
    assert {c.memory_limit for c in cfgs} == {64 * MIB}
    # the base config's cap is used when the option is not given
    assert {c.memory_limit for _, c in grid_configs(base(memory_limit=32 * MIB), {**opts, "memory_limit": None})} \
        == {32 * MIB}


def test_parameter_counts_are_exact_and_allocate_nothing():
    counts = parameter_counts(base(), [(1, 16), (3, 8)])
    # 3x32x32 synthetic images, 10 classes: Linear(3072, w) + (depth - 1) x Linear(w, w) + Linear(w, 10)
    assert counts == {(1, 16): 3072 * 16 + 16 + 16 * 10 + 10,
                      (3, 8): 3072 * 8 + 8 + 2 * (8 * 8 + 8) + 8 * 10 + 10}
    assert parameter_counts(base(), [(4, 100_000)])[4, 100_000] > 3 * 10**10  # 120 GB of parameters, on meta


class ScriptedCells:
    """A cell engine whose runs end as scripted per (workers, depth, width): None = completed, else the reason."""

    def __init__(self, outcomes: dict):
        self.outcomes, self.ran = outcomes, []

    def run(self, cells, *, group):
        [cell] = cells
        key = (cell.config.ranks, cell.config.model_overrides["depth"], cell.config.model_overrides["width"])
        self.ran.append(key)
        reason = self.outcomes[key]
        return [CellResult(cell, (f"run-{len(self.ran)}",), "completed" if reason is None else "failed", reason)]


def test_smaller_models_run_first_and_vouch_for_a_larger_ones_odd_failure():
    """Under a cap, a failure that names no memory error counts as not fitting once a smaller model (depth and
    width no larger) trained on as many workers; without such a model it stays a failure."""
    odd = "rank 0 exited with code 1:   /x/scalelab/sync/meter.py(155): <lambda>"  # gloo's bad_alloc, as seen
    oom = "rank 0 exited with code 1: RuntimeError: DefaultCPUAllocator: can't allocate memory"
    engine = ScriptedCells({(1, 2, 8): None, (1, 2, 64): odd, (1, 8, 8): oom, (1, 8, 64): odd,
                            (2, 2, 8): odd, (2, 2, 64): odd, (2, 8, 8): None, (2, 8, 64): None})
    opts = EXPERIMENT.option_values({"depths": [8, 2], "widths": [64, 8], "memory_limit": "64MiB"})
    chosen = grid_configs(base(global_batch=16), opts)
    results = run_cells(Context(engine, None, lambda line: None), chosen)
    assert engine.ran == sorted(engine.ran)  # per worker count, smaller depth and width first
    status = {(w["workers"], w["depth"], w["width"]): cell_status(r) for (w, _), r in zip(chosen, results)}
    assert status == {(1, 2, 8): "completed", (1, 2, 64): "does not fit", (1, 8, 8): "does not fit",
                      (1, 8, 64): "does not fit", (2, 2, 8): "failed", (2, 2, 64): "failed",
                      (2, 8, 8): "completed", (2, 8, 64): "completed"}
    assert [r.cell.config.ranks for r in results] == [1, 1, 1, 1, 2, 2, 2, 2]  # in the grid's order


@pytest.mark.parametrize("given,field,fragment", [
    ({"depths": "0,2"}, "depths", "integers >= 1"),
    ({"depths": [2, 0]}, "depths", "integers >= 1"),
    ({"widths": "wide"}, "widths", "comma-separated integers"),
    ({"widths": [256, "x"]}, "widths", "comma-separated integers"),
    ({"workers": "0"}, "workers", "integers >= 1"),
    ({"memory_limit": "lots"}, "memory_limit", ""),
    ({"depth": 2}, "model_grid.depth", "unknown option"),
])
def test_bad_options_are_one_config_error_line(given, field, fragment):
    with pytest.raises(ConfigError) as info:
        EXPERIMENT.option_values(given)
    assert info.value.field == field and fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("cfg,opts,field,fragment", [
    (base(), {"memory_limit": None}, "memory_limit", "required on CPU"),
    (base(model="resnet18"), {}, "model", "depth and width options: mlp, cnn"),
    (base(global_batch=12), {"workers": [1, 5]}, "workers", "5 does not divide it"),
])
def test_configs_the_grid_cannot_run_are_refused_before_any_cell(cfg, opts, field, fragment):
    values = EXPERIMENT.option_values({"memory_limit": "64MiB", **opts})
    with pytest.raises(ConfigError) as info:
        grid_configs(cfg, values)
    assert info.value.field == field and fragment in str(info.value)


@pytest.mark.parametrize("argv,fragment", [
    (["--depths", "0"], "depths: '0' is not allowed; allowed: comma-separated integers >= 1"),
    (["--widths", "abc"], "widths: 'abc' is not allowed; allowed: comma-separated integers"),
    (["--depths", "2", "--widths", "8"], "memory_limit: None is not allowed; required on CPU"),
])
def test_the_command_says_bad_input_in_one_line_and_runs_nothing(argv, fragment, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["model-grid", *argv, "--store", str(tmp_path / "store"), "--out", str(tmp_path / "out")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "store" / "runs").exists() or not any((tmp_path / "store" / "runs").iterdir())


def test_on_cuda_the_gpu_is_the_limit(monkeypatch):
    from scalelab import config as config_mod

    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 2)
    with pytest.raises(ConfigError) as info:
        grid_configs(base(), EXPERIMENT.option_values({"memory_limit": "64MiB"}))
    assert info.value.field == "memory_limit" and "GPU's memory is the limit" in str(info.value)
    chosen = grid_configs(base(memory_limit=64 * MIB), EXPERIMENT.option_values({}))  # a study's CPU cap
    assert {cfg.memory_limit for _, cfg in chosen} == {None} and {cfg.resolved_device for _, cfg in chosen} == {"cuda"}
