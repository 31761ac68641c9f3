"""What does scalelab's measurement cost? Throughput of scalelab's loop vs a bare DDP loop, interleaved.

Same model (ResNet-18), data (synthetic 32×32), global batch and ranks (2 gloo ranks) for both; the two
variants alternate `--repeats` times in one invocation so machine drift hits both alike. Each variant's
throughput counts only steps after the warm-up. Prints every measurement and the ratio of medians.
Goal: scalelab / bare >= 0.98.

    python benchmarks/overhead.py [--steps 20] [--warmup 3] [--global-batch 64] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def bare_worker(args) -> None:
    """One rank of the bare loop: no timers, no records, no sampler thread."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    from scalelab.config import default_threads
    from scalelab.zoo.data import build_data
    from scalelab.zoo.models import build_model

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(default_threads(world))
    bundle = build_data("synthetic", samples=args.samples, eval_samples=16, seed=0)
    torch.manual_seed(0)
    model = DDP(build_model("resnet18", bundle.spec))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = torch.utils.data.distributed.DistributedSampler(bundle.train, world, rank, seed=0)
    loader = DataLoader(bundle.train, batch_size=args.global_batch // world, sampler=sampler, drop_last=True)
    batches, step, t0 = iter(loader), 0, None
    while step < args.steps:
        if step == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            sampler.set_epoch(step)
            batches = iter(loader)
            x, y = next(batches)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        samples = (args.steps - args.warmup) * args.global_batch
        Path(args.out).write_text(json.dumps({"throughput": samples / elapsed}))
    dist.destroy_process_group()


def run_bare(args, port_dir: Path) -> float:
    from scalelab.run.launch import free_port, run_torchrun

    out = port_dir / f"bare-{time.time_ns()}.json"
    argv = ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "static",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", __file__, "--bare-worker",
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--global-batch", str(args.global_batch),
            "--samples", str(args.samples), "--out", str(out)]
    run_torchrun(argv)
    return json.loads(out.read_text())["throughput"]


def run_scalelab(args, store) -> float:
    from scalelab.config import TrainConfig
    from scalelab.run.execute import execute

    cfg = TrainConfig(model="resnet18", dataset="synthetic", samples=args.samples, eval_samples=16, ranks=2,
                      global_batch=args.global_batch, steps=args.steps, warmup_steps=args.warmup, eval_every=10**9,
                      drop_last=True)
    return execute(cfg, store, say=lambda s: None).summary["throughput(samples/s)"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_worker:
        bare_worker(args)
        return
    import os

    from scalelab.config import default_threads
    from scalelab.store import Store

    os.environ.setdefault("OMP_NUM_THREADS", str(default_threads(2)))
    results: dict[str, list[float]] = {"scalelab": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        for i in range(args.repeats):
            order = ("scalelab", "bare") if i % 2 == 0 else ("bare", "scalelab")
            for variant in order:
                value = run_scalelab(args, store) if variant == "scalelab" else run_bare(args, Path(tmp))
                results[variant].append(value)
                print(f"repeat {i + 1}/{args.repeats} {variant:8s} {value:8.1f} samples/s", flush=True)
    ours, bare = statistics.median(results["scalelab"]), statistics.median(results["bare"])
    print(f"median throughput: scalelab {ours:.1f} samples/s, bare DDP {bare:.1f} samples/s")
    print(f"ratio scalelab/bare = {ours / bare:.3f} (goal >= 0.98)")


if __name__ == "__main__":
    sys.exit(main())
