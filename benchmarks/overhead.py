"""What does scalelab's measured loop cost? Its default loop against a bare DDP loop, in interleaved launch pairs.

Both sides train the same model on the same data (scalelab's `build_inputs`, so the same weights, dataset and
optimizer) with 2 gloo ranks and the same threads per rank. The bare loop is what a user writes: DataLoader with a
DistributedSampler, DDP, cross-entropy, backward, step; no timers, records, threads or hooks. A pair is one launch
of each, in alternating order, so machine drift hits both alike.

Each launch's rate is taken the same way on both sides, from rank 0's clock: the samples of the steps after the
warm-up over the time from the end of the warm-up's last step to the end of the last step. Everything the loop
does between those two instants counts (records, flushes, heartbeats, sampler threads, metering), which
scalelab's own stage-timed `throughput_no_data` would not see; that figure is printed beside it. On CUDA both
ends are where the device finished the step: the bare loop synchronises there; scalelab reads its CUDA events a
step late and records as `t_end(perf_s)` the host time at which the step's last event completed (never the
earlier moment the host finished queueing it), so neither side's stretch ends before its GPU work does.

Both sides load data with the same settings: those scalelab resolves for the device (CUDA: 2 workers and pinned
memory unless set; CPU: 0 workers, not pinned), and, where that has workers, again with both at 0 workers (pinned
as resolved), so that a ratio is the cost of measuring, not a better loader on one side.

A pair's ratio is scalelab's rate over the bare rate; the headline is the median ratio over the pairs, with a
95 % interval from a bootstrap over the pairs (the pairing kept). Goal: median >= 0.98, lower bound >= 0.95.

    python benchmarks/overhead.py [--models resnet18,bncnn] [--pairs 10]
    python benchmarks/overhead.py --device cuda --models resnet18 --pairs 3   # one rank on a GPU (GPU-CHECKS 2)
    python benchmarks/overhead.py --device cuda --loaders resolved   # only the resolved loader settings

Models: resnet18 (11.2 M parameters; batch 64, 40 steps) and bncnn, a small CNN with BatchNorm defined here
(~240 k parameters; batch 128, 100 steps, about 20 s a launch here, so that a run spans the loop's
periodic work). Per-feature costs: benchmarks/overhead_ablation.py.
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

# (global batch, steps, warm-up steps) per model and device
SHAPES = {("resnet18", "cpu"): (64, 40, 8), ("bncnn", "cpu"): (128, 100, 15),
          ("resnet18", "cuda"): (256, 60, 10), ("bncnn", "cuda"): (256, 200, 20)}
RANKS = {"cpu": 2, "cuda": 1}  # 2 gloo ranks on this machine's 2 cores; one rank on one GPU


def bn_cnn(spec):
    """Four Conv-BatchNorm-ReLU blocks (32, 64, 128, 128 channels, the last three stride 2), mean pool, Linear."""
    from torch import nn

    def block(c_in: int, c_out: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

    return nn.Sequential(block(spec.shape[0], 32, 1), block(32, 64, 2), block(64, 128, 2), block(128, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, spec.num_classes))


def train_config(model: str, device: str = "cpu", workers: int | None = None, pinned: bool | None = None):
    """scalelab's config of a launch; `workers`, `pinned` None: the loader settings it resolves for the device."""
    from scalelab.config import TrainConfig

    batch, steps, warmup = SHAPES[model, device]
    name = f"{__file__}:bn_cnn" if model == "bncnn" else model
    return TrainConfig(model=name, dataset="synthetic", samples=batch * steps, eval_samples=16, ranks=RANKS[device],
                       global_batch=batch, steps=steps, warmup_steps=warmup, eval_every=10**9, drop_last=True,
                       device=device, num_workers=workers, pin_memory=pinned)


def loader_settings(device: str, which: str) -> list[tuple[int, bool]]:
    """(workers, pinned) pairs to compare at: the resolved ones, then (unless `which` is "resolved", or they have no
    workers) 0 workers with the same pinning."""
    cfg = train_config("bncnn", device).resolved()
    out = [(cfg.num_workers, cfg.pin_memory)]
    if which == "both" and cfg.num_workers:
        out.append((0, cfg.pin_memory))
    return out


def rate_after_warmup(t_ends: list[float], warmup: int, global_batch: int) -> float:
    """Samples per second from the end of step `warmup` to the end of the last step (one clock, one rank)."""
    return (len(t_ends) - warmup) * global_batch / (t_ends[-1] - t_ends[warmup - 1])


def bare_worker(model_name: str, device: str, out: str, workers: int, pinned: bool) -> None:
    """One rank of the bare loop (on CUDA: the device is waited for at the end of the warm-up and of the last
    step, so that both ends of the timed stretch are the device's, as scalelab's step ends are)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from scalelab.config import default_threads
    from scalelab.train.setup import build_inputs, build_optimizer

    cfg = train_config(model_name, device, workers, pinned)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(default_threads(world))
    bundle, model = build_inputs(cfg)
    dev = torch.device(device)
    model = model.to(dev)
    net = DDP(model) if world > 1 else model
    opt = build_optimizer(model, cfg)
    sampler = DistributedSampler(bundle.train, world, rank, seed=cfg.seed)
    loader = DataLoader(bundle.train, batch_size=cfg.per_rank_batch, sampler=sampler, drop_last=True,
                        num_workers=workers, pin_memory=pinned and dev.type == "cuda")  # scalelab's settings
    t_ends = []
    for step in bare_steps(loader, net, opt, dev, pinned, cfg.steps, new_epoch=sampler.set_epoch):
        if dev.type == "cuda" and step in (cfg.warmup_steps - 1, cfg.steps - 1):
            torch.cuda.synchronize()
        t_ends.append(time.perf_counter())
    if rank == 0:
        Path(out).write_text(json.dumps({"t_end": t_ends}))
    dist.destroy_process_group()


def bare_steps(loader, net, opt, dev, pinned: bool, steps: int, new_epoch=lambda step: None):
    """The bare loop, what a user writes: batch, copy, forward, cross-entropy, backward, step; yields each step's
    index once its work is queued (`new_epoch(step)` before the loader starts over)."""
    import torch.nn.functional as F

    batches = iter(loader)
    for step in range(steps):
        try:
            x, y = next(batches)
        except StopIteration:
            new_epoch(step)
            batches = iter(loader)
            x, y = next(batches)
        x, y = x.to(dev, non_blocking=pinned), y.to(dev, non_blocking=pinned)
        F.cross_entropy(net(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        yield step


def launch(script: str, args: list[str], ranks: int = 2) -> None:
    """`script ARGS` as `ranks` ranks of one torchrun launch on this machine's loopback (the benchmarks' workers)."""
    from scalelab.config import default_threads
    from scalelab.run.launch import free_port, run_torchrun

    os.environ.setdefault("OMP_NUM_THREADS", str(default_threads(ranks)))
    run_torchrun(["--nnodes", "1", "--nproc-per-node", str(ranks), "--rdzv-backend", "static",
                  "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", script, *args])


def run_bare(model: str, device: str, tmp: Path, workers: int, pinned: bool) -> float:
    out = tmp / f"bare-{time.time_ns()}.json"
    launch(__file__, ["--bare-worker", model, "--device", device, "--out", str(out), "--workers", str(workers),
                      *(["--pinned"] if pinned else [])], RANKS[device])
    batch, _, warmup = SHAPES[model, device]
    return rate_after_warmup(json.loads(out.read_text())["t_end"], warmup, batch)


def run_scalelab(model: str, device: str, store, workers: int, pinned: bool) -> tuple[float, float]:
    """The same rate from rank 0's step records (their t_end: where the device finished each step), and scalelab's
    own throughput_no_data."""
    from scalelab.run.execute import execute
    from scalelab.store.rundir import RunDir

    outcome = execute(train_config(model, device, workers, pinned), store, say=lambda s: None)
    batch, _, warmup = SHAPES[model, device]
    t_ends = [r["t_end(perf_s)"] for r in RunDir(outcome.run_dir).read_steps(0)]
    return rate_after_warmup(t_ends, warmup, batch), outcome.summary["throughput_no_data(samples/s)"]


def median_interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """The median and its 95 % percentile-bootstrap interval (10,000 resamples); no interval (NaN) from fewer
    than 5 values, where a bootstrap's 95 % would be a fiction."""
    import numpy as np
    from scipy import stats

    if len(values) < 5:
        return statistics.median(values), float("nan"), float("nan")
    res = stats.bootstrap((np.asarray(values),), np.median, confidence_level=0.95, method="percentile",
                          n_resamples=10_000, random_state=np.random.default_rng(seed))
    return statistics.median(values), float(res.confidence_interval.low), float(res.confidence_interval.high)


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + sys) of this process and of its waited-for children (the launches' ranks and agents)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def compare(model: str, device: str, pairs: int, tmp: Path, store, workers: int, pinned: bool) -> dict:
    """Interleaved pairs at one loader setting. Beside each launch's rate: the CPU seconds the whole launch used
    (every process of it, set-up included) and what this process spent while it ran (scalelab's launcher runs in
    it), which other tenants inflate far less than the wall clock."""
    loader = f"{workers} worker{'s' if workers != 1 else ''}, {'pinned' if pinned else 'not pinned'}"
    ratios, own, cpu = [], [], []
    for i in range(pairs):
        got, used = {}, {}
        for side in (("scalelab", "bare") if i % 2 == 0 else ("bare", "scalelab")):
            before = cpu_seconds()
            if side == "bare":
                got["bare"] = run_bare(model, device, tmp, workers, pinned)
            else:
                got["scalelab"], got["own"] = run_scalelab(model, device, store, workers, pinned)
            after = cpu_seconds()
            used[side] = (after[0] - before[0], after[1] - before[1])
        ratios.append(got["scalelab"] / got["bare"])
        own.append(got["own"] / got["bare"])
        cpu.append({side: {"self_s": u[0], "children_s": u[1]} for side, u in used.items()})
        print(f"{model} [{loader}] pair {i + 1}/{pairs}: scalelab {got['scalelab']:7.1f}  bare {got['bare']:7.1f} samples/s  "
              f"ratio {ratios[-1]:.3f}  (scalelab's own throughput_no_data / bare: {own[-1]:.3f}); CPU s of the "
              f"launch: scalelab {used['scalelab'][1]:.1f} (+{used['scalelab'][0]:.1f} launcher), bare "
              f"{used['bare'][1]:.1f} (+{used['bare'][0]:.1f})", flush=True)
    med, low, high = median_interval(ratios)
    print(f"{model} [{loader}]: scalelab / bare over {pairs} pairs: median {med:.3f}, 95 % interval [{low:.3f}, {high:.3f}], "
          f"range {min(ratios):.3f}-{max(ratios):.3f}; goal median >= 0.98 and lower bound >= 0.95: "
          f"{'met' if med >= 0.98 and low >= 0.95 else 'NOT met'}", flush=True)
    return {"model": model, "device": device, "num_workers": workers, "pin_memory": pinned, "pairs": pairs,
            "ratios": ratios, "own_ratios": own, "cpu": cpu, "median": med, "low": low, "high": high}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,bncnn", help="comma-separated: resnet18, bncnn")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--device", default="cpu", choices=sorted(RANKS), help="cpu: 2 gloo ranks; cuda: one rank")
    p.add_argument("--loaders", default="both", choices=("both", "resolved"),
                   help="both: the resolved loader settings and, where they have workers, 0 workers; resolved: only them")
    p.add_argument("--loader", action="append", metavar="WORKERS,pinned|plain",
                   help="compare at these loader settings instead (repeatable), e.g. 2,pinned: for a tree whose "
                        "config cannot resolve them (a baseline from before the CUDA defaults)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--bare-worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--pinned", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.bare_worker:
        bare_worker(args.bare_worker, args.device, args.out, args.workers, args.pinned)
        return
    from scalelab.config import default_threads
    from scalelab.store import Store

    os.environ.setdefault("OMP_NUM_THREADS", str(default_threads(RANKS[args.device])))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        settings = ([(int(w), p == "pinned") for w, p in (x.split(",") for x in args.loader)] if args.loader
                    else loader_settings(args.device, args.loaders))
        for workers, pinned in settings:
            for model in args.models.split(","):
                results.append(compare(model, args.device, args.pairs, Path(tmp), store, workers, pinned))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
