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

Readiness is not read from the file: the coordinator's ticks under a NEGOTIATE_ALLREDUCE span (one per rank
reporting the tensor ready) are missing whenever Horovod's response cache answers, which is every step after the
first by default; analysis/hvdcomm.py takes every rank's own enqueue stamps instead.

Steps (`step_spans`): rank 0's step k runs over [t_end(unix_s) - wall(s), t_end(unix_s)]; a span belongs to the
step whose window holds its end (after the offset). An allreduce of step k ends before that step's synchronize()
returns on rank 0; a negotiation ends when the last rank, rank 0 included, is ready, which is inside rank 0's
backward of that step (it may start earlier, when a peer was ready first). Per step: `collective(s)` = the union of
the ALLREDUCE spans (a fused allreduce is one span per tensor, microseconds apart: counted once), `ops` = the
overlapping groups of them (collectives on the wire: Horovod's background thread runs one at a time, so their
plain sum is the union), `negotiation(s)` = the union of the NEGOTIATE_ALLREDUCE spans, `copies(s)` = the union
of the fusion-buffer copies (MEMCPY_IN/OUT_FUSION_BUFFER, inside the ALLREDUCE spans).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

import pandas as pd

from scalelab.analysis.peers import union_seconds

COPIES = ("MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER")
STEP_COLUMNS = ["collective(s)", "ops", "negotiation(s)", "copies(s)"]


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


def _anchor(events: list[dict]) -> tuple[float, dict]:
    """The timeline's wall-clock start (µs since the epoch, from its first metadata event) and each row's tensor."""
    start_us = next((e["args"]["start_time_since_epoch_in_micros"] for e in events
                     if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in e.get("args", {})), 0)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    return start_us, names


def intervals(events: list[dict]) -> list[Interval]:
    """Every B/E span of every tensor on unix time, from the timeline's start metadata."""
    start_us, names = _anchor(events)
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


def enqueues_unix(rank0: list[dict]) -> list[float]:
    """Rank 0's gradient enqueues on unix time: each allreduce record's start, moved from the meter clock
    (perf_counter) to unix time by its step record's two end stamps."""
    return [rec["t_end(unix_s)"] - (rec["t_end(perf_s)"] - start)
            for rec in rank0 if "t_end(perf_s)" in rec and "t_end(unix_s)" in rec
            for op, _phase, start, _seconds, _nbytes in rec.get("comm_events", []) if op == "allreduce"]


def step_windows(rank0: list[dict]) -> list[tuple[float, float, int]]:
    """(start, end, step) in unix s of rank 0's timed steps, in order."""
    return sorted((r["t_end(unix_s)"] - r["wall(s)"], r["t_end(unix_s)"], r["step"]) for r in rank0
                  if not r.get("warmup") and "t_end(unix_s)" in r and "wall(s)" in r)


def step_of(end_s: float, windows: list[tuple[float, float, int]]) -> int | None:
    """The timed step whose window holds `end_s` (a span belongs to the step it ends in), or None."""
    return next((k for lo, hi, k in windows if lo <= end_s <= hi), None)


def step_spans(spans: list[Interval], rank0: list[dict], offset_s: float = 0.0) -> pd.DataFrame:
    """Per timed step of rank 0 (index: step) that holds at least one ALLREDUCE span, STEP_COLUMNS (see the
    module docstring); `offset_s` from `align`. Empty (with those columns) when no step holds one."""
    windows = step_windows(rank0)
    found: dict[int, dict[str, set]] = {}
    for s in spans:
        end = s.start_s + offset_s + s.seconds
        step = step_of(end, windows)
        if step is None:
            continue
        kind = ("allreduce" if s.activity == "ALLREDUCE" and s.depth == 0 else
                "negotiation" if s.activity == "NEGOTIATE_ALLREDUCE" else "copies" if s.activity in COPIES else None)
        if kind:
            found.setdefault(step, {"allreduce": set(), "negotiation": set(), "copies": set()})[kind].add(
                (s.start_s + offset_s, end))
    rows = {step: {"collective(s)": union_seconds(got["allreduce"]), "ops": _groups(got["allreduce"]),
                   "negotiation(s)": union_seconds(got["negotiation"]), "copies(s)": union_seconds(got["copies"])}
            for step, got in sorted(found.items()) if got["allreduce"]}
    return pd.DataFrame.from_dict(rows, orient="index", columns=STEP_COLUMNS)


def _groups(spans: set[tuple[float, float]]) -> int:
    """How many stretches the union of [start, end] spans falls into."""
    count, reach = 0, float("-inf")
    for start, end in sorted(spans):
        count += start > reach
        reach = max(reach, end)
    return count


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
