"""`scalelab explain RUN` and `scalelab runs compare A B --breakdown` on a store of runs with exact synthetic
summaries (nothing trains): the breakdown comes from stored runs only, its variants found by config, and bad input
is one line with a non-zero exit."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.cli import main
from scalelab.config import TrainConfig
from scalelab.store import Store


def summary(step, *, fastest=None, data=1.0, waiting=None, wire=None, collectives=None):
    s = {keys.STEP_MEDIAN_MS: step, keys.STEP_MEDIAN_CI_LOW_MS: step - 1, keys.STEP_MEDIAN_CI_HIGH_MS: step + 1,
         keys.STEPS_TIMED: 20, keys.stage_ms("data"): data, **dict(zip(keys.ci_keys(keys.stage_ms("data")),
                                                                       (data - 0.1, data + 0.1)))}
    for key, value in ((keys.STEP_FASTEST_MEDIAN_MS, fastest), (keys.COMM_PEERS_WAIT_MS, waiting),
                       (keys.COMM_CRITICAL_MS, wire)):
        if value is not None:
            s[key] = value
            s.update(zip(keys.ci_keys(key), (value - 0.5, value + 0.5)))
    if collectives is not None:
        s.update({keys.COMM_COLLECTIVES_PER_STEP: collectives, keys.COMM_BYTES_PER_STEP: 2**20,
                  keys.COMM_BUSBW: 0.5})
    return s


def stored(store: Store, cfg: TrainConfig, summ: dict, *, status="completed", study="s/scale_strong") -> str:
    rid = store.create_run(cfg.resolved().to_dict(), {}, kind="train", study=study)
    store.finish_run(rid, status, summary=summ, reason=None if status == "completed" else "boom")
    return rid


def cli(args: list[str]) -> int:
    """`scalelab ARGS` in this process: its exit code (0 when it returns)."""
    try:
        main(args)
    except SystemExit as e:
        return e.code or 0
    return 0


BASE = TrainConfig(model="mlp", dataset="synthetic", global_batch=64, steps=20, ranks=2, bucket_mb=4.0, device="cpu")  # stored runs only: a GPU machine too


@pytest.fixture
def runs(tmp_path):
    store = Store(tmp_path / "store")
    ids = {
        "one": stored(store, TrainConfig(model="mlp", dataset="synthetic", global_batch=64, steps=20, bucket_mb=4.0, device="cpu"),
                      summary(40.0)),
        "real": stored(store, BASE, summary(50.0, fastest=45.0, data=1.5, waiting=10.0, wire=12.0, collectives=2)),
        "nosync": stored(store, BASE.__class__(**{**BASE.to_dict(), "sync": "noop"}), summary(27.0, fastest=25.0)),
        "noop": stored(store, BASE.__class__(**{**BASE.to_dict(), "noop_collectives": True}),
                       summary(30.0, fastest=28.0)),
    }
    return store, ids


def test_explain_prints_every_part_from_the_stored_variants(runs, capsys):
    store, ids = runs
    code = cli(["explain", ids["real"][:-1], "--store", str(store.root)])  # a unique prefix is enough
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("one", "nosync", "noop"):
        assert ids[name] in out, (name, out)
    # ideal 20 = 40 / 2; data 1.5 - 0.5 = 1; compute (25 - 1) - (20 - 0.5) = 4.5; sync work 28 - 25 = 3;
    # exposed 50 - 28 = 22 = waiting 10 + wire 12 (interference / hidden 0); rest = 1 - 1.5 = -0.5
    expected = {"the 1-worker step scaled to the same work": "20", "+ data wait beyond the 1-worker run's": "1",
                "+ the sync's own work outside its collectives": "3", "· waiting for peers": "10",
                "+ the rest": "-0.5", "the measured step": "50"}
    for label, value in expected.items():
        line = next(x.strip() for x in out.splitlines() if x.strip().startswith(label))
        assert line[len(label):].split()[0] == value, line
    # the largest cause is an additive part (analysis.breakdown.largest_cause): exposed 22 ms, never its wire 12 ms
    assert "largest cause: exposed communication: the real run against its no-op collectives, 22 ms" in out
    assert "not measured" not in out
    assert "bucket" not in out  # no bucket sweep of this config is stored: no bucket size is suggested


def test_a_bucket_size_is_suggested_only_beside_a_stored_sweep(runs, capsys):
    store, ids = runs
    stored(store, BASE.__class__(**{**BASE.to_dict(), "bucket_mb": 1.0}), summary(44.0), study="s/bucket_sweep")
    cli(["explain", ids["real"], "--store", str(store.root)])
    out = capsys.readouterr().out
    assert "another bucket size: bucket_mb 1 measured a 44 ms step against this run's 50 ms" in out


def test_missing_variants_are_not_measured_and_name_their_command(tmp_path, capsys):
    store = Store(tmp_path / "store")
    rid = stored(store, BASE, summary(50.0, fastest=45.0, waiting=10.0, wire=12.0, collectives=2))
    cli(["explain", rid, "--store", str(store.root)])
    out = capsys.readouterr().out
    assert out.count("not measured") >= 5, out
    assert "scalelab train (this run's config) --sync noop" in out
    assert "scalelab scale --workers 1,2 --batches 64 --mode strong" in out
    assert "the 1-worker step" in out and "waiting for peers" in out


def test_runs_compare_breakdown_side_by_side(runs, capsys):
    store, ids = runs
    code = cli(["runs", "compare", ids["real"], ids["one"], "--breakdown", "--store", str(store.root)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert ids["real"] in out and ids["one"] in out and "waiting for peers" in out and "measured step" in out


@pytest.mark.parametrize("args, words", [
    (["explain", "no-such-run"], "not found"),
    (["runs", "compare", "a", "--breakdown"], "exactly 2"),
])
def test_bad_input_is_one_line_and_exit_2(runs, capsys, args, words):
    store, _ = runs
    code = cli([*args, "--store", str(store.root)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and len(err.splitlines()) == 1, err


def test_a_failed_run_cannot_be_explained_and_one_without_steps_says_what_is_missing(tmp_path, capsys):
    store = Store(tmp_path / "store")
    failed = stored(store, BASE, {}, status="failed")
    code = cli(["explain", failed, "--store", str(store.root)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "only a completed run" in err and len(err.splitlines()) == 1, err
    empty = stored(store, BASE, {keys.STEPS_TIMED: 0})
    code = cli(["explain", empty, "--store", str(store.root)])
    out = capsys.readouterr().out
    assert code == 0 and f"run {empty}: no timed steps (steps/boundary: none)" in out, out
    assert "part" not in out.split()  # no breakdown table


def test_a_one_rank_run_says_it_has_no_lost_speedup_in_one_line(runs, capsys):
    store, ids = runs
    code = cli(["explain", ids["one"], "--store", str(store.root)])
    out = capsys.readouterr().out.strip()
    assert code == 0 and len(out.splitlines()) == 1 and "has 1 rank: it has no lost speedup" in out, out


def test_a_one_rank_script_run_without_a_batch_says_it_has_no_lost_speedup(tmp_path, capsys):
    """A plain script run on one rank that gave no batch and had none read at a forward (no DDP model): the same
    one line, not a traceback from dividing an unknown batch."""
    store = Store(tmp_path / "store")
    config = {"command": ["python", "plain.py"], "ranks": 1, "nnodes": 1, "global_batch": None,
              "model": "script:plain.py", "dataset": "script"}
    rid = store.create_run(config, {}, kind="script")
    store.finish_run(rid, "completed", summary=summary(3.0), reason=None)
    code = cli(["explain", rid, "--store", str(store.root)])
    out = capsys.readouterr().out.strip()
    assert code == 0 and len(out.splitlines()) == 1 and "(script) has 1 rank: it has no lost speedup" in out, out


def test_the_variants_point_to_the_real_run_they_serve(runs, capsys):
    store, ids = runs
    code = cli(["explain", ids["noop"], "--store", str(store.root)])
    out = capsys.readouterr().out.strip()
    assert code == 0 and out == (f"run {ids['noop']} is the no-op-collectives variant of {ids['real']}: it serves "
                                 f"their breakdown (`scalelab explain {ids['real']}`)."), out
    code = cli(["explain", ids["nosync"], "--store", str(store.root)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith(f"run {ids['nosync']} is the no-sync variant of {ids['real']}"), out
    # then broken down as a run without sync: its own no-sync and no-op variant, its sync's parts 0
    assert f"no-sync variant: {ids['nosync']}" in out and f"no-op collectives: {ids['nosync']}" in out, out
    line = next(x.strip() for x in out.splitlines() if x.strip().startswith("+ the sync's own work"))
    assert line.split()[-4] == "0", line


def test_a_scripts_run_gets_the_parts_its_probe_saw(tmp_path, capsys):
    """A user's script (kind "script": `scalelab run`, the probe, the Lightning callback) given its global batch:
    the ideal step from the same script on 1 worker, data wait, waiting for peers and wire from its own steps; the
    parts that need a variant without its sync are not measured and say why."""
    from scalelab.run.script import ScriptConfig

    (tmp_path / "train.py").write_text("")
    store = Store(tmp_path / "store")
    cmd = ("python", "train.py", "--batch", "{per_worker_batch}")
    ids = {}
    for name, ranks, summ in (("one", 1, summary(40.0)),
                              ("real", 2, summary(50.0, fastest=45.0, data=1.5, waiting=10.0, wire=12.0,
                                                  collectives=2))):
        cfg = ScriptConfig(command=cmd, ranks=ranks, global_batch=64, cwd=str(tmp_path))
        ids[name] = store.create_run(cfg.to_dict(), {}, kind="script")
        store.finish_run(ids[name], "completed", summary=summ)
    code = cli(["explain", ids["real"], "--store", str(store.root)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"1-worker run: {ids['one']}" in out
    assert "not measurable for a script of yours" in out
    for label, value in (("the 1-worker step scaled to the same work", "20"),
                         ("+ data wait beyond the 1-worker run's", "1"), ("· waiting for peers", "10")):
        line = next(x.strip() for x in out.splitlines() if x.strip().startswith(label))
        assert line[len(label):].split()[0] == value, line
    assert "not measured: compute, sync_work, interference, hidden" in out
    # the rest is what the measured parts leave of the gap: 30 - 1 - 10 - 12, holding the parts not measured
    rest = next(x for x in out.splitlines() if x.strip().startswith("+ the rest"))
    assert rest.split()[3] == "7" and "holds the parts not measured" in rest, rest
