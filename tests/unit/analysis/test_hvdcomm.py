"""Horovod's waiting for peers from each rank's gradient enqueues (its hooks' stamps in the step records), on
synthetic records and timelines whose truth is known by construction: identical ranks with many small tensors
(whose negotiation spans tile the backward pass) wait only for the last tensor's skew; a rank 40 ms late makes its
peer wait 40 ms; a rank's enqueues missing, or on another host's clock: not estimated."""
from __future__ import annotations

import json
import math

import pytest

from scalelab.analysis import hvdcomm, keys, timeline

START_US = 1_700_000_000_000_000
T0 = START_US / 1e6
STEP_MS = 100.0  # step k (k = 1, 2, 3; 1 is warm-up) runs over [100 (k - 1), 100 k] ms on every rank


def timeline_text(tensors: list[tuple[str, dict[int, float]]], allreduces: list[tuple[float, float]]) -> str:
    """Rank 0's Horovod timeline as the response cache leaves it: per tensor a NEGOTIATE_ALLREDUCE span from its
    first rank's readiness to its last (ms), no ticks inside, and ALLREDUCE spans (ms) on the first tensor's row."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": START_US}}]
    for pid, (name, ready) in enumerate(tensors, start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": min(ready.values()) * 1e3, "pid": pid},
                   {"ph": "E", "ts": max(ready.values()) * 1e3, "pid": pid}]
    for start, end in allreduces:
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": start * 1e3, "pid": 1},
                   {"ph": "E", "ts": end * 1e3, "pid": 1}]
    return json.dumps(events)


def records(tensors: list[tuple[str, dict[int, float]]], ranks=(0, 1)) -> list[dict]:
    """Every rank's step records, each gradient's enqueue (ms since T0) an allreduce comm event; the perf clock is
    unix time here, so the records' two end stamps agree."""
    out = []
    for rank in ranks:
        for k in (1, 2, 3):
            end = T0 + k * STEP_MS / 1e3
            events = [["allreduce", "backward", T0 + ready[rank] / 1e3, 0.001, 100] for name, ready in tensors
                      if name.endswith(f".s{k}") and rank in ready]
            out.append({"step": k, "rank": rank, "warmup": k == 1, "wall(s)": STEP_MS / 1e3, "t_end(unix_s)": end,
                        "t_end(perf_s)": end, "comm_events": events, "comm_alg_bytes": 1000,
                        "comm_bus_bytes": 1000})
    return out


def backward(step: int, late_ms: dict[int, float], *, alternate_ms: float = 0.0):
    """20 tensors ready 2.5 ms apart from 10 ms into the step; with `alternate_ms` the ranks take turns being
    first by that much (even tensors rank 0, odd rank 1); rank r is `late_ms[r]` later throughout."""
    base = (step - 1) * STEP_MS + 10.0
    tensors = []
    for k in range(20):
        t = base + 2.5 * k
        ready = {0: t + (alternate_ms if k % 2 else 0.0), 1: t + (0.0 if k % 2 else alternate_ms)}
        tensors.append((f"allreduce.p{k}.s{step}", {r: ms + late_ms.get(r, 0.0) for r, ms in ready.items()}))
    last = max(ms for _, ready in tensors for ms in ready.values())
    return tensors, [(last + 0.5, last + 1.5)]  # one fused allreduce once every tensor is ready


def steps(late_ms: dict[int, float], alternate_ms: float = 0.0):
    tensors, allreduces = [], []
    for step in (2, 3):
        t, a = backward(step, late_ms, alternate_ms=alternate_ms)
        tensors += t
        allreduces += a
    return tensors, allreduces


def run(late_ms: dict[int, float], alternate_ms: float = 0.0, **kw) -> dict:
    tensors, allreduces = steps(late_ms, alternate_ms)
    return hvdcomm.horovod_comm(timeline_text(tensors, allreduces), records(tensors), **kw)


def test_identical_ranks_with_many_small_tensors_wait_only_for_the_last_skew():
    """The ranks take turns being 3 ms ahead on each of 20 tensors: the negotiation spans cover 10 -> 60.5 ms of
    each step (the old figure, 50.5 ms), but rank 0 is done computing at 60.5 ms and rank 1 at 58 ms, when only the
    last tensor is left: rank 1 waits 2.5 ms."""
    out = run({}, alternate_ms=3.0)
    assert out[keys.COMM_PEERS_WAIT_MS] == pytest.approx(2.5, abs=1e-3)
    tensors, allreduces = steps({}, alternate_ms=3.0)
    spans = timeline.step_spans(timeline.intervals(timeline.load_events(timeline_text(tensors, allreduces))),
                                [r for r in records(tensors) if r["rank"] == 0])
    assert 1e3 * spans.loc[2, "negotiation(s)"] == pytest.approx(50.5, abs=1e-3)  # what the union of spans said


def test_a_rank_40_ms_late_makes_its_peer_wait_40_ms():
    control = run({})  # identical ranks, no skew: no wait
    late = run({1: 40.0})
    assert control[keys.COMM_PEERS_WAIT_MS] == pytest.approx(0.0, abs=1e-3)
    assert late[keys.COMM_PEERS_WAIT_MS] == pytest.approx(40.0, abs=1e-3)
    low, high = (late[k] for k in keys.ci_keys(keys.COMM_PEERS_WAIT_MS))
    assert low >= 0 and high >= low


def test_waiting_overlapping_an_allreduce_on_the_wire_is_communication():
    """Rank 0 is ready with tensor b at 25 ms, rank 1 at 27; a's allreduce runs over 24 -> 26 ms: rank 0 waits
    26 -> 27 ms only."""
    tensors = [("allreduce.a.s2", {0: 123.0, 1: 124.0}), ("allreduce.b.s2", {0: 125.0, 1: 127.0})]
    recs = records(tensors)
    waits = hvdcomm.waiting_per_step(hvdcomm.ready_per_step(recs),
                                     timeline.intervals(timeline.load_events(
                                         timeline_text(tensors, [(124.0, 126.0), (127.0, 128.0)]))),
                                     [r for r in recs if r["rank"] == 0])
    assert list(waits.index) == [2] and 1e3 * waits[2] == pytest.approx(1.0, abs=1e-3)  # unix s: ~0.2 µs steps


def test_without_every_ranks_enqueues_waiting_is_not_estimated():
    tensors, allreduces = steps({1: 40.0})
    text = timeline_text(tensors, allreduces)
    out = hvdcomm.horovod_comm(text, records(tensors, ranks=(0,)) + [
        r | {"comm_events": r["comm_events"][:-1]} for r in records(tensors, ranks=(1,))])  # rank 1 lost one
    assert math.isnan(out[keys.COMM_PEERS_WAIT_MS]) and out[keys.COMM_TIME_MS] > 0  # the wire is still measured
    assert "no timed step has every rank's enqueues" in out[hvdcomm.COMM_NOT_AVAILABLE]
    alone = hvdcomm.horovod_comm(text, records(tensors, ranks=(0,)))
    assert math.isnan(alone[keys.COMM_PEERS_WAIT_MS])


def test_ranks_on_different_hosts_clocks_are_not_compared():
    out = run({1: 40.0}, one_clock=False)
    assert math.isnan(out[keys.COMM_PEERS_WAIT_MS]) and "different hosts' clocks" in out[hvdcomm.COMM_NOT_AVAILABLE]
