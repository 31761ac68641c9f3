"""Why N workers are not N times faster: the lost speedup of one run, ideal step -> measured step, in parts (pure).

The parts are differences between named runs of the same config (docs/definitions.md, "Lost speedup"):
- one: the 1-worker run; k = the real run's per-rank batch / its batch, and the ideal step = k x its median step
  (the 1-worker step scaled to the same work: 1/N of it in strong scaling, all of it in weak);
- nosync: the same config with no sync at all (`sync: noop`: ranks train apart);
- noop: the same strategy and wrapper with no-op collectives (`noop_collectives`);
- real: the run explained; gap = its median step - the ideal step.

A step's time is the slowest rank's, but with a sync the fastest rank waits inside the collectives for the others,
and that stretch is "waiting for peers" (scalelab.analysis.peers). The variants without collectives are therefore
taken at their fastest rank (keys.STEP_FASTEST_MEDIAN_MS): a straggler's extra time then shows where the real run
loses it, waiting for peers, not as compute slowdown. A run without any sync is its own no-sync and no-op variant;
nobody waits in it, so it is taken at its slowest rank, the step it reports.

    data         = data wait (the stage, mean over ranks) of real - k x that of one
    compute      = (nosync's step - its data wait) - k x (one's step - its data wait)
    sync_work    = noop's step - nosync's step (the sync's own work outside its collectives)
    exposed      = real's step - noop's step, split into
      waiting    = waiting for peers (real), wire = communication on the critical path (real),
      interference = exposed - waiting - wire when that is above 0 (collectives slowing the compute around
                     them), else hidden = the same difference (waiting or wire time overlapped with compute, a
                     negative part); its interval says whether it is beyond noise (`within_noise`)
    rest         = gap - every part above: the data wait of the no-sync variant against the real run's (the
                   compute part excludes the no-sync run's data wait, the data part counts the real run's).
                   Reported as it comes out.

Every part has a conservative 95 % interval (the intervals of the figures it is made of, combined: scalelab.analysis.
intervals.difference_interval). A part whose run or figure is missing is not measured (value NaN, `measured`
False) with the run it needs, never 0; then `rest` holds the unmeasured parts too and says so.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.intervals import difference_interval
from scalelab.analysis.stragglers import MATERIAL

# (part, what it is); "exposed" is the sum of the four parts under it (level 1), shown as a subtotal
PARTS = {
    "ideal": "the 1-worker step scaled to the same work",
    "data": "data wait beyond the 1-worker run's",
    "compute": "compute slowdown: N ranks with no sync against the ideal",
    "sync_work": "the sync's own work outside its collectives",
    "exposed": "exposed communication: the real run against its no-op collectives",
    "waiting": "waiting for peers",
    "wire": "communication on the critical path (wire time)",
    "interference": "interference: collectives slowing the compute around them",
    "hidden": "waiting or wire time hidden behind compute",
    "rest": "the rest",
    "measured": "the measured step",
}
LEAVES = ("data", "compute", "sync_work", "waiting", "wire", "interference", "hidden")
SUBPARTS = ("waiting", "wire", "interference", "hidden")
ADDITIVE = ("data", "compute", "sync_work", "exposed")  # ideal + these + rest = measured; SUBPARTS split exposed
# The no-op baseline keeps everything but the collectives, yet the real sync still does a little more outside its
# collective intervals (the meter's bookkeeping, waking the waiter): seen 1-1.5 % of comm with blocking collectives
# on 2 gloo ranks. An overlap is judged implausible only beyond this much above 1 (or above 0 for a blocking
# strategy), past its interval.
OVERLAP_SLACK = 0.05
REST_LIMIT = 0.20  # |rest| beyond this share of the gap is said in words (issue 31: it must stay small)
COLUMNS = ["part", "level", "value(ms)", "value_ci_low(ms)", "value_ci_high(ms)", "within_noise", "measured", "needs",
           "share_of_gap"]
# what a part that needs a variant without sync says for a user's script (`scalelab run`, the probe, Lightning)
SCRIPT_VARIANT = ("not measurable for a script of yours: scalelab cannot remove the sync of code it did not write "
                  "(`scalelab scale` with the model in scalelab's loop runs every variant)")
# the variant a part needs -> its config fields (what `needs` names)
VARIANTS = {"one": "ranks=1", "nosync": "sync=noop", "noop": "noop_collectives=true"}


class Figure(tuple):
    """(value, low, high) in ms; NaN where unknown. Sums and differences combine intervals conservatively."""

    def __new__(cls, value=math.nan, low=math.nan, high=math.nan):
        return super().__new__(cls, (float(value), float(low), float(high)))

    value = property(lambda self: self[0])
    low = property(lambda self: self[1])
    high = property(lambda self: self[2])

    def known(self) -> bool:
        return not math.isnan(self[0])

    def __add__(self, other: Figure) -> Figure:
        return Figure(self[0] + other[0], self[1] + other[1], self[2] + other[2])

    def __sub__(self, other: Figure) -> Figure:
        return Figure(self[0] - other[0], *difference_interval((self[1], self[2]), (other[1], other[2])))

    def scaled(self, k: float) -> Figure:
        return Figure(k * self[0], k * self[1], k * self[2])


ZERO = Figure(0.0, 0.0, 0.0)


def figure(summary: Mapping | None, key: str) -> Figure:
    """A summary figure with its interval (the point twice where it has none); NaN where absent."""
    s = summary or {}
    value = s.get(key)
    if not _number(value):
        return Figure()
    low, high = (s.get(k) for k in keys.ci_keys(key))
    return Figure(value, low, high) if _number(low) and _number(high) else Figure(value, value, value)


def step(summary: Mapping | None, *, fastest: bool) -> Figure:
    """A run's median step; `fastest`: its fastest rank's (the step itself where that was not recorded: one rank,
    or a run stored before scalelab kept it)."""
    if fastest and _number((summary or {}).get(keys.STEP_FASTEST_MEDIAN_MS)):
        return figure(summary, keys.STEP_FASTEST_MEDIAN_MS)
    return figure(summary, keys.STEP_MEDIAN_MS)


def data_wait(summary: Mapping | None) -> Figure:
    return figure(summary, keys.stage_ms("data"))


def without_collectives(summary: Mapping | None) -> bool:
    """The run metered no collective in its timed steps: its communication is 0, measured."""
    return (summary or {}).get(keys.COMM_COLLECTIVES_PER_STEP) == 0


def own_baseline(real: Mapping | None, noop: Mapping | None) -> bool:
    """The run is its own no-op baseline (no sync at all): the same summary on both sides."""
    return noop is not None and (noop is real or noop == real)


def baseline_step_ms(noop: Mapping | None, *, real: Mapping | None = None) -> float | None:
    """The no-op baseline's step that exposed communication is measured against: its fastest rank's median
    (exposed_figures), the median step where that was not recorded or where `real` is its own baseline
    (own_baseline); None without a baseline."""
    value = step(noop, fastest=not own_baseline(real, noop)).value if noop else math.nan
    return None if math.isnan(value) else value


def exposed_figures(real: Mapping | None, noop: Mapping | None, *, fastest: bool = True) -> dict[str, Figure]:
    """A cell's exposed communication and what it is made of, the one definition every view reads (docs/
    definitions.md, "Exposed communication"): {"exposed": real's median step - noop's median step at its fastest
    rank (`fastest`; the step itself where not recorded), "waiting": waiting for peers, "wire": communication on
    the critical path, "comm": waiting + wire (the time the step could have lost to its collectives), "hidden": comm
    - exposed (ms that ran under compute; below 0: interference), "overlap": hidden / comm, a share with the same
    interval divided by comm}. Intervals combine conservatively (Figure); NaN where a run or figure is missing.

    Why the fastest rank: the no-op run's ranks never wait for each other, so its slowest rank's step holds their
    natural imbalance, which the real run shows as waiting for peers; subtracting it would count that imbalance
    out of exposed and in again in waiting, and the split would not add up."""
    # a run with no sync at all is its own baseline: nothing is exposed (not its ranks' imbalance)
    own = own_baseline(real, noop)
    exposed = step(real, fastest=False) - step(noop, fastest=fastest and not own) if noop is not None else Figure()
    waiting, wire = figure(real, keys.COMM_PEERS_WAIT_MS), figure(real, keys.COMM_CRITICAL_MS)
    comm = waiting + wire
    hidden = comm - exposed
    share = hidden.scaled(1 / comm.value) if comm.known() and comm.value > 0 else Figure()
    return {"exposed": exposed, "waiting": waiting, "wire": wire, "comm": comm, "hidden": hidden, "overlap": share}


def breakdown(real: Mapping | None, *, one: Mapping | None = None, nosync: Mapping | None = None,
              noop: Mapping | None = None, k: float | None = None, no_sync_run: bool = False,
              commands: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The lost-speedup table of one run (module docstring): one row per part in PARTS order, with `level` (0 a
    part, 1 a part of exposed), value and 95 % interval in ms, `measured`, `needs` (the command that measures a
    missing part, from `commands`: variant name -> command; else the variant's fields) and its share of the gap.

    `real`, `one`, `nosync`, `noop`: run summaries (None: not run); `k`: real's per-rank batch / one's batch;
    `no_sync_run`: the real run has no sync at all (it is then its own no-sync and no-op variant)."""
    if no_sync_run:
        nosync = noop = real
    commands = commands or {}
    need = {v: None if run is not None else commands.get(v, VARIANTS[v])
            for v, run in (("one", one), ("nosync", nosync), ("noop", noop))}
    fast = not no_sync_run
    measured_step = step(real, fastest=False)
    ideal = step(one, fastest=False).scaled(k) if one is not None and k else Figure()
    data_1 = data_wait(one).scaled(k) if one is not None and k else Figure()
    parts: dict[str, Figure] = {"ideal": ideal}
    parts["data"] = data_wait(real) - data_1
    compute_ns = step(nosync, fastest=fast) - data_wait(nosync) if nosync is not None else Figure()
    parts["compute"] = compute_ns - (ideal - data_1)
    noop_step = step(noop, fastest=fast) if noop is not None else Figure()
    parts["sync_work"] = noop_step - step(nosync, fastest=fast) if nosync is not None else Figure()
    parts["exposed"] = exposed_figures(real, noop, fastest=fast)["exposed"]
    if no_sync_run:  # one run in three roles: these differences are 0 by construction, not within noise
        parts["sync_work"] = parts["exposed"] = ZERO if measured_step.known() else Figure()
    if no_sync_run or without_collectives(real):
        parts["waiting"], parts["wire"] = ZERO, ZERO
    else:
        parts["waiting"] = figure(real, keys.COMM_PEERS_WAIT_MS)
        parts["wire"] = figure(real, keys.COMM_CRITICAL_MS)
    parts["interference"], parts["hidden"], left = _beyond_comm(parts["exposed"], parts["waiting"] + parts["wire"],
                                                                 communicates=not no_sync_run)
    gap = measured_step - ideal
    known = [parts[p] for p in LEAVES if parts[p].known()]
    all_known = len(known) == len(LEAVES) and gap.known()
    rest_value = gap.value - sum(f.value for f in known) if gap.known() else math.nan
    if all_known:  # rest = left (a run without collectives: its exposed) + the no-sync's data wait against real's
        rest = left + (data_wait(nosync) - data_wait(real))
        parts["rest"] = Figure(rest_value, rest.low + rest_value - rest.value, rest.high + rest_value - rest.value)
    else:
        parts["rest"] = Figure(rest_value)
    parts["measured"] = measured_step
    rows = []
    for name, what in PARTS.items():
        f = parts[name]
        measured = f.known() and (name != "rest" or all_known)
        rows.append({"part": name, "level": 1 if name in SUBPARTS else 0, "value(ms)": f.value,
                     "value_ci_low(ms)": f.low, "value_ci_high(ms)": f.high, "within_noise": _within_noise(f),
                     "measured": measured, "needs": None if measured else _needs(name, need, real is not None),
                     "share_of_gap": f.value / gap.value if gap.known() and gap.value and name not in
                     ("ideal", "measured") else math.nan, "what": what})
    frame = pd.DataFrame(rows, columns=[*COLUMNS, "what"])
    frame.attrs["gap(ms)"] = gap.value
    return frame


def per_rank_batch(config: Mapping) -> float:
    """Samples one rank trains on per step (over its micro-batches)."""
    return config["global_batch"] / (config.get("ranks", 1) * config.get("nnodes", 1))


def breakdown_of_runs(real: Mapping, *, one: Mapping | None = None, nosync: Mapping | None = None,
                      noop: Mapping | None = None, commands: Mapping[str, str] | None = None) -> pd.DataFrame:
    """`breakdown` of stored runs ({config, summary} each; None: not run): k and whether the run has no sync at all
    come from their configs."""
    summary = lambda run: None if run is None else (run.get("summary") or {})
    k = per_rank_batch(real["config"]) / per_rank_batch(one["config"]) if one is not None else None
    return breakdown(summary(real), one=summary(one), nosync=summary(nosync), noop=summary(noop), k=k,
                     no_sync_run=real["config"].get("sync") == "noop", commands=commands)


def _beyond_comm(exposed: Figure, comm: Figure, *, communicates: bool) -> tuple[Figure, Figure, Figure]:
    """(interference, hidden, what is left in rest) from the exposed communication and waiting + wire: their
    difference is interference when above 0, hidden wire time when below (its interval says whether it is beyond
    noise); a run without collectives has neither, and any difference stays in rest."""
    if not exposed.known() or not comm.known():
        return Figure(), Figure(), Figure()
    diff = exposed - comm
    if not communicates:
        return ZERO, ZERO, diff
    return (diff, ZERO, ZERO) if diff.value >= 0 else (ZERO, diff, ZERO)


def _within_noise(f: Figure) -> bool | None:
    """Whether the interval reaches 0 (the part is not a finding); None without an interval of positive width."""
    if any(math.isnan(v) for v in f) or not f.high > f.low:
        return None
    return f.low <= 0 <= f.high


def _needs(part: str, need: Mapping[str, str | None], have_real: bool) -> str | None:
    """The command(s) whose run would measure a part that was not (None when nothing is missing)."""
    wanted = {"ideal": ("one",), "data": ("one",), "compute": ("one", "nosync"), "sync_work": ("nosync", "noop"),
              "exposed": ("noop",), "interference": ("noop",), "hidden": ("noop",),
              "rest": ("one", "nosync", "noop")}.get(part, ())
    missing = [need[v] for v in wanted if need.get(v)]
    if not have_real:
        return "the run itself"
    if part in ("waiting", "wire"):  # the run's own figures: absent only where its ranks' clocks do not compare
        return "a run whose ranks share one host's clock (a run across hosts has no critical-path figures)"
    return "; ".join(dict.fromkeys(missing)) or None


def sum_of_parts(table: pd.DataFrame) -> float:
    """ideal + every leaf part + rest: the measured step when every part was measured (the breakdown's identity)."""
    values = table.set_index("part")["value(ms)"]
    return float(values["ideal"] + sum(values[p] for p in (*LEAVES, "rest")))


def largest_cause(table: pd.DataFrame, *, material: float = MATERIAL) -> dict | None:
    """The additive part (ADDITIVE: data, compute slowdown, sync work, exposed communication; never a part of
    exposed's split, which would be larger than the loss it explains) that cost the most time, as its row; only
    a part beyond noise (its interval above 0) whose lower end reaches `material` (2 %) of the measured step, the
    straggler rule's material share (scalelab.analysis.stragglers). None when no part is both. When it is the
    exposed communication, `largest_split` names what it is made of."""
    step = table.set_index("part").loc["measured", "value(ms)"]
    parts = table[table["part"].isin(ADDITIVE) & table["measured"] & (table["value_ci_low(ms)"] > 0)]
    if _number(step):
        parts = parts[parts["value_ci_low(ms)"] >= material * step]
    if not len(parts):
        return None
    return parts.loc[parts["value(ms)"].idxmax()].to_dict()


def largest_split(table: pd.DataFrame) -> dict | None:
    """The positive part of exposed communication's split (waiting, wire, interference) that is largest beyond
    noise, as its row (what to act on when exposed communication is the largest cause); None when none is."""
    parts = table[table["part"].isin(SUBPARTS) & table["measured"] & (table["value_ci_low(ms)"] > 0)]
    return parts.loc[parts["value(ms)"].idxmax()].to_dict() if len(parts) else None


def exposed_sum(table: pd.DataFrame) -> str | None:
    """Exposed communication's split worded as a sum, so no part reads as larger than its whole, and its overlap
    (the part that ran under compute as a share of waiting + wire, with the same interval: exposed_figures), real
    only when that interval excludes 0; None when the split was not measured."""
    part = table.set_index("part")
    rows = {p: part.loc[p] for p in ("exposed", *SUBPARTS)}
    if not all(r["measured"] and _number(r["value(ms)"]) for r in rows.values()):
        return None
    v = {p: float(r["value(ms)"]) for p, r in rows.items()}
    comm = v["waiting"] + v["wire"]
    line = f"exposed communication {v['exposed']:.3g} ms = waiting {v['waiting']:.3g} + wire {v['wire']:.3g}"
    if v["hidden"] < 0:
        line += f" − {-v['hidden']:.3g} ran under compute"
    elif v["interference"] > 0:
        line += f" + {v['interference']:.3g} interference (collectives slowing the compute around them)"
    if comm <= 0:
        return line
    hidden = rows["hidden"] if v["hidden"] < 0 else rows["interference"]
    # no -0; negated, so the high end gives the low share
    share, low, high = (0.0 - float(hidden[c]) / comm for c in ("value(ms)", "value_ci_high(ms)", "value_ci_low(ms)"))
    exposed = rows["exposed"]
    if low > 1 + OVERLAP_SLACK or (_number(exposed["value_ci_high(ms)"]) and exposed["value_ci_high(ms)"] < 0):
        verdict = ("implausible: more than all of it ran under compute beyond noise (the no-op baseline ran slower "
                   "than the real run): not a finding")
    elif low <= 0 <= high:
        verdict = "within noise: its interval reaches 0, so no overlap is shown"
    else:
        verdict = "beyond noise: its interval excludes 0"
    if share > 1 and low <= 1 + OVERLAP_SLACK:  # no more than all of it can run under compute
        verdict += "; above 100 % only within noise (no more than all of it can run under compute)"
    return (f"{line}; overlap {100 * share:.0f} % of the {comm:.3g} ms spent waiting and on the wire (95 % interval "
            f"{100 * low:.0f} to {100 * high:.0f} %), {verdict}")


def rest_too_large(table: pd.DataFrame) -> bool:
    """|rest| above REST_LIMIT of the gap (only when every part was measured)."""
    row = table.set_index("part").loc["rest"]
    return bool(row["measured"]) and _number(row["share_of_gap"]) and abs(row["share_of_gap"]) > REST_LIMIT


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def scaling_breakdown(table: pd.DataFrame, runs: list[dict], noops: list[dict], nosyncs: list[dict], *,
                      needs: Callable[[int, int], Mapping[str, str]] | None = None) -> pd.DataFrame:
    """The breakdown of every multi-rank cell of a scaling table (scalelab.analysis.scaling: `run_id`,
    `reference_run_id` = its 1-worker run, `workers`, `global_batch`, `per_worker_batch`), one row per cell and
    part. `runs` are the table's runs, `noops` / `nosyncs` the completed variants of its cells (matched by workers
    and global batch); `needs(workers, global_batch)`: the command that runs each missing variant."""
    by_id = {r["run_id"]: r for r in runs}
    noop, nosync = (_by_cell(v) for v in (noops, nosyncs))
    blocks = []
    for row in table.itertuples(index=False):
        if row.workers < 2 or row.run_id not in by_id:
            continue
        cell = (int(row.workers), int(row.global_batch))
        part = breakdown_of_runs(by_id[row.run_id], one=by_id.get(row.reference_run_id), noop=noop.get(cell),
                                 nosync=nosync.get(cell), commands=needs(*cell) if needs else None)
        part.insert(0, "per_worker_batch", row.per_worker_batch)
        part.insert(0, "global_batch", row.global_batch)
        part.insert(0, "workers", row.workers)
        part["gap(ms)"] = part.attrs["gap(ms)"]
        blocks.append(part.drop(columns="what"))
    return pd.concat(blocks, ignore_index=True) if blocks else pd.DataFrame()


def _by_cell(runs: list[dict]) -> dict[tuple[int, int], dict]:
    return {(r["config"]["ranks"] * r["config"].get("nnodes", 1), r["config"]["global_batch"]): r for r in runs}
