"""`compare strategies` / `compare backends` on real 2-rank gloo runs.

The real runs share one store (module fixture): backends first (gloo + its baseline with no-op collectives: 2
runs), then every strategy and its baseline (ddp and its baseline are the same cells as gloo's, and noop is its
own baseline, so 9 + 8 - 2 = 15 new runs), then the same strategies again through the CLI (nothing new runs). Model: Flatten -> Linear(3072, 16) -> Linear(16, 16) -> Linear(16, 10), no biases, no
buffers: gradient bytes per step (fp32) = (3072*16 + 16*16 + 16*10) * 4 = 198272, one DDP bucket.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from conftest import TINY_MLP, run_experiment
from scalelab.analysis import breakdown
from scalelab.analysis.compare import BACKENDS
from scalelab.cli import main
from scalelab.config import TrainConfig
from scalelab.experiments import backends as backends_exp
from scalelab.sync.registry import variants

STRATEGIES = variants()
GRAD_BYTES = (3072 * 16 + 16 * 16 + 16 * 10) * 4


def first_measurements(store) -> int:
    """Runs of the store that are not a cell measured once more (a noisy or implausible row's, under .../again)."""
    runs = store.list_runs()
    return int((~runs["study"].str.endswith("/again")).sum())


# ---------------------------------------------------------------- real 2-rank gloo runs
@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from scalelab.store import Store

    root = tmp_path_factory.mktemp("compare")
    (root / "tiny.py").write_text(TINY_MLP)
    fields = dict(model=f"{root / 'tiny.py'}:make", dataset="synthetic", samples=64, eval_samples=16,
                  global_batch=16, steps=4, warmup_steps=1, ranks=2, sample_interval_s=0.1)
    (root / "tiny.yaml").write_text(yaml.safe_dump(fields))
    base = TrainConfig(**fields)
    store, out = Store(root / "store"), root / "out"
    backends = run_experiment("backends", base, store, "s", out, launches=1)
    after_backends = first_measurements(store)
    strategies = run_experiment("strategies", base, store, "s", out, accumulate=2, launches=1)
    return {"root": root, "store": store, "out": out, "backends": backends, "strategies": strategies,
            "after_backends": after_backends}


@pytest.mark.dist
@pytest.mark.timeout(480)
def test_strategy_table_bytes_follow_the_meter_conventions(measured):
    table = measured["strategies"].tables["compare_strategies"].set_index("sync")
    assert list(table.index) == list(STRATEGIES)
    assert (table["status"] == "completed").all()
    b = table["bytes_per_step"]
    assert b["ddp"] == b["allreduce"] == b["bucketed"] == b["ddp+accumulate"] == GRAD_BYTES
    assert b["ddp+fp16"] == b["ddp+bf16"] == GRAD_BYTES / 2
    assert b["gather_scatter"] == 2 * b["allreduce"]  # S gathered + S scattered per rank (n = 2)
    assert 0 < b["ddp+powersgd"] < b["ddp"]
    assert b["noop"] == 0 and table.at["noop", "collectives_per_step"] == 0
    assert (table["bytes_forward_per_step"] == 0).all() and (table["bytes_optimizer_per_step"] == 0).all()
    assert (table["bytes_backward_per_step"] == b).all()
    assert table.at["allreduce", "collectives_per_step"] == 3  # one per parameter
    assert table.at["ddp", "collectives_per_step"] == 1  # one bucket
    assert (table.drop(index="noop")["busbw(GB/s)"] > 0).all()
    assert table["train_loss"].notna().all()


@pytest.mark.dist
@pytest.mark.timeout(480)
def test_strategy_table_compute_is_the_same_config_with_no_op_collectives(measured):
    table = measured["strategies"].tables["compare_strategies"].set_index("sync")
    store = measured["store"]
    for name in STRATEGIES:
        row = table.loc[name]
        run, baseline = store.get(row["run_id"]), store.get(row["baseline_run_id"])
        # the no-op baseline at its fastest rank (docs/definitions.md, "Exposed communication"; issue 57)
        own = name == "noop"  # no sync at all: its own baseline, its compute its step
        assert row["compute(ms)"] == breakdown.step(baseline["summary"], fastest=not own).value, name
        assert row["exposed_comm(ms)"] == pytest.approx(row["step(ms)"] - row["compute(ms)"]), name  # not clipped
        if name == "noop":  # no sync at all: its own baseline
            assert baseline["run_id"] == run["run_id"] and row["exposed_comm(ms)"] == 0
            continue
        # the baseline is the very same config but for its collectives
        differs = {k for k in run["config"] if run["config"][k] != baseline["config"].get(k)}
        assert differs == {"noop_collectives"}, name
        assert baseline["config"]["noop_collectives"] is True
        assert baseline["summary"].get("comm/bytes_per_step", 0) == 0  # nothing was communicated
        # ok, or a stated reason (a figure implausible beyond its interval, a run or baseline on a busy machine,
        # measured once more)
        assert row["quality"] == "ok" or row["quality"].startswith(("implausible", "noisy", "baseline noisy", "re-measured")), name
        assert row["exposed_ci_low(ms)"] <= row["exposed_comm(ms)"] <= row["exposed_ci_high(ms)"]
        assert row["comm_wait(ms)"] > 0, name  # measured directly for every strategy, DDP included
    acc = table.loc["ddp+accumulate"]
    # its own baseline: 2 micro-steps of 4 samples per rank (the global batch is kept)
    assert (acc["accumulate"], acc["micro_batch_per_rank"], acc["global_batch"]) == (2, 4, 16)
    assert store.get(acc["baseline_run_id"])["config"]["accumulate"] == 2
    assert "keeps the global batch 16" in measured["strategies"].notes["accumulate"]


@pytest.mark.dist
@pytest.mark.timeout(480)
def test_backends_table_runs_gloo_and_lists_the_others_as_skipped(measured):
    table = measured["backends"].tables["compare_backends"].set_index("backend")
    facts = backends_exp.runtime_facts()
    assert list(table.index) == list(BACKENDS)
    assert table.at["gloo", "status"] == "completed"
    assert table.at["gloo", "bytes_per_step"] == GRAD_BYTES and table.at["gloo", "busbw(GB/s)"] > 0
    assert table.at["gloo", "compute(ms)"] > 0 and not math.isnan(table.at["gloo", "exposed_comm(ms)"])
    if facts["gpus"] < 2:
        assert table.at["nccl", "status"] == "skipped"
        assert table.at["nccl", "reason"] == f"needs CUDA with >= 2 GPUs (found {facts['gpus']})"
    if not facts["mpi"]:
        assert table.at["mpi", "status"] == "skipped"
        assert table.at["mpi", "reason"] == "torch.distributed.is_mpi_available() is False"
    assert measured["after_backends"] == 2  # gloo and its baseline
    # the strategies reused gloo's cells (same config): ddp is gloo's cell, and its baseline gloo's baseline (the
    # same runs, unless a noisy or implausible row had the cell measured once more in between)
    strat = measured["strategies"].tables["compare_strategies"].set_index("sync")
    store = measured["store"]
    for mine, theirs in (("run_id", "run_id"), ("baseline_run_id", "baseline_run_id")):
        assert store.get(strat.at["ddp", mine])["config"] == store.get(table.at["gloo", theirs])["config"]
    assert first_measurements(store) == 2 + 15  # re-measures of noisy or implausible rows come beside them
    names = {p.name for p in measured["backends"].files + measured["strategies"].files}
    assert {"compare_backends.csv", "compare_backends.json", "compare_backends.png", "compare_strategies.csv",
            "compare_strategies.json", "compare_strategies.png", "compare_strategies_bytes.png"} <= names
    assert all(p.exists() for p in measured["strategies"].files)


@pytest.mark.dist
@pytest.mark.timeout(480)
def test_resumed_cli_invocation_runs_nothing_new(measured, capsys):
    store, root = measured["store"], measured["root"]
    before = len(store.list_runs())
    main(["compare", "strategies", "--config", str(root / "tiny.yaml"), "--accumulate", "2", "--launches", "1",
          "--study", "s",
          "--store", str(store.root), "--out", str(root / "again")])
    out = capsys.readouterr().out
    assert len(store.list_runs()) == before
    assert out.count("already done") == 2 * len(STRATEGIES)  # every strategy and its baseline (noop's is itself)
    assert "[compare] gather_scatter: already done" in out
    again = pd.read_csv(root / "again" / "compare_strategies.csv")
    first = measured["strategies"].tables["compare_strategies"]
    assert list(again["run_id"]) == list(first["run_id"])
    assert list(again["bytes_per_step"]) == list(first["bytes_per_step"])
