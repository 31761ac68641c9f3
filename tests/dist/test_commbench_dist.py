"""Communication benchmark on 2 real gloo ranks: every op measured and checked over a sweep, and the
corruption hook counted by the check."""
from __future__ import annotations

import pandas as pd
import pytest

from scalelab.cli import main
from scalelab.measure import commbench_worker as cw
from scalelab.measure.commbench import OPS, CommBenchConfig, build_table, read_results
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
    assert (ok["wrong"] == 0).all() and (ok["busbw(GB/s)"] > 0).all() and (ok["iters"] == 2).all()
    assert (ok["busbw_min(GB/s)"] <= ok["busbw(GB/s)"]).all() and (ok["busbw(GB/s)"] <= ok["busbw_max(GB/s)"]).all()
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
