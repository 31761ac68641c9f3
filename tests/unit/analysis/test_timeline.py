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
