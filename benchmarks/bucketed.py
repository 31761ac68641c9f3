"""scalelab's own bucketed overlapped allreduce vs torch DDP: throughput side by side, interleaved.

ResNet-18 on synthetic 32×32 images, 2 gloo ranks, the same global batch and bucket size for both; the variants
alternate `--repeats` times in one invocation. Prints every measurement and the ratio of medians.
Goal: bucketed / ddp >= 0.95.

    python benchmarks/bucketed.py [--steps 12] [--global-batch 64] [--bucket-mb 25] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scalelab.config import TrainConfig
from scalelab.run.execute import execute
from scalelab.store import Store


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    results: dict[str, list[float]] = {"bucketed": [], "ddp": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        for i in range(args.repeats):
            for sync in (("bucketed", "ddp") if i % 2 == 0 else ("ddp", "bucketed")):
                cfg = TrainConfig(model="resnet18", dataset="synthetic", samples=2048, eval_samples=16, ranks=2,
                                  global_batch=args.global_batch, steps=args.steps, warmup_steps=args.warmup,
                                  sync=sync, bucket_mb=args.bucket_mb, eval_every=10**9, drop_last=True)
                value = execute(cfg, store, say=lambda s: None).summary["throughput(samples/s)"]
                results[sync].append(value)
                print(f"repeat {i + 1}/{args.repeats} {sync:8s} {value:8.1f} samples/s", flush=True)
    ours, ddp = statistics.median(results["bucketed"]), statistics.median(results["ddp"])
    print(f"median throughput: bucketed {ours:.1f} samples/s, ddp {ddp:.1f} samples/s")
    print(f"ratio bucketed/ddp = {ours / ddp:.3f} (goal >= 0.95)")


if __name__ == "__main__":
    main()
