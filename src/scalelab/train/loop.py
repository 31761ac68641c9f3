"""The one training loop: every rank runs it; every step is timed stage by stage.

Host syncs: on CUDA the StepTimer bounds stages with CUDA events, and a step's events are read when the next step
has ended (train.late): the wait for step k's last event comes after step k+1 is queued, so the device always has
work while the host waits. A step's record, its auto-length decision and its `t_end` (where the device finished
it) therefore arrive one step late; before an evaluation, a checkpoint and at the run's end the loop reads every
queued step (a wait), and an interrupted run polls the queued steps for a bounded time and drops, saying so, a step
the device has not finished. With `sync_stages` the device is synchronised at every stage boundary instead and
steps are read as they end, as on the CPU. Loss and accuracy stay on the device and are read only when records
are flushed or progress is printed, in one copy on a side stream, of steps that have ended (scalar_reader): no
read waits for the steps still queued. Evaluation runs after a step has ended: it is timed
on its own, never inside a step.
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from scalelab.config import TrainConfig
from scalelab.distenv import DistContext
from scalelab.measure.memory import peak_memory, reset_peak
from scalelab.measure.timer import CudaMarks, StepTimer
from scalelab.store.files import append_jsonl, read_jsonl, write_jsonl_atomic
from scalelab.store.rundir import RunDir
from scalelab.train import checkpoint
from scalelab.train.lr import lr_at, set_lr
from scalelab.train.memory import MemoryByKind
from scalelab.train.sampler import ShardedBatchSampler
from scalelab.train.setup import build_optimizer, wrap_model
from scalelab.train.heartbeat import Heartbeat
from scalelab.train.late import Ended, LateSteps
from scalelab.train.length import AGREE_EVERY, AutoLength, max_over_ranks

FLUSH_EVERY_S = 2.0  # how often step records reach disk (a killed run keeps what was flushed)
PROGRESS_EVERY_S = 2.0


@dataclass
class StepLog:
    """Per-rank step records, appended to `path` at each flush: a flush writes and holds only the records since the
    last one, so its cost does not grow with the run (a crash keeps every flushed line; store.files)."""

    path: Path
    pending: list[tuple[dict, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    last_flush: float = field(default_factory=time.monotonic)
    flushed_bytes: int = 0  # of the last flush: what it cost on disk

    def restart_at(self, step: int) -> None:
        """Keep the records up to `step`, rewritten once: none for a fresh run (step 0), those up to the checkpoint
        for a resumed one (later steps run again)."""
        if self.path.exists():
            write_jsonl_atomic(self.path, [r for r in read_jsonl(self.path) if r["step"] <= step])

    def add(self, record: dict, loss: torch.Tensor, correct: torch.Tensor) -> None:
        self.pending.append((record, loss, correct))

    def flush(self, read: Callable[[list[torch.Tensor]], list[float]] | None = None) -> None:
        """Write the pending records with their loss and accuracy, read in one copy (`read`: scalar_reader's)."""
        read = read or scalar_reader(torch.device("cpu"))
        values = read([t for _, loss, correct in self.pending for t in (loss, correct)])
        for (record, _, _), loss, correct in zip(self.pending, values[0::2], values[1::2]):
            record["loss"] = loss
            record["acc"] = correct / max(1, record["targets"])
        self.flushed_bytes = append_jsonl(self.path, [r for r, _, _ in self.pending])
        self.pending.clear()
        self.last_flush = time.monotonic()

    def maybe_flush(self, read: Callable[[list[torch.Tensor]], list[float]] | None = None) -> None:
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush(read)


def loss_and_correct(logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and the number of correct predictions (classes or next tokens)."""
    flat = logits.reshape(-1, logits.shape[-1])
    target = y.reshape(-1)
    loss = F.cross_entropy(flat.float(), target)
    return loss, (flat.argmax(-1) == target).sum()


def autocast_for(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, cfg: TrainConfig, ctx: DistContext,
             heartbeat: Heartbeat | None = None) -> dict[str, float]:
    """Loss and accuracy on the whole eval set; ranks evaluate disjoint shards and sum their counts."""
    was_training = model.training
    model.eval()
    idx = list(range(ctx.rank, len(data), ctx.world))
    batch = max(1, cfg.per_rank_batch * 2)
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, targets
    for start in range(0, len(idx), batch):
        xs, ys = zip(*(data[i] for i in idx[start:start + batch]))
        x, y = torch.stack(xs).to(ctx.device), torch.stack(ys).to(ctx.device)
        with autocast_for(cfg, ctx.device):
            logits = model(x)
        loss, correct = loss_and_correct(logits, y)
        totals += torch.tensor([loss.item() * y.numel(), correct.item(), y.numel()], dtype=torch.float64)
        if heartbeat:  # a long evaluation is progress, not a hang
            heartbeat.enter("eval")
    if ctx.world > 1 and dist.is_initialized():
        dist.all_reduce(totals)  # one collective per evaluation, outside the timed training stages
    model.train(was_training)
    loss_sum, correct, n = totals.tolist()
    return {"loss": loss_sum / max(1, n), "acc": correct / max(1, n), "targets": int(n)}


def make_loader(data: Dataset, cfg: TrainConfig, ctx: DistContext) -> tuple[DataLoader, ShardedBatchSampler]:
    sampler = ShardedBatchSampler(len(data), cfg.global_batch, rank=ctx.rank, world=ctx.world,
                                  seed=cfg.seed, drop_last=cfg.drop_last)
    extra = {}
    workers = cfg.resolved_num_workers  # unset: the device's default (config.TrainConfig.resolved)
    if workers > 0:
        # Workers are started anew each epoch (not persistent) so they see the dataset's epoch for augmentation;
        # their start-up lands in the first step's data wait, as in a plain PyTorch loop.
        extra = {"prefetch_factor": cfg.prefetch_factor or 2}
        # more workers than cores is a setting the loader sweep measures on purpose (its table has the cores);
        # torch's warning of it, two lines of 300 characters per epoch and rank, filled a study's terminal
        warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=workers,
                        pin_memory=cfg.resolved_pin_memory and ctx.device.type == "cuda", **extra)
    return loader, sampler


def micro_batches(x: torch.Tensor, y: torch.Tensor, k: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Split a rank's batch into up to `k` micro-batches with loss weights (share of the samples), so the
    accumulated gradient is the batch mean even when the last batch of an epoch does not split evenly."""
    if k == 1:
        return [(x, y, 1.0)]
    n = x.shape[0]
    return [(xm, ym, xm.shape[0] / n) for xm, ym in zip(x.tensor_split(k), y.tensor_split(k)) if xm.shape[0]]


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """`steps`, when a number, wins over `epochs` (a run may then span a fraction of an epoch or several); with
    `steps: auto` the epochs are the most a run takes (scalelab.train.length stops it earlier)."""
    return cfg.steps if isinstance(cfg.steps, int) else cfg.epochs * steps_per_epoch


def auto_length(cfg: TrainConfig, ctx: DistContext) -> AutoLength | None:
    """The stop rule of a `steps: auto` run (None for a fixed length); ranks agree every AGREE_EVERY timed steps."""
    if not cfg.auto_length:
        return None
    several = ctx.world > 1 and dist.is_initialized()
    return AutoLength(cfg.target_precision, cfg.time_budget_s, cfg.min_timed_steps,
                      reduce=max_over_ranks(ctx.device) if several else None, every=AGREE_EVERY if several else 1)


def step_timer(cfg: TrainConfig, device: torch.device, clock: Callable[[], float],
               heartbeat: Heartbeat | None, marks=None) -> StepTimer:
    """Host clock on the CPU; CUDA events on CUDA, or a device-wide sync at every boundary with `sync_stages`.
    `marks`: device marks to use instead (tests give CUDA-event-shaped fakes on the CPU)."""
    on_enter = heartbeat.enter if heartbeat else None
    if marks is not None:
        return StepTimer(clock, on_enter=on_enter, marks=marks)
    if device.type != "cuda":
        return StepTimer(clock, on_enter=on_enter)
    if cfg.sync_stages:
        return StepTimer(clock, sync=lambda: torch.cuda.synchronize(device), on_enter=on_enter)
    return StepTimer(clock, on_enter=on_enter, marks=CudaMarks(device))


def after_step_flags(cfg: TrainConfig, step: int, n_steps: int, last_of_epoch: bool) -> tuple[bool, bool]:
    """(evaluate after this step, checkpoint after it)."""
    last_of_epoch = last_of_epoch or step == n_steps
    due = (cfg.eval_every and step % cfg.eval_every == 0) or (last_of_epoch and (not cfg.eval_every or step == n_steps))
    return bool(due), bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < n_steps)


def end_times(t_end: float, lag: int, clock: Callable[[], float]) -> dict[str, float]:
    """A step record's end on both clocks (collectives use perf_counter). A step read as it ends (lag 0): now. A
    step read late: `t_end`, where its last event completed (measure.timer), on the timer's clock, and the wall
    clock's time that was that long ago."""
    if not lag:
        return {"t_end(unix_s)": time.time(), "t_end(perf_s)": time.perf_counter()}
    return {"t_end(unix_s)": time.time() - (clock() - t_end), "t_end(perf_s)": t_end}


def scalar_reader(device: torch.device) -> Callable[[list[torch.Tensor]], list[float]]:
    """Reads finished steps' scalars (losses, counts) in one device-to-host copy. On CUDA the copy runs on a side
    stream: the steps it reads have ended on the device (their events were waited for), and on the main stream it
    would queue behind the steps still running there, a wait for the whole queue at every flush (and, on an
    interruption, on a device that may hang). float64 holds a float32 loss and a count exactly. On the CPU each
    scalar's `.item()` is a plain read, cheaper than building one tensor of them."""
    if device.type != "cuda":
        return lambda tensors: [t.item() for t in tensors]

    def stacked(tensors: list[torch.Tensor]) -> list[float]:
        return torch.stack([t.detach().reshape(()).double() for t in tensors]).tolist() if tensors else []

    stream = torch.cuda.Stream(device)

    def read(tensors: list[torch.Tensor]) -> list[float]:
        with torch.cuda.stream(stream):
            return stacked(tensors)  # .tolist() copies to the host and waits for this stream alone

    return read


def train(cfg: TrainConfig, ctx: DistContext, bundle, model: torch.nn.Module, run_dir: Path,
          *, clock: Callable[[], float] = time.perf_counter, say: Callable[[str], None] = print,
          heartbeat: Heartbeat | None = None, resume: checkpoint.Checkpoint | None = None, marks=None) -> dict:
    """Train `model` on `bundle` under `cfg`; write per-step records; return this rank's result.
    With `resume`, continue from that checkpoint: its weights, optimizer, RNG, step and records so far.
    `marks`: the step timer's device marks (tests: CUDA-event-shaped fakes, to drive the late reading on the CPU)."""
    device = ctx.device
    model = model.to(device)
    net, sync = wrap_model(model, cfg, ctx)  # sync is None without a process group
    optimizer = build_optimizer(model, cfg)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
    loader, sampler = make_loader(bundle.train, cfg, ctx)
    steps_per_epoch = len(sampler)
    n_steps = total_steps(cfg, steps_per_epoch)
    epochs = math.ceil(n_steps / steps_per_epoch)
    timer = step_timer(cfg, device, clock, heartbeat, marks)
    length = auto_length(cfg, ctx)
    # the blocking wait of the sync starts when the step's last gradient is produced, whatever the strategy
    ready_hooks = [p.register_post_accumulate_grad_hook(lambda _p: timer.ready())
                   for p in model.parameters() if p.requires_grad] if sync else []
    log = StepLog(RunDir(run_dir).steps_file(ctx.rank))
    evals: list[dict] = []
    step = 0
    if resume:
        checkpoint.restore(resume, model, optimizer, scaler)
        step, evals = resume.step, list(resume.state["evals"])
    log.restart_at(step)  # a fresh run keeps no old records; a resumed one those up to its checkpoint
    if sync:  # after a resume's restore: an engine may wrap or broadcast the optimizer's state (Horovod)
        sync.attach_optimizer(optimizer)
    memory = MemoryByKind(model, optimizer, device, net=net)
    pinned = cfg.resolved_pin_memory
    late = LateSteps(lag=1 if timer.deferred else 0)  # CUDA events are read one step late: no wait at a step's end
    read = scalar_reader(device)

    def read_step(e: Ended, feed: bool = True) -> tuple[dict, Ended]:
        """An ended step's record (its times read now), fed to the auto-length rule unless `feed` is False."""
        nonlocal n_steps
        times, t_end = e.timer.read()
        if feed and length and not e.warmup and length.after_step(times["wall"]):  # outside the timed spans
            n_steps = step  # every rank stops here: they read the same steps at the same points (train.late)
        record = {**e.record, **{f"{k}(s)": v for k, v in times.items()}, **end_times(t_end, late.lag, clock)}
        if e.comm is not None:
            record.update(e.comm.read())
        return record, e

    reset_peak(device)
    t_start, last_progress, first_step = time.monotonic(), time.monotonic(), step
    net.train()
    try:
        for epoch in range(step // steps_per_epoch, epochs):
            if step >= n_steps:  # an auto-length run that stopped at the end of the previous epoch
                break
            skip = step - epoch * steps_per_epoch  # > 0 only in the epoch a resumed run starts in
            sampler.set_epoch(epoch, skip)  # a new permutation every epoch, the same on every rank
            if hasattr(bundle.train, "set_epoch"):  # per-epoch augmentation; reaches workers started below
                bundle.train.set_epoch(epoch)
            batches = iter(loader)
            for i in range(skip, steps_per_epoch):
                if step >= n_steps:
                    break
                timer.start_step()
                with timer.span("data"):
                    x, y = next(batches)
                with timer.span("h2d"):
                    x = x.to(device, non_blocking=pinned)
                    y = y.to(device, non_blocking=pinned)
                micro = micro_batches(x, y, cfg.accumulate)
                for j, (xm, ym, weight) in enumerate(micro):
                    # no gradient sync on the first K-1 micro-steps: the forward must be inside for DDP's no_sync
                    with (sync.micro_step(last=j == len(micro) - 1) if sync else nullcontext(),
                          memory.probe() if step == first_step and j == 0 else nullcontext()):
                        with timer.span("forward"):
                            with autocast_for(cfg, device):
                                logits = net(xm)
                            loss_m, correct_m = loss_and_correct(logits, ym)
                            if weight != 1.0:
                                loss_m = loss_m * weight
                        with timer.span("backward"):
                            (scaler.scale(loss_m) if scaler else loss_m).backward()
                    if j == 0:
                        loss, correct = loss_m.detach(), correct_m
                    else:
                        loss, correct = loss + loss_m.detach(), correct + correct_m
                if sync:
                    with timer.span("comm"):
                        sync.after_backward()
                if step == first_step:  # the gradients as the optimizer gets them, before zero_grad frees them
                    memory.read_gradients()
                with timer.span("optimizer"):
                    lr = lr_at(step, rule=cfg.lr_rule, base_lr=cfg.lr, base_batch=cfg.base_batch or cfg.global_batch,
                               batch=cfg.global_batch, warmup=cfg.lr_warmup_steps)
                    set_lr(optimizer, lr)
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                step += 1
                if heartbeat:
                    heartbeat.step = step
                warmup = step <= first_step + cfg.warmup_steps
                late.push(Ended(step, warmup, {"step": step, "epoch": epoch, "rank": ctx.rank, "warmup": warmup,
                                               "lr": lr, "samples": int(x.shape[0]), "targets": int(y.numel())},
                                timer.close_step(), sync.meter.close_step() if sync else None,
                                loss.detach(), correct.detach()))
                done = [read_step(e) for e in late.due()]  # this step on the CPU, the one before it on CUDA
                due, checkpointed = after_step_flags(cfg, step, n_steps, i == steps_per_epoch - 1)
                if late and (due or checkpointed or step == n_steps):
                    # evaluation, a checkpoint and the run's end come after this step has finished on the device:
                    # read it now (a wait), so that neither their timing nor the records wait for it
                    done += [read_step(e) for e in late.all()]
                    due, checkpointed = after_step_flags(cfg, step, n_steps, i == steps_per_epoch - 1)
                if due:  # after the step's end: evaluation is not a training stage (its record was read above)
                    began = time.perf_counter()
                    result = evaluate(model, bundle.eval, cfg, ctx, heartbeat)
                    done[-1][0]["evaluation(s)"] = time.perf_counter() - began
                    evals.append({"step": step, "epoch": epoch, **result})
                if checkpointed:
                    # outside the step's timed wall: checkpointing is not a training stage
                    if heartbeat:
                        heartbeat.enter("checkpoint")
                    began = time.perf_counter()
                    checkpoint.save(run_dir, rank=ctx.rank, step=step, epoch=epoch, model=model,
                                    optimizer=optimizer, scaler=scaler, evals=evals)
                    done[-1][0]["checkpoint(s)"] = time.perf_counter() - began
                for record, e in done:
                    log.add(record, e.loss, e.correct)
                if checkpointed:
                    log.flush(read)  # the records on disk reach at least the checkpoint
                else:
                    log.maybe_flush(read)
                if ctx.is_main and done and time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                    last_progress = time.monotonic()
                    rate = (step - first_step) * cfg.global_batch / (last_progress - t_start)
                    shown = done[-1][1]  # the last step read: ended on the device, so reading it waits for nothing
                    say(f"epoch {epoch + 1}/{epochs} step {shown.step}/{n_steps} loss {read([shown.loss])[0]:.4f} "
                        f"{rate:,.0f} samples/s")
    finally:
        dropped = []
        if late:  # an interrupt (or an error) left steps unread: poll their events, never wait on the device
            try:
                finished, dropped = late.finish_within()
                for e in finished:
                    log.add(read_step(e, feed=False)[0], e.loss, e.correct)
            except Exception:  # noqa: BLE001 - a failing device: the exception in flight is the one to report
                dropped = dropped or late.all()
            if dropped:
                say(f"rank {ctx.rank}: step{'s' if len(dropped) > 1 else ''} "
                    f"{', '.join(str(e.step) for e in dropped)} not recorded: the device had not finished "
                    f"{'them' if len(dropped) > 1 else 'it'} within {late.bound_s:g} s of the interruption")
        log.flush(read)
        for handle in ready_hooks:
            handle.remove()
        if sync:
            sync.close()
    return {
        "rank": ctx.rank,
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "epochs": epochs,
        "evals": evals,
        "memory": {**peak_memory(device), **memory.result()},
        "train_samples": len(bundle.train),
        **({"length": length.result()} if length else {}),
    }
