"""Horovod's timeline (HOROVOD_TIMELINE, written by rank 0) as collective intervals on the run's step clock.

The timeline is a Chrome trace: one process row per tensor ("allreduce.fc1.weight"), nested B/E spans per
operation (NEGOTIATE_ALLREDUCE while the ranks agree the tensor is ready everywhere, then ALLREDUCE with
MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER inside), `ts` in microseconds since the timeline
started, whose wall-clock start is in the first metadata event (`start_time_since_epoch_in_micros`). Horovod writes
it while running and closes the JSON array only at shutdown, so a killed run's file is read up to its last
complete event.

Alignment: the start metadata puts the intervals on unix time, the clock the step records' `t_end(unix_s)` use
(same host, same system clock). It is then checked against the step records: every gradient allreduce is enqueued
by rank 0's hook (its comm_events' starts) before Horovod's background thread negotiates it (within a cycle), so
with as many negotiations as enqueues, paired in time order, the median of (negotiation start - enqueue) is the lag
(reported; ~ the cycle time). A negative lag (negotiations before their enqueues) is impossible: the timeline's
clock is off, and it is shifted by that much (`Alignment.offset_s`). Pure functions over the text and records.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    tensor: str  # Horovod's tensor name, e.g. "allreduce.fc1.weight"
    activity: str  # NEGOTIATE_ALLREDUCE, ALLREDUCE, GLOO_ALLREDUCE, MEMCPY_IN_FUSION_BUFFER, ...
    start_s: float  # unix time
    seconds: float
    depth: int  # 0: an operation; 1: a part of it


@dataclass(frozen=True)
class Alignment:
    offset_s: float  # added to every interval's start (after the file's own wall-clock anchor)
    pairs: int  # enqueue / negotiation pairs checked (0: the file's anchor alone, unchecked)
    lag_s: float | None = None  # median negotiation start - enqueue, after the offset


def load_events(text: str) -> list[dict]:
    """The trace events of a timeline file, complete or cut off while Horovod was writing it."""
    body = text.strip()
    if not body:
        return []
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        pass
    body = body if body.startswith("[") else "[" + body
    end = len(body)
    while (end := body.rfind("}", 0, end)) >= 0:  # the longest prefix that ends with a whole event
        try:
            return json.loads(body[:end + 1] + "]")
        except json.JSONDecodeError:
            continue
    return []


def intervals(events: list[dict]) -> list[Interval]:
    """Every B/E span of every tensor on unix time, from the timeline's start metadata."""
    start_us = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                     if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})), 0)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    open_spans: dict[int, list[tuple[str, float]]] = {}
    out: list[Interval] = []
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph == "B":
            open_spans.setdefault(pid, []).append((e["name"], e["ts"]))
        elif ph == "E" and open_spans.get(pid):
            name, began = open_spans[pid].pop()
            out.append(Interval(names.get(pid, str(pid)), name, (start_us + began) / 1e6, (e["ts"] - began) / 1e6,
                                len(open_spans[pid])))
    return sorted(out, key=lambda i: i.start_s)


def align(spans: list[Interval], enqueues_s: list[float]) -> Alignment:
    """The residual offset of the timeline against rank 0's enqueue times (unix s): see the module docstring."""
    negotiations = sorted(i.start_s for i in spans if i.activity == "NEGOTIATE_ALLREDUCE")
    if not negotiations or len(negotiations) != len(enqueues_s):
        return Alignment(0.0, 0)
    lag = statistics.median(n - q for q, n in zip(sorted(enqueues_s), negotiations))
    offset = max(0.0, -lag)  # only an impossible (negative) lag moves the timeline
    return Alignment(offset, len(negotiations), lag + offset)


def trace_events(spans: list[Interval], alignment: Alignment, *, pid: int) -> list[dict]:
    """Chrome trace events (complete events, µs): one thread per tensor in process `pid`."""
    events = [{"name": "process_name", "ph": "M", "pid": pid,
               "args": {"name": f"horovod timeline (rank 0; {_checked(alignment)})"}}]
    for s in spans:
        events.append({"name": s.activity, "ph": "X", "pid": pid, "tid": s.tensor,
                       "ts": (s.start_s + alignment.offset_s) * 1e6, "dur": s.seconds * 1e6})
    return events


def _checked(a: Alignment) -> str:
    if not a.pairs:
        return "wall-clock anchor, unchecked"
    return (f"wall-clock anchor{f' shifted {a.offset_s * 1e3:+.2f} ms' if a.offset_s else ''}, median lag "
            f"{a.lag_s * 1e3:.2f} ms after {a.pairs} enqueues")
