"""The sync layer's pure parts, on fixed clocks and fixed records: meter, bandwidth math, buckets, config, summary."""
from __future__ import annotations

import threading
import time

import pandas as pd
import pytest
import torch

from scalelab import config as config_mod
from scalelab.analysis.summary import comm_summary, loopback_bytes_per_step, steps_frame, summarize
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.sync.bucketed import assign_buckets
from scalelab.sync.ddp import broadcast_chunks
from scalelab.sync.meter import CommMeter, step_totals
from scalelab.train.loop import micro_batches


class FakeClock:
    """A clock that only moves when the code sleeps (or the test advances it)."""

    def __init__(self):
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


# ---------------------------------------------------------------- meter

def test_a_synchronous_collective_is_timed_and_padded_to_the_emulated_link():
    clock = FakeClock()
    # 10 ms latency, 1 Gbit/s = 125e6 B/s: 1.25e6 bytes take 10 ms more
    meter = CommMeter(2, latency_s=0.010, bandwidth_Bps=125e6, clock=clock, sleep=clock.sleep)
    with meter.collective("allreduce", 1_250_000, phase="backward"):
        clock.t += 0.004  # the real collective took 4 ms
    with meter.collective("broadcast", 40, phase="forward"):
        clock.t += 0.050  # slower than the floor: nothing added
    assert clock.slept == [pytest.approx(0.016)]
    step = meter.take_step()
    assert step == {"comm_total(s)": pytest.approx(0.020 + 0.050), "comm_sum(s)": pytest.approx(0.070),
                    "collectives": 2, "comm_bytes": 1_250_040,
                    "comm_bytes_forward": 40, "comm_bytes_backward": 1_250_000, "comm_bytes_optimizer": 0,
                    "comm_alg_bytes": 1_250_040, "comm_bus_bytes": pytest.approx(1_250_000 * 1.0 + 40),
                    "comm_events": [["allreduce", "backward", pytest.approx(100.0), pytest.approx(0.020), 1_250_000],
                                    ["broadcast", "forward", pytest.approx(100.020), pytest.approx(0.050), 40]]}
    assert meter.take_step()["collectives"] == 0  # the next step starts empty


def test_without_emulation_nothing_sleeps_and_floor_is_zero():
    clock = FakeClock()
    meter = CommMeter(2, clock=clock, sleep=clock.sleep)
    assert not meter.emulating and meter.floor_s(10**9) == 0
    with meter.collective("allreduce", 8, phase="backward"):
        clock.t += 0.001
    assert clock.slept == [] and meter.take_step()["comm_total(s)"] == pytest.approx(0.001)


def test_an_async_collective_is_timed_from_launch_to_completion():
    clock = FakeClock()
    meter = CommMeter(2, clock=clock, sleep=clock.sleep)
    fut = torch.futures.Future()
    out = meter.track(fut, "allreduce", 400, phase="backward", start=clock())
    clock.t += 0.003  # backward goes on while the collective runs
    fut.set_result(torch.ones(100))
    assert torch.equal(out.wait(), torch.ones(100))
    step = meter.take_step()
    assert step["comm_total(s)"] == pytest.approx(0.003) and step["comm_bytes"] == 400


def test_an_async_collective_completes_no_earlier_than_the_emulated_floor():
    meter = CommMeter(2, latency_s=0.03)
    fut = torch.futures.Future()
    out = meter.track(fut, "allreduce", 4, phase="backward", count=2)  # two chained collectives: 2 x 30 ms
    fut.set_result([torch.zeros(1)])
    assert not out.done()  # the real one is done; the emulated link is not
    out.wait()
    step = meter.take_step()
    assert step["collectives"] == 2 and 0.06 <= step["comm_total(s)"] < 0.09


def test_overlapping_async_collectives_count_once_in_the_union_and_bandwidth_uses_it():
    """Three buckets in flight at once (known truth on a fixed clock): 0-30 ms, 10-40 ms, and 60-70 ms. Inside
    collectives: the union, 40 + 10 = 50 ms, not the 70 ms sum; each keeps its own interval; busbw = bus bytes / 50 ms."""
    clock = FakeClock()
    meter = CommMeter(2, clock=clock, sleep=clock.sleep)
    t0 = clock()
    futs = [torch.futures.Future() for _ in range(3)]
    outs = [meter.track(futs[0], "allreduce", 1000, phase="backward", start=t0),
            meter.track(futs[1], "allreduce", 1000, phase="backward", start=t0 + 0.010)]
    clock.t = t0 + 0.030
    futs[0].set_result(None)
    clock.t = t0 + 0.040
    futs[1].set_result(None)
    outs.append(meter.track(futs[2], "allreduce", 1000, phase="backward", start=t0 + 0.060))
    clock.t = t0 + 0.070
    futs[2].set_result(None)
    for out in outs:
        out.wait()
    step = meter.take_step()
    assert step["comm_total(s)"] == pytest.approx(0.050)
    assert step["comm_sum(s)"] == pytest.approx(0.070)
    assert [e[3] for e in step["comm_events"]] == [pytest.approx(0.030), pytest.approx(0.030), pytest.approx(0.010)]
    from scalelab.analysis.summary import comm_summary
    frame = pd.DataFrame([{"step": 1, "rank": 0, "warmup": False, "comm(s)": 0.0, **step}])
    assert comm_summary(frame)["comm/busbw(GB/s)"] == pytest.approx(3000 * 1.0 / 0.050 / 1e9)
    assert comm_summary(frame)["comm/time(ms)"] == pytest.approx(50.0)
    assert comm_summary(frame)["comm/sum(ms)"] == pytest.approx(70.0)


def test_union_of_intervals():
    from scalelab.sync.meter import union_seconds

    assert union_seconds([]) == 0
    assert union_seconds([(0, 1), (2, 3)]) == 2
    assert union_seconds([(0, 3), (1, 2)]) == 3  # nested
    assert union_seconds([(1, 4), (0, 2), (3, 5)]) == 5  # chained, given out of order


def test_an_async_failure_reaches_the_waiter():
    meter = CommMeter(2, latency_s=0.001)
    fut = torch.futures.Future()
    out = meter.track(fut, "allreduce", 4, phase="backward")
    fut.set_exception(RuntimeError("peer went away"))
    with pytest.raises(RuntimeError, match="peer went away"):
        out.wait()


def test_records_from_other_threads_are_all_kept():
    meter = CommMeter(2)

    def many():
        for _ in range(500):
            meter.record("allreduce", 1, 0.0, phase="backward")

    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert meter.take_step()["comm_bytes"] == 2000


def test_a_completed_collective_is_in_the_step_that_saw_it_complete_not_the_next():
    """Issue 57's flake: the meter's callback runs on the completing (gloo) thread and needs the GIL; the caller can
    learn of the completion first (its own `then`, chained after the work completed, runs at once on its thread)
    and end the step. Here the completing thread's callback is held back 0.2 s (its clock read): the step's end
    still reads the collective, by waiting for it, and a collective still running is not waited for."""
    main = threading.get_ident()

    def clock():
        if threading.get_ident() != main:
            time.sleep(0.2)  # the callback, late for the GIL
        return time.perf_counter()

    meter = CommMeter(2, clock=clock)
    done, running = torch.futures.Future(), torch.futures.Future()
    meter.track(done, "allreduce", 4, phase="backward", start=0.0)
    meter.track(running, "allreduce", 8, phase="backward", start=0.0)
    completer = threading.Thread(target=done.set_result, args=(None,))
    completer.start()
    while not done.done():  # the caller sees it complete ...
        time.sleep(0.001)
    assert not meter.idle()  # ... and its step holds it
    step = meter.take_step()
    assert step["collectives"] == 1 and step["comm_bytes"] == 4, step
    completer.join()
    running.set_result(None)  # the one still running lands in the step where it completes
    assert meter.take_step()["comm_bytes"] == 8


def test_bad_phase_or_op_fails_at_record_time():
    meter = CommMeter(2)
    with pytest.raises(ValueError, match="phase"):
        meter.record("allreduce", 1, 0.0, phase="eval")
    with pytest.raises(ValueError, match="alltoall"):
        meter.record("alltoall", 1, 0.0, phase="backward")


def test_gather_uses_the_total_size_for_bandwidth():
    clock = FakeClock()
    meter = CommMeter(4, clock=clock, sleep=clock.sleep)
    with meter.collective("gather", 300, phase="backward", alg_bytes=400):  # root: 3 slices in, S = 4 slices
        clock.t += 0.001
    step = meter.take_step()
    assert (step["comm_bytes"], step["comm_alg_bytes"], step["comm_bus_bytes"]) == (300, 400, pytest.approx(300))


def test_meter_from_config_converts_units(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    meter = CommMeter.from_config(TrainConfig(ranks=2, net_latency_ms=5, net_bandwidth_gbps=8.0), 2)
    assert meter.latency_s == pytest.approx(0.005) and meter.bandwidth_Bps == pytest.approx(1e9)
    assert meter.floor_s(10**9) == pytest.approx(1.005)


def test_step_totals_of_nothing_are_zero():
    assert step_totals([], 2) == {"comm_total(s)": 0, "comm_sum(s)": 0, "collectives": 0, "comm_bytes": 0, "comm_bytes_forward": 0,
                                  "comm_bytes_backward": 0, "comm_bytes_optimizer": 0, "comm_alg_bytes": 0,
                                  "comm_bus_bytes": 0, "comm_events": []}


# ---------------------------------------------------------------- buckets and micro-batches

def test_buckets_close_once_they_reach_the_cap_or_the_dtype_changes():
    sizes = [10, 160, 16, 3000]  # float32 elements: 40, 640, 64, 12000 bytes
    params = [torch.zeros(n) for n in sizes]
    assert assign_buckets(params, 100) == [[0, 1], [2, 3]]
    assert assign_buckets(params, 10**6) == [[0, 1, 2, 3]]
    assert assign_buckets(params, 1) == [[0], [1], [2], [3]]
    mixed = [torch.zeros(10), torch.zeros(10, dtype=torch.float16), torch.zeros(10, dtype=torch.float16)]
    assert assign_buckets(mixed, 10**6) == [[0], [1, 2]]


def test_coalesced_broadcasts_are_counted_per_dtype_and_chunk():
    bn = [torch.zeros(4), torch.zeros(4), torch.zeros((), dtype=torch.int64)]
    assert broadcast_chunks(bn, 250 * 2**20) == 2
    assert broadcast_chunks([torch.zeros(4)] * 5, 32) == 3  # 16+16 sent, 16+16 sent, 16 left over
    assert broadcast_chunks([], 10) == 0


def test_micro_batches_weight_by_samples_and_skip_empty_slices():
    x, y = torch.arange(10.0).view(5, 2), torch.arange(5)
    assert micro_batches(x, y, 1)[0][2] == 1.0 and micro_batches(x, y, 1)[0][0] is x
    parts = micro_batches(x, y, 2)
    assert [p[0].shape[0] for p in parts] == [3, 2] and [p[2] for p in parts] == [0.6, 0.4]
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    assert len(micro_batches(x[:1], y[:1], 4)) == 1  # fewer samples than micro-steps


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("kwargs, field, fragment", [
    ({"sync": "ring"}, "sync", "allowed: auto, gather_scatter, allreduce, bucketed, ddp, noop"),
    ({"noop_collectives": True}, "noop_collectives", "only with a process group"),
    ({"sync": "allreduce", "wrapper": "single"}, "sync", "auto only"),
    ({"ddp_hook": "fp16", "ranks": 2, "sync": "bucketed"}, "ddp_hook", "only with sync ddp"),
    ({"ddp_hook": "powersgd"}, "ddp_hook", "only with sync ddp"),
    ({"accumulate": 0}, "accumulate", ">= 1"),
    ({"accumulate": 3, "ranks": 2, "global_batch": 64}, "global_batch", "ranks x accumulate (6)"),
    ({"bucket_mb": 0}, "bucket_mb", "> 0"),
    ({"powersgd_rank": 0}, "powersgd_rank", ">= 1"),
    ({"net_latency_ms": -1.0}, "net_latency_ms", ">= 0"),
    ({"net_bandwidth_gbps": 0.0, "ranks": 2}, "net_bandwidth_gbps", "> 0"),
    ({"net_latency_ms": 5.0}, "net_latency_ms", "only with a process group"),
])
def test_bad_sync_values_name_the_field_the_value_and_what_is_allowed(kwargs, field, fragment, monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    assert info.value.field == field and fragment in str(info.value) and "\n" not in str(info.value)


def test_any_sync_but_auto_needs_a_process_group(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    one = TrainConfig(sync="bucketed")
    assert (one.resolved_wrapper, one.distributed, one.resolved_sync) == ("ddp", True, "bucketed")
    plain = TrainConfig()
    assert (plain.resolved_wrapper, plain.distributed, plain.resolved_sync) == ("single", False, "none")
    assert TrainConfig(ranks=2).resolved_sync == "ddp"
    assert TrainConfig(accumulate=4, global_batch=8).per_rank_batch == 8  # accumulation alone needs no group
    cfg = TrainConfig(ranks=2, sync="ddp", ddp_hook="powersgd", powersgd_rank=4, bucket_mb=1.5)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


# ---------------------------------------------------------------- summary

def rec(step, rank, *, warmup=False, comm_total=0.01, blocking=0.004, coll=3, fwd=0, bwd=1000, alg=1000,
        bus=1000.0, wall=0.1, t_end=None):
    return {"step": step, "epoch": 0, "rank": rank, "warmup": warmup, "samples": 8, "targets": 8, "wall(s)": wall,
            "comm(s)": blocking, "comm_total(s)": comm_total, "collectives": coll, "comm_bytes": fwd + bwd,
            "comm_bytes_forward": fwd, "comm_bytes_backward": bwd, "comm_bytes_optimizer": 0,
            "comm_alg_bytes": alg, "comm_bus_bytes": bus, "t_end(unix_s)": t_end if t_end is not None else step}


def test_comm_summary_is_exact_on_fixed_records():
    records = [
        rec(1, 0, warmup=True, comm_total=9.0, coll=99),  # warm-up: excluded
        rec(2, 0, comm_total=0.010, blocking=0.002, fwd=40, alg=1040, bus=1040.0),
        rec(2, 1, comm_total=0.030, blocking=0.004, fwd=40, alg=1040, bus=1040.0),
        rec(3, 0, comm_total=0.020, blocking=0.006, coll=5, alg=2000, bus=1000.0),
        rec(3, 1, comm_total=0.020, blocking=0.008, coll=5, alg=2000, bus=1000.0),
    ]
    s = summarize(records, steps_per_epoch=10)
    assert s["comm/collectives_per_step"] == pytest.approx(4.0)
    assert s["comm/bytes_per_step"] == pytest.approx(1020.0)
    assert s["comm/bytes_forward_per_step"] == pytest.approx(20.0)
    assert s["comm/bytes_backward_per_step"] == pytest.approx(1000.0)
    assert s["comm/bytes_optimizer_per_step"] == 0
    assert s["comm/time(ms)"] == pytest.approx(20.0)  # mean over steps of the mean over ranks
    assert s["comm/blocking(ms)"] == pytest.approx(5.0) == s["stage/comm(ms)"]
    seconds = 0.010 + 0.030 + 0.020 + 0.020
    assert s["comm/algbw(GB/s)"] == pytest.approx((1040 * 2 + 2000 * 2) / seconds / 1e9)
    assert s["comm/busbw(GB/s)"] == pytest.approx((1040 * 2 + 1000 * 2) / seconds / 1e9)


def test_runs_without_a_process_group_have_no_comm_metrics():
    records = [{"step": 1, "epoch": 0, "rank": 0, "warmup": False, "samples": 8, "targets": 8, "wall(s)": 0.1}]
    assert comm_summary(steps_frame(records)) == {}
    assert not any(k.startswith("comm/") for k in summarize(records, steps_per_epoch=1))


def test_loopback_bytes_are_interpolated_over_the_timed_window():
    # counter grows 1000 B/s; timed window: step 2 starts at 11.5 (end 12.0 - wall 0.5) and step 4 ends at 14.0
    samples = [{"time": t, "lo_sent(bytes)": 1000 * t} for t in (10.0, 13.0, 15.0)]
    records = [rec(1, 0, warmup=True, t_end=11.0), rec(2, 0, t_end=12.0, wall=0.5), rec(3, 0, t_end=13.0),
               rec(4, 0, t_end=14.0), rec(4, 1, t_end=99.0)]
    assert loopback_bytes_per_step(samples, records) == pytest.approx(1000 * (14.0 - 11.5) / 3)
    assert loopback_bytes_per_step(samples[:1], records) is None  # one sample cannot cover a window
    late = [{"time": t, "lo_sent(bytes)": 0} for t in (12.0, 20.0)]
    assert loopback_bytes_per_step(late, records) is None  # window starts before the first sample
