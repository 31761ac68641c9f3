"""The straggler of stored runs, where people look: `scalelab explain RUN` and the report's scaling section.

The attribution itself is scalelab.analysis.stragglers (pure, over a parsed run); this module reads the runs:
- `explain_lines(run)`: a stored run (a catalog row, `Store.get`) -> the lines `scalelab explain` prints;
- `straggler_table(runs)`: the multi-rank cells of a study (`Cells.rows`: rows with "files", their RunDir, and
  "run_ids", their launches) -> one row per cell, from all its launches pooled: who is the straggler, where it
  loses its time, how long the others waited for it with its interval, beside the cell's waiting for peers;
- `straggler_sentences(table)`: that table in words, for the scaling section.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.stragglers import cell_straggler, run_straggler, straggler_lines
from scalelab.store.rundir import RunDir

COLUMNS = ("run_id", "workers", "nodes", "global_batch", "straggler_rank", "straggler_node", "stage", "caused(ms)",
           "caused_low(ms)", "caused_high(ms)", "last(share)", "steps", "step(ms)", "launches", "waiting(ms)")
# what the report shows of the table (Experiment.columns): who, where, and what it cost the others
SHOWN = ["workers", "global_batch", "straggler_rank", "straggler_node", "stage", "caused(ms)", "caused_low(ms)",
         "caused_high(ms)", "last(share)", "waiting(ms)", "launches"]


def explain_lines(run: dict) -> list[str]:
    """`scalelab explain`'s straggler lines for a stored run (its catalog row: "dir"); nothing for one rank."""
    config = run.get("config") or {}
    if int(config.get("ranks") or 1) * int(config.get("nnodes") or 1) < 2:
        return []
    return straggler_lines(run_straggler(RunDir(run["dir"]).load()))


def launch_dirs(row: dict) -> list[RunDir]:
    """The RunDirs of every launch of a cell's row (`run_ids`, as Cells.rows gives them; the row's own run
    alone without them): the launches are its siblings in the store's runs folder."""
    files = row["files"]
    ids = row.get("run_ids") or [files.run_id]
    return [files if rid == files.run_id else RunDir(files.path.parent / rid) for rid in ids]


def straggler_row(row: dict) -> dict:
    """One cell's row (with "files": its RunDir; "run_ids": its launches) -> its COLUMNS, the verdict of all its
    launches pooled (cell_straggler), beside the cell's pooled waiting for peers; straggler_rank None when none is
    named."""
    config = row.get("config") or {}
    nodes = int(config.get("nnodes") or 1)
    verdict = cell_straggler([files.load() for files in launch_dirs(row)])
    out = dict.fromkeys(COLUMNS)
    out.update({"run_id": row.get("run_id"), "workers": int(config.get("ranks") or 1) * nodes, "nodes": nodes,
                "global_batch": config.get("global_batch"), "step(ms)": verdict["step(ms)"],
                "launches": verdict["launches"], "waiting(ms)": (row.get("summary") or {}).get(keys.COMM_PEERS_WAIT_MS)})
    if verdict["rank"] is not None:
        out.update(straggler_rank=verdict["rank"], straggler_node=verdict["node"], stage=verdict["stage"],
                   steps=verdict["steps"],
                   **{k: verdict[k] for k in ("caused(ms)", "caused_low(ms)", "caused_high(ms)", "last(share)")})
    else:
        table = verdict["table"]
        out["steps"] = int(table["steps"].max()) if len(table) else 0
    return out


def straggler_table(runs: list[dict]) -> pd.DataFrame:
    """One row per completed run of two or more ranks (COLUMNS), in the order given."""
    rows = [straggler_row(r) for r in runs if r.get("status", "completed") == "completed" and r.get("files")
            and int((r.get("config") or {}).get("ranks") or 1) * int((r.get("config") or {}).get("nnodes") or 1) > 1]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def straggler_sentences(table: pd.DataFrame | None, where: str = "") -> list[str]:
    """The scaling section's sentences: each run with a named straggler (rank, node, stage, the others' wait with
    its interval), or one sentence that no cell has a straggler beyond noise. `where` opens each sentence (a
    scaling mode: "strong scaling")."""
    if table is None or not len(table):
        return []
    named = table[table["straggler_rank"].notna()]
    lead = f"{where}, " if where else ""
    if named.empty:
        cells = "the multi-worker cell" if len(table) == 1 else f"any of the {len(table)} multi-worker cells"
        return [f"{where + ': no' if where else 'No'} rank is a straggler beyond noise in {cells}: where ranks "
                "waited inside collectives, they waited for each other alike, or one by less than the others' own "
                "time varies from step to step (imbalance or a shared link, not one slow rank)."]
    out = []
    for d in named.to_dict("records"):
        where = f" on node {int(d['straggler_node'])}" if d["straggler_node"] is not None and not (
            isinstance(d["straggler_node"], float) and math.isnan(d["straggler_node"])) else ""
        stage = f", losing its time in {d['stage']}" if d["stage"] else ""
        out.append(f"{lead}{int(d['workers'])} workers at global batch {d['global_batch']}: rank "
                   f"{int(d['straggler_rank'])}{where} is the straggler{stage}; it arrived last at "
                   f"{100 * d['last(share)']:.0f} % of the collectives and the others waited {d['caused(ms)']:.2f} ms "
                   f"per step for it (95 % interval {d['caused_low(ms)']:.2f}-{d['caused_high(ms)']:.2f}, n = "
                   f"{int(d['steps'])} steps{_launches(d)}, of a {d['step(ms)']:.1f} ms step){_waiting(d)}.")
    return out


def _launches(d: dict) -> str:
    n = d.get("launches")
    return f" over {int(n)} launches" if isinstance(n, (int, float)) and n == n and n > 1 else ""


def _waiting(d: dict) -> str:
    """The cell's waiting for peers beside the straggler's cost: the cost is a part of it (one stretch of time)."""
    w = d.get("waiting(ms)")
    return f"; the cell's waiting for peers {w:.2f} ms" if isinstance(w, (int, float)) and w == w else ""
