"""One quantity, one number: a scale cell's views of its exposed communication, overlap, waiting and straggler cost
held to each other (pure; issue 57). Each returns a list of faults in words, empty when the views agree:
- `cell_view_faults(tables)`: per multi-worker cell of a scale experiment's tables, the scaling table's exposed
  communication equals the breakdown's; its overlap (a share) times waiting + wire equals the breakdown's part that
  ran under compute (ms), and both intervals say alike whether it is beyond noise (one quantity in two units:
  scalelab.analysis.breakdown.exposed_figures); a named straggler's cost to the others is not above its cell's
  waiting for peers beyond the cost's interval. Run by the study's audit (checks.contradictions).
- `straggler_steps_over_waiting(records)`: per timed step of a stored run, no rank's cost to the others exceeds
  the step's largest waiting for peers (checks.run_failures holds every stored run to it).
- `explain_faults(lines, row)`: `scalelab explain`'s pooled-cell lines give the cell's table value.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

import pandas as pd

from scalelab.analysis.peers import rank_split
from scalelab.analysis.stragglers import step_arrivals

SUM_SLACK_S = 1e-6  # a rank's split of one step: float sums of stamps within a microsecond (as in checks)


def _number(row: Mapping, key: str) -> float | None:
    value = row.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


VIEW_SLACK = 1e-6  # relative: two views of one stored figure differ by float rounding at most


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= VIEW_SLACK * (1 + abs(a) + abs(b))


def cell_view_faults(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every multi-worker scale cell whose views of one quantity disagree: the scaling table's exposed
    communication against the breakdown's; its overlap (a share, with its interval) against the breakdown's
    hidden / interference part (ms) over waiting + wire, and whether each interval excludes 0; a named straggler's
    cost to the others above the cell's waiting for peers (the cost is a part of the waiting:
    scalelab.analysis.peers.waiting_stretches), beyond its interval."""
    out = []
    for name, table in tables.items():
        lost = tables.get(f"{name}_lost_speedup")
        if not isinstance(table, pd.DataFrame) or "exposed_comm(ms)" not in table or lost is None or not len(lost):
            continue
        for row in table[table["workers"] > 1].to_dict("records"):
            cell = lost[(lost["workers"] == row["workers"]) & (lost["global_batch"] == row["global_batch"])]
            if not len(cell):
                continue
            out += [f"{name}: {row['workers']} workers at batch {row['global_batch']}: {why}"
                    for why in _exposed_disagrees(row, cell.set_index("part"))]
        stragglers = tables.get(f"{name}_stragglers")
        if isinstance(stragglers, pd.DataFrame) and len(stragglers):
            out += [f"{name}_stragglers: {why}" for why in straggler_over_waiting(stragglers)]
    return out


def _exposed_disagrees(row: Mapping, part: pd.DataFrame) -> list[str]:
    out = []
    table_exposed, lost_exposed = _number(row, "exposed_comm(ms)"), _number(part.loc["exposed"], "value(ms)")
    if table_exposed is not None and lost_exposed is not None and not _close(table_exposed, lost_exposed):
        out.append(f"exposed communication {table_exposed:.6g} ms in the table, {lost_exposed:.6g} ms in the "
                   "breakdown")
    waiting, wire = (_number(part.loc[p], "value(ms)") for p in ("waiting", "wire"))
    share, low, high = (_number(row, k) for k in ("overlap", "overlap_ci_low", "overlap_ci_high"))
    if None in (waiting, wire, share) or waiting + wire <= 0:
        return out
    beyond = part.loc["hidden"] if _number(part.loc["hidden"], "value(ms)") else part.loc["interference"]
    # negated: high <-> low
    hidden = [_number(beyond, k) for k in ("value(ms)", "value_ci_high(ms)", "value_ci_low(ms)")]
    if hidden[0] is None:
        return out
    ms = [-(h or 0.0) for h in hidden]
    if not _close(share * (waiting + wire), ms[0]):
        out.append(f"overlap {share:.4g} of {waiting + wire:.4g} ms is {share * (waiting + wire):.4g} ms, the "
                   f"breakdown's part under compute {ms[0]:.4g} ms")
    if low is not None and high is not None and None not in hidden:
        if (low <= 0 <= high) != (ms[1] <= 0 <= ms[2]):
            out.append(f"overlap interval {low:.3g} to {high:.3g} and the hidden part's {ms[1]:.3g} to {ms[2]:.3g} "
                       "ms disagree on whether it is beyond noise")
    return out


def straggler_over_waiting(stragglers: pd.DataFrame) -> list[str]:
    """Every named straggler whose cost to the others lies above its cell's waiting for peers beyond the cost's
    interval: the others cannot have waited for one rank longer than they waited at all."""
    out = []
    for row in stragglers.to_dict("records"):
        low, waiting = _number(row, "caused_low(ms)"), _number(row, "waiting(ms)")
        if _number(row, "straggler_rank") is None or low is None or waiting is None:
            continue
        if low > waiting * (1 + VIEW_SLACK) + VIEW_SLACK:
            out.append(f"{row.get('workers')} workers at batch {row.get('global_batch')}: rank "
                       f"{int(row['straggler_rank'])} cost the others {row['caused(ms)']:.3g} ms (from "
                       f"{low:.3g}), above the cell's waiting for peers {waiting:.3g} ms")
    return out


def explain_faults(cell_lines: list[str], table_row: Mapping) -> list[str]:
    """`scalelab explain`'s pooled-cell lines (scalelab.lab.pooled.cell_lines) against the scaling table's row of
    that cell: the exposed communication they give must be the table's."""
    said = [float(m.group(1)) for line in cell_lines
            for m in [re.search(r"the cell: exposed communication (-?[\d.e+-]+) ms", line)] if m]
    table = _number(table_row, "exposed_comm(ms)")
    if table is None:
        return []
    if not said:
        return [f"explain gives no pooled exposed communication for a cell whose table has {table:.3g} ms"]
    return [f"explain says exposed communication {v:.3g} ms, the cell's table {table:.3g} ms" for v in said
            if abs(v - table) > 0.0051 * max(1.0, abs(table))]  # printed to 3 significant digits


def straggler_steps_over_waiting(records: list[dict]) -> list[str]:
    """Per timed step of a stored run: a rank's cost to the others (scalelab.analysis.stragglers.step_arrivals) is
    never above the step's largest waiting for peers (peers.rank_split): one stretch of time, counted one way."""
    by_step: dict = {}
    for r in records:
        if not r.get("warmup") and r.get("comm_events"):
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    out = []
    for step, ranks in sorted(by_step.items()):
        order = sorted(ranks)
        events = [list(ranks[k]["comm_events"]) for k in order]
        split, found = rank_split(events), step_arrivals(events, order)
        if split is None or found is None:
            continue
        most = max(w for _c, w, _i in split)
        for rank, caused in found["caused"].items():
            if caused > most + SUM_SLACK_S:
                out.append(f"step {step}: rank {rank} cost the others {1e3 * caused:.4f} ms, above the step's "
                           f"largest waiting for peers {1e3 * most:.4f} ms")
    return out
