"""A run's study cell and the cell's pooled figures, as the report has them (for `scalelab explain RUN`).

`scalelab explain` breaks down one launch. A study's scale cell is launched several times and its report reads the
launches pooled (scalelab.analysis.repeats), so one launch's exposed communication, waiting and straggler can differ
from the report's. The cell's figures are stored once, with the study's result (STUDY/results/scale.json:
scalelab.lab.results); this module finds the cell a run is a launch of (the scale tables' `run_ids`) and reads its
lost-speedup rows and straggler row from there, never recomputing them. A study written elsewhere than
STORE/studies/NAME (`study --out`) is not found: its runs are explained as single launches.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalelab.analysis.breakdown import exposed_sum
from scalelab.errors import StoreError
from scalelab.lab.results import frame_of, results_dir
from scalelab.store.files import read_json

MODES = ("strong", "weak")


def study_cell(store_root: Path, run: dict) -> dict | None:
    """{"study", "mode", "workers", "global_batch", "launches", "run_ids", "lost": the cell's lost-speedup rows,
    "straggler": its straggler row or None} of the study cell `run` is a launch of; None when it is in none."""
    study = run.get("study")
    if not study:
        return None
    # a cell measured again is stored under a sub-study ("NAME/scale_strong/again"): its study is NAME
    path = results_dir(Path(store_root) / "studies" / study.split("/")[0]) / "scale.json"
    try:
        tables = read_json(path)["tables"] if path.is_file() else {}
        frames = {name: frame_of(data) for name, data in tables.items()}
    except (StoreError, KeyError, TypeError, ValueError):
        return None
    for mode in MODES:
        table = frames.get(f"scale_{mode}")
        if table is None or "run_ids" not in table:
            continue
        for row in table.to_dict("records"):
            ids = str(row.get("run_ids") or "").split(",")
            if run["run_id"] not in ids:
                continue
            cell = (table["workers"] == row["workers"]) & (table["global_batch"] == row["global_batch"])
            lost = frames.get(f"scale_{mode}_lost_speedup", pd.DataFrame())
            lost = lost[(lost["workers"] == row["workers"]) & (lost["global_batch"] == row["global_batch"])] \
                if len(lost) else lost
            stragglers = frames.get(f"scale_{mode}_stragglers", pd.DataFrame())
            mine = stragglers[stragglers["run_id"] == row["run_id"]] if len(stragglers) else stragglers
            return {"study": study, "mode": mode, "workers": int(row["workers"]),
                    "global_batch": int(row["global_batch"]), "launches": len(ids), "run_ids": ids,
                    "row": table[cell].iloc[0].to_dict(), "lost": lost.drop(columns=["workers", "global_batch"]),
                    "straggler": mine.iloc[0].to_dict() if len(mine) else None}
    return None


def cell_lines(cell: dict | None, run_id: str) -> list[str]:
    """What `explain` says of a run in a study cell: that its table is this one launch, and the cell's pooled
    exposed communication (as a sum), overlap and straggler beside it, as the report gives them."""
    if cell is None:
        return []
    where = (f"study {cell['study'].split('/')[0]}'s cell ({cell['mode']} scaling, {cell['workers']} workers at "
             f"global batch {cell['global_batch']})")
    out = [f"this run is the one launch of {where}: the report's figures for the cell, as stored with it:"
           if cell["launches"] == 1 else
           f"this run is launch {cell['run_ids'].index(run_id) + 1} of {cell['launches']} of {where}: the table "
           f"above is this launch alone; the report's figures pool the cell's launches:"]
    whole = exposed_sum(cell["lost"].reset_index(drop=True)) if len(cell["lost"]) else None
    if whole:
        out.append(f"  the cell: {whole}.")
    s = cell["straggler"]
    if s is not None:
        rank = s.get("straggler_rank")
        if rank is not None and not (isinstance(rank, float) and math.isnan(rank)):
            out.append(f"  the cell's straggler: rank {int(rank)}, cost to the others {s['caused(ms)']:.2f} ms per "
                       f"step (95 % interval {s['caused_low(ms)']:.2f}-{s['caused_high(ms)']:.2f}); the cell's "
                       f"waiting for peers {s['waiting(ms)']:.2f} ms.")
        else:
            out.append("  the cell's straggler: none beyond noise"
                       + (f" (waiting for peers {s['waiting(ms)']:.2f} ms)." if _number(s.get("waiting(ms)")) else "."))
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))
