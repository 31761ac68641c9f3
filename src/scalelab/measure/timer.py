"""Per-step stage timing.

A step is the span from asking the loader for a batch to the end of the optimizer update. Named stages are timed
with their own spans on one timeline; `other` is the part of the step outside every named span (zero_grad,
bookkeeping, the loop itself), so the stages of a step sum to its wall time by definition and `other` shows how
much the named stages miss. Evaluation is not part of a step (the loop times it on its own).

Where the timeline comes from (`Marks`):
- on the CPU, the host clock (`HostMarks`);
- on CUDA, CUDA events recorded on the current stream at every boundary (`CudaMarks`): a stage is the device time
  between its two events, so it is charged for the kernels it launched, while the CPU keeps running ahead. The
  training loop reads a step late (`close_step` now, `EndedStep.read` when the next step has ended), so the host
  never waits for the device at the end of the step it has just queued; `end_step` reads at once (the probe, the
  benchmarks). With `sync_stages` the device is synchronised at every boundary instead (the old, intrusive way:
  the CPU can no longer queue work ahead); kept for comparison.

Where a late-read step ends on the host clock (`EndedStep.read`'s `t_end`, which the straggler analysis places the
step's spans back from): the host time at which the device finished the step's last event, not when the host
queued it. If reading had to wait for that event, the wait returned when it completed: the host clock then. If the
event was already done, it completed no earlier than any of the step's events was queued plus the device time from
that event to the end (the device cannot run an event before the host records it), and no earlier than the end of
the step read before it plus the device time between the two ends (steps are read in order). The latest of those
bounds is exact where the device was idle at some boundary of the step (the host sets the pace), or where the
device stayed busy since an end that was waited for (the device sets the pace).

The blocking wait of the gradient sync (`wait`): from the moment the last gradient of the step was produced (`ready`,
called from a post-accumulate-grad hook on every parameter) to the end of the "comm" span; for DDP, whose wait sits
inside `backward`, the same two marks bound it, so the figure means the same for every strategy.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from scalelab.analysis.keys import STAGES  # the stage names are metric names too

TIMED_STAGES = tuple(s for s in STAGES if s != "eval")  # eval is timed outside the step; old records have it


class HostMarks:
    """Marks on a host clock: a mark is the clock's reading."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def seconds(self, begin: float, end: float) -> float:
        return end - begin

    def settle(self, last: Any) -> None:
        """Wait until every mark taken so far can be read (nothing to wait for on the host)."""

    def done(self, last: Any) -> bool:
        """Whether `last` can be read without waiting (a host mark always can)."""
        return True


class CudaMarks:
    """Marks as CUDA events on the current stream; read once the step's last event has completed.

    `event`: the event class (torch.cuda.Event; tests give one whose times and completion they control)."""

    def __init__(self, device, event: Callable[..., Any] | None = None):
        if event is None:
            import torch

            event = torch.cuda.Event
        self._event, self._device = event, device

    def mark(self):
        ev = self._event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1e3

    def settle(self, last) -> None:
        last.synchronize()

    def done(self, last) -> bool:
        return last.query()  # non-blocking: has the stream reached this event?


class StepTimer:
    """Accumulates named spans inside one step; `end_step` returns seconds per stage plus `wall`, `other` and,
    when a gradient became ready and a "comm" span ran, `wait` (`close_step` ends the step and leaves the reading
    for later: `EndedStep.read`)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                 on_enter: Callable[[str], None] | None = None, marks=None):
        self._marks = marks if marks is not None else HostMarks(clock)
        self._clock = clock
        self._sync = sync  # device-wide synchronisation at every boundary (only when asked for)
        # host marks are read at once: a span adds its seconds as it ends (the per-step cost a long run pays);
        # device marks are read once the step's last one completes, so their spans wait in a list, and each
        # boundary's host time is kept beside its mark (where the step ends on the host clock: EndedStep.read)
        self._host = isinstance(self._marks, HostMarks)
        if sync is not None:
            self._mark = self._synced_mark
        elif self._host:
            self._mark = self._marks.mark  # called at every boundary of every step: no indirection
        self._on_enter = on_enter  # told the name of every span as it begins (the hang watchdog's heartbeat)
        self._t0 = None
        self._spans: list[tuple[str, Any, Any]] = []
        self._queued: list[tuple[Any, float]] = []  # (device mark, host time when it was recorded)
        self._totals: dict[str, float] = {}
        self._ready = None  # mark of the latest gradient produced in this step
        self._comm_end = None
        self._previous: dict[str, Any] = {}  # the last step read: its end mark and host time (EndedStep.read)

    @property
    def deferred(self) -> bool:
        """Whether the marks are device events, which a step can be read after (host marks are read at once)."""
        return not self._host

    def _synced_mark(self):
        self._sync()
        return self._marks.mark()

    def _mark(self):
        mark = self._marks.mark()
        self._queued.append((mark, self._clock()))
        return mark

    def start_step(self) -> None:
        self._spans, self._totals, self._ready, self._comm_end = [], {}, None, None
        self._queued = []
        self._t0 = self._mark()

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        begin = self.begin(name)
        try:
            yield
        finally:
            self.end(name, begin)

    def begin(self, name: str) -> Any:
        """The start of span `name` (what `span` does on entry, for callers that keep their own context manager);
        returns the mark to hand to `end`."""
        if self._t0 is None:
            raise RuntimeError("span() outside a step: call start_step() first")
        if self._on_enter:
            self._on_enter(name)
        return self._mark()

    def end(self, name: str, begin: Any) -> None:
        end = self._mark()
        if self._host:
            totals = self._totals
            totals[name] = totals.get(name, 0.0) + (end - begin)
        else:
            self._spans.append((name, begin, end))
        if name == "comm":
            self._comm_end = end

    def ready(self) -> None:
        """A gradient has just been produced (the latest call of a step wins). Not synchronising: called from
        autograd's hooks, where a device-wide sync would serialise backward."""
        if self._t0 is not None:
            self._ready = self._marks.mark()

    def add(self, name: str, seconds: float) -> None:
        """Charge time measured elsewhere (e.g. inside a communication hook) to a stage."""
        self._totals[name] = self._totals.get(name, 0.0) + seconds

    def cancel_step(self) -> None:
        """Drop the step in progress: nothing of it is returned (a loop left right after asking for a batch)."""
        self._t0 = None

    def close_step(self) -> "EndedStep":
        """End the step; its figures are read from the returned object, now or later (no wait here)."""
        if self._t0 is None:
            raise RuntimeError("end_step() without start_step()")
        end = self._mark()
        ended = EndedStep(self._marks, self._clock, self._t0, end, self._spans, self._totals, self._ready,
                          self._comm_end, None if self._host else self._queued, self._previous)
        self._t0 = None
        return ended

    def end_step(self) -> dict[str, float]:
        """End the step and read it at once (on CUDA: a wait for the step's last event)."""
        return self.close_step().read()[0]


@dataclass
class EndedStep:
    """A step whose marks are all taken; `read` gives its seconds per stage and where it ended on the host clock."""

    marks: Any
    clock: Callable[[], float]
    t0: Any
    end: Any
    spans: list[tuple[str, Any, Any]]
    totals: dict[str, float]
    ready: Any
    comm_end: Any
    queued: list[tuple[Any, float]] | None  # device marks with their host times; None for host marks
    previous: dict[str, Any]  # shared by a timer's steps: the end mark and host time of the step read last

    def done(self) -> bool:
        """Whether `read` would not wait (the device has finished the step's last event)."""
        return self.marks.done(self.end)

    def read(self) -> tuple[dict[str, float], float]:
        """(seconds per stage, `wall`, `other` and maybe `wait`; the step's end on the host clock). On CUDA this
        waits for the step's last event when the device has not reached it yet (a CPU-GPU sync point)."""
        waited = not self.marks.done(self.end)
        self.marks.settle(self.end)
        seconds = self.marks.seconds
        totals = self.totals
        for name, begin, stop in self.spans:
            totals[name] = totals.get(name, 0.0) + seconds(begin, stop)
        out = dict.fromkeys(TIMED_STAGES, 0.0)
        out.update(totals)
        wall = seconds(self.t0, self.end)
        out["other"] = wall - sum(out.values())
        out["wall"] = wall
        if self.ready is not None and self.comm_end is not None:
            out["wait"] = seconds(self.ready, self.comm_end)
        return out, self._host_end(waited)

    def _host_end(self, waited: bool) -> float:
        """The host time at which the step's last event completed (module docstring)."""
        if self.queued is None:
            return self.end  # a host mark is a host time
        now = self.clock()
        if waited:  # the wait returned as the event completed
            end = now
        else:
            seconds = self.marks.seconds
            bounds = [host + seconds(mark, self.end) for mark, host in self.queued]
            if self.previous:
                bounds.append(self.previous["t_end"] + seconds(self.previous["mark"], self.end))
            end = min(now, max(bounds))
        self.previous.update(mark=self.end, t_end=end)
        return end
