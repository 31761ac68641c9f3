"""No loss of behaviour across the restructure: a store written by scalelab 0.1 (tests/fixtures/store_v0: a quick
study of profile, batch_sweep, strategies and comm, one plain run and one failed run) gives the same
`runs list`, `runs show` and `report` tables as that version printed (tests/fixtures/store_v0_expected).

Columns may differ only by the renames in RENAMED (old name -> new name); rows and values are the same.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import FIXTURES
from scalelab.analysis.tables import interval_parts
from scalelab.cli import main
from scalelab.experiments.comm import SINGLE_CALL

FIXTURE = FIXTURES / "store_v0"
EXPECTED = FIXTURES / "store_v0_expected"
# `runs list` / `runs show`: the catalog's "strategy" column was the model wrapper; a "sync" column is new.
RENAMED: dict[str, str] = {"strategy": "wrapper"}
ADDED = {"sync"}
# report tables: in compare_strategies the sync variant column was "strategy" and the config's sync value "sync".
RENAMED_TABLES: dict[str, str] = {"strategy": "sync", "sync": "sync_config"}
# Issue 12 redefined exposed communication: a run's baseline is the same config with no-op collectives, which a
# 0.1 store never measured, so these columns of its comparison are now empty rather than computed against the
# `noop` run; the table gains the new definitions' columns.
REDEFINED = {"compare_strategies": {"compute(ms)", "exposed_comm(ms)", "overlap", "noop_run_id"}}
ADDED_TABLE_COLUMNS = {"compare_strategies": {"launches", "step_ci_low(ms)", "step_ci_high(ms)", "comm_sum(ms)", "comm_wait(ms)",
                                              "exposed_ci_low(ms)",
                                              "exposed_ci_high(ms)", "overlap_ci_low", "overlap_ci_high", "quality",
                                              "baseline_run_id",
                                              # issue 28: the critical path and the checks of its overlap
                                              "comm_critical(ms)", "comm_critical_ci_high(ms)",
                                              "waiting_for_peers(ms)", "blocks", "interference(ms)",
                                              # issue 28: a finding between rows counts launches
                                              "step_launch_min(ms)", "step_launch_max(ms)",
                                              # issue 57: the part under compute, overlap's twin in ms
                                              "hidden(ms)", "hidden_ci_low(ms)", "hidden_ci_high(ms)",
                                              # issue 56: the noise model's inputs (launch medians, the
                                              # step-to-step spread within launches)
                                              "step_launch_medians(ms)", "step_log_var_within",
                                              "step_log_var_within_dof"}}
# Issue 13: `bench comm` times a back-to-back loop and gives the median's interval; a 0.1 store's bench run has
# neither, so these columns are empty (its busbw is the one it stored, from the median of single calls).
EMPTY_NEW_COLUMNS = {"comm": {"time_loop(us)", "time_ci_low(us)", "time_ci_high(us)"}}
# Issue 60: the system section gains the loopback network's bytes/s (the old store's samples have its counter)
ADDED_SYSTEM_COLUMNS = {"loopback_sent_mean(MB/s)"}
# Issue 13: every table's headline column gains n, its interval, launches and quality. A 0.1 store has no
# interval for throughput or stage times (empty), launched each cell once and flagged nothing.
HEADLINE_COLUMNS = {"n", "launches", "quality"}  # and the headline's interval, named after it (issue 60)


def _store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(FIXTURE, root)
    spec = root / "studies" / "fixture" / "study.json"
    spec.write_text(spec.read_text().replace("/FIXTURE_STORE", str(root)))
    return root


def _renamed(record: dict) -> dict:
    return {RENAMED.get(k, k): v for k, v in record.items()}


def test_runs_list_of_an_old_store_is_unchanged(tmp_path, capsys):
    root = _store(tmp_path)
    try:
        main(["runs", "list", "--json", "--limit", "100", "--store", str(root)])
    except SystemExit as e:
        assert e.code in (0, None)
    got = json.loads(capsys.readouterr().out)
    want = [_renamed(r) for r in json.loads((EXPECTED / "runs_list.json").read_text())]
    assert [r["run_id"] for r in got] == [r["run_id"] for r in want]
    for g, w in zip(got, want):
        assert set(g) == set(w) | ADDED
        assert {k: g[k] for k in w} == w


@pytest.mark.parametrize("path", sorted((EXPECTED / "show").glob("*.json")), ids=lambda p: p.stem)
def test_runs_show_of_an_old_store_is_unchanged(tmp_path, capsys, path):
    root = _store(tmp_path)
    try:
        main(["runs", "show", path.stem, "--store", str(root)])
    except SystemExit as e:
        assert e.code in (0, None)
    got = json.loads(capsys.readouterr().out)
    got.pop("dir")
    want = _renamed(json.loads(path.read_text()))
    assert set(got) == set(want) | ADDED
    assert {k: got[k] for k in want} == want


def test_report_of_an_old_store_gives_the_same_tables(tmp_path, capsys):
    root = _store(tmp_path)
    study = root / "studies" / "fixture"
    try:
        main(["report", str(study)])
    except SystemExit as e:
        assert e.code in (0, None)
    tables = study / "report" / "tables"
    for path in sorted((EXPECTED / "report_tables").glob("*.csv")):
        name = next((n for n in REDEFINED if path.stem.endswith(n)), None)
        want = pd.read_csv(path).rename(columns=RENAMED_TABLES).drop(columns=list(REDEFINED.get(name, ())))
        got = pd.read_csv(tables / path.name)
        if name:
            # nothing made up: only `noop` (no sync at all, its own baseline) has compute = its step, exposed 0
            redefined = got[[c for c in REDEFINED[name] if c in got]]
            others = got["sync"] != "noop"
            assert redefined[others].isna().all().all(), path.name
            noop = got[~others].iloc[0]
            assert (noop["compute(ms)"], noop["exposed_comm(ms)"]) == (noop["step(ms)"], 0.0)
            assert set(got.columns) - set(want.columns) == ADDED_TABLE_COLUMNS[name] | (REDEFINED[name] - {
                "noop_run_id"}), path.name
            got = got[list(want.columns)]
        if path.stem.endswith("system"):
            assert got[sorted(ADDED_SYSTEM_COLUMNS)].notna().all().all(), path.name
            got = got.drop(columns=sorted(ADDED_SYSTEM_COLUMNS))
            # the section now shows the run with the most samples, not the first one found
            assert list(got.columns) == list(want.columns) and (got["samples"] >= want["samples"]).all()
            continue
        if path.stem.endswith("comm"):  # issue 60: the study's comm table names the single calls' columns apart
            got = got.rename(columns={v: k for k, v in SINGLE_CALL.items()}).drop(columns=["size",
                                                                                   "busbw_single(GB/s)"])
        empty = next((cols for n, cols in EMPTY_NEW_COLUMNS.items() if path.stem.endswith(n)), set())
        headline = sorted(c for c in set(got.columns) - set(want.columns) - empty
                          if c in HEADLINE_COLUMNS or interval_parts(c))
        if headline:
            assert got[[c for c in headline if interval_parts(c)]].isna().all().all(), path.name
            if "quality" in headline:
                assert (got["quality"] == "ok").all() and got.get("launches", pd.Series([1])).eq(1).all(), path.name
            got = got.drop(columns=headline)
        assert got[sorted(empty)].isna().all().all(), path.name
        got = got.drop(columns=sorted(empty))
        assert list(got.columns) == list(want.columns), path.name
        pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-9, obj=path.name)


def test_a_second_report_renders_the_saved_results_to_the_same_tables(tmp_path, capsys):
    """The first `report` of the old study derives every result from the stored runs and saves it (lab.results);
    the second renders from the saved files alone, to byte-identical tables; a result saved by another analysis
    version, or a corrupt one, is derived again."""
    import json

    root = _store(tmp_path)
    study = root / "studies" / "fixture"
    main_ok(["report", str(study)])
    first = capsys.readouterr().out
    tables = {p.name: p.read_bytes() for p in sorted((study / "report" / "tables").glob("*.csv"))}
    n = len(json.loads((study / "study.json").read_text())["spec"]["experiments"])
    assert f"0 of {n} experiments from their saved results" in first
    main_ok(["report", str(study)])
    assert f"{n} of {n} experiments from their saved results" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in sorted((study / "report" / "tables").glob("*.csv"))} == tables
    saved = study / "results" / "batch_sweep.json"
    data = json.loads(saved.read_text())
    saved.write_text(json.dumps({**data, "analysis_version": "0.0"}))
    (study / "results" / "profile.json").write_text("{not json")
    main_ok(["report", str(study)])
    assert f"{n - 2} of {n} experiments from their saved results" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in sorted((study / "report" / "tables").glob("*.csv"))} == tables


def main_ok(argv):
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None)


def test_the_stored_fixture_study_has_no_sentence_a_check_contradicts(tmp_path):
    """Every check of analysis.checks over every row of the old study's tables: no sentence or recommendation the
    report would print relies on a row a check fails."""
    from scalelab.lab import registry, results
    from scalelab.lab.study import audit, held_to_host_peak

    study = _store(tmp_path) / "studies" / "fixture"
    try:
        main(["report", str(study)])
    except SystemExit as e:
        assert e.code in (0, None)
    folder = results.results_dir(study)
    answered = [(registry.get(p.stem), results.load(registry.get(p.stem), folder))
                for p in sorted(folder.glob("*.json")) if p.stem in registry.names()]
    assert {e.name for e, _ in answered} >= {"strategies", "comm"}
    assert audit(held_to_host_peak(answered)) == []


def test_the_rebuilt_report_of_an_old_store_passes_the_checks_of_what_it_shows(tmp_path, capsys):
    """Issue 60: every table of the old study's rebuilt report, as a reader sees it (the columns shown, the caption,
    the section's sentences), passes analysis.shown_checks: intervals named after their figure and containing it,
    units alike, shares summing to 100 %, rows told apart, a headline within its own band."""
    from types import SimpleNamespace

    from scalelab.lab import registry
    from scalelab.lab.base import Result
    from scalelab.lab.results import frame_of
    from scalelab.report.audit import report_faults
    from scalelab.report.build import build_report
    from scalelab.store import read_json

    root = _store(tmp_path)
    study = root / "studies" / "fixture"
    main_ok(["report", str(study)])
    answered = []
    for path in sorted((study / "results").glob("*.json")):
        if path.stem in registry.names():
            data = read_json(path)
            answered.append((registry.get(path.stem), Result(data["name"], {k: frame_of(t) for k, t in
                                                                             data["tables"].items()},
                                                               notes=data.get("notes", {}))))
    assert {e.name for e, _ in answered} >= {"profile", "batch_sweep", "comm", "strategies"}
    spec = SimpleNamespace(quick=False, name="fixture", experiments=[e.name for e, _ in answered])
    assert report_faults(build_report(spec, answered, {"host": "fixture"}, "scalelab study")) == []
