"""Which rank is the straggler: arrival times at the collectives across ranks, and where it loses its time (pure).

The lost-speedup breakdown's "waiting for peers" (scalelab.analysis.peers) says how long the ranks stood inside
collectives waiting; this module says for whom. Every rank stamps each collective's enter time and length on its
meter clock (`comm_events` of a step record: [op, phase, start, seconds, bytes]). Across machines the clocks
differ: a time t on rank r is t - offset_r on rank 0's clock, offset_r estimated at start-up
(scalelab.measure.clocks, the run's clocks.json); on one host every offset is 0.

Per timed step, with the ranks' collectives matched by position (every rank issues the same collectives in the
same order; a step where they differ is skipped, as in peers.step_split):
- a_k = the last arrival (aligned enter time) at collective k, and last_k the rank that arrived then;
- per rank r: last(count) = the collectives where r was last_k; the wait r caused in the step (its cost to the
  others) = the most any other rank q waited for it: max over q != r of q's waiting for peers
  (scalelab.analysis.peers.waiting_stretches: inside a collective with none of its collectives on the wire) at
  the collectives k with last_k = r. A stretch where q waits at its second bucket while its first is still on
  the wire is communication in both figures, never waiting in one and wire time in the other; so a rank's cost
  to the others never exceeds the step's waiting for peers, and with one straggler it equals it.
The wait caused is a mean over the timed steps with its 95 % interval (scalelab.analysis.intervals.mean_interval).

Named straggler, only beyond noise and material (`straggler`): the rank whose wait caused has an interval that lies
above every other rank's (intervals separated), and
- whose lower end reaches MATERIAL (2 %) of the median step: a rank that is last by a few microseconds on every
  step is last, but not what makes the step slow; and
- whose own work is longer than the others' by their jitter: a rank's own work in a step is its time outside
  collectives (`own_work`); its excess (`work_excess(ms)`) is, per step, its own work less the other ranks'
  median, a mean whose interval's low end must reach the others' jitter (`jitter(ms)`: a robust step-to-step spread
  of their own work, `within_spread`). A straggler makes the others wait because its own work is longer; the
  ranks' natural imbalance makes one late by a steady few ms without it, which the cost's interval alone names once
  the steps are many. The low end must reach WORK_FACTOR (1.5) times the jitter; why and the known truth that sets
  it: docs/definitions.md, "Straggler".
A slower link is not a straggler: in a ring allreduce it slows every rank inside the collective, no rank arrives
late, and its cost is wire time (communication once every peer has arrived, peers.step_split) and per-node MB/s.

Where it loses its time (`stage_excess`): per step and stage (data, h2d, forward, backward, optimizer), the
straggler's own time there minus the median over the other ranks' own time, a rank's own time in a stage being its
span less the time it stood inside collectives waiting for a later peer within that span (DDP on gloo waits for
its buckets at the end of backward: a waiting rank's backward is as long as the straggler's); the stage named is
the one with the largest mean excess whose interval is above 0. A node is named as its straggler rank's node (torchrun's numbering: node =
rank // ranks per node).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from scalelab.analysis.intervals import mean_interval
from scalelab.analysis.peers import matched, union_seconds, waiting_stretches

# forward_backward: a step scalelab found in a script that marks none (scalelab.run.found_steps) has forward and
# backward as one span, between its data wait and its optimizer
STAGES = ("data", "h2d", "forward", "backward", "forward_backward", "optimizer")
SPAN_ORDER = ("data", "h2d", "forward", "backward", "forward_backward", "comm", "optimizer")  # as the loop runs
MATERIAL = 0.02  # least share of the median step a named straggler's wait caused must reach (its interval's low)
WORK_FACTOR = 1.5  # a straggler's excess own work (its interval's low end) over the others' jitter: a control
# reached 1.26 once in the suite (after 0.28 at most in 14 runs), a sleep of 30 ms >= 2.57, a quarter-core rank 1.63
COLUMNS = ("rank", "node", "steps", "collectives", "last", "last(share)", "set_step", "caused(ms)",
           "caused_low(ms)", "caused_high(ms)", "work_excess(ms)", "work_excess_low(ms)", "jitter(ms)")
MAD_SCALE = 1.4826  # the median absolute deviation of a normal sample times this estimates its standard deviation
LAUNCH = 10**6  # a pooled cell's steps are numbered launch x LAUNCH + step (_on_one_clock)


def _offset(offsets: Sequence[float] | None, rank: int) -> float:
    return float(offsets[rank]) if offsets is not None and rank < len(offsets) else 0.0


def _timed_steps(records: list[dict]) -> dict[int, dict[int, dict]]:
    """{step: {rank: record}} of the timed (not warm-up) steps."""
    out: dict[int, dict[int, dict]] = {}
    for rec in records:
        if not rec.get("warmup", False):
            out.setdefault(rec["step"], {})[rec["rank"]] = rec
    return out


def step_arrivals(events: list[list], ranks: Sequence[int], offsets: Sequence[float] | None = None) -> dict | None:
    """One step's arrivals from each rank's comm_events (one list per rank, in the order of `ranks`):
    {"last": the last rank at each collective, "caused": {rank: seconds the others waited for it}, "arrival": the
    aligned last arrival a_k per collective, "waits": {rank: its waiting stretches on its own clock}}; None when
    fewer than two ranks metered collectives or their ops differ. The waiting stretches are peers' (one
    definition of waiting for both figures: scalelab.analysis.peers.waiting_stretches)."""
    found = matched(events)
    if found is None:
        return None
    shift = np.array([_offset(offsets, r) for r in ranks], dtype=float)[:, None]
    starts, ends = found[0] - shift, found[1] - shift  # ranks x collectives, on rank 0's clock
    last = np.argmax(starts, axis=0)
    stretches = waiting_stretches(starts, ends)
    caused, waits = {}, {}
    for i, rank in enumerate(ranks):  # rank's waiting stretches on its own clock
        waits[rank] = [(lo + shift[i, 0], hi + shift[i, 0]) for lo, hi, _k in stretches[i]]
        caused[rank] = max((sum(hi - lo for lo, hi, k in stretches[q] if last[k] == i)
                            for q in range(len(ranks)) if q != i), default=0.0)
    return {"last": [int(ranks[i]) for i in last], "caused": caused, "arrival": starts.max(axis=0).tolist(),
            "waits": waits}


def arrival_table(records: list[dict], offsets: Sequence[float] | None = None, *,
                  ranks_per_node: int | None = None) -> pd.DataFrame:
    """One row per rank (COLUMNS): timed steps compared, collectives, how often it was last to arrive (count and
    share), at how many steps it was last at the final collective (the rank the step waited for), and the mean
    wait it caused per step in ms with its 95 % interval. Empty when no step could be compared."""
    caused: dict[int, list[float]] = {}
    work: dict[int, dict[int, float]] = {}  # step -> rank -> its own work (outside collectives), seconds
    last: dict[int, int] = {}
    set_step: dict[int, int] = {}
    total = 0
    for step in sorted(steps := _timed_steps(records)):
        ranks = sorted(steps[step])
        found = step_arrivals([list(steps[step][r].get("comm_events") or []) for r in ranks], ranks, offsets)
        if found is None:
            continue
        total += len(found["last"])
        for r in ranks:
            caused.setdefault(r, []).append(found["caused"][r])
            last[r] = last.get(r, 0) + found["last"].count(r)
            if (own := own_work(steps[step][r])) is not None:
                work.setdefault(step, {})[r] = own
        set_step[found["last"][-1]] = set_step.get(found["last"][-1], 0) + 1
    rows = []
    for r in sorted(caused):
        low, high = mean_interval(caused[r], positive=True)  # a wait: never below 0
        excess = [w[r] - float(np.median([v for q, v in w.items() if q != r]))
                  for w in work.values() if r in w and len(w) > 1]
        ex_low = mean_interval(excess)[0] if len(excess) > 1 else math.nan
        by_launch: dict[int, list[float]] = {}
        for step, w in work.items():
            if r in w:
                by_launch.setdefault(step // LAUNCH, []).append(w[r])
        rows.append({"rank": r, "node": r // ranks_per_node if ranks_per_node else None, "steps": len(caused[r]),
                     "collectives": total, "last": last.get(r, 0),
                     "last(share)": last.get(r, 0) / total if total else math.nan,
                     "set_step": set_step.get(r, 0), "caused(ms)": 1e3 * float(np.mean(caused[r])),
                     "caused_low(ms)": 1e3 * low, "caused_high(ms)": 1e3 * high,
                     "work_excess(ms)": 1e3 * float(np.mean(excess)) if excess else math.nan,
                     "work_excess_low(ms)": 1e3 * ex_low, "jitter(ms)": 1e3 * within_spread(list(by_launch.values()))})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def own_work(rec: dict) -> float | None:
    """A rank's own work in a step record: its wall time less the union of its collectives' intervals (waiting and
    wire alike: what peers can lengthen); None without wall(s), or for a script's last collective (no period)."""
    if rec.get("wall(s)") is None or rec.get("no_period"):
        return None
    return rec["wall(s)"] - union_seconds((e[2], e[2] + e[3]) for e in rec.get("comm_events") or [])


def within_spread(groups: Sequence[Sequence[float]]) -> float:
    """A robust standard deviation of values about their own group's median, pooled over the groups:
    MAD_SCALE x the median absolute deviation (a launch's steps about that launch's median: launches of one cell
    may differ in their level, which is no step-to-step jitter). Robust because a loaded machine takes a rank off
    its core for a time slice or more on a few steps: those stalls are not its step-to-step jitter, and one of
    them in 22 steps moved a rank's standard deviation from about 10 to 28 ms (and hid a 30 ms sleep behind it).
    NaN with fewer than 2 values in every group."""
    deviations = [abs(v - float(np.median(g))) for g in groups if len(g) > 1 for v in g]
    return MAD_SCALE * float(np.median(deviations)) if deviations else math.nan


def stage_spans(rec: dict) -> dict[str, tuple[float, float]]:
    """A step record's stage windows on its rank's meter clock: laid end to end from the step's start
    (t_end(perf_s) - wall(s)) in the order the loop runs them (SPAN_ORDER), as the trace draws them; {} for a record
    without t_end(perf_s)."""
    if rec.get("t_end(perf_s)") is None:
        return {}
    t = rec["t_end(perf_s)"] - rec.get("wall(s)", 0.0)
    out = {}
    for stage in SPAN_ORDER:
        dur = rec.get(f"{stage}(s)", 0.0)
        out[stage] = (t, t + dur)
        t += dur
    return out


def _overlap(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    return union_seconds((max(lo, window[0]), min(hi, window[1])) for lo, hi in intervals)


def own_stage_seconds(by_rank: dict[int, dict], offsets: Sequence[float] | None = None) -> dict[int, dict]:
    """Per rank of one step, each stage's span less the time the rank stood inside collectives waiting for a later
    peer within it: what the rank itself spent there. A rank waiting for a straggler inside a stage (DDP's gloo
    buckets are waited for at the end of backward) would otherwise look as slow there as the straggler."""
    ranks = sorted(by_rank)
    found = step_arrivals([list(by_rank[r].get("comm_events") or []) for r in ranks], ranks, offsets)
    out = {}
    for r in ranks:
        rec = by_rank[r]
        spans = stage_spans(rec) if found else {}
        waits = found["waits"][r] if found else []
        out[r] = {stage: rec.get(f"{stage}(s)", 0.0) - (_overlap(waits, spans[stage]) if stage in spans else 0.0)
                  for stage in STAGES}
    return out


def stage_excess(records: list[dict], rank: int, offsets: Sequence[float] | None = None) -> pd.DataFrame:
    """Per stage (STAGES): `rank`'s own time there (own_stage_seconds) minus the other ranks' median, per timed
    step, in ms: columns stage, excess(ms), low(ms), high(ms), steps. Empty without another rank to compare with."""
    own = [own_stage_seconds(by, offsets) for by in _timed_steps(records).values() if rank in by and len(by) > 1]
    rows = []
    for stage in STAGES:
        diffs = [o[rank][stage] - float(np.median([o[q][stage] for q in o if q != rank])) for o in own]
        if not diffs:
            continue
        low, high = mean_interval(diffs)
        rows.append({"stage": stage, "excess(ms)": 1e3 * float(np.mean(diffs)), "low(ms)": 1e3 * low,
                     "high(ms)": 1e3 * high, "steps": len(diffs)})
    return pd.DataFrame(rows, columns=["stage", "excess(ms)", "low(ms)", "high(ms)", "steps"])


def losing_stage(excess: pd.DataFrame) -> str | None:
    """The stage with the largest mean excess whose interval lies above 0; None when no stage's does."""
    beyond = excess[excess["low(ms)"] > 0] if len(excess) else excess
    return None if beyond.empty else str(beyond.sort_values("excess(ms)").iloc[-1]["stage"])


def median_step_ms(records: list[dict]) -> float:
    """Median over timed steps of the slowest rank's wall time, in ms (NaN without timed steps)."""
    walls = [max(r.get("wall(s)", 0.0) for r in by.values()) for by in _timed_steps(records).values()]
    return 1e3 * float(np.median(walls)) if walls else math.nan


def jitter_ms(table: pd.DataFrame, rank: int) -> float:
    """The ranks' natural jitter against which `rank`'s excess own work is held: the median of the other ranks'
    jitter(ms) (0 where none is known)."""
    values = [v for v in table.loc[table["rank"] != rank, "jitter(ms)"] if math.isfinite(v)] \
        if "jitter(ms)" in table else []
    return float(np.median(values)) if values else 0.0


def straggler(table: pd.DataFrame, step_ms: float, *, material: float = MATERIAL) -> int | None:
    """The rank named as the straggler (module docstring), or None: no rank's wait caused stands above every
    other's beyond noise, by at least `material` of the step, while its own work exceeds the others' by their
    jitter (module docstring; a table without own work, records with no wall time, has no such floor)."""
    if len(table) < 2:
        return None
    top = table.sort_values("caused(ms)").iloc[-1]
    others = table[table["rank"] != top["rank"]]
    low = top["caused_low(ms)"]
    if not (math.isfinite(low) and low >= material * step_ms):
        return None
    excess = top.get("work_excess_low(ms)", math.nan)
    if excess is not None and math.isfinite(excess) and excess < WORK_FACTOR * jitter_ms(table, int(top["rank"])):
        return None
    if not all(math.isfinite(h) and h < low for h in others["caused_high(ms)"]):
        return None
    return int(top["rank"])


def find_straggler(records: list[dict], offsets: Sequence[float] | None = None, *,
                   ranks_per_node: int | None = None) -> dict:
    """The whole verdict of one run: {"table": arrival_table, "step(ms)", "rank": the named straggler or None,
    "node", "stage": where it loses its time (None: not beyond noise), "excess": its stage_excess table,
    "caused(ms)" with "caused_low(ms)" / "caused_high(ms)", "last(share)", "steps"}."""
    table = arrival_table(records, offsets, ranks_per_node=ranks_per_node)
    step_ms = median_step_ms(records)
    rank = straggler(table, step_ms)
    out = {"table": table, "step(ms)": step_ms, "rank": rank, "node": None, "stage": None, "excess": None,
           "per": "step"}
    if rank is not None:
        row = table[table["rank"] == rank].iloc[0]
        excess = stage_excess(records, rank, offsets)
        out.update(node=row["node"], stage=losing_stage(excess), excess=excess, steps=int(row["steps"]),
                   **{k: float(row[k]) for k in ("caused(ms)", "caused_low(ms)", "caused_high(ms)", "last(share)")})
    return out


def aligned_records(records: list[dict], offsets: Sequence[float] | None) -> list[dict]:
    """The step records with every collective's enter time moved onto rank 0's clock (start - offset_rank): what
    peers.step_split needs across machines (on one host, offsets None, the records themselves)."""
    if offsets is None or not any(offsets):
        return records
    return [{**r, "comm_events": [[e[0], e[1], e[2] - _offset(offsets, r["rank"]), *e[3:]]
                                  for e in r.get("comm_events") or []]} if r.get("comm_events") else r
            for r in records]


def collective_records(results: dict[int, dict], *, warmup: int = 2) -> list[dict]:
    """Pseudo step records of a user's script that marks no steps (`scalelab run` without the probe API): the
    collectives it made, metered into each rank's result (`comm_outside`), one record per collective, the first
    `warmup` of them warm-up. A record's wall(s) is that rank's time from this collective's enter to the next's
    (the last: its own length, marked "no_period": no part of the ranks' own work), so the step the material share
    refers to is the period between collectives."""
    out = []
    for rank, result in results.items():
        events = (result.get("comm_outside") or {}).get("comm_events") or []
        for k, ev in enumerate(events):
            period = (events[k + 1][2] - ev[2]) if k + 1 < len(events) else ev[3]
            out.append({"step": k + 1, "rank": rank, "warmup": k < warmup, "comm_events": [list(ev)],
                        "wall(s)": period, **({"no_period": True} if k + 1 == len(events) else {})})
    return out


def offsets_of(config: dict, clocks: dict | None) -> tuple[bool, list[float] | None]:
    """(comparable, offsets) of a run: its clocks.json offsets; None (all 0) on one host, a --local-nodes cluster
    included; not comparable across machines without them."""
    offsets = (clocks or {}).get("offsets(s)")
    across = int(config.get("nnodes") or 1) > 1 and not config.get("local_nodes")
    return offsets is not None or not across, offsets


def _launch(run) -> tuple[list[dict], list[float] | None, bool, bool]:
    """(step records, clock offsets, comparable, stages) of one stored launch (a ParsedRun): a script's run that
    marked no steps is read from its metered collectives (`collective_records`)."""
    config = run.config or {}
    comparable, offsets = offsets_of(config, run.clocks)
    records = run.all_steps
    stages = any(r.get("comm_events") for r in records)
    if not stages:
        records = collective_records(run.results, warmup=int(config.get("warmup_steps", 2)))
    return records, offsets, comparable, stages


def _on_one_clock(records: list[dict], offsets: Sequence[float] | None, launch: int) -> list[dict]:
    """One launch's records with its collectives and step ends moved onto rank 0's clock and its steps numbered
    apart from every other launch's (launch x 10^6 + step): launches pooled into one arrival table."""
    out = []
    for rec in aligned_records(records, offsets):
        moved = {**rec, "step": launch * LAUNCH + rec["step"]}
        if rec.get("t_end(perf_s)") is not None:
            moved["t_end(perf_s)"] = rec["t_end(perf_s)"] - _offset(offsets, rec["rank"])
        out.append(moved)
    return out


def run_straggler(run) -> dict:
    """`find_straggler` of a stored run (a ParsedRun: scalelab.store.rundir), with its clock offsets
    (clocks.json; 0 on one host, a --local-nodes cluster included) and its nodes (node = rank // ranks per node).
    A script's run that marked no steps is read from its metered collectives (`collective_records`); its verdict
    has "stages": False (no stage spans to say where the straggler loses its time). Across machines without
    clock offsets nothing is compared: "unaligned": True and an empty table."""
    return cell_straggler([run])


def cell_straggler(launches: Sequence) -> dict:
    """The verdict of a cell from all its launches (ParsedRuns of one config) pooled: every launch's timed steps in
    one arrival table, each on rank 0's clock, so the cost to the others and its interval are the cell's, as its
    pooled summary's waiting for peers is (scalelab.analysis.repeats). One launch: `run_straggler`'s verdict."""
    config = launches[-1].config or {}
    nnodes = int(config.get("nnodes") or 1)
    found = [_launch(run) for run in launches]
    stages = all(f[3] for f in found)
    if not all(f[2] for f in found):
        return {"table": pd.DataFrame(columns=list(COLUMNS)), "step(ms)": math.nan, "rank": None, "node": None,
                "stage": None, "excess": None, "stages": stages, "unaligned": True, "launches": len(launches)}
    if len(found) == 1:
        records, offsets = found[0][0], found[0][1]
    else:
        records = [r for i, f in enumerate(found) for r in _on_one_clock(f[0], f[1], i)]
        offsets = None
    verdict = find_straggler(records, offsets, ranks_per_node=int(config.get("ranks") or 1) if nnodes > 1 else None)
    return {**verdict, "stages": stages, "unaligned": False, "per": "step" if stages else "collective",
            "launches": len(launches)}


def last_arrivals(records: list[dict], offsets: Sequence[float] | None = None) -> set[tuple[int, int, int]]:
    """(rank, step, index in its comm_events) of every collective's last arrival, warm-up steps included: what the
    trace marks."""
    by_step: dict[int, dict[int, dict]] = {}
    for rec in records:
        by_step.setdefault(rec["step"], {})[rec["rank"]] = rec
    out = set()
    for step, by in by_step.items():
        ranks = sorted(by)
        found = step_arrivals([list(by[r].get("comm_events") or []) for r in ranks], ranks, offsets)
        for k, rank in enumerate(found["last"] if found else []):
            out.add((rank, step, k))
    return out


def straggler_lines(verdict: dict) -> list[str]:
    """The verdict (`find_straggler` / `run_straggler`) in words: who is the straggler (or that none is beyond noise), how often it arrived last, how
    long the others waited for it, and where it loses its time; one line each."""
    table = verdict["table"]
    if verdict.get("unaligned"):
        return [("Stragglers: not compared: the run spans machines and has no clock offsets (clocks.json), so "
                 "its ranks' arrival times do not compare.")]
    if table.empty:
        return ["Stragglers: no step with collectives on two or more ranks to compare."]
    rank, per = verdict["rank"], verdict.get("per", "step")
    if rank is None:
        worst = table.sort_values("caused(ms)").iloc[-1]
        return [(f"No straggler beyond noise: the most any rank made the others wait was rank "
                 f"{int(worst['rank'])}'s {_ms(worst)} per {per} (n = {int(worst['steps'])} {per}s; a straggler's "
                 f"must stand above every other rank's and reach {MATERIAL:.0%} of the {verdict['step(ms)']:.1f} ms "
                 f"{per}, with its own work longer than theirs by their jitter, "
                 f"{jitter_ms(table, int(worst['rank'])):.2f} ms). Slow communication that every rank shares is wire "
                 f"time, not a straggler.")]
    where = f" (node {int(verdict['node'])})" if verdict.get("node") is not None else ""
    lines = [(f"Straggler: rank {rank}{where}, last to arrive at {verdict['last(share)']:.0%} of the collectives; "
              f"the others waited {verdict['caused(ms)']:.2f} ms per {per} for it (95 % interval "
              f"{verdict['caused_low(ms)']:.2f}-{verdict['caused_high(ms)']:.2f}, n = {verdict['steps']} {per}s, "
              f"{per} {verdict['step(ms)']:.1f} ms).")]
    excess = verdict["excess"]
    if verdict.get("stages") is False:
        lines.append("The script marks no steps (scalelab.probe): no stage spans say where it loses its time.")
    elif verdict["stage"] is not None:
        row = excess[excess["stage"] == verdict["stage"]].iloc[0]
        lines.append(f"It loses its time in {verdict['stage']}: {row['excess(ms)']:.2f} ms per step more than the "
                     f"other ranks' median (95 % interval {row['low(ms)']:.2f}-{row['high(ms)']:.2f}).")
    else:
        lines.append("No stage of its own is slower than the other ranks' beyond noise: it loses its time "
                     "outside the timed stages (or between them).")
    return lines


def _ms(row) -> str:
    low, high = row["caused_low(ms)"], row["caused_high(ms)"]
    iv = f" (95 % interval {low:.2f}-{high:.2f})" if math.isfinite(low) else ""
    return f"{row['caused(ms)']:.2f} ms{iv}"
