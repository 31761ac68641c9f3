"""Communication benchmark: exact math, the correctness check's truth, CLI errors (the real 2-rank gloo runs are in
tests/dist/test_commbench_dist.py)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from scalelab.cli import main
from scalelab.errors import ConfigError
from scalelab.measure import commbench_worker as cw
from scalelab.analysis.intervals import median_interval
from scalelab.measure.commbench import (
    COLUMNS, ITERS_MAX, ITERS_MIN, ITERS_TARGET_S, OPS, CommBenchConfig, algbw_gbps, build_table, busbw_factor,
    busbw_gbps, choose_iters, format_size, iteration_times, message_count, parse_ops, parse_size, size_sweep,
    summarize_table, wrong_reason)
from scalelab.run.execute import run_commbench
from scalelab.run.kinds import commbench_argv

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- pure math

@pytest.mark.parametrize("ranks, factors", [
    (2, {"allreduce": 1.0, "allgather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}),
    (4, {"allreduce": 1.5, "allgather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0}),
    (8, {"allreduce": 1.75, "allgather": 0.875, "reduce_scatter": 0.875, "broadcast": 1.0}),
])
def test_busbw_factors_are_the_nccl_tests_ones(ranks, factors):
    assert {op: busbw_factor(op, ranks) for op in OPS} == factors


def test_algbw_and_busbw_are_exact_on_fixed_inputs():
    assert algbw_gbps(10**9, 1.0) == 1.0
    assert algbw_gbps(2**26, 0.5) == 2**27 / 1e9
    assert busbw_gbps("allreduce", 2**20, 0.25, 4) == 2**22 / 1e9 * 1.5
    assert busbw_gbps("allgather", 2**20, 0.25, 4) == 2**22 / 1e9 * 0.75
    assert busbw_gbps("broadcast", 2**20, 0.25, 4) == 2**22 / 1e9
    with pytest.raises(ConfigError, match="op: 'gather'"):
        busbw_factor("gather", 2)


@pytest.mark.parametrize("text, nbytes", [
    ("1K", 1024), ("64M", 64 * 2**20), ("1G", 2**30), ("4096", 4096), ("2kb", 2048), ("8KiB", 8192),
    (" 3M ", 3 * 2**20), (512, 512)])
def test_sizes_parse_in_powers_of_1024(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "1X", "1.5K", "-1", "0", "1 T", "64MM"])
def test_bad_sizes_are_one_line_config_errors_naming_the_field(text):
    with pytest.raises(ConfigError) as info:
        parse_size(text, "begin")
    msg = str(info.value)
    assert msg.startswith("begin: ") and "allowed" in msg and "\n" not in msg


def test_format_size_is_the_inverse_for_whole_units():
    assert [format_size(s) for s in (1024, 64 * 2**20, 2**30, 1536, 1000)] == ["1K", "64M", "1G", "1536", "1000"]


def test_size_sweep_includes_both_ends_on_the_sweep():
    assert size_sweep(1024, 65536, 2) == [1024 * 2**k for k in range(7)]
    assert size_sweep(1024, 10 * 1024, 3) == [1024, 3072, 9216]
    assert size_sweep(4096, 4096, 2) == [4096]
    with pytest.raises(ConfigError, match=r"^end: '1K' is not allowed; allowed: a size >= begin \(1M\)$"):
        size_sweep(2**20, 1024, 2)
    with pytest.raises(ConfigError, match="^factor: 1 "):
        size_sweep(1024, 2048, 1)


def test_message_count_rounds_down_to_equal_chunks_per_rank():
    assert message_count(1024, 4, 2) == 256
    assert message_count(1024, 4, 3) == 255
    assert message_count(1024, 2, 3) == 510
    assert message_count(4, 4, 2) == 0


def test_parse_ops_keeps_order_drops_repeats_and_names_a_bad_op():
    assert parse_ops("all") == OPS
    assert parse_ops("broadcast, allreduce,broadcast") == ("broadcast", "allreduce")
    with pytest.raises(ConfigError, match="^ops: 'gather' is not allowed"):
        parse_ops("allreduce,gather")
    with pytest.raises(ConfigError, match="^ops: "):
        parse_ops(" , ")


def test_iteration_time_is_the_slowest_rank_per_iteration():
    assert iteration_times([[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]) == [3.0, 5.0, 2.5]
    with pytest.raises(ValueError):
        iteration_times([[1.0], [1.0, 2.0]])


def test_iterations_per_size_reach_the_target_within_the_bounds():
    # probe medians of a gloo allreduce here: 4 KiB ~ 0.45 ms, 4 MiB ~ 4 ms, 256 MiB ~ 0.4 s
    probes = {4 * 2**10: 0.45e-3, 4 * 2**20: 4e-3, 256 * 2**20: 0.4}
    iters = {size: choose_iters(t) for size, t in probes.items()}
    assert iters == {4 * 2**10: 445, 4 * 2**20: 50, 256 * 2**20: ITERS_MIN}  # ceil(0.2 / t), at least 5
    assert choose_iters(1e-6) == ITERS_MAX and choose_iters(0.0) == ITERS_MAX and choose_iters(float("nan")) == ITERS_MAX
    assert choose_iters(ITERS_TARGET_S / 7) == 7  # exactly on the target: no rounding up past it
    assert choose_iters(1e-3, target_s=1.0, lo=2, hi=100) == 100
    assert choose_iters(10.0, target_s=1.0, lo=2, hi=100) == 2
    # smaller messages never get fewer iterations than larger ones (probe times grow with size)
    counts = [choose_iters(t) for t in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)]
    assert counts == sorted(counts, reverse=True) and all(ITERS_MIN <= c <= ITERS_MAX for c in counts)


class _FakeClock:
    """A clock that moves only when the fake collective or barrier says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loop_pays_a_wake_up_once_and_single_calls_pay_it_every_time():
    # A collective that costs 0.1 ms back to back, but 4 ms more when it is the first call after a barrier (the
    # ranks' threads went to sleep in it: a scheduler tick). Known truth: per iteration 4.1 ms each; the loop of n
    # pays the wake-up once: (4 + 0.1 n) ms / n.
    clock, state = _FakeClock(), {"woken": True}

    def barrier():
        clock.now += 0.5  # the barrier's own time is outside both timers
        state["woken"] = False

    def call():
        clock.now += 0.1e-3 + (0 if state["woken"] else 4e-3)
        state["woken"] = True

    bufs = cw.make_buffers("allreduce", 8, 0, 2, torch.float32, torch.device("cpu"))
    cpu = torch.device("cpu")
    times = cw.time_iterations(call, bufs, 5, cpu, barrier=barrier, clock=clock)
    assert times == pytest.approx([4.1e-3] * 5)
    n = 200
    loop = cw.time_loop(call, bufs, n, cpu, barrier=barrier, clock=clock)
    assert loop == pytest.approx(4e-3 + 0.1e-3 * n)
    assert loop / n == pytest.approx(0.12e-3)


def test_agreed_iters_is_the_fixed_count_without_probing():
    def no_call():
        raise AssertionError("a fixed count must not probe")

    assert cw.agreed_iters(CommBenchConfig(iters=7), no_call, None, torch.device("cpu")) == 7


def _records():
    mib = 2**20
    recs = [{"op": "allreduce", "size(B)": mib, "count": mib // 4, "rank": 0, "impl": "all_reduce",
             "times(s)": [1e-3, 2e-3, 4e-3], "loop(s)": 3e-3, "wrong": 0},
            {"op": "allreduce", "size(B)": mib, "count": mib // 4, "rank": 1, "impl": "all_reduce",
             "times(s)": [2e-3, 1e-3, 3e-3], "loop(s)": 4.5e-3, "wrong": 2},
            {"op": "allgather", "size(B)": mib, "count": mib // 4, "rank": 1, "impl": "all_gather_single",
             "times(s)": [0.5e-3, 0.25e-3], "loop(s)": 0.5e-3, "wrong": 0},
            {"op": "allgather", "size(B)": mib, "count": mib // 4, "rank": 0, "impl": "all_gather_single",
             "times(s)": [0.25e-3, 0.5e-3], "loop(s)": 0.4e-3, "wrong": 0}]
    recs += [{"op": "reduce_scatter", "size(B)": mib, "count": mib // 4, "rank": r, "skipped": "no gloo support"}
             for r in (0, 1)]
    return recs


def test_table_from_per_iteration_timings_is_exact():
    table = build_table(_records(), ranks=2, dtype="float32")
    assert list(table.columns) == list(COLUMNS)
    ar, ag, rs = (table[table["op"] == op].iloc[0] for op in ("allreduce", "allgather", "reduce_scatter"))
    # allreduce: per iteration max over ranks = [2, 2, 4] ms; loop: slowest rank 4.5 ms / 3 iterations = 1.5 ms
    assert (ar["time_min(us)"], ar["time_median(us)"], ar["time_max(us)"]) == pytest.approx((2000, 2000, 4000))
    assert ar["time_loop(us)"] == pytest.approx(1500)
    low, high = median_interval([2e-3, 2e-3, 4e-3])
    assert (ar["time_ci_low(us)"], ar["time_ci_high(us)"]) == pytest.approx((low * 1e6, high * 1e6))
    assert ar["time_ci_low(us)"] <= ar["time_median(us)"] <= ar["time_ci_high(us)"]
    assert ar["algbw(GB/s)"] == pytest.approx(2**20 / 1.5e-3 / 1e9)
    assert ar["busbw(GB/s)"] == pytest.approx(2**20 / 1.5e-3 / 1e9 * 1.0)
    assert (ar["busbw_min(GB/s)"], ar["busbw_max(GB/s)"]) == (2**20 / 4e-3 / 1e9, 2**20 / 2e-3 / 1e9)
    assert (ar["wrong"], ar["iters"], ar["status"]) == (2, 3, "ok")
    # allgather: loop 0.5 ms / 2 = 0.25 ms; busbw factor (n-1)/n = 1/2
    assert ag["time_loop(us)"] == pytest.approx(250)
    assert ag["busbw(GB/s)"] == pytest.approx(2**20 / 0.25e-3 / 1e9 * 0.5)
    assert ag["impl"] == "all_gather_single"
    assert (rs["status"], rs["reason"], pd.isna(rs["busbw(GB/s)"])) == ("skipped", "no gloo support", True)
    summary = summarize_table(table)
    assert summary["allreduce/busbw_peak(GB/s)"] == ar["busbw(GB/s)"]
    assert summary["allreduce/busbw_peak_size(B)"] == 2**20
    assert summary["reduce_scatter/skipped"] == "no gloo support"
    assert summary["wrong"] == 2
    assert wrong_reason(table) == "correctness check failed: allreduce has 2 wrong element(s)"
    with pytest.raises(ValueError, match="1 of 2 ranks"):
        build_table(_records()[:3], ranks=2, dtype="float32")


def test_calibration_fits_on_the_loop_time_and_reads_older_runs_by_their_mean(tmp_path):
    from scalelab.perf.fit import bench_means
    from scalelab.store.rundir import RunDir

    files = RunDir(tmp_path)
    files.write_timings({"ranks": 2, "records": _records()})
    assert bench_means(files) == (pytest.approx([2**20]), pytest.approx([1.5e-3]), 2)  # slowest rank's loop / n
    old = [{k: v for k, v in r.items() if k != "loop(s)"} for r in _records()]  # before the loop was timed
    files.write_timings({"ranks": 2, "records": old})
    assert bench_means(files)[1] == pytest.approx([(2e-3 + 2e-3 + 4e-3) / 3])


# ---------------------------------------------------------------- the check's truth, without a process group

def _simulate(op: str, inputs: list[torch.Tensor], rank: int) -> torch.Tensor:
    """What a correct collective leaves on `rank`, computed by hand from every rank's input."""
    world = len(inputs)
    if op == "allreduce":
        return sum(x.double() for x in inputs)
    if op == "broadcast":
        return inputs[0].double()
    if op == "allgather":
        return torch.cat([x.double() for x in inputs])
    return sum(x.double() for x in inputs).chunk(world)[rank]  # reduce_scatter


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", OPS)
def test_check_accepts_a_correct_result_and_counts_a_wrong_element(op, dtype):
    world, count = 8, 8 * 21  # bfloat16 sums over 8 ranks stay exact with the worker's pattern
    bufs = [cw.make_buffers(op, count, r, world, dtype, torch.device("cpu")) for r in range(world)]
    for b in bufs:
        b.reset()
    for rank in range(world):
        result = _simulate(op, [b.inp for b in bufs], rank).to(dtype)
        want = cw.expected(op, count, rank, world)
        assert cw.count_wrong(result, want, world) == 0
        result[3] = -7
        assert cw.count_wrong(result, want, world) == 1
        result[4] = float("nan")
        assert cw.count_wrong(result, want, world) == 2


def test_check_catches_chunks_from_the_wrong_rank():
    world, count = 2, 64
    bufs = [cw.make_buffers("allgather", count, r, world, torch.float32, torch.device("cpu")) for r in range(world)]
    for b in bufs:
        b.reset()
    swapped = torch.cat([bufs[1].inp, bufs[0].inp]).double()
    assert cw.count_wrong(swapped, cw.expected("allgather", count, 0, world), world) == count


def test_an_api_the_backend_refuses_falls_through_and_all_refused_is_a_skip_with_reasons():
    def refuse():
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter\nmore detail")

    assert cw.first_supported([("new", refuse), ("old", lambda: None)]) == ("old", None)
    name, reason = cw.first_supported([("new", refuse), ("old", refuse)])
    assert name is None
    assert reason == ("new: ProcessGroupGloo does not support reduce_scatter; "
                      "old: ProcessGroupGloo does not support reduce_scatter")


def test_busbw_plot_draws_measured_ops_and_names_skipped_ones(tmp_path):
    from scalelab.run.exports import plot_busbw

    path = plot_busbw(build_table(_records(), ranks=2, dtype="float32"), tmp_path / "busbw.png", title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="missing column 'busbw_min"):
        plot_busbw(pd.DataFrame({"op": [], "size(B)": [], "busbw(GB/s)": []}), tmp_path / "x.png")


# ---------------------------------------------------------------- config and launch

def test_config_round_trips_and_nccl_needs_a_gpu_per_rank(monkeypatch):
    cfg = CommBenchConfig(ops="allreduce", begin="1K", end="8K", iters=3)
    assert cfg.sizes == (1024, 2048, 4096, 8192)
    assert CommBenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    auto = CommBenchConfig(ops="allreduce")
    assert auto.iters is None and CommBenchConfig.from_dict(json.loads(json.dumps(auto.to_dict()))) == auto
    assert (cfg.iters_label, auto.iters_label) == ("3", "~0.2 s (5..1000)")
    monkeypatch.setattr("scalelab.config.cuda_device_count", lambda: 1)
    assert CommBenchConfig().resolved_backend == "gloo"
    with pytest.raises(ConfigError, match=r"^backend: 'nccl' .*GPU per rank \(2\), found 1"):
        CommBenchConfig(backend="nccl")
    monkeypatch.setattr("scalelab.config.cuda_device_count", lambda: 2)
    assert (CommBenchConfig().resolved_backend, CommBenchConfig(backend="nccl").device) == ("nccl", "cuda")


def test_argv_is_a_static_loopback_rendezvous_running_the_bench_worker(tmp_path):
    argv = commbench_argv(CommBenchConfig(ranks=3), tmp_path, port=29999)
    assert argv == ["--nnodes", "1", "--nproc-per-node", "3", "--node-rank", "0", "--rdzv-backend", "static",
                    "--rdzv-endpoint", "127.0.0.1:29999", "--max-restarts", "0", "--monitor-interval", "0.2",
                    "--log-dir", str(tmp_path / "logs"), "--module", "scalelab.measure.commbench_worker",
                    "--run-dir", str(tmp_path)]


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="an nccl benchmark needs 2 CUDA GPUs")
def test_two_nccl_ranks_measure_and_check_every_op(store):
    outcome = run_commbench(CommBenchConfig(begin="1K", end="1M", warmup=1, iters=2), store, say=lambda s: None)
    assert outcome.status == "completed"
    assert store.get(outcome.run_id)["config"]["backend"] == "nccl"
    ok = outcome.table[outcome.table["status"] == "ok"]
    assert set(ok["op"]) == set(OPS) and (ok["wrong"] == 0).all() and (ok["busbw(GB/s)"] > 0).all()


# ---------------------------------------------------------------- CLI

@pytest.mark.parametrize("args, fragment", [
    (["--begin", "1X"], "begin: '1X'"),
    (["--end", "0"], "end: '0'"),
    (["--begin", "1M", "--end", "1K"], "end: '1K'"),
    (["--factor", "1"], "factor: 1"),
    (["--factor", "two"], "--factor"),
    (["--ops", "allreduce,gather"], "ops: 'gather'"),
    (["--backend", "nccl"], "backend: 'nccl'"),
    (["--backend", "mpi"], "backend: 'mpi'"),
    (["--dtype", "int8"], "dtype: 'int8'"),
    (["--ranks", "1"], "ranks: 1"),
    (["--iters", "0"], "iters: 0"),
    (["--ranks", "1", "--local-nodes", "2", "--launcher", "mpi"], "nodes_launcher: 'mpi'"),
    (["--ranks", "1", "--local-nodes", "2", "--launcher", "slurm", "--link-gbps", "1"], "link_gbps: 1.0"),
])
def test_bad_bench_input_is_one_line_and_exit_code_2(args, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("scalelab.config.cuda_device_count", lambda: 0)
    with pytest.raises(SystemExit) as info:
        main(["bench", "comm", *args, "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fragment in err, err
    assert not (tmp_path / "store").exists()  # rejected before anything was recorded
