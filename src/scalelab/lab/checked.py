"""Compared cells measured with a second chance: a row whose figures look implausible, or whose run was noisy, is
measured once more, automatically; what persists is flagged in words.

    table = run_checked(ctx, cells, group="compare", analyse=lambda results: comparison_table(...))

`analyse` turns the cells' results into the experiment's table; the table has `run_id` (and optionally
`baseline_run_id`, `reference_run_id`) and `quality` columns ("ok", or why not: scalelab.analysis.compare). The cells behind a row
whose quality starts with one of SUSPECT are measured again (the engine's `again`: as many new launches as they
have repeats, interleaved), the table is computed again from the new launches, and each such row says:
- "re-measured" when it is ok now;
- its reason plus " (persisted when re-measured)" when it is not;
- "re-measured: the two measurements disagree (...)" when the step intervals of the first and the second
  measurement do not meet: drift between them, not a figure to trust.
A report rebuilt from the store (replay) finds the same launches and labels them the same way; it never measures.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pandas as pd

from scalelab.analysis import keys
from scalelab.lab.cells import Cell, CellResult, replaying
from scalelab.lab.decision import remeasured_apart

SUSPECT = ("implausible", "noisy")
# the columns naming the runs a row's figures come from: its own, its no-op baseline, its 1-worker reference
RUN_COLUMNS = ("run_id", "baseline_run_id", "reference_run_id")
PERSISTED = " (persisted when re-measured)"


def suspect(quality) -> bool:
    return isinstance(quality, str) and quality.startswith(SUSPECT)


def run_checked(ctx, cells: Sequence[Cell], *, group: str,
                analyse: Callable[[list[CellResult]], pd.DataFrame]) -> pd.DataFrame:
    """Run `cells` interleaved, analyse, measure the cells behind suspect rows once more, analyse again, label."""
    results = ctx.cells.run(cells, group=group, interleave=True)
    table = analyse(results)
    doubtful = _doubtful(table)
    again = [r.cell for r in results if set(r.run_ids) & set(doubtful) and not r.earlier]
    if again and not replaying():
        why = sorted({doubtful[i] for r in results if r.cell in again for i in r.run_ids if i in doubtful})
        ctx.say(f"[{group}] measuring {len(again)} cell(s) once more ({'; '.join(why)}): "
                f"{', '.join(c.label for c in again)}")
        results = ctx.cells.run(cells, group=group, interleave=True, again=again)
        table = analyse(results)
    return label_remeasured(table, results, ctx.cells)


def _doubtful(table: pd.DataFrame) -> dict[str, str]:
    """run id -> the reason of the suspect row it is part of (the row's own run and its baseline)."""
    out: dict[str, str] = {}
    if not len(table) or "quality" not in table:
        return out
    for row in table.itertuples(index=False):
        quality = getattr(row, "quality")
        if suspect(quality):
            for column in RUN_COLUMNS:
                run_id = getattr(row, column, None)
                if isinstance(run_id, str):
                    out[run_id] = quality
    return out


def label_remeasured(table: pd.DataFrame, results: Sequence[CellResult], cells) -> pd.DataFrame:
    """Each row whose run or baseline was measured again says so in its quality (module docstring)."""
    redone = {r.run_id: r for r in results if r.earlier and r.run_id is not None}
    if not redone or not len(table):
        return table
    table = table.copy()
    for index, row in table.iterrows():
        hits = [redone[row.get(c)] for c in RUN_COLUMNS if row.get(c) in redone]
        if not hits:
            continue
        quality = row.get("quality") if isinstance(row.get("quality"), str) else "ok"
        disagree = [d for d in (_disagreement(r, cells) for r in hits) if d]
        if disagree:
            table.at[index, "quality"] = "re-measured: the two measurements disagree (" + "; ".join(disagree) + ")"
        elif quality == "ok":
            table.at[index, "quality"] = "re-measured"
        else:
            table.at[index, "quality"] = quality + PERSISTED
    return table


def _disagreement(result: CellResult, cells) -> str | None:
    """Words when the median step's intervals of the earlier and the new launches of a cell do not meet."""
    first, second = (_step(cells, replace(result, run_ids=ids)) for ids in (result.earlier, result.run_ids))
    if first is None or second is None or not remeasured_apart(first[1], second[1]):
        return None
    return f"{result.label}: {first[0]:.3g} ms, then {second[0]:.3g} ms"


def _step(cells, result: CellResult) -> tuple[float, tuple[float, float]] | None:
    """(median step, its interval) of the result's launches pooled."""
    summary = cells.pooled(cells.runs([result], all_repeats=True)) or {}
    median = summary.get(keys.STEP_MEDIAN_MS)
    low, high = summary.get(keys.STEP_MEDIAN_CI_LOW_MS), summary.get(keys.STEP_MEDIAN_CI_HIGH_MS)
    return None if median is None or low is None else (median, (low, high))
