"""Warm ranks against cold launches: the same cells, interleaved (cold, warm, cold, warm ...), n launches each.

For each model (2 gloo ranks, fixed seed): every launch's step median (ms, the summary's), their median and range
per path, the launch-to-launch spread (the interquartile range of the launches' medians over their median), a
Mann-Whitney test of "the two paths give the same step times" (two-sided; p > 0.05: within noise), and whether
the first 20 steps' losses of every rank were bit-identical between every warm and every cold launch.

What it answers: a warm launch measures what a cold one does (medians within noise), and warm launches of one cell
scatter as much as cold ones (the spread): if warm repeats were less independent (sharing a process, its caches
and its heap), their spread would shrink and the launch-level intervals (analysis/repeats.py) would be too narrow.

    python benchmarks/warm_cold.py [--launches 5] [--models cnn,mlp]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def launch(store, cfg, warm_path: bool) -> tuple[float, dict]:
    """One launch: its step median (ms) and every rank's {step: loss}."""
    import contextlib

    from scalelab.analysis import keys
    from scalelab.run import warm
    from scalelab.run.execute import execute
    from scalelab.store import RunDir

    with contextlib.nullcontext() if warm_path else warm.paused():
        out = execute(cfg, store, say=lambda _line: None)
    files = RunDir(out.run_dir)
    losses = {rank: {r["step"]: r["loss"] for r in files.read_steps(rank) if r["step"] <= 20} for rank in (0, 1)}
    return out.summary[keys.STEP_MEDIAN_MS], losses


def main() -> None:
    from scipy.stats import mannwhitneyu

    from scalelab.config import TrainConfig
    from scalelab.run import warm
    from scalelab.store import Store

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5)
    parser.add_argument("--models", default="cnn,mlp")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, warm.ranks():
        store = Store(Path(tmp) / "store")
        for model in args.models.split(","):
            cfg = TrainConfig(model=model, dataset="synthetic", samples=2048, eval_samples=64, global_batch=64,
                              steps=30, warmup_steps=5, ranks=2, seed=11)
            launch(store, cfg, True)  # the warm ranks' start-up, not one of the n
            medians: dict[str, list[float]] = {"cold": [], "warm": []}
            losses: dict[str, list[dict]] = {"cold": [], "warm": []}
            for i in range(2 * args.launches):
                path = "cold" if i % 2 == 0 else "warm"
                median, loss = launch(store, cfg, path == "warm")
                medians[path].append(median)
                losses[path].append(loss)
            same = all(w == c for w in losses["warm"] for c in losses["cold"])
            p = mannwhitneyu(medians["cold"], medians["warm"], alternative="two-sided").pvalue
            print(f"\n{model}, 2 ranks, {args.launches} launches per path, interleaved")
            for path, values in medians.items():
                q = statistics.quantiles(values, n=4)
                print(f"  {path}: step median {statistics.median(values):.2f} ms (range {min(values):.2f}-"
                      f"{max(values):.2f}), launch-to-launch IQR {100 * (q[2] - q[0]) / statistics.median(values):.1f} %"
                      f"  [{', '.join(f'{v:.2f}' for v in values)}]")
            print(f"  warm / cold medians: {statistics.median(medians['warm']) / statistics.median(medians['cold']):.3f}"
                  f"; Mann-Whitney p = {p:.2f} ({'within noise' if p > 0.05 else 'beyond noise'})")
            print(f"  losses of steps 1-20, every rank: {'bit-identical' if same else 'DIFFERENT'} across all "
                  f"{2 * args.launches} launches")


if __name__ == "__main__":
    main()
