"""Model size on 1 and N workers (seed 004), pure: the grid of depth x width x workers, and what N workers change.

The input is one plain dict per cell, as the experiment hands it over:

    {"depth": 4, "width": 1024, "workers": 2, "global_batch": 256, "parameters": 7_352_330,
     "status": "completed" | "does not fit" | "failed" | "missing", "reason": None, "run_id": "...",
     "summary": {...}}          # the run's summary; None or {} for a cell without a completed run

Memory by kind is per rank (the largest rank's), read from the summary keys of `analysis.keys`; a run that did not
record them has NaN there. With the global batch kept, N workers each hold 1/N of it: data parallelism should
shrink only the batch's activations, while every worker keeps a full copy of parameters, gradients and optimizer
state; `workers_table` says which part fell and what it cost in step time.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys

# memory kind -> its summary key; the first four add up to what a rank holds during a step (the backward peak is
# a peak of activations, overlapping the saved ones, so it is never stacked on them)
MEMORY_KINDS = {"parameters": keys.MEMORY_PARAMETERS_BYTES, "gradients": keys.MEMORY_GRADIENTS_BYTES,
                "optimizer_state": keys.MEMORY_OPTIMIZER_BYTES, "activations_saved": keys.MEMORY_ACTIVATIONS_BYTES,
                "activations_backward_peak": keys.MEMORY_ACTIVATIONS_PEAK_BYTES}
STACKED = ("parameters", "gradients", "optimizer_state", "activations_saved")
PEAK_ADDED = "peak_added(bytes)"  # peak memory training added on top of set-up (RSS on CPU, allocated on CUDA)

# A part "falls" with N workers when it is below this fraction of its 1-worker size, "rises" above its inverse:
# a tenth either way is well outside the few percent two runs of one config differ by.
FALLS_BELOW = 0.9
RISES_ABOVE = 1 / FALLS_BELOW

GRID_COLUMNS = ["depth", "width", "workers", "per_worker_batch", "parameters", "fits", "status", "reason",
                "step(ms)", "step_min(ms)", "step_max(ms)", *[f"{k}(bytes)" for k in MEMORY_KINDS], PEAK_ADDED,
                "run_id"]


def memory_column(kind: str) -> str:
    """The grid table's column of a memory kind: "gradients" -> "gradients(bytes)"."""
    return f"{kind}(bytes)"


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def fits_of(status: str) -> bool | None:
    """True: trained under the cap; False: ran out of memory (an outcome); None: failed otherwise or missing."""
    return True if status == "completed" else False if status == "does not fit" else None


def grid_table(cells: list[dict]) -> pd.DataFrame:
    """One row per (depth, width, workers): parameters, fits, step time (median, min, max over the timed steps)
    and memory by kind per rank; NaN where the run did not fit or did not record a number."""
    rows = []
    for cell in cells:
        s = (cell.get("summary") or {}) if cell["status"] == "completed" else {}
        added = s.get(keys.MEMORY_TRAIN_ADDED_BYTES)
        rows.append({"depth": cell["depth"], "width": cell["width"], "workers": cell["workers"],
                     "per_worker_batch": cell["global_batch"] // cell["workers"], "parameters": cell["parameters"],
                     "fits": fits_of(cell["status"]), "status": cell["status"],
                     "reason": None if cell["status"] == "completed" else cell.get("reason"),
                     "step(ms)": _number(s.get(keys.STEP_MEDIAN_MS)), "step_min(ms)": _number(s.get(keys.STEP_MIN_MS)),
                     "step_max(ms)": _number(s.get(keys.STEP_MAX_MS)),
                     **{memory_column(k): _number(s.get(key)) for k, key in MEMORY_KINDS.items()},
                     PEAK_ADDED: _number(added), "run_id": cell.get("run_id")})
    frame = pd.DataFrame(rows, columns=GRID_COLUMNS)
    frame["fits"] = frame["fits"].astype(object)  # True / False / None, never NaN
    return frame.sort_values(["workers", "depth", "width"], kind="stable").reset_index(drop=True)


def _fit_change(one: bool | None, many: bool | None, n: int) -> str:
    if one is None or many is None:
        return "unknown"
    return {(True, True): "fits on both", (False, False): "fits on neither",
            (False, True): f"fits only on {n} workers", (True, False): "fits only on 1 worker"}[(one, many)]


def _ratio(many: float, one: float) -> float:
    return many / one if one and not math.isnan(one) and not math.isnan(many) else math.nan


def workers_table(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (depth, width) and worker count N > 1, against 1 worker: whether each fits, each memory kind's ratio
    (N workers / 1 worker, per rank), the step time's ratio, and which parts fell or rose (`FALLS_BELOW`).
    Ratios are NaN where either side did not fit or did not record the number."""
    columns = ["depth", "width", "workers", "fits_1", "fits_n", "fit", *[f"{k}(ratio)" for k in MEMORY_KINDS],
               "peak_added(ratio)", "step(ratio)", "falls", "rises"]
    rows = []
    records = grid.to_dict("records")
    ones = {(r["depth"], r["width"]): r for r in records if r["workers"] == 1}
    for many in (r for r in records if r["workers"] > 1):
        one = ones.get((many["depth"], many["width"]))
        if one is None:
            continue
        ratios = {k: _ratio(many[memory_column(k)], one[memory_column(k)]) for k in MEMORY_KINDS}
        ratios["peak_added"] = _ratio(many[PEAK_ADDED], one[PEAK_ADDED])
        rows.append({"depth": many["depth"], "width": many["width"], "workers": many["workers"],
                     "fits_1": one["fits"], "fits_n": many["fits"],
                     "fit": _fit_change(one["fits"], many["fits"], many["workers"]),
                     **{f"{k}(ratio)": v for k, v in ratios.items()},
                     "step(ratio)": _ratio(many["step(ms)"], one["step(ms)"]),
                     "falls": ", ".join(k for k, v in ratios.items() if v < FALLS_BELOW),
                     "rises": ", ".join(k for k, v in ratios.items() if v > RISES_ABOVE)})
    frame = pd.DataFrame(rows, columns=columns)
    for name in ("fits_1", "fits_n"):
        frame[name] = frame[name].astype(object)
    return frame
