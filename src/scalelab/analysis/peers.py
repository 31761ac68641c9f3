"""Time inside collectives split into waiting for peers and communication on the critical path (pure).

A rank that reaches a collective before its peers stands inside it until the last one arrives: that stretch is
not communication, it is a peer still computing (or, in gather/scatter, rank 0 still averaging). Counting it as
communication made a blocking strategy look as if it hid half of its communication behind compute.

Every rank stamps each collective's start and length on its meter clock (`comm_events` of a step record,
scalelab.sync.meter). On one host, network namespaces included, that clock is the machine's one monotonic clock,
so the ranks' stamps compare directly. Per timed step, with the ranks' collectives matched by position (every
rank issues the same collectives in the same order; a step where they differ is skipped):
- a_k, the last arrival at collective k = the latest start over ranks;
- the rank that sets the step = the last to arrive at the step's final collective (the one the others wait for);
- critical communication = the union of that rank's [max(start_k, a_k), end_k]: its time inside collectives
  once every peer had arrived;
- waiting for peers = the most any rank spent inside collectives before the last peer arrived: the union of its
  [start_k, min(end_k, a_k)], the largest over ranks.
Both are means over the timed steps, with the mean's interval (scalelab.analysis.intervals).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (overlapping stretches counted once; empty ones ignored)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def step_split(events: list[list]) -> tuple[float, float] | None:
    """(critical communication, waiting for peers) in seconds of one step from every rank's comm_events
    ([op, phase, start, seconds, bytes] per collective; one list per rank); None when fewer than two ranks
    metered collectives or their sequences of ops differ."""
    if len(events) < 2 or not all(events) or len({tuple(e[0] for e in ev) for ev in events}) != 1:
        return None
    starts = np.array([[e[2] for e in ev] for ev in events], dtype=float)  # ranks x collectives
    ends = starts + np.array([[e[3] for e in ev] for ev in events], dtype=float)
    arrival = starts.max(axis=0)
    setter = int(np.argmax(starts[:, -1]))
    critical = union_seconds(zip(np.maximum(starts[setter], arrival), ends[setter]))
    waiting = max(union_seconds(zip(starts[r], np.minimum(ends[r], arrival))) for r in range(len(events)))
    return critical, waiting

