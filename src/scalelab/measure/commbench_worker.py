"""One rank of the communication benchmark: `python -m scalelab.measure.commbench_worker --run-dir DIR`.

torchrun starts it; it reads the run's config.json, sweeps sizes × ops, and rank 0 gathers every rank's
loop and per-iteration times and correctness counts and writes timings.json, results.csv and results.json.
Per size and op: warm-up, a probe that fixes n (unless `iters` does; the same n on every rank), the
back-to-back loop of n calls, n calls timed one by one, then the check on the last one's result.

Inputs hold known values, small integers exact in every dtype: rank r's input is (r+1)·p with p[i] = 1 + i mod 7,
so a sum, a chunk from the wrong rank or a chunk at the wrong offset all show up as wrong elements.
SCALELAB_COMMBENCH_CORRUPT=op[,op] overwrites one result element of those ops on rank 0 before the check:
a test hook proving that the check catches a wrong element.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from scalelab.distenv import dist_context, exit_without_teardown
from scalelab.measure.memory import freeze_alive
from scalelab.measure.commbench import (
    DTYPES, PROBE_ITERS, CommBenchConfig, build_table, choose_iters, message_count)
from scalelab.store.rundir import RunDir

CORRUPT_ENV = "SCALELAB_COMMBENCH_CORRUPT"
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Newest API first; an API the backend refuses falls through to the next, and when none works the op is skipped.
IMPLS: dict[str, tuple[str, ...]] = {
    "allreduce": ("all_reduce",),
    "allgather": ("all_gather_single", "all_gather_into_tensor", "all_gather"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter"),
    "broadcast": ("broadcast",),
}


@dataclass
class Buffers:
    """An op's tensors: `inp` is reset from `pristine` and `out` refilled before every iteration."""

    pristine: torch.Tensor
    inp: torch.Tensor
    out: torch.Tensor  # the result (the same tensor as inp for in-place ops)

    def reset(self) -> None:
        self.inp.copy_(self.pristine)
        if self.out is not self.inp:
            self.out.fill_(-1)  # never an expected value: a result the collective did not write is wrong


def pattern(count: int, offset: int = 0) -> torch.Tensor:
    """p[i] = 1 + (offset + i) mod 7 in float64: small integers, exact in float16 and bfloat16 sums."""
    return 1.0 + torch.remainder(torch.arange(offset, offset + count, dtype=torch.float64), 7)


def make_buffers(op: str, count: int, rank: int, world: int, dtype: torch.dtype, device: torch.device) -> Buffers:
    """Tensors for one op; `count` is the element count of S, a multiple of world."""
    chunk = count // world
    if op == "allreduce":
        pristine = (rank + 1) * pattern(count)
        inp = torch.empty(count, dtype=dtype, device=device)
        return Buffers(pristine.to(device, dtype), inp, inp)
    if op == "broadcast":
        pristine = pattern(count) if rank == 0 else torch.full((count,), -1.0, dtype=torch.float64)
        inp = torch.empty(count, dtype=dtype, device=device)
        return Buffers(pristine.to(device, dtype), inp, inp)
    if op == "allgather":
        pristine = (rank + 1) * pattern(chunk)
        return Buffers(pristine.to(device, dtype), torch.empty(chunk, dtype=dtype, device=device),
                       torch.empty(count, dtype=dtype, device=device))
    if op == "reduce_scatter":
        pristine = (rank + 1) * pattern(count)
        return Buffers(pristine.to(device, dtype), torch.empty(count, dtype=dtype, device=device),
                       torch.empty(chunk, dtype=dtype, device=device))
    raise ValueError(f"op: {op!r}")


def expected(op: str, count: int, rank: int, world: int) -> torch.Tensor:
    """What this rank's result must hold, in float64."""
    chunk, total = count // world, world * (world + 1) / 2  # total = sum of (r+1) over ranks
    if op == "allreduce":
        return total * pattern(count)
    if op == "broadcast":
        return pattern(count)
    if op == "allgather":
        return torch.cat([(j + 1) * pattern(chunk) for j in range(world)])
    if op == "reduce_scatter":
        return total * pattern(chunk, offset=rank * chunk)
    raise ValueError(f"op: {op!r}")


def count_wrong(result: torch.Tensor, want: torch.Tensor, world: int) -> int:
    """Elements of `result` that differ from `want` by more than the dtype's rounding over `world` additions.

    NaN counts as wrong (isclose is False for it).
    """
    tol = torch.finfo(result.dtype).eps * world
    got = result.detach().to("cpu", torch.float64)
    return int((~torch.isclose(got, want, rtol=tol, atol=0.0)).sum())


def collective(impl: str, bufs: Buffers, world: int) -> Callable[[], None]:
    """A call of the named torch.distributed API on these buffers."""
    inp, out = bufs.inp, bufs.out
    if impl == "all_reduce":
        return lambda: dist.all_reduce(inp)
    if impl == "broadcast":
        return lambda: dist.broadcast(inp, src=0)
    if impl in ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor"):
        fn = getattr(dist, impl)
        return lambda: fn(out, inp)
    if impl == "all_gather":
        return lambda: dist.all_gather(list(out.chunk(world)), inp)  # chunks are views: results land in out
    if impl == "reduce_scatter":
        return lambda: dist.reduce_scatter(out, list(inp.chunk(world)))
    raise ValueError(f"impl: {impl!r}")


def first_supported(calls: list[tuple[str, Callable[[], None]]]) -> tuple[str | None, str | None]:
    """(name, None) of the first call that runs, or (None, reason) when every one raises."""
    reasons = []
    for name, call in calls:
        try:
            call()
            return name, None
        except (RuntimeError, NotImplementedError, ValueError, AttributeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            reasons.append(f"{name}: {first}")
    return None, "; ".join(reasons) or "no implementation"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a CPU-GPU sync point: the kernel is done before the clock is read


def time_iterations(call: Callable[[], None], bufs: Buffers, n: int, device: torch.device, *,
                    barrier: Callable[[], None] = dist.barrier, clock: Callable[[], float] = time.perf_counter,
                    ) -> list[float]:
    """Seconds of each of n calls on this rank; resets and the start barrier stay outside the timer."""
    times = []
    for _ in range(n):
        bufs.reset()
        _sync(device)
        barrier()  # every rank starts the iteration together
        t0 = clock()
        call()
        _sync(device)
        times.append(clock() - t0)
    return times


def time_loop(call: Callable[[], None], bufs: Buffers, n: int, device: torch.device, *,
              barrier: Callable[[], None] = dist.barrier, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of n back-to-back calls on this rank (nccl-tests' timing): one barrier before, one sync after.

    The buffers are reset once, not per call: the timed loop does nothing but the collectives (an in-place sum
    grows to inf over many calls, which costs the same; the check runs later, on reset buffers)."""
    bufs.reset()
    _sync(device)
    barrier()  # every rank starts the loop together
    t0 = clock()
    for _ in range(n):
        call()  # no sync here: on CUDA the calls queue on the stream, as in training
    _sync(device)  # the loop's only sync point: its last collective is done
    return clock() - t0


def agreed_iters(cfg: CommBenchConfig, call: Callable[[], None], bufs: Buffers, device: torch.device) -> int:
    """n for this size: cfg.iters when given, else choose_iters on the slowest rank's probe median, which the
    MAX all_reduce gives to every rank, so all of them run the same n (a collective with unequal counts hangs)."""
    if cfg.iters is not None:
        return cfg.iters
    probe = statistics.median(time_iterations(call, bufs, PROBE_ITERS, device))
    slowest = torch.tensor([probe], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return choose_iters(float(slowest.item()))


def run_sweep(cfg: CommBenchConfig, rank: int, world: int, device: torch.device,
              corrupt: frozenset[str] = frozenset()) -> list[dict]:
    """This rank's records for every op × size (see commbench.build_table)."""
    dtype, records = _TORCH_DTYPES[cfg.dtype], []
    for op in cfg.ops:
        impl, skipped = None, None
        for size in cfg.sizes:
            count = message_count(size, DTYPES[cfg.dtype], world)
            rec = {"op": op, "size(B)": count * DTYPES[cfg.dtype], "count": count, "rank": rank}
            if skipped:
                records.append({**rec, "skipped": skipped})
                continue
            bufs = make_buffers(op, count, rank, world, dtype, device)
            if impl is None:  # the first size probes which API the backend accepts
                bufs.reset()
                impl, skipped = first_supported([(name, collective(name, bufs, world)) for name in IMPLS[op]
                                                 if hasattr(dist, name)])
                if skipped:
                    records.append({**rec, "skipped": skipped})
                    continue
            call = collective(impl, bufs, world)
            time_iterations(call, bufs, cfg.warmup, device)
            n = agreed_iters(cfg, call, bufs, device)
            loop = time_loop(call, bufs, n, device)
            times = time_iterations(call, bufs, n, device)  # last: it leaves the result of one reset call
            if op in corrupt and rank == 0:
                bufs.out.view(-1)[0] = -7  # test hook: one element no check may accept
            wrong = count_wrong(bufs.out, expected(op, count, rank, world), world)
            records.append({**rec, "impl": impl, "times(s)": times, "loop(s)": loop, "wrong": wrong})
            del bufs
    return records


def write_results(run_dir: Path, records: list[dict], cfg: CommBenchConfig, world: int) -> None:
    """Rank 0: raw timings, then the table as CSV and JSON, each written atomically."""
    rundir = RunDir(run_dir)
    rundir.write_timings({"ranks": world, "records": records})
    table = build_table(records, world, cfg.dtype)
    clean = table.astype(object).where(table.notna(), None)  # NaN/NA → null: results.json stays valid JSON
    rundir.write_results_table(table.to_csv(index=False),
                               {"columns": list(table.columns), "rows": clean.to_dict("records")})


def run_rank(cfg: CommBenchConfig, run_dir: Path) -> None:
    ctx = dist_context(cfg.device)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    corrupt = frozenset(s.strip() for s in os.environ.get(CORRUPT_ENV, "").split(",") if s.strip())
    dist.init_process_group(cfg.backend, rank=ctx.rank, world_size=ctx.world,
                            device_id=ctx.device if ctx.device.type == "cuda" else None)
    try:
        records = run_sweep(cfg, ctx.rank, ctx.world, ctx.device, corrupt)
        gathered = [None] * ctx.world if ctx.is_main else None
        dist.gather_object(records, gathered, dst=0)
        if ctx.is_main:
            write_results(run_dir, [r for rank_records in gathered for r in rank_records], cfg, ctx.world)
    finally:
        dist.destroy_process_group()


def _exit_on_sigterm(signum, _frame):
    sys.exit(128 + signum)  # unwinds through finally: the process group is destroyed


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    freeze_alive()  # no full collection of the imports' objects inside a timed loop
    run_rank(CommBenchConfig.from_dict(RunDir(args.run_dir).read_config()), args.run_dir)


if __name__ == "__main__":
    main()
    exit_without_teardown()  # done and recorded, as a training rank
