"""Per-step stage timing.

A step is the span from asking the loader for a batch to the end of the optimizer update. Named stages are timed
with their own spans on one timeline; `other` is the part of the step outside every named span (zero_grad,
bookkeeping, the loop itself), so the stages of a step sum to its wall time by definition and `other` shows how
much the named stages miss. Evaluation is not part of a step (the loop times it on its own).

Where the timeline comes from (`Marks`):
- on the CPU, the host clock (`HostMarks`);
- on CUDA, CUDA events recorded on the current stream at every boundary (`CudaMarks`): a stage is the device time
  between its two events, so it is charged for the kernels it launched, while the CPU keeps running ahead. The
  step waits for its last event once, at `end_step`. With `sync_stages` the device is synchronised at every
  boundary instead (the old, intrusive way: the CPU can no longer queue work ahead); kept for comparison.

The blocking wait of the gradient sync (`wait`): from the moment the last gradient of the step was produced (`ready`,
called from a post-accumulate-grad hook on every parameter) to the end of the "comm" span; for DDP, whose wait sits
inside `backward`, the same two marks bound it, so the figure means the same for every strategy.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


class CudaMarks:
    """Marks as CUDA events on the current stream; read once the step's last event has completed."""

    def __init__(self, device):
        import torch

        self._torch, self._device = torch, device

    def mark(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1e3

    def settle(self, last) -> None:
        last.synchronize()


class StepTimer:
    """Accumulates named spans inside one step; `end_step` returns seconds per stage plus `wall`, `other` and,
    when a gradient became ready and a "comm" span ran, `wait`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                 on_enter: Callable[[str], None] | None = None, marks=None):
        self._marks = marks if marks is not None else HostMarks(clock)
        self._sync = sync  # device-wide synchronisation at every boundary (only when asked for)
        if sync is None:
            self._mark = self._marks.mark  # called at every boundary of every step: no indirection
        self._on_enter = on_enter  # told the name of every span as it begins (the hang watchdog's heartbeat)
        self._t0 = None
        # host marks are read at once: a span adds its seconds as it ends (the per-step cost a long run pays);
        # device marks are read after the step's last one completes, so their spans wait in a list
        self._host = isinstance(self._marks, HostMarks)
        self._spans: list[tuple[str, Any, Any]] = []
        self._totals: dict[str, float] = {}
        self._ready = None  # mark of the latest gradient produced in this step
        self._comm_end = None

    def _mark(self):
        self._sync()
        return self._marks.mark()

    def start_step(self) -> None:
        self._t0 = self._mark()
        self._spans, self._totals, self._ready, self._comm_end = [], {}, None, None

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

    def end_step(self) -> dict[str, float]:
        if self._t0 is None:
            raise RuntimeError("end_step() without start_step()")
        end = self._mark()
        self._marks.settle(end)
        seconds = self._marks.seconds
        totals = self._totals
        for name, begin, stop in self._spans:
            totals[name] = totals.get(name, 0.0) + seconds(begin, stop)
        out = dict.fromkeys(TIMED_STAGES, 0.0)
        out.update(totals)
        wall = seconds(self._t0, end)
        out["other"] = wall - sum(out.values())
        out["wall"] = wall
        if self._ready is not None and self._comm_end is not None:
            out["wait"] = seconds(self._ready, self._comm_end)
        self._t0 = None
        return out
