"""Does `scalelab bench comm` measure what a plain loop measures? allreduce busbw at 64 MB, side by side.

Both variants: 2 gloo ranks on 127.0.0.1 through torchrun, float32, the same warm-up and iteration counts, the
same threads per rank. scalelab times every iteration (barrier before, slowest rank, median over iterations);
the plain loop times `iters` back-to-back all_reduce calls after one barrier and divides (slowest rank). The
variants alternate `--repeats` times in one invocation so machine drift hits both alike. busbw = S/t · 2(n−1)/n.
Goal: scalelab / plain within 10 %.

    python benchmarks/comm.py [--size 64M] [--warmup 5] [--iters 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RANKS = 2


def plain_worker(args) -> None:
    """One rank of the plain loop: no barriers inside the timed loop, no resets, no checks."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    world = dist.get_world_size()
    x = torch.zeros(args.size // 4 // world * world, dtype=torch.float32)  # zeros: no growth over iterations
    for _ in range(args.warmup):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(x)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the loop is done when the slowest rank is
    if dist.get_rank() == 0:
        seconds = elapsed.item() / args.iters
        busbw = x.numel() * 4 / seconds / 1e9 * 2 * (world - 1) / world
        Path(args.out).write_text(json.dumps({"busbw": busbw}))
    dist.destroy_process_group()


def run_plain(args, tmp: Path) -> float:
    from scalelab.run.launch import free_port, run_torchrun

    out = tmp / f"plain-{time.time_ns()}.json"
    argv = ["--nnodes", "1", "--nproc-per-node", str(RANKS), "--rdzv-backend", "static",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", __file__, "--plain-worker",
            "--size", str(args.size), "--warmup", str(args.warmup), "--iters", str(args.iters), "--out", str(out)]
    run_torchrun(argv)
    return json.loads(out.read_text())["busbw"]


def run_scalelab(args, store) -> float:
    from scalelab.measure.commbench import CommBenchConfig
    from scalelab.run.execute import run_commbench

    cfg = CommBenchConfig(ops="allreduce", begin=args.size, end=args.size, warmup=args.warmup, iters=args.iters,
                          ranks=RANKS, backend="gloo")
    outcome = run_commbench(cfg, store, say=lambda s: None)
    assert outcome.status == "completed", outcome.reason
    return float(outcome.table["busbw(GB/s)"].iloc[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="64M", help="Message size S (K/M/G = powers of 1024).")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_worker:
        args.size = int(args.size)
        plain_worker(args)
        return
    from scalelab.config import default_threads
    from scalelab.measure.commbench import parse_size
    from scalelab.store import Store

    args.size = parse_size(args.size, "size")
    # the same environment scalelab gives its ranks
    os.environ.update(OMP_NUM_THREADS=str(default_threads(RANKS)), GLOO_SOCKET_IFNAME="lo")
    results: dict[str, list[float]] = {"scalelab": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        for i in range(args.repeats):
            order = ("scalelab", "plain") if i % 2 == 0 else ("plain", "scalelab")
            for variant in order:
                value = run_scalelab(args, store) if variant == "scalelab" else run_plain(args, Path(tmp))
                results[variant].append(value)
                print(f"repeat {i + 1}/{args.repeats} {variant:8s} allreduce busbw {value:.3f} GB/s", flush=True)
    ours, plain = statistics.median(results["scalelab"]), statistics.median(results["plain"])
    print(f"median allreduce busbw at {args.size} B, {RANKS} gloo ranks: scalelab {ours:.3f} GB/s, "
          f"plain loop {plain:.3f} GB/s")
    print(f"ratio scalelab/plain = {ours / plain:.3f} (goal: within 10 %, 0.90..1.10)")


if __name__ == "__main__":
    sys.exit(main())
