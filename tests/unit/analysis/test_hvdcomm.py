"""Horovod's waiting for peers from the ranks' ready ticks in its timeline, on synthetic timelines whose truth is
known by construction: identical ranks with many small tensors (whose negotiation spans tile the backward pass)
wait only for the last tensor's skew; a rank 40 ms late makes its peer wait 40 ms; no ticks: not estimated."""
from __future__ import annotations

import json
import math

import pytest

from scalelab.analysis import hvdcomm, keys, timeline

START_US = 1_700_000_000_000_000
T0 = START_US / 1e6
STEP_MS = 100.0  # rank 0's step k (k = 1, 2, 3; 1 is warm-up) runs over [100 (k - 1), 100 k] ms


def timeline_text(tensors: list[tuple[str, dict[int, float]]], allreduces: list[tuple[float, float]]) -> str:
    """A Horovod timeline: per tensor a NEGOTIATE_ALLREDUCE span from its first rank's tick to its last (ms), with
    the ticks inside in time order, and ALLREDUCE spans (ms) on the first tensor's row."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": START_US}}]
    for pid, (name, ready) in enumerate(tensors, start=1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        ticks = sorted((ms, rank) for rank, ms in ready.items())
        events.append({"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ticks[0][0] * 1e3, "pid": pid})
        events += [{"ph": "X", "name": str(rank), "ts": ms * 1e3, "pid": pid, "dur": 0} for ms, rank in ticks]
        events.append({"ph": "E", "ts": ticks[-1][0] * 1e3, "pid": pid})
    for start, end in allreduces:
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": start * 1e3, "pid": 1},
                   {"ph": "E", "ts": end * 1e3, "pid": 1}]
    return json.dumps(events)


def rank0_steps() -> list[dict]:
    return [{"step": k, "rank": 0, "warmup": k == 1, "wall(s)": STEP_MS / 1e3, "t_end(unix_s)": T0 + k * STEP_MS / 1e3,
             "comm_alg_bytes": 1000, "comm_bus_bytes": 1000} for k in (1, 2, 3)]


def backward(step: int, late_ms: dict[int, float], *, alternate_ms: float = 0.0):
    """20 tensors ready 2.5 ms apart from 10 ms into the step; with `alternate_ms` the ranks take turns being
    first by that much (even tensors rank 0, odd rank 1); rank r is `late_ms[r]` later throughout."""
    base = (step - 1) * STEP_MS + 10.0
    tensors = []
    for k in range(20):
        t = base + 2.5 * k
        ready = {0: t + (alternate_ms if k % 2 else 0.0), 1: t + (0.0 if k % 2 else alternate_ms)}
        tensors.append((f"allreduce.p{k}", {r: ms + late_ms.get(r, 0.0) for r, ms in ready.items()}))
    last = max(ms for _, ready in tensors for ms in ready.values())
    return tensors, [(last + 0.5, last + 1.5)]  # one fused allreduce once every tensor is ready


def run(late_ms: dict[int, float], alternate_ms: float = 0.0) -> dict:
    tensors, allreduces = [], []
    for step in (2, 3):
        t, a = backward(step, late_ms, alternate_ms=alternate_ms)
        tensors += [(f"{name}.s{step}", ready) for name, ready in t]
        allreduces += a
    return hvdcomm.horovod_comm(timeline_text(tensors, allreduces), rank0_steps())


def test_the_ticks_give_each_ranks_readiness_per_tensor():
    text = timeline_text([("allreduce.w", {0: 12.0, 1: 9.0})], [])
    [n] = timeline.negotiations(timeline.load_events(text))
    assert n.tensor == "allreduce.w" and n.ready_s == {1: pytest.approx(T0 + 0.009), 0: pytest.approx(T0 + 0.012)}
    assert (n.start_s, n.end_s) == (pytest.approx(T0 + 0.009), pytest.approx(T0 + 0.012))


def test_identical_ranks_with_many_small_tensors_wait_only_for_the_last_skew():
    """The ranks take turns being 3 ms ahead on each of 20 tensors: the negotiation spans cover 10 -> 60.5 ms of
    each step (the old figure, 50.5 ms), but rank 0 is done computing at 60.5 ms and rank 1 at 58 ms, when only the
    last tensor is left: rank 1 waits 2.5 ms."""
    out = run({}, alternate_ms=3.0)
    assert out[keys.COMM_PEERS_WAIT_MS] == pytest.approx(2.5, abs=1e-3)
    steps = timeline.step_spans(timeline.intervals(timeline.load_events(
        timeline_text(*backward(2, {}, alternate_ms=3.0)))), rank0_steps())
    assert 1e3 * steps.loc[2, "negotiation(s)"] == pytest.approx(50.5, abs=1e-3)  # what the union of spans said


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
    text = timeline_text([("allreduce.a", {0: 123.0, 1: 124.0}), ("allreduce.b", {0: 125.0, 1: 127.0})],
                         [(124.0, 126.0), (127.0, 128.0)])
    waits = hvdcomm.waiting_per_step(timeline.negotiations(timeline.load_events(text)),
                                     timeline.intervals(timeline.load_events(text)), rank0_steps())
    assert list(waits.index) == [2] and 1e3 * waits[2] == pytest.approx(1.0, abs=1e-3)  # unix s: ~0.2 µs steps


def test_without_every_ranks_ticks_waiting_is_not_estimated():
    events = [e for e in json.loads(timeline_text(*backward(2, {1: 40.0})))
              if not (e["ph"] == "X" and e["name"] == "1")]  # rank 1's ticks missing
    out = hvdcomm.horovod_comm(json.dumps(events), rank0_steps())
    assert math.isnan(out[keys.COMM_PEERS_WAIT_MS]) and out[keys.COMM_TIME_MS] > 0  # the wire is still measured
    assert "no timed step's negotiations carry every rank's ready tick" in out[hvdcomm.COMM_NOT_AVAILABLE]
