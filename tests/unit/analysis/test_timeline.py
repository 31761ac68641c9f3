"""Horovod's timeline parsed and aligned on a small hand-written file (two tensors, one step): known spans, a
file cut off mid-event, the alignment against known enqueue times, and the run trace that carries it."""
from __future__ import annotations

import json

import pytest

from scalelab.analysis import timeline
from scalelab.run.exports import HOROVOD_PID, write_trace
from scalelab.store.rundir import RunDir

START_US = 1_700_000_000_000_000  # the timeline's wall-clock start
TEXT = f"""[
{{"name": "process_name", "ph": "M", "pid": 0, "args": {{"start_time_since_epoch_in_micros":{START_US}}}}},
{{"name": "process_name", "ph": "M", "pid": 1, "args": {{"name": "allreduce.fc.weight"}}}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 1000, "pid": 1}},{{"ph": "E", "ts": 3000, "pid": 1}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 3000, "pid": 1}},{{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 3500, "pid": 1}},
{{"ph": "E", "ts": 7500, "pid": 1}},{{"ph": "E", "ts": 8000, "pid": 1}},
{{"name": "process_name", "ph": "M", "pid": 2, "args": {{"name": "allreduce.fc.bias"}}}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 2000, "pid": 2}},{{"ph": "E", "ts": 3000, "pid": 2}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 3000, "pid": 2}},{{"ph": "E", "ts": 8000, "pid": 2, "args": {{"dtype": "float32"}}}}]"""
T0 = START_US / 1e6  # (unix seconds in float64: about 0.2 µs of resolution, hence abs tolerances)


def test_spans_are_on_unix_time_with_their_nesting():
    spans = timeline.intervals(timeline.load_events(TEXT))
    weight = [s for s in spans if s.tensor == "allreduce.fc.weight"]
    assert [(s.activity, s.depth) for s in weight] == [("NEGOTIATE_ALLREDUCE", 0), ("ALLREDUCE", 0),
                                                       ("GLOO_ALLREDUCE", 1)]
    gloo = weight[2]
    assert gloo.start_s == pytest.approx(T0 + 0.0035, abs=1e-6) and gloo.seconds == pytest.approx(0.004, abs=1e-6)


def test_a_file_cut_off_mid_event_keeps_its_whole_events():
    cut = TEXT[:TEXT.index('"ts": 8000, "pid": 2') - 10].rstrip()  # Horovod was killed while writing
    events = timeline.load_events(cut)
    assert events == json.loads(TEXT)[:len(events)] and len(events) == len(json.loads(TEXT)) - 1  # all but the torn one
    assert timeline.load_events("") == []


def test_alignment_keeps_the_anchor_and_reports_the_lag():
    spans = timeline.intervals(timeline.load_events(TEXT))
    # enqueued 0.5 ms before each negotiation: the normal order, nothing moves
    a = timeline.align(spans, [T0 + 0.0005, T0 + 0.0015])
    assert a.offset_s == 0.0 and a.pairs == 2 and a.lag_s == pytest.approx(0.0005, abs=1e-6)
    # negotiations 2 ms before their enqueues: impossible, the timeline is shifted by 2 ms
    b = timeline.align(spans, [T0 + 0.003, T0 + 0.004])
    assert b.offset_s == pytest.approx(0.002, abs=1e-6) and b.lag_s == pytest.approx(0.0, abs=1e-6)
    assert timeline.align(spans, [T0]).pairs == 0  # counts differ: the anchor alone, unchecked


def test_the_run_trace_carries_the_timeline(tmp_path):
    rundir = RunDir(tmp_path)
    end_unix, end_perf = T0 + 0.01, 500.0
    # rank 0 enqueued both gradients at 0.5 ms and 1.5 ms after the timeline's start
    events = [["allreduce", "backward", end_perf - 0.0095, 0.008, 40], ["allreduce", "backward", end_perf - 0.0085,
                                                                        0.007, 4]]
    rundir.write_steps(0, [{"step": 1, "rank": 0, "wall(s)": 0.01, "t_end(unix_s)": end_unix,
                            "t_end(perf_s)": end_perf, "comm_events": events}])
    rundir.horovod_timeline.write_text(TEXT)
    trace = json.loads(write_trace(tmp_path).read_text())["traceEvents"]
    rows = [e for e in trace if e["pid"] == HOROVOD_PID]
    assert "median lag 0.50 ms after 2 enqueues" in rows[0]["args"]["name"]
    gloo = next(e for e in rows if e["name"] == "GLOO_ALLREDUCE")
    assert gloo["tid"] == "allreduce.fc.weight" and gloo["ts"] == pytest.approx((T0 + 0.0035) * 1e6, abs=1)


# Two timed steps of rank 0 (and a warm-up one): step 2's window is [10, 20] ms after the timeline's start, step
# 3's [22, 32] ms. Step 2: two tensors fused (their ALLREDUCE spans 10 µs apart), one negotiation starting before
# the window (a peer was ready first), copies in and out of the fusion buffer; step 3: two allreduces one after
# the other, no copies. A warm-up span and one past every window belong to no timed step. The ranks' enqueues
# (RANKS' comm events; the negotiations' ticks say the same, as an uncached run's timeline would): in step 2 rank 1
# is ready with a at 9 and b at 10 ms, rank 0 with both at 12 (rank 1 waits 10 -> 12 ms: 2 ms); in step 3 rank 0
# is ready with a at 23 and b at 25, rank 1 at 24 and 27 (rank 0 waits 25 -> 27 ms, less a's allreduce on the
# wire over 24 -> 26: 1 ms).
STEPS_TEXT = f"""[
{{"name": "process_name", "ph": "M", "pid": 0, "args": {{"start_time_since_epoch_in_micros":{START_US}}}}},
{{"name": "process_name", "ph": "M", "pid": 1, "args": {{"name": "allreduce.a"}}}},
{{"name": "process_name", "ph": "M", "pid": 2, "args": {{"name": "allreduce.b"}}}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 1000, "pid": 1}},{{"ph": "E", "ts": 5000, "pid": 1}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 9000, "pid": 1}},
{{"ph": "X", "name": "1", "ts": 9000, "pid": 1, "dur": 0}},{{"ph": "X", "name": "0", "ts": 12000, "pid": 1, "dur": 0}},
{{"ph": "E", "ts": 12000, "pid": 1}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 10000, "pid": 2}},
{{"ph": "X", "name": "1", "ts": 10000, "pid": 2, "dur": 0}},{{"ph": "X", "name": "0", "ts": 12000, "pid": 2, "dur": 0}},
{{"ph": "E", "ts": 12000, "pid": 2}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 12500, "pid": 1}},
{{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 12500, "pid": 1}},{{"ph": "E", "ts": 13000, "pid": 1}},
{{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 13000, "pid": 1}},{{"ph": "E", "ts": 15500, "pid": 1}},
{{"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 15500, "pid": 1}},{{"ph": "E", "ts": 16000, "pid": 1}},
{{"ph": "E", "ts": 16000, "pid": 1}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 12510, "pid": 2}},{{"ph": "E", "ts": 16010, "pid": 2}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 23000, "pid": 1}},
{{"ph": "X", "name": "0", "ts": 23000, "pid": 1, "dur": 0}},{{"ph": "X", "name": "1", "ts": 24000, "pid": 1, "dur": 0}},
{{"ph": "E", "ts": 24000, "pid": 1}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 24000, "pid": 1}},{{"ph": "E", "ts": 26000, "pid": 1}},
{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 25000, "pid": 2}},
{{"ph": "X", "name": "0", "ts": 25000, "pid": 2, "dur": 0}},{{"ph": "X", "name": "1", "ts": 27000, "pid": 2, "dur": 0}},
{{"ph": "E", "ts": 27000, "pid": 2}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 27000, "pid": 2}},{{"ph": "E", "ts": 28000, "pid": 2}},
{{"ph": "B", "name": "ALLREDUCE", "ts": 40000, "pid": 1}},{{"ph": "E", "ts": 41000, "pid": 1}}]"""
RANK0 = [{"step": 1, "rank": 0, "warmup": True, "wall(s)": 0.008, "t_end(unix_s)": T0 + 0.008,
          "comm_alg_bytes": 1000, "comm_bus_bytes": 1000},
         {"step": 2, "rank": 0, "warmup": False, "wall(s)": 0.010, "t_end(unix_s)": T0 + 0.020,
          "comm_alg_bytes": 1000, "comm_bus_bytes": 1000},
         {"step": 3, "rank": 0, "warmup": False, "wall(s)": 0.010, "t_end(unix_s)": T0 + 0.032,
          "comm_alg_bytes": 1000, "comm_bus_bytes": 1000}]
READY_MS = {(2, 0): (12, 12), (2, 1): (9, 10), (3, 0): (23, 25), (3, 1): (24, 27)}  # (step, rank): a, b
RANKS = [{**r, "rank": rank, "t_end(perf_s)": r["t_end(unix_s)"],  # the perf clock is unix time here
          "comm_events": [["allreduce", "backward", T0 + ms / 1e3, 0.001, 500] for ms in READY_MS.get((r["step"], rank),
                                                                                                    ())]}
         for rank in (0, 1) for r in RANK0]


def test_spans_map_to_rank_0s_timed_steps_by_their_end():
    steps = timeline.step_spans(timeline.intervals(timeline.load_events(STEPS_TEXT)), RANK0)
    assert list(steps.index) == [2, 3]
    ms = (1e3 * steps[["collective(s)", "negotiation(s)", "copies(s)"]]).round(3)
    assert ms.loc[2].tolist() == [3.51, 3.0, 1.0]  # fused: [12.5, 16.01]; negotiations [9, 12]; copies 0.5 + 0.5
    assert ms.loc[3].tolist() == [3.0, 3.0, 0.0]
    assert steps["ops"].tolist() == [1, 2]
    # an offset moves every span: 3 ms later, step 3's allreduces end at 29 and 31 ms, still inside its window,
    # and step 2's at 19.01 ms, inside its own
    later = timeline.step_spans(timeline.intervals(timeline.load_events(STEPS_TEXT)), RANK0, 0.003)
    assert list(later.index) == [2, 3] and (1e3 * later["collective(s)"]).round(3).tolist() == [3.51, 3.0]
    assert timeline.step_spans([], RANK0).empty


def test_horovod_comm_from_the_timeline_on_exact_numbers():
    from scalelab.analysis import hvdcomm, keys

    out = hvdcomm.horovod_comm(STEPS_TEXT, RANKS, latency_ms=2.0)
    assert out[keys.COMM_TIME_MS] == pytest.approx((5.51 + 5.0) / 2, abs=1e-3)  # the union + the emulated 2 ms
    assert out[keys.COMM_CRITICAL_MS] == out[keys.COMM_TIME_MS] == out[keys.COMM_SUM_MS]
    assert out[keys.COMM_PEERS_WAIT_MS] == pytest.approx(1.5, abs=1e-3)  # (2 + 1) / 2, not the spans' (3 + 3) / 2
    assert out[hvdcomm.HVD_COPIES_MS] == pytest.approx(0.5, abs=1e-3)
    assert out[keys.COMM_ALGBW] == pytest.approx(2000 / 0.01051 / 1e9, rel=1e-3)
    assert out[hvdcomm.TIMELINE_STEPS] == 2 and "rank 0" in out[hvdcomm.COMM_NOT_AVAILABLE]
    low, high = (out[k] for k in keys.ci_keys(keys.COMM_TIME_MS))
    assert low < out[keys.COMM_TIME_MS] < high


def test_horovod_comm_without_a_timeline_is_not_available_not_estimated():
    import math

    from scalelab.analysis import hvdcomm, keys

    out = hvdcomm.horovod_comm(None, RANK0)
    assert all(math.isnan(out[k]) for k in (keys.COMM_TIME_MS, keys.COMM_CRITICAL_MS, keys.COMM_PEERS_WAIT_MS,
                                            keys.COMM_ALGBW, keys.COMM_BUSBW, *keys.ci_keys(keys.COMM_TIME_MS)))
    assert out[hvdcomm.COMM_NOT_AVAILABLE].endswith("no Horovod timeline")
    cut = hvdcomm.horovod_comm(STEPS_TEXT, [RANK0[0]])  # only a warm-up step: no timed step covered
    assert math.isnan(cut[keys.COMM_TIME_MS]) and "covers no timed step" in cut[hvdcomm.COMM_NOT_AVAILABLE]


def test_a_horovod_runs_summary_takes_its_collective_times_from_the_timeline(tmp_path):
    """collect_summary: the meter's enqueue -> synchronize() intervals (here 9 ms a step) give way to the timeline's
    figures on rank 0 (3.51 and 3.0 ms: the fixture above); a DDP run's summary is left alone."""
    from scalelab.analysis import hvdcomm, keys
    from scalelab.run.kinds import collect_summary

    rundir = RunDir(tmp_path)
    for rank in (0, 1):
        rundir.write_steps(rank, [{**r, "samples": 8, "comm(s)": 0.001, "comm_total(s)": 0.009,
                                   "comm_sum(s)": 0.027, "collectives": 3, "comm_bytes": 1000,
                                   "comm_bytes_forward": 0, "comm_bytes_backward": 1000, "comm_bytes_optimizer": 0}
                                  for r in RANKS if r["rank"] == rank])
        rundir.write_result(rank, {"rank": rank, "steps_per_epoch": 8, "evals": [], "memory": {}})
    rundir.horovod_timeline.write_text(STEPS_TEXT)
    rundir.write_config({"engine": "horovod", "nnodes": 1})
    s = collect_summary(tmp_path)
    assert s[keys.COMM_TIME_MS] == pytest.approx(3.255, abs=1e-3) and s[hvdcomm.COMM_SOURCE] == hvdcomm.SOURCE
    assert s[keys.COMM_PEERS_WAIT_MS] == pytest.approx(1.5, abs=1e-3)
    low, high = (s[k] for k in keys.ci_keys(keys.COMM_ALGBW))
    assert low < s[keys.COMM_ALGBW] < high  # the rate's interval follows the new time's
    rundir.write_config({"engine": "ddp", "nnodes": 1})
    assert collect_summary(tmp_path)[keys.COMM_TIME_MS] == pytest.approx(9.0)
