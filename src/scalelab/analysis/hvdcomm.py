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
  per gradient tensor, rank r is ready when its hook enqueues the tensor (the meter's allreduce records, on every
  rank, moved to unix time by each step record's two end stamps; the i-th enqueue of a step on one rank is paired
  with the i-th on another: every rank's hooks fire in the same backward order) and the collective can start at
  the last rank's enqueue; r waits over [its enqueue, the last enqueue] once it has nothing left to compute (from
  its last enqueue of the step: before that it is still running backward), less any stretch where an allreduce
  of the step is on rank 0's timeline wire (communication, not waiting, as for DDP's overlapping buckets); the
  figure is the largest over ranks (the rank that waited most), per timed step every rank recorded with as many
  enqueues. Not the timeline's readiness ticks: Horovod's response cache (on by default) negotiates a cached
  tensor without them, so after the first step the file has none (issue 43's CI run), and turning the cache off
  made a 2 ms step 107 ms. Not the union of the negotiation spans: for a model of many small tensors those spans
  tile the whole backward pass even on identical ranks (issue 43: 375 of a 427 ms step). Ranks on different
  hosts' clocks, or no timed step with every rank's enqueues: NaN, and `comm/not_available` says why;
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
RANK0_ONLY = ("comm/time, comm/critical, algbw and busbw are rank 0's (its timeline); other ranks' intervals are "
              "not available")
# figures with an interval: replaced with their interval, or NaN with it
TIMED = (keys.COMM_TIME_MS, keys.COMM_CRITICAL_MS, keys.COMM_PEERS_WAIT_MS, HVD_COPIES_MS)
RATES = (keys.COMM_ALGBW, keys.COMM_BUSBW)


def horovod_comm(text: str | None, records: list[dict], *, latency_ms: float = 0.0, one_clock: bool = True) -> dict:
    """The summary keys above from the timeline's text and every rank's step records (module docstring)."""
    rank0 = [r for r in records if r["rank"] == 0]
    events = timeline.load_events(text) if text else []
    spans = timeline.intervals(events)
    ready = ready_per_step(records)
    # a negotiation starts at its tensor's first rank's report, which need not be rank 0's (a straggling rank 0)
    firsts = [min(tensor) for by_rank in ready.values() if len({len(v) for v in by_rank.values()}) == 1
              for tensor in zip(*by_rank.values())] if one_clock else []
    alignment = timeline.align(spans, firsts or timeline.enqueues_unix(rank0))
    steps = timeline.step_spans(spans, rank0, alignment.offset_s)
    if not len(steps):
        why = "no Horovod timeline" if not text else "the Horovod timeline covers no timed step"
        return not_available(f"comm/time, comm/sum, comm/critical, comm/waiting_for_peers, algbw, busbw: {why}")
    comm = steps["collective(s)"] + latency_ms / 1e3
    if one_clock:
        timed = {r["step"] for r in rank0 if not r.get("warmup")}
        waiting = waiting_per_step({k: v for k, v in ready.items() if k in timed}, spans, rank0, alignment.offset_s)
        missing = "no timed step has every rank's enqueues, as many on each"
    else:
        waiting, missing = pd.Series(dtype=float), "the ranks' enqueues are on different hosts' clocks"
    why = RANK0_ONLY if len(waiting) else f"{RANK0_ONLY}; comm/waiting_for_peers: {missing}"
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


def ready_per_step(records: list[dict]) -> dict[int, dict[int, list[float]]]:
    """step -> rank -> that rank's gradient enqueues of the step on unix time, in order (every step: the timeline is
    aligned on all of them; waiting reads the timed ones)."""
    out: dict[int, dict[int, list[float]]] = {}
    for rec in records:
        out.setdefault(rec["step"], {})[rec["rank"]] = sorted(timeline.enqueues_unix([rec]))
    return out


def waiting_per_step(ready: dict[int, dict[int, list[float]]], spans: list[timeline.Interval], rank0: list[dict],
                     offset_s: float = 0.0) -> pd.Series:
    """Seconds of waiting for peers per timed step (index: step) of the rank that waited most (module docstring);
    only steps where every rank has as many enqueues (at least one)."""
    windows = timeline.step_windows(rank0)
    world = max((len(by_rank) for by_rank in ready.values()), default=0)
    wire: dict[int, list[tuple[float, float]]] = {}
    for s in spans:
        step = timeline.step_of(s.start_s + offset_s + s.seconds, windows)
        if s.activity == "ALLREDUCE" and s.depth == 0 and step is not None:
            wire.setdefault(step, []).append((s.start_s + offset_s, s.start_s + offset_s + s.seconds))
    out = {}
    for step, by_rank in sorted(ready.items()):
        counts = {len(stamps) for stamps in by_rank.values()}
        if world < 2 or len(by_rank) < world or len(counts) != 1 or counts == {0}:
            continue  # a rank's readiness is not in the records, or its tensors do not pair: not estimated
        last = [max(tensor) for tensor in zip(*by_rank.values())]  # each tensor's last rank ready
        on_wire = wire.get(step, [])
        waits = []
        for stamps in by_rank.values():
            done = stamps[-1]  # the rank's last tensor ready: nothing left to compute
            pieces = [(max(t, done), end) for t, end in zip(stamps, last)]
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
