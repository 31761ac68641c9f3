"""How long `scalelab report` takes: rendered from the saved results (lab.results) against derived again from the
stored runs (the results folder removed first, as for a study of an older analysis version), in interleaved pairs
of whole commands on copies of one study folder.

    python benchmarks/report_render.py STORE/studies/NAME [--pairs 5]

Prints each side's median, minimum and maximum wall time over the pairs, and the median ratio.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(study: Path) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "scalelab", "report", str(study)], check=True, capture_output=True)
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path, help="a study folder `scalelab study` wrote (its store must be where it was)")
    p.add_argument("--pairs", type=int, default=5)
    args = p.parse_args()
    times: dict[str, list[float]] = {"saved": [], "derived": []}
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / args.study.name
        shutil.copytree(args.study, study)
        timed(study)  # the results of this version saved once
        for i in range(args.pairs):
            for side in ("saved", "derived") if i % 2 == 0 else ("derived", "saved"):
                if side == "derived":
                    shutil.rmtree(study / "results")
                times[side].append(timed(study))
    for side, values in times.items():
        print(f"report from {side} results: median {statistics.median(values):.2f} s, range "
              f"{min(values):.2f}-{max(values):.2f} s over {len(values)} runs")
    ratios = [s / d for s, d in zip(times["saved"], times["derived"])]
    print(f"saved / derived: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    sys.exit(main())
