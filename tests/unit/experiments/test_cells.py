"""The cell engine on real tiny 1-rank runs: one cell per config in a study, repeats, interleaved rounds, replay,
failures (errors and outcomes)."""
from __future__ import annotations

import dataclasses

import pytest

from conftest import quiet_cells
from scalelab.config import TrainConfig
from scalelab.errors import ScalelabError
from scalelab.lab import cells as engine
from scalelab.lab.cells import Cell, replay_only, with_fields

pytestmark = pytest.mark.timeout(240)


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", dataset="synthetic", samples=64, eval_samples=16, global_batch=16, steps=2,
                warmup_steps=1)
    return TrainConfig(**{**base, **kw})


BAD_MODEL = ("from torch import nn\nclass M(nn.Module):\n    def forward(self, x):\n        raise ValueError('x')\n"
             "    def __init__(self, spec):\n        super().__init__()\n        self.l = nn.Linear(1, 1)\n"
             "def make(spec):\n    return M(spec)\n")


def oldest_first(store, **filters) -> list[dict]:
    ids = list(store.list_runs(**filters)["run_id"])[::-1]  # the catalog lists newest first
    return [store.get(i) for i in ids]


def test_identical_configs_in_two_groups_of_one_study_are_one_cell(store):
    cells = quiet_cells(store, "st")
    [first] = cells.run([Cell("a", tiny())], group="one")
    [second] = cells.run([Cell("same config, other label", tiny(run_id="other"))], group="two")
    assert (first.status, first.reused) == ("completed", False)
    assert (second.status, second.reused) == ("completed", True)
    assert second.run_ids == first.run_ids
    assert len(store.list_runs()) == 1
    # a fresh engine (another process) on the same study finds it too; another study does not share it
    assert quiet_cells(store, "st").run([Cell("a", tiny())], group="three")[0].reused
    [other] = quiet_cells(store, "elsewhere").run([Cell("a", tiny())], group="one")
    assert not other.reused and len(store.list_runs()) == 2


def test_repeats_give_that_many_runs_and_more_repeats_add_only_the_missing(store):
    cells = quiet_cells(store, "st")
    [res] = cells.run([Cell("x", tiny(), repeats=3)], group="g")
    assert res.status == "completed" and len(res.run_ids) == 3 and len(set(res.run_ids)) == 3
    assert list(res.run_ids) == [r["run_id"] for r in oldest_first(store)]  # oldest first
    assert len(store.list_runs(study="st/g")) == 3
    assert len(cells.runs([res], all_repeats=True)) == 3 and cells.runs([res])[0]["run_id"] == res.run_ids[-1]
    [again] = cells.run([Cell("x", tiny(), repeats=4)], group="g")
    assert len(again.run_ids) == 4 and again.run_ids[:3] == res.run_ids and not again.reused
    assert len(store.list_runs()) == 4
    with pytest.raises(ScalelabError):
        Cell("x", tiny(), repeats=0)


def test_interleaved_repeats_run_in_rounds(store):
    a, b = Cell("A", tiny(global_batch=8), repeats=2), Cell("B", tiny(global_batch=16), repeats=2)
    results = quiet_cells(store, "st").run([a, b], group="g", interleave=True)
    assert [len(r.run_ids) for r in results] == [2, 2]
    assert [r["config"]["global_batch"] for r in oldest_first(store)] == [8, 16, 8, 16]  # A B A B
    store2 = type(store)(store.root.parent / "plain")
    quiet_cells(store2, "st").run([a, b], group="g")
    assert [r["config"]["global_batch"] for r in oldest_first(store2)] == [8, 8, 16, 16]  # A A B B


def test_replay_only_runs_nothing_and_reports_missing_cells(store):
    cells = quiet_cells(store, "st")
    [done] = cells.run([Cell("stored", tiny())], group="g")
    with replay_only():
        results = quiet_cells(store, "st").run([Cell("stored", tiny()), Cell("absent", tiny(global_batch=8))],
                                               group="g")
    assert [r.status for r in results] == ["completed", "missing"]
    assert results[0].run_ids == done.run_ids and results[0].reused
    assert results[1].run_ids == () and results[1].reason == "not in the store"
    assert len(store.list_runs()) == 1  # nothing ran
    rows = cells.rows(results)
    assert [r["status"] for r in rows] == ["completed", "missing"] and rows[1]["run_id"] is None
    assert rows[1]["config"]["global_batch"] == 8


def test_failed_cell_is_reported_and_the_grid_goes_on(store, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_MODEL)
    cells = quiet_cells(store, "g")
    results = cells.run([Cell("bad", tiny(model=f"{bad}:make")), Cell("good", tiny())], group="grid")
    assert [r.status for r in results] == ["failed", "completed"]
    assert "ValueError" in results[0].reason
    assert store.get(results[0].run_id)["status"] == "failed"  # the failed attempt stays in the store
    # an error is not an outcome: running the grid again tries the failed cell again, and only it
    again = cells.run([Cell("bad", tiny(model=f"{bad}:make")), Cell("good", tiny())], group="grid")
    assert [r.status for r in again] == ["failed", "completed"] and again[1].reused
    assert len(store.list_runs(status="failed")) == 2 and len(store.list_runs(status="completed")) == 1


def test_a_failure_accepted_as_an_outcome_is_reused_without_running_again(store, tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_MODEL)
    cell = Cell("does not fit", tiny(model=f"{bad}:make"), outcome_failure=lambda reason: "ValueError" in reason)
    [first] = quiet_cells(store, "st").run([cell], group="g")
    assert first.status == "failed" and "ValueError" in first.reason and not first.reused
    ran = []
    real = engine._execute_train

    def counting(c, st, study, say):
        ran.append(c.label)
        return real(c, st, study, say)

    monkeypatch.setitem(engine._KINDS, "train", dataclasses.replace(engine._KINDS["train"], execute=counting))
    [again] = quiet_cells(store, "st").run([cell], group="g")
    assert ran == [] and again.reused
    assert (again.status, again.run_ids) == ("failed", first.run_ids) and "ValueError" in again.reason
    assert len(store.list_runs()) == 1
    # the same failure not accepted (no outcome_failure): an error, so the cell runs again
    [plain] = quiet_cells(store, "st").run([Cell("plain", cell.config)], group="g")
    assert ran == ["plain"] and plain.status == "failed" and len(store.list_runs()) == 2


def test_cell_identity_is_the_resolved_config_and_kind():
    assert Cell("a", tiny()).key == Cell("b", tiny(run_id="x", device="cpu")).key
    assert Cell("a", tiny()).key != Cell("a", with_fields(tiny(), global_batch=8)).key
    assert Cell("a", tiny()).key != Cell("a", tiny(), kind="loader").key


def test_progress_counts_cells_and_follows_the_running_run(store):
    from scalelab.lab.progress import PlainProgress

    lines, followed = [], []

    class Recorder(PlainProgress):
        def run_started(self, files) -> None:
            followed.append(files)

    cells = engine.Cells(store, "p", progress=Recorder(lines.append))
    results = cells.run([Cell("a", tiny()), Cell("b", tiny(seed=1))], group="g")
    assert [f.run_id for f in followed] == [r.run_id for r in results]  # each run's own directory, in order
    assert [f.path for f in followed] == [store.run_dir(r.run_id) for r in results]
    done = [line for line in lines if ": done in " in line]
    assert [line.split("]")[0] for line in done] == ["[g 1/2", "[g 2/2"]
    again = engine.Cells(store, "p", progress=Recorder(lines.append)).run([Cell("a", tiny())], group="g")
    assert again[0].reused and lines[-1].startswith("[g] a: already done")


def test_measuring_a_cell_again_adds_its_repeats_interleaved_and_supersedes_the_earlier_launches(store):
    a, b = Cell("A", tiny(global_batch=8), repeats=2), Cell("B", tiny(global_batch=16), repeats=2)
    cells = quiet_cells(store, "st")
    first = cells.run([a, b], group="g", interleave=True)
    again = cells.run([a, b], group="g", interleave=True, again=[a])
    assert len(store.list_runs(study="st/g/again")) == 2  # A twice more; B untouched
    assert again[0].earlier == first[0].run_ids and len(set(again[0].run_ids) & set(first[0].run_ids)) == 0
    assert again[1].run_ids == first[1].run_ids and again[1].earlier == ()
    # a later engine (a report rebuilt) sees the same: the new launches count, the earlier ones are named
    with replay_only():
        replayed = quiet_cells(store, "st").run([a, b], group="g", again=[a])
    assert replayed[0].run_ids == again[0].run_ids and replayed[0].earlier == first[0].run_ids
    assert len(store.list_runs()) == 6  # nothing ran in the replay, nothing was deleted


def test_a_held_cell_keeps_its_launches_while_the_others_grow_and_replays_so(store):
    """Racing (lab.study.top_up): within `held`, a cell whose label is held gets at most that many launches; a
    report re-derived under the same hold reads the launches it has, not a missing one."""
    cells = quiet_cells(store, "h")
    first = cells.run([Cell("fast", tiny(), repeats=2), Cell("slow", tiny(seed=1), repeats=2)], group="g",
                      interleave=True)
    assert [len(r.run_ids) for r in first] == [2, 2]
    with engine.held({"slow": 2}):
        grown = cells.run([Cell("fast", tiny(), repeats=4), Cell("slow", tiny(seed=1), repeats=4)], group="g",
                          interleave=True)
    assert [len(r.run_ids) for r in grown] == [4, 2] and grown[1].run_ids == first[1].run_ids
    assert len(store.list_runs(status="completed")) == 6
    with replay_only(), engine.held({"slow": 2}):
        again = cells.run([Cell("fast", tiny(), repeats=4), Cell("slow", tiny(seed=1), repeats=4)], group="g")
    assert [r.status for r in again] == ["completed", "completed"] and [len(r.run_ids) for r in again] == [4, 2]
