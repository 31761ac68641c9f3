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
- a rank's critical communication = the union of its [max(start_k, a_k), end_k]: its time inside collectives
  once every peer had arrived at one of them;
- a rank's waiting for peers = the rest of its time inside collectives (the union of its [start_k, end_k] less
  its critical communication): a stretch where it waits inside one collective while another of its collectives
  is on the wire (asynchronous buckets) is communication, not waiting. Each waiting stretch is waiting for one
  peer: the last to arrive at the earliest collective the rank is inside then (`waiting_stretches`; the
  straggler's cost to the others, scalelab.analysis.stragglers, is the sum of the stretches that name it, so a
  wait is counted the same way in both). So, per rank and step, exactly:
  waiting + critical = time inside collectives (the union: the meter's comm_total(s)); the run's invariant
  check holds every run to it (scalelab.analysis.checks.run_failures).
The step's figures aggregate them over ranks, each in its own way (named in the definitions):
- comm/critical = the critical communication of the rank that sets the step (the last to arrive at the step's
  final collective: the one the others wait for);
- comm/waiting_for_peers = the largest waiting over ranks (the rank that waited most).
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


def waiting_stretches(starts: np.ndarray, ends: np.ndarray) -> list[list[tuple[float, float, int]]]:
    """Per rank (row of `starts` / `ends`: ranks x collectives, on one clock), its waiting for peers as stretches
    (lo, hi, k): time inside one of its collectives at which it was inside no collective whose last peer had
    arrived (none on the wire), k the earliest collective (by position) it was inside then: the one it waits at.
    The union of the stretches is the rank's time inside collectives less its critical communication."""
    arrival = starts.max(axis=0)
    out = []
    for r in range(starts.shape[0]):
        s, e = starts[r], ends[r]
        edges = np.unique(np.concatenate([s, e, np.clip(arrival, s, e)]))
        if len(edges) < 2:
            out.append([])
            continue
        mid = (edges[:-1] + edges[1:])[:, None] / 2  # one point of each elementary segment
        inside = (s <= mid) & (mid < e)
        critical = (np.maximum(s, arrival) <= mid) & (mid < e)
        waits = inside.any(axis=1) & ~critical.any(axis=1)
        at = inside.argmax(axis=1)  # the first collective (by position) the rank is inside
        stretches: list[tuple[float, float, int]] = []
        for i in np.flatnonzero(waits):
            lo, hi, k = float(edges[i]), float(edges[i + 1]), int(at[i])
            if stretches and stretches[-1][1] == lo and stretches[-1][2] == k:
                stretches[-1] = (stretches[-1][0], hi, k)  # one stretch, not its elementary pieces
            else:
                stretches.append((lo, hi, k))
        out.append(stretches)
    return out


def matched(events: list[list]) -> tuple[np.ndarray, np.ndarray] | None:
    """(starts, ends) of one step's collectives, ranks x collectives, from every rank's comm_events ([op, phase,
    start, seconds, bytes] per collective; one list per rank); None when fewer than two ranks metered collectives
    or their sequences of ops differ."""
    if len(events) < 2 or not all(events) or len({tuple(e[0] for e in ev) for ev in events}) != 1:
        return None
    starts = np.array([[e[2] for e in ev] for ev in events], dtype=float)  # ranks x collectives
    return starts, starts + np.array([[e[3] for e in ev] for ev in events], dtype=float)


def rank_split(events: list[list]) -> list[tuple[float, float, float]] | None:
    """Per rank, (critical communication, waiting for peers, time inside collectives) in seconds of one step from
    every rank's comm_events ([op, phase, start, seconds, bytes] per collective; one list per rank); None when
    fewer than two ranks metered collectives or their sequences of ops differ."""
    found = matched(events)
    if found is None:
        return None
    starts, ends = found
    out = []
    for r, stretches in enumerate(waiting_stretches(starts, ends)):
        inside = union_seconds(zip(starts[r], ends[r]))
        waiting = sum(hi - lo for lo, hi, _k in stretches)
        out.append((inside - waiting, waiting, inside))
    return out


def setter(events: list[list]) -> int:
    """The rank (position in `events`) that sets the step: the last to arrive at its final collective."""
    return int(np.argmax([ev[-1][2] for ev in events]))


def step_split(events: list[list]) -> tuple[float, float] | None:
    """(critical communication of the rank that sets the step, the largest waiting for peers over ranks) in
    seconds of one step (rank_split); None where rank_split is."""
    split = rank_split(events)
    if split is None:
        return None
    return split[setter(events)][0], max(waiting for _critical, waiting, _inside in split)
