"""Per-step stage timing.

A step is the span from asking the loader for a batch to the end of the optimizer update (plus evaluation when
it falls on that step). Named stages are timed with their own spans on one clock; `other` is the part of the
step outside every named span (zero_grad, bookkeeping, the loop itself), so the stages of a step sum to its wall
time by definition and `other` shows how much the named stages miss.

On CUDA every span boundary synchronises the device (`sync`), so a stage is charged for the kernels it launched
rather than for whatever was still queued when it began. That sync is the price of per-stage attribution.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from scalelab.analysis.keys import STAGES  # the stage names are metric names too


class StepTimer:
    """Accumulates named spans inside one step; `end_step` returns seconds per stage plus `wall` and `other`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None,
                 on_enter: Callable[[str], None] | None = None):
        self._clock = clock
        self._sync = sync
        self._on_enter = on_enter  # told the name of every span as it begins (the hang watchdog's heartbeat)
        self._t0: float | None = None
        self._spans: dict[str, float] = {}

    def start_step(self) -> None:
        if self._sync:
            self._sync()
        self._t0 = self._clock()
        self._spans = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        if self._t0 is None:
            raise RuntimeError("span() outside a step: call start_step() first")
        if self._on_enter:
            self._on_enter(name)
        if self._sync:
            self._sync()
        begin = self._clock()
        try:
            yield
        finally:
            if self._sync:
                self._sync()
            self._spans[name] = self._spans.get(name, 0.0) + self._clock() - begin

    def add(self, name: str, seconds: float) -> None:
        """Charge time measured elsewhere (e.g. inside a communication hook) to a stage."""
        self._spans[name] = self._spans.get(name, 0.0) + seconds

    def end_step(self) -> dict[str, float]:
        if self._t0 is None:
            raise RuntimeError("end_step() without start_step()")
        if self._sync:
            self._sync()
        wall = self._clock() - self._t0
        self._t0 = None
        out = dict(self._spans)
        out["other"] = wall - sum(self._spans.values())
        out["wall"] = wall
        return out
