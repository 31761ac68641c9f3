"""What every experiment's table shares: a frame of stored runs ({run_id, config, summary}) with the spread of its
timings (`runs_frame`, `SPREAD`, `HEADLINE`). Each experiment's own table lives in its module.

Every table keeps the spread of its timings (min/median/max step time over the timed steps, and the median's 95 %
interval) and says its unit in the column name. Its headline column is followed by `n` (timed steps, pooled over
launches), `ci_low` and `ci_high` (that column's 95 % interval); `launches` and `quality` ("ok", or why not: the
run's noise reason, "precision not reached") close each row.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import run_quality
from scalelab.analysis.repeats import LAUNCH_MEDIANS, LAUNCHES, WITHIN_DOF, WITHIN_VAR

# the launch medians and within-launch spread: the noise model's inputs (scalelab.analysis.noise)
SPREAD = [keys.STEP_MIN_MS, keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS,
          keys.STEP_MAX_MS, LAUNCH_MEDIANS, WITHIN_VAR, WITHIN_DOF]


HEADLINE = ["n", "ci_low", "ci_high"]


def runs_frame(runs: list[dict], config_keys: list[str], metrics: list[str], headline: str | None = None
               ) -> pd.DataFrame:
    """One row per run: the chosen config fields and summary metrics (missing metrics are NaN); with a
    `headline` metric, its n and interval right after it, and launches and quality at the end."""
    rows, columns = [], ["run_id", *config_keys, *metrics]
    if headline is not None:
        at = columns.index(headline) + 1
        columns[at:at] = HEADLINE
        columns += [LAUNCHES, "quality"]
    for run in runs:
        summary = run["summary"] or {}
        row = {"run_id": run["run_id"]}
        row.update({k: run["config"].get(k) for k in config_keys})
        row.update({m: summary.get(m) for m in metrics})
        if headline is not None:
            low, high = keys.ci_keys(headline)
            row.update({"n": summary.get(keys.STEPS_TIMED), "ci_low": summary.get(low), "ci_high": summary.get(high),
                        LAUNCHES: summary.get(LAUNCHES, 1), "quality": run_quality(summary)})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(config_keys, kind="stable").reset_index(drop=True) if len(frame) else frame


