"""Entry point of one rank: `python -m scalelab.run.worker --run-dir DIR` (torchrun starts it; so can a test).

The rank reads the run's config.json, trains, and writes its own files into the run directory:
steps.rank<r>.jsonl, system.rank<r>.jsonl and result.rank<r>.json. The parent process summarises them. With
several nodes rank 0 also gathers every rank's files at the end (nodes may not share a filesystem).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from scalelab.config import TrainConfig, default_threads, namespace_nodes
from scalelab.distenv import DistContext, dist_context, exit_without_teardown
from scalelab.engines import registry as engines
from scalelab.measure.clocks import estimate_in_run
from scalelab.measure.machine import RunCpu, local_rank_pids
from scalelab.measure.memory import (
    added_since, cap_address_space, cap_cuda_memory, freeze_alive, training_baseline)
from scalelab.measure.system import SystemSampler
from scalelab.store.rundir import RunDir
from scalelab.train import checkpoint
from scalelab.train.heartbeat import Heartbeat
from scalelab.train.loop import loss_and_correct, train
from scalelab.train.setup import build_inputs, build_optimizer


def run_rank(cfg: TrainConfig, run_dir: Path, ctx: DistContext, *, resume: bool = False,
             phases: dict[str, float] | None = None) -> dict:
    """Set up this rank, train (from the run's last checkpoint if `resume`), and write its result file. Always
    closes the sampler and the process group.

    `phases`: unix times the caller marked already (process start, imports done); this rank adds its set-up's
    (connected, clocks, inputs, trained) and stores them in its result (`phases(unix_s)`): where a short cell's
    fixed cost goes (benchmarks/cell_cost.py)."""
    phases = dict(phases or {})
    phases.setdefault("start", time.time())
    torch.set_num_threads(cfg.threads or default_threads(ctx.local_world, namespace_nodes(cfg)))
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    rundir = RunDir(run_dir)
    engine = engines.get(cfg.engine)
    # the first rank of each host also samples the whole machine, for noise detection (measure.machine)
    machine = (RunCpu(lambda: local_rank_pids(run_dir, siblings_only=engine.launcher == "torchrun"),
                      since=time.time()) if ctx.local_rank == 0 else None)
    sampler = SystemSampler(rundir.system_file(ctx.rank), cfg.sample_interval_s, rank=ctx.rank,
                            gpu_index=ctx.device.index if ctx.device.type == "cuda" else None,
                            machine=machine).start()
    heartbeat = (Heartbeat(run_dir, ctx.rank, interval_s=min(1.0, cfg.hang_timeout_s / 10)).start()
                 if cfg.hang_timeout_s > 0 else None)
    cuda_capped = False
    try:
        engine.connect(cfg, ctx)  # a process group (ddp), hvd.init() (horovod); nothing for one plain rank
        phases["connected"] = time.time()
        clocks = estimate_in_run(ctx.rank, ctx.world)  # before training: the ranks' clock offsets to rank 0
        if clocks is not None:
            rundir.write_clocks(clocks)
        phases["clocks"] = time.time()
        bundle, model = build_inputs(cfg)
        phases["inputs"] = time.time()
        if cfg.memory_limit and ctx.device.type == "cuda":
            cuda_capped = cap_cuda_memory(ctx.device, cfg.memory_limit) < 1.0
        if cfg.memory_limit and ctx.device.type == "cpu":
            warm_up(model, bundle.train, ctx.device, cfg)
            baseline = training_baseline()
            cap_address_space(baseline, cfg.memory_limit)
        else:
            baseline = training_baseline()
        ckpt = checkpoint.load(run_dir, ctx.rank, ctx.device) if resume else None
        result = train(cfg, ctx, bundle, model, run_dir, say=lambda s: print(s, flush=True), heartbeat=heartbeat,
                       resume=ckpt)
        phases["trained"] = time.time()
        result["memory"]["train_added(bytes)"] = added_since(baseline, ctx.device)
        result["phases(unix_s)"] = phases
        result["threads"] = torch.get_num_threads()  # what the rank ran with, as torch reports it
        rundir.write_result(ctx.rank, result)
        if cfg.nnodes > 1:
            sampler.stop()  # its file complete before it travels
            sampler = None
            gather_on_rank0(rundir, ctx)
        return result
    finally:
        if cuda_capped:  # a rank run in the caller's process leaves the caller's allocator as it found it
            torch.cuda.set_per_process_memory_fraction(1.0, ctx.device)
        if sampler:
            sampler.stop()
        if heartbeat:
            heartbeat.stop()
        engine.disconnect()


def gather_on_rank0(rundir: RunDir, ctx: DistContext) -> None:
    """Every rank's records into rank 0's run directory, through the process group: nodes need not share a
    filesystem (node-local scratch), and node 0 summarises the run from its own directory. Rank 0 writes only the
    files it lacks, so on a shared filesystem nothing changes. A collective: every rank calls it, once, at the end."""
    payloads: list | None = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object(rundir.rank_payload(ctx.rank), payloads, dst=0)
    if ctx.rank == 0:
        for payload in payloads[1:]:
            rundir.add_missing(payload)


def warm_up(model: torch.nn.Module, data, device: torch.device, cfg: TrainConfig) -> None:
    """One forward/backward on two samples and one optimizer step on a scratch parameter, so that what any step
    allocates whatever its batch (thread pools, autograd's engine, the optimizer's lazy imports: ~70 MB) is part
    of the baseline a memory cap is measured from."""

    warm_up_runtime(cfg)
    xs, ys = zip(*(data[i] for i in range(min(2, len(data)))))
    model.to(device).train()
    loss, _ = loss_and_correct(model(torch.stack(xs).to(device)), torch.stack(ys).to(device))
    loss.backward()
    model.zero_grad(set_to_none=True)


def warm_up_runtime(cfg: TrainConfig) -> None:
    """One forward/backward and optimizer step on a scratch parameter: torch's one-time allocations (thread pools,
    autograd's engine, the optimizer's lazy imports) made before a baseline is read."""
    scratch = torch.nn.Linear(1, 1)
    scratch(torch.ones(1, 1)).sum().backward()
    build_optimizer(scratch, cfg).step()


def _exit_on_sigterm(signum, _frame):
    # SystemExit unwinds through the finally blocks, so records and samples are flushed before the rank ends.
    sys.exit(128 + signum)


_WATCHING: list[int] = []  # the parent a watch thread of this process already follows (a warm rank runs many jobs)


def end_with_parent(poll_s: float = 1.0, grace_s: float = 10.0) -> None:
    """If the launching process dies without stopping us (kill -9 of scalelab, which hosts torchrun's agent),
    end this rank instead of training on as an orphan: SIGTERM ourselves (records flushed), then exit hard."""
    parent = os.getppid()
    if parent in _WATCHING:
        return
    _WATCHING.append(parent)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)  # still here: the main thread is blocked in C++ and cannot run the handler
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scalelab.run.worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    end_with_parent()
    cfg = TrainConfig.from_dict(RunDir(args.run_dir).read_config())
    # the process's start (before Python imported torch and scalelab) and this call: a cold rank's start-up
    phases = {"process": psutil.Process().create_time(), "start": time.time()}
    freeze_alive()  # as a warm rank does after its imports: no full collection rescans them mid-step
    run_rank(cfg, args.run_dir, dist_context(cfg.resolved_device), resume=args.resume, phases=phases)


if __name__ == "__main__":
    main()
    exit_without_teardown()  # done and recorded; a failed rank raised above and takes torchrun's error file
