"""Communication benchmark on 2 real gloo ranks: every op measured and checked over a sweep, and the
corruption hook counted by the check."""
from __future__ import annotations

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.measure import commbench_worker as cw
from scalelab.measure.commbench import ITERS_MAX, ITERS_MIN, OPS, CommBenchConfig, build_table, read_results
from scalelab.run.execute import run_commbench
from scalelab.store import read_json

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- real ranks

@pytest.mark.dist
def test_two_gloo_ranks_measure_and_check_every_op_over_a_sweep(store, capsys):
    main(["bench", "comm", "--begin", "1K", "--end", "64K", "--warmup", "1", "--iters", "2",
          "--store", str(store.root)])
    out = capsys.readouterr().out
    runs = store.list_runs(kind="bench")
    assert list(runs["status"]) == ["completed"] and list(runs["ranks"]) == [2]
    run_dir = store.run_dir(runs["run_id"][0])
    table = read_results(run_dir)
    sizes = [1024 * 2**k for k in range(7)]
    assert list(zip(table["op"], table["size(B)"])) == [(op, s) for op in OPS for s in sizes]
    # gloo in torch 2.13 runs all four; were one refused, its rows would say so instead of vanishing
    ok = table[table["status"] == "ok"]
    assert (table[table["status"] != "ok"]["reason"].str.len() > 0).all()
    assert set(ok["op"]) == set(OPS)
    assert (ok["wrong"] == 0).all() and (ok["busbw(GB/s)"] > 0).all() and (ok["iters"] == 2).all()  # --iters fixes n
    assert (ok["busbw_min(GB/s)"] <= ok["busbw_max(GB/s)"]).all() and (ok["time_loop(us)"] > 0).all()
    # the stored table is exactly what the stored raw per-rank timings give
    timings = read_json(run_dir / "timings.json")
    rebuilt = build_table(timings["records"], timings["ranks"], "float32")
    pd.testing.assert_frame_equal(rebuilt.reset_index(drop=True), table, check_dtype=False)
    assert pd.read_csv(run_dir / "results.csv").shape == table.shape
    assert (run_dir / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = store.get(runs["run_id"][0])
    assert row["config"]["backend"] == "gloo" and row["config"]["sizes"] == sizes
    assert row["summary"]["allreduce/busbw_peak(GB/s)"] == ok[ok["op"] == "allreduce"]["busbw(GB/s)"].max()
    assert "allreduce" in out and "64K" in out and "busbw" in out


@pytest.mark.dist
def test_iterations_are_chosen_per_size_agreed_by_ranks_and_timed_both_ways(store):
    sizes = [4 * 2**10 * 4**k for k in range(7)]  # 4K .. 16M
    cfg = CommBenchConfig(ops="allreduce", begin="4K", end="16M", factor=4, warmup=2)
    outcome = run_commbench(cfg, store, say=lambda s: None)
    assert outcome.status == "completed"
    table = outcome.table.set_index("size(B)")
    assert list(table.index) == sizes and (table["wrong"] == 0).all()
    # ranks agree: every rank timed the same n per size, and n is the table's
    timings = read_json(store.run_dir(outcome.run_id) / "timings.json")
    for size in sizes:
        recs = [r for r in timings["records"] if r["size(B)"] == size]
        assert sorted(r["rank"] for r in recs) == [0, 1]
        assert {len(r["times(s)"]) for r in recs} == {table.loc[size, "iters"]}
        assert all(r["loop(s)"] > 0 for r in recs)
    iters = table["iters"]
    assert iters.between(ITERS_MIN, ITERS_MAX).all() and iters[sizes[0]] > iters[sizes[-1]]
    # both timings exist; the median's interval holds the median
    assert table[["time_loop(us)", "time_median(us)", "time_ci_low(us)", "time_ci_high(us)"]].notna().all().all()
    assert ((table["time_ci_low(us)"] <= table["time_median(us)"])
            & (table["time_median(us)"] <= table["time_ci_high(us)"])).all()
    # No assertion compares the loop's time with the single calls' (tests never assert on timings): on this shared
    # 2-core machine the loop was up to 2.5x slower per call than the single calls' mean (load 7.5: 16 KiB, 1590
    # vs 623 µs), because the barrier before a single call absorbs the wait for a preempted peer and the loop
    # cannot. That a wake-up is paid once per loop and once per single call is tested on an injected delay in
    # tests/unit/measure/test_commbench.py.


@pytest.mark.dist
def test_corruption_hook_makes_the_check_count_the_wrong_element(store, monkeypatch):
    monkeypatch.setenv(cw.CORRUPT_ENV, "broadcast")
    cfg = CommBenchConfig(ops="allreduce,broadcast", begin="1K", end="2K", warmup=0, iters=1)
    outcome = run_commbench(cfg, store, say=lambda s: None)
    wrong = dict(zip(zip(outcome.table["op"], outcome.table["size(B)"]), outcome.table["wrong"]))
    assert wrong == {("allreduce", 1024): 0, ("allreduce", 2048): 0, ("broadcast", 1024): 1, ("broadcast", 2048): 1}
    assert outcome.status == "failed"
    row = store.get(outcome.run_id)
    assert row["status"] == "failed" and row["reason"] == "correctness check failed: broadcast has 2 wrong element(s)"
    assert row["summary"]["broadcast/wrong"] == 2 and row["summary"]["allreduce/wrong"] == 0
