"""What each of scalelab's measurements costs, switched off and on in alternating blocks within one launch.

One launch of 2 gloo ranks trains a model (benchmarks/overhead.py's shapes) in a loop built from scalelab's own
parts, as `train.loop.train` and `run.worker.run_rank` use them:
- stages: the StepTimer's spans around data, h2d, forward, backward, comm and optimizer, and the per-parameter
  hooks that mark the last gradient (the blocking wait);
- records: each step's record (stage times, lr, sizes, collective totals) added to the StepLog, flushed every
  FLUSH_EVERY_S;
- heartbeat: the hang watchdog's thread, told every stage boundary;
- sampling: the system sampler's thread, with the machine-wide /proc readings of noise detection on local rank 0;
- metering: the CommMeter behind scalelab's DDP comm hook and buffer broadcast (off: the hook passes the future
  through, nothing is timed or recorded).
For each feature in turn, blocks of `k` steps alternate with the feature on and off, every other feature on, the
order flipped every round. Launch-to-launch noise cancels: a round's cost is (mean step time on) / (mean step time
off) - 1 from neighbouring blocks of one launch. Blocks are timed on rank 0 from the start of their first step to
the end of their last; the threads are started and stopped between blocks, outside them. On a shared machine the
wall clock of neighbouring seconds still varies by several per cent, so each block also reads rank 0's CPU time
(every thread of the process): a feature's CPU cost is (CPU seconds per step on - off) / (wall seconds per step
off), the share of a step its work takes, which other tenants do not inflate (it does not see waits, such as a
fsync on the main thread, which the wall cost does). Printed: the median of each over the rounds with a 95 %
bootstrap interval.

    python benchmarks/overhead_ablation.py [--model bncnn] [--rounds 12] [--block-s 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from overhead import SHAPES, launch, median_interval, train_config  # noqa: E402

FEATURES = ("stages", "records", "heartbeat", "sampling", "metering")


class NullTimer:
    """The stage timer switched off: no clock reads, no spans."""

    def start_step(self) -> None:
        pass

    def span(self, name: str):
        return nullcontext()

    def ready(self) -> None:
        pass

    def end_step(self) -> dict[str, float]:
        return {}


class Loop:
    """scalelab's step with each measurement switchable between steps."""

    def __init__(self, model_name: str, run_dir: Path):
        import torch
        import torch.distributed as dist

        from scalelab.config import default_threads
        from scalelab.distenv import dist_context
        from scalelab.train.loop import StepLog, make_loader
        from scalelab.train.setup import build_inputs, build_optimizer, wrap_model

        self.cfg = train_config(model_name)
        dist.init_process_group("gloo")
        self.ctx = dist_context(self.cfg.resolved_device)
        torch.set_num_threads(default_threads(self.ctx.world))
        self.run_dir = run_dir
        bundle, self.model = build_inputs(self.cfg)
        self.net, self.sync = wrap_model(self.model, self.cfg, self.ctx)
        self.meter = self.sync.meter
        self.opt = build_optimizer(self.model, self.cfg)
        self.loader, self.sampler = make_loader(bundle.train, self.cfg, self.ctx)
        self.batches, self.epoch = iter(self.loader), 0
        self.log = StepLog(run_dir / f"steps.rank{self.ctx.rank}.jsonl")
        self.on = dict.fromkeys(FEATURES, True)
        self.heartbeat = self.system = None
        self.hooks: list = []
        self.step = 0
        self.timer = NullTimer()
        # direct work while on: CPU seconds of the threads (their own thread clocks), main-thread seconds of the
        # records, and the wall seconds each feature was on
        self.work = dict.fromkeys(FEATURES, 0.0)
        self.collectives = 0  # per step, as the meter counts them (DDP's buckets and its buffer broadcast)
        self.on_s = dict.fromkeys(FEATURES, 0.0)
        self.apply()

    # ------------------------------------------------------------ switching (between blocks)
    def apply(self) -> None:
        """Start or stop each feature's parts to match `self.on`."""
        from scalelab.measure.machine import RunCpu, local_rank_pids
        from scalelab.measure.system import SystemSampler
        from scalelab.measure.timer import StepTimer
        from scalelab.train.heartbeat import Heartbeat

        on = self.on
        if on["heartbeat"] and self.heartbeat is None:
            self.heartbeat = Heartbeat(self.run_dir, self.ctx.rank, interval_s=1.0).start()
        elif not on["heartbeat"] and self.heartbeat is not None:
            self.work["heartbeat"] += self.heartbeat.cpu_s
            self.heartbeat.stop()
            self.heartbeat = None
        if on["sampling"] and self.system is None:
            machine = (RunCpu(lambda: local_rank_pids(self.run_dir), since=time.time())
                       if self.ctx.local_rank == 0 else None)
            self.system = SystemSampler(self.run_dir / f"system.rank{self.ctx.rank}.jsonl",
                                        self.cfg.sample_interval_s, rank=self.ctx.rank, machine=machine).start()
        elif not on["sampling"] and self.system is not None:
            self.work["sampling"] += self.system.cpu_s
            self.system.stop()
            self.system = None
        if on["stages"]:
            self.timer = StepTimer(on_enter=self.heartbeat.enter if self.heartbeat else None)
            if not self.hooks:
                self.hooks = [p.register_post_accumulate_grad_hook(lambda _p: self.timer.ready())
                              for p in self.model.parameters() if p.requires_grad]
        else:
            self.timer = NullTimer()
            for h in self.hooks:
                h.remove()
            self.hooks = []
        meter = self.meter
        if on["metering"]:
            for name in ("track", "collective"):
                meter.__dict__.pop(name, None)
        else:  # the hook's future passes through; a synchronous collective runs untimed
            meter.track = lambda fut, *a, **k: fut
            meter.collective = lambda *a, **k: nullcontext()
        self.meter.take_step()  # nothing carries across a switch

    def close(self) -> None:
        self.on = dict.fromkeys(FEATURES, False)
        self.apply()
        self.log.flush()

    # ------------------------------------------------------------ one step, as train.loop.train runs it
    def run_step(self) -> None:
        from scalelab.train.loop import loss_and_correct
        from scalelab.train.lr import lr_at, set_lr

        cfg, timer, on = self.cfg, self.timer, self.on
        timer.start_step()
        with timer.span("data"):
            try:
                x, y = next(self.batches)
            except StopIteration:
                self.epoch += 1
                self.sampler.set_epoch(self.epoch)
                self.batches = iter(self.loader)
                x, y = next(self.batches)
        with timer.span("h2d"):
            x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        with timer.span("forward"):
            loss, correct = loss_and_correct(self.net(x), y)
        with timer.span("backward"):
            loss.backward()
        with timer.span("comm"):
            self.sync.after_backward()
        with timer.span("optimizer"):
            lr = lr_at(self.step, rule=cfg.lr_rule, base_lr=cfg.lr, base_batch=cfg.base_batch or cfg.global_batch,
                       batch=cfg.global_batch, warmup=cfg.lr_warmup_steps)
            set_lr(self.opt, lr)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self.step += 1
        if self.heartbeat:
            self.heartbeat.step = self.step
        times = timer.end_step()
        comm = self.meter.take_step() if on["metering"] else {}
        self.collectives = comm.get("collectives", self.collectives)
        if on["records"]:
            began = time.perf_counter()
            record = {"step": self.step, "epoch": self.epoch, "rank": self.ctx.rank, "warmup": False, "lr": lr,
                      "samples": int(x.shape[0]), "targets": int(y.numel()),
                      **{f"{k}(s)": v for k, v in times.items()}, "t_end(unix_s)": time.time(),
                      "t_end(perf_s)": time.perf_counter(), **comm}
            self.log.add(record, loss.detach(), correct.detach())
            self.log.maybe_flush()
            self.work["records"] += time.perf_counter() - began


def main_thread_costs(loop: Loop, blocks: list, steps: int = 2000) -> dict[str, float]:
    """The stage timer's and the meter's own work per step, timed alone in a tight loop on this rank, as a share
    of the median step: the timer's spans and one `ready` per parameter; the meter's hook wrapping (`track` on a
    completed future, its callback's record) per DDP bucket, and `take_step`."""
    import statistics

    import torch

    from scalelab.measure.timer import StepTimer
    from scalelab.sync.meter import CommMeter

    step_s = statistics.median(b[3] for b in blocks)
    n_params = sum(1 for p in loop.model.parameters() if p.requires_grad)
    timer = StepTimer()
    began = time.perf_counter()
    for _ in range(steps):
        timer.start_step()
        for name in ("data", "h2d", "forward", "backward", "comm", "optimizer"):
            with timer.span(name):
                pass
        for _ in range(n_params):
            timer.ready()
        timer.end_step()
    stages = (time.perf_counter() - began) / steps
    buckets = max(1, loop.collectives)  # as the meter counted them in the last metered step
    meter = CommMeter(loop.ctx.world)
    began = time.perf_counter()
    for _ in range(steps):
        for _ in range(buckets):
            fut = torch.futures.Future()
            fut.set_result(None)
            meter.track(fut, "allreduce", 4 * 2**20, phase="backward", start=meter.now()).wait()
        meter.take_step()
    metering = (time.perf_counter() - began) / steps
    return {"stages": stages / step_s, "metering": metering / step_s}


def ablation_worker(model_name: str, rounds: int, block_s: float, out: str) -> None:
    import torch.distributed as dist

    run_dir = Path(out).parent / f"rank-files-{Path(out).stem}"
    run_dir.mkdir(parents=True, exist_ok=True)
    loop = Loop(model_name, run_dir)
    _, _, warmup = SHAPES[model_name, "cpu"]
    for _ in range(warmup):
        loop.run_step()
    # block length in steps from the warm-up's step time, agreed by both ranks (rank 0's)
    began = time.perf_counter()
    for _ in range(5):
        loop.run_step()
    k = [max(5, round(block_s / ((time.perf_counter() - began) / 5)))]
    dist.broadcast_object_list(k, src=0)
    k = k[0]
    blocks = []  # (feature, round, on, wall seconds per step, CPU seconds per step)
    for feature in FEATURES:
        for r in range(rounds):
            for state in ((True, False) if r % 2 == 0 else (False, True)):
                loop.on = {**dict.fromkeys(FEATURES, True), feature: state}
                loop.apply()
                dist.barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(k):
                    loop.run_step()
                wall = time.perf_counter() - t0
                blocks.append((feature, r, state, wall / k, (time.process_time() - c0) / k))
                for f, f_on in loop.on.items():
                    loop.on_s[f] += wall if f_on else 0.0
    loop.close()
    direct = {f: loop.work[f] / loop.on_s[f] for f in ("records", "heartbeat", "sampling")}
    direct.update(main_thread_costs(loop, blocks))
    if loop.ctx.rank == 0:
        Path(out).write_text(json.dumps({"k": k, "blocks": blocks, "direct": direct}))
    dist.destroy_process_group()


def costs(blocks: list, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each feature's cost per round: wall on / off - 1, and (CPU on - CPU off) / wall off."""
    by = {(f, r, on): (wall, cpu) for f, r, on, wall, cpu in blocks}
    return {f: {"wall": [by[(f, r, True)][0] / by[(f, r, False)][0] - 1 for r in range(rounds)],
                "cpu": [(by[(f, r, True)][1] - by[(f, r, False)][1]) / by[(f, r, False)][0] for r in range(rounds)]}
            for f in FEATURES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bncnn", choices=sorted(SHAPES))
    p.add_argument("--rounds", type=int, default=12, help="on/off block pairs per feature (>= 5 for an interval)")
    p.add_argument("--block-s", type=float, default=2.0, help="seconds per block (at least the 2 s flush period)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        ablation_worker(args.model, args.rounds, args.block_s, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ablation.json"
        launch(__file__, ["--worker", "--model", args.model, "--rounds", str(args.rounds), "--block-s",
                          str(args.block_s), "--out", str(out)])
        result = json.loads(out.read_text())
    per_feature = costs(result["blocks"], args.rounds)
    print(f"{args.model}: blocks of {result['k']} steps, {args.rounds} on/off rounds per feature")
    print(f"{'feature':10s} {'clock':5s} {'median cost':>12s} {'95 % interval':>20s} {'range':>20s}")
    summary = {}
    for feature, by_clock in per_feature.items():
        for clock, values in by_clock.items():
            med, low, high = median_interval(values)
            summary[f"{feature}/{clock}"] = {"costs": values, "median": med, "low": low, "high": high}
            print(f"{feature:10s} {clock:5s} {100 * med:+11.2f}% {f'[{100 * low:+.2f}, {100 * high:+.2f}] %':>20s} "
                  f"{f'{100 * min(values):+.2f} .. {100 * max(values):+.2f} %':>20s}")
    print("direct work of each measurement, as a share of a step (rank 0; threads by their own CPU clocks, the "
          "records by the main thread's clock, stages and metering timed alone):")
    for feature in FEATURES:
        print(f"{feature:10s} {100 * result['direct'][feature]:8.3f} %")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "k": result["k"], **summary,
                                         "direct": result["direct"]}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
