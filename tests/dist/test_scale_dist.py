"""The scale experiment end to end on a tiny config: real 1- and 2-rank gloo runs, strong and weak, with the
baseline (the same config with no-op collectives) of each multi-rank cell."""
from __future__ import annotations

import pytest

from conftest import run_experiment
from scalelab.analysis import breakdown, keys
from scalelab.analysis.breakdown import sum_of_parts
from scalelab.config import TrainConfig
from scalelab.store import RunDir

pytestmark = pytest.mark.timeout(300)


def test_scale_strong_and_weak_with_a_no_op_collectives_baseline(store, tmp_path):
    base = TrainConfig(model="mlp", samples=128, eval_samples=16, steps=4, warmup_steps=1)
    res = run_experiment("scale", base, store, "sc", tmp_path, workers=[1, 2], batches=[32], launches=1)
    strong, weak = res.tables["scale_strong"], res.tables["scale_weak"]
    assert list(strong["workers"]) == [1, 2] and list(strong["global_batch"]) == [32, 32]
    assert list(weak["global_batch"]) == [32, 64]
    two = strong[strong["workers"] == 2].iloc[0]
    assert two["comm/bytes_per_step"] > 0 and two["compute(ms)"] > 0
    nosync_id = two["baseline_run_id"]
    nosync = store.get(nosync_id)
    run = store.get(two["run_id"])
    assert {k for k in run["config"] if run["config"][k] != nosync["config"].get(k)} == {"noop_collectives"}
    # the baseline of this very cell, at its fastest rank (docs/definitions.md, "Exposed communication"; issue 57)
    assert two["compute(ms)"] == breakdown.step(nosync["summary"], fastest=True).value
    assert two["exposed_comm(ms)"] == pytest.approx(two["step(ms)"] - two["compute(ms)"])
    assert two["comm/wait(ms)"] > 0
    assert two["quality"] == "ok" or two["quality"].startswith(("implausible", "noisy", "baseline noisy", "re-measured"))
    # 1 and 2 workers, the baseline of 2 and its no-sync variant
    assert len(store.list_runs(study="sc/scale_strong")) == 4
    assert any(p.name == "scale_strong.png" for p in res.files)
    # the lost-speedup breakdown of the 2-worker cell, every part measured, adding up to its measured step
    lost = res.tables["scale_strong_lost_speedup"]
    assert set(lost["workers"]) == {2} and lost["measured"].all(), lost
    assert sum_of_parts(lost) == pytest.approx(two["step(ms)"])
    assert any(p.name == "scale_strong_lost_speedup.png" for p in res.files)


def test_compared_cells_launched_three_times_in_rounds_pool_into_one_figure(store, tmp_path):
    """launches=3: every cell (1 worker, 2 workers, the baseline of 2, its no-sync variant) runs three times, in
    rounds (A B C D, A B C D, A B C D), and each table row is all three: its median step is the median of every launch's steps and its interval
    reaches each launch's own median."""
    import statistics

    from scalelab.analysis.summary import timed_step_ms

    base = TrainConfig(model="mlp", samples=128, eval_samples=16, steps=5, warmup_steps=1)
    res = run_experiment("scale", base, store, "sc3", tmp_path, workers=[1, 2], batches=[32], mode=["strong"],
                         launches=3)
    runs = store.list_runs(study="sc3/scale_strong")
    assert len(runs) == 12
    # interleaved in rounds: the first four runs (list_runs is newest first) are the four different cells
    oldest_first = [store.get(r)["config"] for r in reversed(list(runs["run_id"]))]
    first_round = {(c["ranks"], c.get("noop_collectives", False), c["sync"]) for c in oldest_first[:4]}
    assert first_round == {(1, False, "auto"), (2, False, "ddp"), (2, True, "ddp"), (2, False, "noop")}
    table = res.tables["scale_strong"].set_index("workers")
    for workers in (1, 2):
        row = table.loc[workers]
        run = store.get(row["run_id"])
        # a cell measured once more (a noisy launch: quality "re-measured") pools its 3 newest launches, which
        # live in the study's "again" group
        every = [store.get(r) for study in ("sc3/scale_strong", "sc3/scale_strong/again")
                 for r in store.list_runs(study=study)["run_id"]]
        mine = sorted((r for r in every if r["config"] == run["config"]), key=lambda r: (r["created"], r["run_id"]))
        assert len(mine) in (3, 6)
        cell_runs = mine[-3:]
        assert row["run_id"] in [r["run_id"] for r in cell_runs]
        # a launch flagged noisy among enough clean ones is set aside (analysis.repeats), said in the quality
        clean = [r for r in cell_runs if not r["summary"].get(keys.QUALITY_NOISY)]
        if len(clean) < 3 and len(clean) >= 2:
            assert row["launches"] == len(clean) and "launches set aside" in row["quality"], row["quality"]
            cell_runs = clean
        else:
            assert row["launches"] == 3
        launches = [timed_step_ms(RunDir(r["dir"]).read_steps()) for r in cell_runs]
        medians = [statistics.median(steps) for steps in launches]
        assert row["step_ci_low(ms)"] <= min(medians) and row["step_ci_high(ms)"] >= max(medians)
        # the median of every launch's steps together (with an even count of steps per launch this may lie
        # outside the launches' own medians, so the definition is checked, not a range)
        assert row["step(ms)"] == pytest.approx(statistics.median([t for steps in launches for t in steps]))
