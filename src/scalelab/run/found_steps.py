"""The steps of a script that does not mark them, found by the probe (scalelab.run.probe) at its DDP model.

A script run under `scalelab run` without a line of scalelab still has steps: scalelab finds their boundaries from
what the intercept (scalelab.sync.intercept) sees. The boundary (`steps/boundary` in the summary):

- ddp_forward (chosen whenever a DistributedDataParallel model runs a training forward): the first DDP model to
  run a forward with `model.training` and grad enabled is the one whose forwards make the steps. A step begins at
  such a forward when the previous one synced gradients (DDP's `require_backward_grad_sync`): forwards inside
  `no_sync()` are micro-batches of the step they open, so accumulation over k micro-batches is one step per
  optimizer update. Evaluation forwards (`model.eval()`, `torch.no_grad()`) are no step, and the time up to the end
  of the last one lies between steps. Why this signal: DDP runs exactly one synced forward per update whatever the
  script does with its optimizer: a GradScaler that skips `optimizer.step()` on an overflow, two `step()` calls per
  iteration (two optimizers, a closure), no optimizer at all; and its first input carries the batch.
  `optimizer.step` was the alternative: a skipped step merges two iterations into one, a second `step()` splits
  one (or needs a rule to join them), and it sees no batch. The pattern of the gradient collectives was the other:
  it needs every collective of a step before knowing the step ended, and bucket counts vary.
- optimizer_step (no DDP model ran a training forward: Horovod's DistributedOptimizer, a script calling
  torch.distributed itself): a step ends when `Optimizer.step` returns; a `step()` with no collective since the
  previous one (a second optimizer in the same iteration) joins the step before it; a GradScaler's skipped step
  merges two iterations into one.
- none: neither was seen (the run keeps its wall time and collectives only).

Step k runs from the end of step k-1 to the end of its last `optimizer.step()` (a step whose update was skipped
ends at the next step's forward), as scalelab's own steps run from the request for a batch to the end of the
update. Its stages (the names of scalelab.measure.timer's steps, so summary, trace and analysis read them alike):
  data             = the previous step's end -> its first forward (the wait for the batch, zero_grad, the loop),
  forward_backward = the first forward -> the first optimizer.step (backward runs inside `loss.backward()`,
                     which scalelab does not see: it cannot be split from the forward; the gradient collectives
                     are inside it, in the step's record with their waiting and critical parts),
  optimizer        = the optimizer.step calls, summed; other = the rest.
The batch is the first input's leading dimension at each forward of the step, summed over micro-batches.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from scalelab.measure.timer import TIMED_STAGES, CudaMarks, HostMarks

BOUNDARIES = ("probe", "ddp_forward", "optimizer_step", "none")
SPAN = "forward_backward"  # forward and backward as one stage


def first_tensor(value) -> torch.Tensor | None:
    """The first tensor of a batch (a tensor, or a tuple / list / dict holding one); None without one."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def batch_samples(batch) -> int | None:
    """A batch's samples: its first tensor's length (None without a tensor of one dimension or more)."""
    found = batch if isinstance(batch, torch.Tensor) else first_tensor(batch)
    return int(found.shape[0]) if found is not None and found.dim() else None


def batch_of(args: tuple, kwargs: dict) -> int:
    """Samples of one forward: the leading dimension of its first tensor input (0 without one)."""
    return batch_samples(args) or batch_samples(list(kwargs.values())) or 0


class FoundSteps:
    """The state of the step in progress; `record(times, samples, end_perf_s)` receives each finished step
    (Probe.record), `beginning()` is called as a step begins. Told of every forward of a DDP model, every
    optimizer step and every collective (scalelab.sync.intercept)."""

    def __init__(self, record: Callable[[dict, int, float], None], *, clock: Callable[[], float] = time.perf_counter,
                 on_enter: Callable[[str], None] | None = None, beginning: Callable[[], None] = lambda: None):
        self._record, self._clock, self._on_enter, self._beginning = record, clock, on_enter, beginning
        self.boundary = "none"
        self.clock = "host"
        self.model: Any = None  # the DDP model whose training forwards are the steps
        self.marks = None
        self.open = False
        self.start = self.forward_at = self.opt_first = self.opt_end = None
        self.opt_spans: list[tuple[Any, Any]] = []
        self.samples = 0
        self.synced = True  # the model's last training forward synced its gradients
        self.gap = None  # (mark, perf) where the next step begins: the last step's end, or an eval forward's
        self._opt_begin = None
        self._depth = 0  # optimizer.step calls in progress (a wrapper's step calling its base's)
        self.collectives = 0  # collectives seen so far (the optimizer boundary needs one in a step)
        self._collectives_at_begin = 0

    # ------------------------------------------------------------ marks
    def _marks(self):
        """Host clock until the script has initialised CUDA, then CUDA events (as the probe's StepTimer)."""
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.marks is None or (cuda and self.clock == "host"):
            self.marks = CudaMarks(torch.cuda.current_device()) if cuda else HostMarks(self._clock)
            self.clock = "cuda_events" if cuda else "host"
            self.gap = None  # a mark of the old clock cannot start a step on the new one
        return self.marks

    def _now(self) -> tuple[Any, float]:
        return self.marks.mark(), time.perf_counter()

    # ------------------------------------------------------------ signals
    def forward(self, net, args: tuple, kwargs: dict) -> None:
        """A DDP model's forward is about to run."""
        if self._depth:  # a forward inside optimizer.step (LBFGS's closure) belongs to the update
            return
        if not (net.training and torch.is_grad_enabled()):
            if self.open and self.opt_end is not None:  # evaluation after the update: the step is over
                self.finish(self.opt_end)
            return
        if self.model is None:
            if self.open:  # the optimizer bounded steps before this model ran: that open one ends (or is dropped)
                self.close()
            self.model, self.boundary = net, "ddp_forward"
        elif net is not self.model:
            return
        samples = batch_of(args, kwargs)
        if self.open and not self.synced:  # the next micro-batch of the step (the last one ran in no_sync)
            self.samples += samples
        else:
            if self.open:
                self.finish(self.opt_end or self._now())
            self.begin(samples)
        self.synced = bool(getattr(net, "require_backward_grad_sync", True))

    def after_forward(self, net) -> None:
        """A DDP model's forward returned: after an evaluation forward, the next step begins here."""
        if not (net.training and torch.is_grad_enabled()) and not self.open and self.marks is not None:
            self.gap = self._now()

    def optimizer_begin(self) -> None:
        self._depth += 1
        if self._depth > 1:
            return
        if self.model is None:  # no DDP model: the optimizer's step is the boundary
            self.boundary = "optimizer_step"
            if not self.open:  # the first step: the collectives before its update were its own
                self.begin(0, at_forward=False)
                self._collectives_at_begin = 0
        if self.open:
            if self._on_enter:
                self._on_enter("optimizer")
            self._opt_begin = self.marks.mark()
            self.opt_first = self.opt_first or self._opt_begin

    def optimizer_end(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth or not self.open or self._opt_begin is None:
            return
        self.opt_end = self._now()
        self.opt_spans.append((self._opt_begin, self.opt_end[0]))
        self._opt_begin = None
        # the optimizer boundary: the update ends the step when the step made a collective (or the run none yet);
        # a second optimizer's step right after the first opens the next step, which it then belongs to
        if self.model is None and self._synced_since_begin():
            self.finish(self.opt_end)
            self.begin(0, at_forward=False)  # the next step runs from here: its collectives come before its update

    def collective(self) -> None:
        self.collectives += 1

    def _synced_since_begin(self) -> bool:
        """The step made a collective (or the run has made none: then every update is a step)."""
        return self.collectives > self._collectives_at_begin or not self.collectives

    # ------------------------------------------------------------ steps
    def begin(self, samples: int, *, at_forward: bool = True) -> None:
        """A step begins (where the last one ended, else now); what the meter holds belongs to no step."""
        self._beginning()
        self._collectives_at_begin = self.collectives
        self._marks()
        now = self._now()
        self.start = self.gap or now
        self.forward_at = now if at_forward else self.start
        self.opt_first, self.opt_end, self.opt_spans = None, None, []
        self.samples, self.open = samples, True
        if self._on_enter:
            self._on_enter("forward")

    def finish(self, end: tuple[Any, float]) -> None:
        """The step in progress ends at `end` (a mark and its host time): its stage seconds go to the recorder."""
        marks = self.marks
        marks.settle(end[0])
        seconds = marks.seconds
        times = dict.fromkeys(TIMED_STAGES, 0.0)
        times["data"] = seconds(self.start[0], self.forward_at[0])
        times[SPAN] = seconds(self.forward_at[0], self.opt_first if self.opt_first is not None else end[0])
        times["optimizer"] = sum(seconds(b, e) for b, e in self.opt_spans)
        wall = seconds(self.start[0], end[0])
        times["other"] = wall - sum(times.values())
        times["wall"] = wall
        self.open, self.gap, self.synced = False, end, True
        self._record(times, self.samples, end[1])

    def close(self) -> None:
        """The script ended: a step whose update ran is recorded (ending there); one without is dropped (the
        script left its loop, or evaluated, after the forward; without DDP, a second optimizer's update after the
        last step)."""
        if self.open and self.opt_end is not None and (self.model is not None or self._synced_since_begin()):
            self.finish(self.opt_end)
        self.open = False
