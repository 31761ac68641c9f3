"""What does the probe cost a user's script? The same DDP script with and without the probe, interleaved A/B.

The script (`--worker`, below) is a plain DDP loop; with `--probe` it adds the probe's lines (open, `run.data`,
forward / backward / optimizer stages) and records a run in a scratch store. Every variant times itself the same
way (barrier, then the wall time of the steps after the warm-up; the probe's own numbers are not used), on 2 gloo
ranks, the same model, batch and steps. Variants, in alternating order, `--repeats` pairs each:
- probe vs bare, for ResNet-18 and the small MLP: the probe's whole cost (timers, records, sampler thread, the
  metered collectives and its Python comm hook);
- python-hook vs builtin (no probe): what routing DDP's buckets through a Python comm hook (torch's
  allreduce_hook, as the probe does) costs against DDP's built-in C++ allreduce;
- found vs bare: the plain script (no probe lines) under the probe `scalelab run` opens, which finds its steps at
  the DDP model's forward and the optimizer's step (scalelab.run.found_steps): what `scalelab run` costs a script
  that marks nothing.
Prints each measurement, then per comparison the mean of the paired throughput ratios with its 95 % interval
(scalelab.analysis.intervals.mean_interval). Goal: probe / bare within 1 % (1.00 inside the interval, or the
interval above 0.99).

    python benchmarks/probe_cost.py [--repeats 10] [--steps 30] [--warmup 5] [--models resnet18,mlp]
    python benchmarks/probe_cost.py --repeats 2 --steps 4 --warmup 1 --models mlp    # a quick check that it runs
    python benchmarks/probe_cost.py --models mlp --comparisons found                 # scalelab run on a plain script
    python benchmarks/probe_cost.py --device cuda --models resnet18 --global-batch 256 --comparisons probe,found
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

MODELS = {"resnet18": {}, "mlp": {"depth": 2, "width": 256}}  # the small MLP: 2 x 256 hidden


def worker(args) -> None:
    """One rank of the user's script."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from scalelab.config import default_threads
    from scalelab.zoo.data import build_data
    from scalelab.zoo.models import build_model

    cuda = args.device == "cuda"
    if cuda:  # one GPU: the user's DDP script on NCCL, one rank
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(default_threads(world))
    dev = torch.device(args.device)
    run = found = None
    if args.found:  # what scalelab.run.script_rank opens before a user's script
        from scalelab.distenv import dist_context
        from scalelab.run.probe import Probe

        found = Probe(Path(args.out).with_suffix(".run"), dist_context(args.device), warmup_steps=args.warmup,
                      heartbeat_s=None, rank_pids=lambda: [os.getpid()], find_steps=True).start()
    if args.probe:
        from scalelab import probe

        run = probe.open(warmup_steps=args.warmup)
    bundle = build_data("synthetic", samples=args.samples, eval_samples=16, seed=0)
    torch.manual_seed(0)
    model = build_model(args.model, bundle.spec, **MODELS[args.model]).to(dev)
    model = DDP(model, device_ids=[0]) if cuda else DDP(model)
    if args.python_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(bundle.train, world, rank, seed=0)
    # on CUDA what a GPU user writes, and scalelab's CUDA loader defaults: 2 workers, pinned
    loader = DataLoader(bundle.train, batch_size=args.global_batch // world, sampler=sampler, drop_last=True,
                        **({"num_workers": 2, "pin_memory": True} if cuda else {}))
    stage = run.stage if run else (lambda name: _Nothing())
    batches = run.data(loader) if run else loader
    t0 = None
    for step, (x, y) in enumerate(batches):
        if step == args.steps:
            break
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        x, y = x.to(dev, non_blocking=cuda), y.to(dev, non_blocking=cuda)
        with stage("forward"):
            loss = F.cross_entropy(model(x), y)
        with stage("backward"):
            loss.backward()
        with stage("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
    if cuda:  # the timed stretch ends where the device finished
        torch.cuda.synchronize()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    if found is not None:
        found.close()
    if rank == 0:
        samples = (args.steps - args.warmup) * args.global_batch
        Path(args.out).write_text(json.dumps({"throughput": samples / elapsed}))
    dist.destroy_process_group()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def launch(args, model: str, variant: str, scratch: Path) -> float:
    from scalelab.run.launch import environ, free_port, run_torchrun

    out = scratch / f"{variant}-{time.time_ns()}.json"
    argv = ["--nnodes", "1", "--nproc-per-node", "1" if args.device == "cuda" else "2", "--rdzv-backend", "static",
            "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", __file__, "--worker",
            "--model", model, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--global-batch", str(args.global_batch), "--samples", str(args.samples), "--out", str(out),
            "--device", args.device,
            *(["--probe"] if variant == "probe" else []), *(["--python-hook"] if variant == "python-hook" else []),
            *(["--found"] if variant == "found" else [])]
    with environ({"SCALELAB_STORE": str(scratch / "store"), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}):
        run_torchrun(argv)
    return json.loads(out.read_text())["throughput"]


def compare(args, model: str, a: str, b: str, scratch: Path) -> tuple[float, float, float]:
    """`repeats` interleaved pairs (a, b then b, a); the mean of a/b over the pairs and its 95 % interval."""
    from scalelab.analysis.intervals import mean_interval

    ratios = []
    for i in range(args.repeats):
        got = {}
        for variant in ((a, b) if i % 2 == 0 else (b, a)):
            got[variant] = launch(args, model, variant, scratch)
            print(f"{model:8s} pair {i + 1}/{args.repeats} {variant:11s} {got[variant]:9.1f} samples/s", flush=True)
        ratios.append(got[a] / got[b])
    low, high = mean_interval(ratios)
    return sum(ratios) / len(ratios), low, high


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--python-hook", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--found", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    p.add_argument("--models", default="resnet18,mlp")
    p.add_argument("--repeats", type=int, default=10, help="pairs per comparison (n)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--comparisons", default="probe,python-hook,found",
                   help="which of: probe (probe / bare), python-hook (python-hook / builtin), found (found / bare)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: 2 gloo ranks; cuda: one rank on one GPU (NCCL), loader with 2 workers, pinned")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=4096)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for variant in args.comparisons.split(","):
                what = "python-hook / builtin" if variant == "python-hook" else f"{variant} / bare"
                rows.append((model, what, *compare(args, model, variant, "bare", Path(tmp))))
    print(f"\nthroughput ratios, mean of {args.repeats} interleaved pairs, 95 % interval "
          "(goal for the probe: 1.00 inside, or above 0.99):")
    for model, what, mean, low, high in rows:
        print(f"  {model:8s} {what:22s} {mean:.4f}  [{low:.4f}, {high:.4f}]")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
