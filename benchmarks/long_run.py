"""Do long runs stay cheap? A million steps through the probe's real recorder, then the run's summary.

One rank's probe (scalelab.run.probe) on a fixed clock: each step asks a loader for a batch and runs forward,
backward and optimizer stages whose lengths are drawn from lognormal distributions (seeded), so the exact
quantiles of the step times are known. Prints: the seconds and peak memory (RSS high-water mark) of recording
and of summarising, the size of the files left, and the rank error of the summary's p50 and p95 step against the
exact quantiles; the same steps through the recorder alone (`Probe.record`, the stage seconds given as the timer
gives them), and the bare loop without the probe. Goal: a million steps recorded and summarised in under 10 s
and 500 MB, p50/p95 within 1 % rank.

    python benchmarks/long_run.py [--steps 1000000]
    python benchmarks/long_run.py --steps 20000      # a quick check that it runs
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from scalelab.analysis import keys
from scalelab.distenv import DistContext
from scalelab.measure.timer import TIMED_STAGES
from scalelab.run.probe import Probe
from scalelab.run.script import summarise_script


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1_000_000)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    n = args.steps
    stages = {name: rng.lognormal(mean, 0.3, n) for name, mean in
              (("data", -7.0), ("forward", -4.0), ("backward", -3.3), ("optimizer", -6.0))}
    batch = (torch.zeros(8, 4), torch.zeros(8))
    clock = Clock()
    data = stages["data"].tolist()

    def loader():
        for i in range(n):
            clock.t += data[i]
            yield batch

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        probe = Probe(run_dir, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, clock=clock,
                      warmup_steps=0)
        fwd, bwd, opt = (stages[s].tolist() for s in ("forward", "backward", "optimizer"))
        rss0, began = peak_rss_mb(), time.perf_counter()
        for i, _ in enumerate(probe.data(loader())):
            with probe.stage("forward"):
                clock.t += fwd[i]
            with probe.stage("backward"):
                clock.t += bwd[i]
            with probe.stage("optimizer"):
                clock.t += opt[i]
        probe.close()
        recorded = time.perf_counter() - began
        # the same loop without the probe (a no-op stage), to tell the probe's cost from the loop's own
        began = time.perf_counter()
        for i, _ in enumerate(loader()):
            for seconds in (fwd[i], bwd[i], opt[i]):
                with _Nothing():
                    clock.t += seconds
        bare = time.perf_counter() - began
        rss1 = peak_rss_mb()
        # the recorder alone: the same steps' stage seconds handed to Probe.record as its timer hands them
        rec_dir = run_dir / "recorder"
        rec_dir.mkdir()
        recorder = Probe(rec_dir, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, clock=clock,
                         warmup_steps=0)
        empty = dict.fromkeys(TIMED_STAGES, 0.0)
        began = time.perf_counter()
        for i in range(n):
            times = {**empty, "data": data[i], "forward": fwd[i], "backward": bwd[i], "optimizer": opt[i],
                     "other": 0.0, "wall": data[i] + fwd[i] + bwd[i] + opt[i]}
            recorder.record(times, 8)
        recorder.close()
        recorder_only = time.perf_counter() - began
        began = time.perf_counter()
        summarise_script(rec_dir)
        recorder_summary = time.perf_counter() - began
        began = time.perf_counter()
        summary = summarise_script(run_dir)
        summarised = time.perf_counter() - began
        size = sum(f.stat().st_size for f in run_dir.iterdir() if f.is_file())
    total = recorder_only + recorder_summary
    print(f"{n:,} steps through the recorder alone (Probe.record): {recorder_only:.1f} s "
          f"({1e6 * recorder_only / n:.1f} us/step) + summary {recorder_summary:.2f} s = {total:.1f} s "
          f"(goal < 10 s: {'met' if total < 10 else 'NOT met'})")
    walls = np.sort(sum(stages.values()))
    print(f"{n:,} steps, the loop alone (no probe): {bare:.1f} s ({1e6 * bare / n:.1f} us/step)")
    print(f"{n:,} steps through the whole probe (data, 3 stages, recorder): recorded in {recorded:.1f} s "
          f"({1e6 * recorded / n:.1f} us/step), summarised in "
          f"{summarised:.2f} s; peak RSS {rss1:.0f} MB (before recording {rss0:.0f} MB); files {size / 1e6:.1f} MB")
    print(f"steps in the summary: {summary[keys.STEPS_TOTAL]:,} total, {summary.get(keys.STEPS_DETAILED, n):,} kept "
          "in full")
    for q, key in ((0.5, keys.STEP_MEDIAN_MS), (0.95, keys.STEP_P95_MS)):
        estimate = summary[key] / 1e3
        rank = np.searchsorted(walls, estimate, side="right") / n
        print(f"p{int(q * 100)}: sketch {1e3 * estimate:.4f} ms, exact {1e3 * np.quantile(walls, q):.4f} ms, "
              f"rank error {100 * abs(rank - q):.3f} % (goal < 1 %)")


if __name__ == "__main__":
    main()
