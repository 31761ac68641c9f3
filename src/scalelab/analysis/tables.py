"""What every experiment's table shares: a frame of stored runs ({run_id, config, summary}) with the spread of its
timings (`runs_frame`, `SPREAD`, `HEADLINE`). Each experiment's own table lives in its module.

Every table keeps the spread of its timings (min/median/max step time over the timed steps, and the median's 95 %
interval) and says its unit in the column name. Its headline column is followed by `n` (timed steps, pooled over
launches) and that column's 95 % interval, named after it (`keys.ci_keys`: "throughput(samples/s)" ->
"throughput_ci_low(samples/s)", "throughput_ci_high(samples/s)"), so that no choice of columns can set an interval
beside another figure; `launches` and `quality` ("ok", or why not: the run's noise reason, "precision not reached")
close each row.
"""
from __future__ import annotations

import re

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import run_quality
from scalelab.analysis.repeats import LAUNCH_MEDIANS, LAUNCHES, WITHIN_DOF, WITHIN_VAR

# the launch medians and within-launch spread: the noise model's inputs (scalelab.analysis.noise)
SPREAD = [keys.STEP_MIN_MS, keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS,
          keys.STEP_MAX_MS, LAUNCH_MEDIANS, WITHIN_VAR, WITHIN_DOF]


def headline_columns(headline: str) -> list[str]:
    """The columns that follow a headline figure: its n and its 95 % interval, named after it."""
    return ["n", *keys.ci_keys(headline)]


def runs_frame(runs: list[dict], config_keys: list[str], metrics: list[str], headline: str | None = None
               ) -> pd.DataFrame:
    """One row per run: the chosen config fields and summary metrics (missing metrics are NaN); with a
    `headline` metric, its n and interval (named after it) right after it, and launches and quality at the end."""
    rows, columns = [], ["run_id", *config_keys, *metrics]
    if headline is not None:
        at = columns.index(headline) + 1
        columns[at:at] = [c for c in headline_columns(headline) if c not in columns]
        columns += [LAUNCHES, "quality"]
    for run in runs:
        summary = run["summary"] or {}
        row = {"run_id": run["run_id"]}
        row.update({k: run["config"].get(k) for k in config_keys})
        row.update({m: summary.get(m) for m in metrics})
        if headline is not None:
            low, high = keys.ci_keys(headline)
            row.update({"n": summary.get(keys.STEPS_TIMED), low: summary.get(low), high: summary.get(high),
                        LAUNCHES: summary.get(LAUNCHES, 1), "quality": run_quality(summary)})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(config_keys, kind="stable").reset_index(drop=True) if len(frame) else frame




_INTERVAL = re.compile(r"^(?:(?P<stem>.+)_)?ci_(?P<end>low|high)(?P<unit>\(.*\))?$")


def interval_parts(column: str) -> tuple[str, str, str] | None:
    """("stem", "low" | "high", "(unit)" or "") of an interval column "stem_ci_low(unit)" (a bare "ci_low": stem
    ""); None for any other."""
    m = _INTERVAL.match(str(column))
    return (m["stem"] or "", m["end"], m["unit"] or "") if m else None


def figure_of(interval: str, columns) -> str | None:
    """The figure an interval column belongs to, matched by name: "stem(unit)" (keys.ci_keys' rule), else the one
    column "stem_<more>(unit)" ("exposed_ci_low(ms)" -> "exposed_comm(ms)"); None when no column or several match
    (an interval that names no figure, such as a bare "ci_low", has none)."""
    parts = interval_parts(interval)
    if parts is None:
        return None
    stem, _, unit = parts
    if not stem:
        return None
    names = [str(c) for c in columns if interval_parts(str(c)) is None]
    if stem + unit in names:
        return stem + unit
    longer = [c for c in names if c.startswith(stem + "_") and c.endswith(unit) and (unit or "(" not in c)]
    return longer[0] if len(longer) == 1 else None


def intervals_of(figure: str, columns) -> list[str]:
    """The interval columns (low, high) that belong to `figure` among `columns` (figure_of), in that order."""
    found = {interval_parts(c)[1]: c for c in map(str, columns)
             if interval_parts(c) and figure_of(c, columns) == figure}
    return [found[end] for end in ("low", "high") if end in found]
