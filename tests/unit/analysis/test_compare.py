"""`compare strategies` / `compare backends`: pure table arithmetic on fixed inputs, input errors before anything
runs, and a replayed comparison (the real 2-rank runs are in tests/dist/test_compare_dist.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import run_experiment
from scalelab.analysis import compare as pure
from scalelab.analysis.compare import BACKENDS, comparison_table, exposed_comm, overlap
from scalelab.sync.registry import variant_of as strategy_of
from scalelab.sync.registry import variants

STRATEGIES = variants()


def strategies_table(pairs):
    return pure.comparison_table(pairs, axis="sync", label_of=strategy_of, order=variants())
from scalelab.cli import main
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments import backends as backends_exp
from scalelab.lab.cells import replay_only
from scalelab.experiments.strategies import strategy_fields

# ---------------------------------------------------------------- pure functions on fixed inputs
def _run(run_id, step, comm=0.0, ci=None, **config):
    cfg = {"sync": "ddp", "ddp_hook": "none", "accumulate": 1, "global_batch": 16, "ranks": 2, "nnodes": 1,
           "backend": "gloo", **config}
    low, high = ci or (step - 0.5, step + 0.5)
    summary = {"time/step_median(ms)": step, "time/step_min(ms)": step - 1, "time/step_max(ms)": step + 1,
               "time/step_median_ci_low(ms)": low, "time/step_median_ci_high(ms)": high,
               "comm/time(ms)": comm, "comm/bytes_per_step": 1000.0, "comm/loopback_bytes_per_step": 2500.0}
    return {"run_id": run_id, "config": cfg, "summary": summary, "status": "completed"}


def test_exposed_and_overlap_follow_the_definitions():
    assert exposed_comm(10.0, 4.0) == 6.0
    assert exposed_comm(3.0, 4.0) == -1.0  # not clipped: reported and judged against its interval
    assert exposed_comm(None, 4.0) is None and exposed_comm(5.0, float("nan")) is None
    assert overlap(6.0, 8.0) == 0.25
    assert overlap(12.0, 8.0) == -0.5  # the sync costs more than its collectives
    assert overlap(0.0, 0.0) is None and overlap(1.0, None) is None


def test_exposed_interval_is_the_conservative_difference_of_the_medians_intervals():
    row = pure.exposed_with_interval(_run("s", 40.0, 20.0, ci=(38.0, 43.0))["summary"],
                                     _run("b", 30.0, ci=(29.0, 32.0))["summary"], 20.0)
    assert (row["exposed_comm(ms)"], row["exposed_ci_low(ms)"], row["exposed_ci_high(ms)"]) == (10.0, 6.0, 14.0)
    assert (row["overlap"], row["overlap_ci_low"], row["overlap_ci_high"]) == (0.5, pytest.approx(0.3), 0.7)
    assert row["quality"] == "ok"


@pytest.mark.parametrize("step, ci, comm, quality", [
    (25.0, (24.0, 26.0), 8.0, "implausible: the sync is faster than its no-op baseline beyond noise"),
    (29.5, (28.0, 31.0), 8.0, "ok"),  # 0.5 ms faster, within noise: reported as -0.5 ms, not flagged
    (45.0, (44.0, 46.0), 5.0, "ok"),  # exposed 15 > comm 5 beyond noise: interference, a figure, not an error
    (25.0, (24.9, 25.1), 100.0, "implausible: the sync is faster than its no-op baseline beyond noise"),
    (45.0, (36.0, 50.0), 5.0, "ok"),  # the same point, but the interval reaches overlap 0: noise, not a finding
    (50.6, (50.5, 50.7), 20.0, "ok"),  # exposed 20.6 > comm 20 by 3 %: the sync's own bookkeeping, within the slack
    (42.0, (41.5, 42.5), 20.0, "ok"),  # 40 % hidden
    (31.0, (30.9, 31.1), 100.0, "ok"),  # 99 % hidden
])
def test_quality_flags_what_lies_outside_the_definitions_beyond_noise(step, ci, comm, quality):
    row = pure.exposed_with_interval(_run("s", step, comm, ci=ci)["summary"],
                                     _run("b", 30.0, ci=(29.0, 31.0))["summary"], comm)
    assert row["quality"] == quality
    assert row["exposed_comm(ms)"] == step - 30.0  # never clipped


def test_time_inside_collectives_longer_than_the_step_is_implausible():
    """An injected impossible value: 30 ms inside collectives (interval 29-31) per step of 20 ms on average
    (epoch of 10 steps: 0.19-0.21 s). Flagged, whatever the exposed part says; within the intervals it is not."""
    def summary(comm_ci, epoch_ci):
        s = _run("s", 20.0, 30.0, ci=(19.0, 21.0))["summary"]
        s.update({"comm/time_ci_low(ms)": comm_ci[0], "comm/time_ci_high(ms)": comm_ci[1], "time/epoch(s)": 0.2,
                  "time/epoch_ci_low(s)": epoch_ci[0], "time/epoch_ci_high(s)": epoch_ci[1], "steps/per_epoch": 10})
        return s
    base = _run("b", 10.0, ci=(9.0, 11.0))["summary"]
    assert pure.exposed_with_interval(summary((29.0, 31.0), (0.19, 0.21)), base, 30.0)["quality"] == \
        "implausible: time inside collectives longer than the step beyond noise"
    assert pure.exposed_with_interval(summary((20.0, 40.0), (0.19, 0.21)), base, 30.0)["quality"] != \
        "implausible: time inside collectives longer than the step beyond noise"


def test_strategy_of_names_every_strategy():
    configs = [strategy_fields(s, 3) for s in STRATEGIES]
    assert [strategy_of(c) for c in configs] == list(STRATEGIES)
    assert strategy_of({"sync": "auto"}) == "ddp"


def test_strategies_table_pairs_each_run_with_its_own_baseline():
    acc, ddp, noop = _run("acc", 80.0, 20.0, accumulate=2), _run("ddp", 70.0, 40.0), _run("n", 40.0, sync="noop")
    acc_base = _run("ab", 50.0, accumulate=2, noop_collectives=True)
    ddp_base = _run("db", 40.0, noop_collectives=True)
    table = strategies_table([(acc, acc_base), (ddp, ddp_base), (noop, noop)])
    assert list(table["sync"]) == ["ddp", "ddp+accumulate", "noop"]  # STRATEGIES order
    ddp, acc, noop = (table.iloc[i] for i in range(3))
    assert (ddp["compute(ms)"], ddp["exposed_comm(ms)"], ddp["overlap"], ddp["baseline_run_id"]) == \
        (40.0, 30.0, 0.25, "db")
    assert (acc["compute(ms)"], acc["exposed_comm(ms)"], acc["overlap"], acc["baseline_run_id"]) == \
        (50.0, 30.0, -0.5, "ab")
    assert acc["quality"] == "ok" and acc["interference(ms)"] == 10.0  # exposed 30 against 20 inside collectives
    assert (acc["micro_batch_per_rank"], ddp["micro_batch_per_rank"]) == (4, 8)
    assert noop["exposed_comm(ms)"] == 0.0 and pd.isna(noop["overlap"])
    assert ddp["loopback/payload"] == 2.5
    # a failed baseline gives no compute and no exposed communication (nothing is made up)
    lost = strategies_table([(_run("x", 35.0, 8.0), {**ddp_base, "status": "failed"})]).iloc[0]
    assert pd.isna(lost["compute(ms)"]) and pd.isna(lost["exposed_comm(ms)"])


def test_backends_table_keeps_skipped_backends_with_their_reason():
    gloo, base = _run("g", 30.0, 10.0), _run("gn", 25.0, noop_collectives=True)
    entries = [({"backend": "mpi", "status": "skipped", "reason": "no mpi"}, None), (gloo, base),
               ({"backend": "nccl", "status": "skipped", "reason": "no gpu"}, None)]
    table = comparison_table(entries, axis="backend", label_of=lambda c: c["backend"], order=BACKENDS)
    assert list(table["backend"]) == list(BACKENDS)
    assert list(table["status"]) == ["completed", "skipped", "skipped"]
    assert list(table["reason"])[1:] == ["no gpu", "no mpi"]
    assert (table.at[0, "exposed_comm(ms)"], table.at[0, "overlap"]) == (5.0, 0.5)


def test_backend_skip_reasons_say_what_is_missing():
    base = TrainConfig(ranks=2, global_batch=16)
    none = {"gpus": 0, "gloo": True, "nccl": False, "mpi": False}
    assert backends_exp.backend_skip_reason("gloo", base, none) is None
    assert backends_exp.backend_skip_reason("nccl", base, {**none, "gpus": 1}) == "needs CUDA with >= 2 GPUs (found 1)"
    assert backends_exp.backend_skip_reason("nccl", base, {**none, "gpus": 2}) == \
        "torch.distributed.is_nccl_available() is False"
    assert backends_exp.backend_skip_reason("mpi", base, none) == "torch.distributed.is_mpi_available() is False"
    assert backends_exp.backend_skip_reason("mpi", base, {**none, "mpi": True}) is None


@pytest.mark.parametrize("kwargs, field", [({"strategies": ["ddp", "allgather"]}, "strategies"),
                                           ({"accumulate": 1}, "accumulate"), ({"strategies": []}, "strategies")])
def test_bad_strategy_input_fails_before_anything_runs(store, tmp_path, kwargs, field):
    with pytest.raises(ConfigError) as err:
        run_experiment("strategies", TrainConfig(ranks=2, global_batch=16), store, "s", tmp_path, **kwargs)
    assert err.value.field == field
    assert len(store.list_runs()) == 0


@pytest.mark.parametrize("args, words", [
    (["compare", "strategies", "--strategies", "ddp,bogus"], "strategies: 'bogus' is not allowed"),
    (["compare", "strategies", "--accumulate", "1"], "accumulate: 1 is not allowed"),
    (["compare", "backends", "--backends", "gloo,ucc"], "backends: 'ucc' is not allowed"),
    (["compare", "strategies", "--set", "global_batch=15"], "global_batch: 15 is not allowed"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--store", str(tmp_path / "st")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_replayed_comparison_lists_missing_cells_and_runs_nothing(store, tmp_path):
    with replay_only():
        res = run_experiment("strategies", TrainConfig(ranks=2, global_batch=16), store, "s", tmp_path)
    table = res.tables["compare_strategies"]
    assert list(table["sync"]) == list(STRATEGIES) and (table["status"] == "missing").all()
    assert len(store.list_runs()) == 0


def test_a_noisy_run_or_baseline_shows_in_the_quality_column():
    noisy = _run("s", 40.0, 20.0)
    noisy["summary"].update({"quality/noisy": True, "quality/noise_reason": "noisy: 1.6 cores busy outside the run"})
    base = _run("b", 30.0, noop_collectives=True)
    row = strategies_table([(noisy, base)]).iloc[0]
    assert row["quality"] == "noisy: 1.6 cores busy outside the run"
    short = _run("b2", 30.0, noop_collectives=True)
    short["summary"]["quality"] = "precision not reached"
    row = strategies_table([(_run("s2", 40.0, 20.0), short)]).iloc[0]
    assert row["quality"] == "baseline precision not reached"
    assert strategies_table([(_run("s3", 40.0, 20.0), base)]).iloc[0]["quality"] == "ok"


def test_exposed_beyond_communication_is_interference_measured_not_flagged():
    """Exposed 15 ms (interval 13-17) against 5 ms of communication (interval up to 6): 10 ms of interference;
    the same exposed against 14 ms (interval up to 16) is within noise: 0."""
    step, base = _run("s", 45.0, 5.0, ci=(44.0, 46.0))["summary"], _run("b", 30.0, ci=(29.0, 31.0))["summary"]
    row = pure.exposed_with_interval(step, base, 5.0, comm_high_ms=6.0)
    assert row["interference(ms)"] == 10.0 and row["quality"] == "ok"
    assert pure.exposed_with_interval(step, base, 14.0, comm_high_ms=16.0)["interference(ms)"] == 0.0


@pytest.mark.parametrize("step, ci, quality", [
    (40.0, (39.5, 40.5), "implausible: a blocking sync hides nothing, yet its overlap interval (43–57 %) excludes 0"),
    (48.0, (47.0, 49.0), "ok"),  # exposed 18 of 20 ms: overlap interval 0-20 % reaches 0
    (50.0, (49.5, 50.5), "ok"),  # nothing hidden
])
def test_a_blocking_strategy_that_seems_to_hide_communication_is_implausible(step, ci, quality):
    """20 ms of critical communication after a 30 ms baseline: a blocking sync's step is 50 ms; a step of 40 ms
    (overlap 50 %, interval 43-57 %) would mean it hid half of it, which it cannot."""
    row = pure.exposed_with_interval(_run("s", step, 20.0, ci=ci)["summary"],
                                     _run("b", 30.0, ci=(29.0, 31.0))["summary"], 20.0, blocks=True)
    assert row["quality"] == quality
    unflagged = pure.exposed_with_interval(_run("s", step, 20.0, ci=ci)["summary"],
                                           _run("b", 30.0, ci=(29.0, 31.0))["summary"], 20.0)
    assert unflagged["quality"] == "ok"  # an overlapping strategy may hide it
