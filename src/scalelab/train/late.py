"""Steps read late: on CUDA the training loop reads a step's events when the next step has ended, so the host never
waits for the device at the end of the step it has just queued (it queues the next one while the device runs).

A step that has ended is kept here until it is read, oldest first: `due` hands over every step but the newest `lag`
(1 on CUDA, 0 on the CPU, where a step is read as it ends); `all` hands over every step (before an evaluation or a
checkpoint, and at the run's end); `finish_within` is for an interrupt: it polls the steps' last events for a
bounded time, never a blocking wait on a device that may hang, and drops the first step still unfinished and every
later one. The order in which steps are handed over depends on step counts alone, never on how far the device has
got, so every rank reads (and feeds the auto-length rule) the same steps at the same points.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scalelab.measure.timer import EndedStep

POLL_S = 0.01  # between two looks at an unfinished step's last event on an interrupt
INTERRUPT_BOUND_S = 5.0  # how long an interrupted run waits for the device to finish the steps it queued


@dataclass
class Ended:
    """A step the host has finished queueing: what is known of it now; its times are read from `timer`."""

    step: int
    warmup: bool
    record: dict  # the step's record fields known at its end (step, epoch, lr, samples, ...), times not yet
    timer: EndedStep
    comm: Any  # the comm meter's EndedComm, or None without a sync strategy
    loss: Any
    correct: Any

    def done(self) -> bool:
        """Whether reading the step would not wait for the device."""
        return self.timer.done() and (self.comm is None or self.comm.done())


class LateSteps:
    """Ended steps waiting to be read, oldest first."""

    def __init__(self, lag: int, bound_s: float | None = None):
        self.lag = lag
        self.bound_s = INTERRUPT_BOUND_S if bound_s is None else bound_s  # finish_within's bound
        self._queue: deque[Ended] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, ended: Ended) -> None:
        self._queue.append(ended)

    def due(self) -> list[Ended]:
        """The steps to read now: all but the newest `lag`."""
        out = []
        while len(self._queue) > self.lag:
            out.append(self._queue.popleft())
        return out

    def all(self) -> list[Ended]:
        out = list(self._queue)
        self._queue.clear()
        return out

    def finish_within(self, *, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> tuple[list[Ended], list[Ended]]:
        """(steps whose device work completed within `bound_s`, in order; the first one that did not and every
        later one, dropped). Polls, never waits on the device: for an interrupt, where the device may hang."""
        deadline = clock() + self.bound_s
        finished: list[Ended] = []
        while self._queue:
            if self._queue[0].done():
                finished.append(self._queue.popleft())
            elif clock() >= deadline:
                break
            else:
                sleep(POLL_S)
        return finished, self.all()
