"""Does scalelab know when its numbers are noise? The quick study's scaling and strategy sections measured quiet,
then again with a background CPU hog (one busy process for the whole second pass), each in a fresh store.

Headline figures: per scaling row with more than one worker, its efficiency and exposed communication; per
strategy, its median step and exposed communication. For each figure of the hog pass it counts whether it moved
beyond its quiet interval, and whether its row is flagged (quality other than "ok": noisy, implausible,
re-measured ...). Prints every figure, then the counts. Targets: quiet, at most 1 headline figure flagged; with
the hog, no figure that moved beyond its quiet interval left unflagged.

    python benchmarks/noise.py [--launches 1]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

# (table, row key columns, figure, its interval columns)
FIGURES = [
    ("scale_strong", ("workers", "global_batch"), "efficiency", ("ci_low", "ci_high")),
    ("scale_strong", ("workers", "global_batch"), "exposed_comm(ms)", ("exposed_ci_low(ms)", "exposed_ci_high(ms)")),
    ("scale_weak", ("workers", "per_worker_batch"), "efficiency", ("ci_low", "ci_high")),
    ("scale_weak", ("workers", "per_worker_batch"), "exposed_comm(ms)", ("exposed_ci_low(ms)", "exposed_ci_high(ms)")),
    ("compare_strategies", ("sync",), "step(ms)", ("step_ci_low(ms)", "step_ci_high(ms)")),
    ("compare_strategies", ("sync",), "exposed_comm(ms)", ("exposed_ci_low(ms)", "exposed_ci_high(ms)")),
]


def measure(root: Path, launches: int) -> dict[str, pd.DataFrame]:
    """The quick study's scale and strategies sections in a fresh store: their tables."""
    from scalelab.lab.progress import PlainProgress
    from scalelab.lab.study import default_spec, run_experiments
    from scalelab.store import Store

    spec = default_spec(quick=True)
    spec.experiments, spec.reference = ["scale", "strategies"], False
    for name in spec.experiments:
        spec.options[name]["launches"] = launches
    answered = run_experiments(spec, Store(root / "store"), root / "out", PlainProgress(lambda line: None))
    return {key: frame for _, result in answered for key, frame in result.tables.items()}


def figures(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per headline figure: where it is, its value and interval, its row's quality."""
    rows = []
    for table, key, figure, (low, high) in FIGURES:
        frame = tables.get(table, pd.DataFrame())
        if not len(frame) or figure not in frame:
            continue
        if "workers" in frame:
            frame = frame[frame["workers"] > 1]
        for _, r in frame.iterrows():
            rows.append({"figure": f"{table}: {figure} @ " + ", ".join(f"{k} {r[k]}" for k in key),
                         "value": r[figure], "low": r.get(low), "high": r.get(high), "quality": r.get("quality")})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=1, help="launches per compared cell (the quick study: 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scalelab-noise-") as tmp:
        quiet = figures(measure(Path(tmp) / "quiet", args.launches))
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            busy = figures(measure(Path(tmp) / "hog", args.launches))
        finally:
            hog.kill()
            hog.wait()
    both = quiet.merge(busy, on="figure", suffixes=("_quiet", "_hog"))
    both["flagged_quiet"] = both["quality_quiet"].fillna("ok") != "ok"
    both["flagged_hog"] = both["quality_hog"].fillna("ok") != "ok"
    both["moved"] = (both["value_hog"] < both["low_quiet"]) | (both["value_hog"] > both["high_quiet"])
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(both[["figure", "value_quiet", "low_quiet", "high_quiet", "quality_quiet", "value_hog",
                    "quality_hog", "moved"]].to_string(index=False))
    unflagged = both[both["moved"] & ~both["flagged_hog"]]
    print(f"\nheadline figures: {len(both)}")
    print(f"quiet: {int(both['flagged_quiet'].sum())} flagged (target <= 1)")
    print(f"with a CPU hog: {int(both['moved'].sum())} moved beyond their quiet interval, "
          f"{int(both['flagged_hog'].sum())} flagged, {len(unflagged)} moved and unflagged (target 0)")


if __name__ == "__main__":
    main()
