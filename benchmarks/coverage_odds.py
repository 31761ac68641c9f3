"""How often does a perfectly calibrated interval meet the protocol's coverage goals on one run? (issue 41)

The held-out points of one protocol run share one calibration, so their errors share an offset: e_i = o + ε_i,
o ~ N(0, offset²) per run, ε_i ~ N(0, within²) per point. Give each point the ideal intervals for that total
variance (half-widths z·√(offset² + within²)) and count, over many simulated runs of `points` points, how often a
run's 50 % interval holds 30-70 % of its points and its 95 % interval ≥ 80 %: the chance that one run meets the
goals, and that two runs both do, with nothing wrong in the interval.

    python benchmarks/coverage_odds.py [--points 16] [--ratio 0.8]   # ratio: offset sd / within-run sd
"""
from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import norm


def odds(ratio: float, points: int, runs: int = 100_000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    total = np.hypot(ratio, 1.0)
    errors = rng.normal(0, ratio, (runs, 1)) + rng.normal(0, 1, (runs, points))
    c50 = (np.abs(errors) < norm.ppf(0.75) * total).mean(1)
    c95 = (np.abs(errors) < norm.ppf(0.975) * total).mean(1)
    return float(((c50 >= 0.3) & (c50 <= 0.7) & (c95 >= 0.8)).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=16)
    ap.add_argument("--ratio", type=float, action="append", help="offset sd / within-run sd (repeatable)")
    args = ap.parse_args()
    for ratio in args.ratio or [0.0, 0.5, 0.8, 1.0]:
        p = odds(ratio, args.points)
        print(f"offset sd / within sd {ratio:.2f}: one run meets the coverage goals {100 * p:.0f} %, two runs both "
              f"{100 * p * p:.0f} %")


if __name__ == "__main__":
    main()
