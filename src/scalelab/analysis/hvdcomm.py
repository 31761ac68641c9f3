"""Horovod's communication figures from what Horovod itself records: its timeline, written by rank 0 (pure).

The meter's Horovod records run from a gradient's enqueue to the return of synchronize() (engines/horovod.py):
that interval spans backward compute, so it cannot be DDP's "time inside collectives". The summary keys below
are replaced by the same quantities DDP's carry, taken from rank 0's timeline (scalelab.analysis.timeline,
`step_spans`), per timed step of rank 0 that the timeline covers:
- comm/time = comm/critical = the union of the step's ALLREDUCE spans (the collective's execution, fusion-buffer
  copies included): Horovod starts an allreduce only once negotiation found every rank ready, so all of it lies
  after the last peer arrived; plus the emulated latency (`net_latency_ms`, slept by every rank after
  synchronize(), counted inside the collective as the meter counts its emulated remainder);
- comm/sum = comm/time: Horovod's background thread runs one collective at a time, nothing overlaps;
- comm/waiting_for_peers = each rank's time spent waiting for a peer, on DDP's footing (scalelab.analysis.peers):
  per tensor, rank r is ready at its tick under the tensor's NEGOTIATE_ALLREDUCE span (timeline.negotiations) and
  the collective can start at the last rank's tick; r waits over [its tick, the last tick] once it has nothing
  left to compute (from its last tick of the step: before that it is still running backward, as every rank
  is while a tensor's negotiation spans the backward pass), less any stretch where an allreduce of the step is on
  the wire (communication, not waiting, as for DDP's overlapping buckets); the figure is the largest over ranks
  (the rank that waited most), per timed step whose negotiations carry every rank's tick. The union of the
  negotiation spans is not waiting: for a model of many small tensors those spans, one per tensor, tile the
  whole backward pass even on identical ranks (issue 43: 375 of a 427 ms step). Without every rank's ticks in
  any timed step the figure is NaN, and `comm/not_available` says so: it is not estimated;
- algbw / busbw = rank 0's bytes of those steps over their summed comm/time;
- comm/hvd_fusion_copies = the union of the fusion-buffer copies (MEMCPY_IN/OUT_FUSION_BUFFER): work the
  exposed-communication baseline cannot keep (it has no fusion buffer).
Only rank 0 writes a timeline: the figures are rank 0's, not the mean over ranks DDP's comm/time is; another
rank's intervals are not available. Without a timeline, or when it covers no timed step, these figures are NaN
and `comm/not_available` says why; nothing is estimated in their place. comm/wait (last gradient produced -> end
of synchronize()) and comm/blocking (the loop's comm span) stay as measured on every rank.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys, timeline
from scalelab.analysis.intervals import mean_interval
from scalelab.analysis.peers import union_seconds

HVD_COPIES_MS = "comm/hvd_fusion_copies(ms)"  # fusion-buffer copies per step (timeline MEMCPY spans, rank 0)
COMM_SOURCE = "comm/source"  # where the interval figures came from, in words
COMM_NOT_AVAILABLE = "comm/not_available"  # which figures are NaN and why
TIMELINE_STEPS = "comm/timeline_steps"  # timed steps the timeline covered (of steps/timed)

SOURCE = "horovod timeline, rank 0"
RANK0_ONLY = ("comm/time, comm/critical, comm/waiting_for_peers, algbw and busbw are rank 0's (its timeline); "
              "other ranks' intervals are not available")
# figures with an interval: replaced with their interval, or NaN with it
TIMED = (keys.COMM_TIME_MS, keys.COMM_CRITICAL_MS, keys.COMM_PEERS_WAIT_MS, HVD_COPIES_MS)
RATES = (keys.COMM_ALGBW, keys.COMM_BUSBW)


def horovod_comm(text: str | None, rank0: list[dict], *, latency_ms: float = 0.0) -> dict:
    """The summary keys above from the timeline's text and rank 0's step records (see the module docstring)."""
    events = timeline.load_events(text) if text else []
    spans = timeline.intervals(events)
    alignment = timeline.align(spans, timeline.enqueues_unix(rank0))
    steps = timeline.step_spans(spans, rank0, alignment.offset_s)
    if not len(steps):
        why = "no Horovod timeline" if not text else "the Horovod timeline covers no timed step"
        return not_available(f"comm/time, comm/sum, comm/critical, comm/waiting_for_peers, algbw, busbw: {why}")
    comm = steps["collective(s)"] + latency_ms / 1e3
    waiting = waiting_per_step(timeline.negotiations(events), spans, rank0, alignment.offset_s)
    why = RANK0_ONLY if len(waiting) else (f"{RANK0_ONLY}; comm/waiting_for_peers: no timed step's negotiations "
                                           "carry every rank's ready tick")
    out: dict = {COMM_SOURCE: SOURCE, COMM_NOT_AVAILABLE: why, TIMELINE_STEPS: int(len(steps))}
    for key, series in ((keys.COMM_TIME_MS, comm), (keys.COMM_CRITICAL_MS, comm),
                        (keys.COMM_PEERS_WAIT_MS, waiting), (HVD_COPIES_MS, steps["copies(s)"])):
        out[key] = 1e3 * float(series.mean()) if len(series) else math.nan
        low, high = mean_interval(series, positive=True)  # times: never below 0
        out.update(zip(keys.ci_keys(key), (1e3 * low, 1e3 * high)))
    out[keys.COMM_SUM_MS] = out[keys.COMM_TIME_MS]
    covered = pd.DataFrame([r for r in rank0 if r["step"] in steps.index])
    seconds = float(comm.sum())
    for key, col in ((keys.COMM_ALGBW, "comm_alg_bytes"), (keys.COMM_BUSBW, "comm_bus_bytes")):
        out[key] = float(covered[col].sum()) / seconds / 1e9 if col in covered and seconds > 0 else math.nan
    return out


def waiting_per_step(negotiations: list[timeline.Negotiation], spans: list[timeline.Interval], rank0: list[dict],
                     offset_s: float = 0.0) -> pd.Series:
    """Seconds of waiting for peers per timed step (index: step) of the rank that waited most (module docstring);
    only steps whose every negotiation carries a tick of every rank."""
    windows = timeline.step_windows(rank0)
    world = max((len(n.ready_s) for n in negotiations), default=0)
    by_step: dict[int, list[timeline.Negotiation]] = {}
    for n in negotiations:
        step = timeline.step_of(n.end_s + offset_s, windows)
        if step is not None:
            by_step.setdefault(step, []).append(n)
    wire: dict[int, list[tuple[float, float]]] = {}
    for s in spans:
        step = timeline.step_of(s.start_s + offset_s + s.seconds, windows)
        if s.activity == "ALLREDUCE" and s.depth == 0 and step is not None:
            wire.setdefault(step, []).append((s.start_s + offset_s, s.start_s + offset_s + s.seconds))
    out = {}
    for step, group in sorted(by_step.items()):
        if world < 2 or any(len(n.ready_s) < world for n in group):
            continue  # a rank's readiness is not in the file: not estimated
        on_wire = wire.get(step, [])
        waits = []
        for r in group[0].ready_s:
            done = max(n.ready_s[r] for n in group)  # r's last tensor ready: nothing left to compute
            pieces = [(max(n.ready_s[r], done) + offset_s, max(n.ready_s.values()) + offset_s) for n in group]
            waits.append(union_seconds(pieces + on_wire) - union_seconds(on_wire))
        out[step] = max(waits)
    return pd.Series(out, dtype=float)


def not_available(why: str) -> dict:
    """Every replaced figure NaN (with its interval), and why."""
    nan = math.nan
    out: dict = {COMM_SOURCE: SOURCE, COMM_NOT_AVAILABLE: why, TIMELINE_STEPS: 0, keys.COMM_SUM_MS: nan}
    for key in (*TIMED, *RATES):
        out[key] = nan
        out.update(dict.fromkeys(keys.ci_keys(key), nan))
    return out
