"""What does a device-wide sync at every stage boundary cost on a GPU? Step time of scalelab's loop on CUDA with
stages bounded by CUDA events (the default: one wait per step) vs `sync_stages` (torch.cuda.synchronize at every
boundary), interleaved.

Same model (ResNet-18), data (synthetic 32×32), batch and steps for both; the two variants alternate `--repeats`
times (A B, B A, ...) in one invocation so drift hits both alike. Prints every run's median step, the ratio of
medians (sync / events) with the ratios' min..max over the paired repeats. Needs CUDA: without a GPU it says so
and exits 0.

    python benchmarks/stage_timing.py [--steps 40] [--warmup 5] [--global-batch 128] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path


def step_ms(args, store, sync_stages: bool) -> float:
    from scalelab.config import TrainConfig
    from scalelab.run.execute import execute

    cfg = TrainConfig(model="resnet18", dataset="synthetic", samples=args.samples, eval_samples=16, device="cuda",
                      global_batch=args.global_batch, steps=args.steps, warmup_steps=args.warmup, eval_every=10**9,
                      drop_last=True, sync_stages=sync_stages)
    return execute(cfg, store, say=lambda s: None).summary["time/step_median(ms)"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("stage_timing: needs a CUDA GPU (none is visible); nothing measured")
        return 0
    from scalelab.store import Store

    results: dict[str, list[float]] = {"events": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        for i in range(args.repeats):
            for variant in (("events", "sync") if i % 2 == 0 else ("sync", "events")):
                value = step_ms(args, store, variant == "sync")
                results[variant].append(value)
                print(f"repeat {i + 1}/{args.repeats} {variant:6s} median step {value:8.2f} ms", flush=True)
    ratios = [s / e for s, e in zip(results["sync"], results["events"])]
    events, sync = statistics.median(results["events"]), statistics.median(results["sync"])
    print(f"median step: events {events:.2f} ms, sync at every stage {sync:.2f} ms (n={args.repeats} each)")
    print(f"ratio sync/events = {sync / events:.3f} (paired repeats: min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
