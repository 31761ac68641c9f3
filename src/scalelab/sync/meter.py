"""Communication accounting: every collective a sync strategy issues is recorded here, one CommMeter per rank.

A record holds the op, the phase of the step it serves ("forward": DDP's buffer broadcast; "backward": gradient
sync; "optimizer": reserved for optimizer-side collectives), payload bytes and the interval inside the collective:
- synchronous collectives: from the call to its return (`collective`);
- asynchronous ones: from launch to the moment the caller's future completes (`track`). A collective that has
  completed is recorded before the step that saw it complete is read (`settle`): its record is made by a callback on
  the completing (gloo) thread, which needs the GIL, and the caller may learn of the completion first (a `then`
  chained after the meter's, registered once the work had completed, runs on the caller's thread at once); the
  step's end would otherwise read it in the next step (issue 57: 0 and 2 collectives in two found steps);
- on CUDA, between CUDA events on the stream that waits for the collective (read at `take_step`, or later:
  `close_step` ends a step and its `EndedComm.read` reads the events when the training loop reads that step).
Asynchronous collectives overlap compute and each other, so a step's time inside collectives is the length of the
union of its intervals (`comm_total(s)`), never their sum (kept as `comm_sum(s)`, which counts overlapped
stretches more than once).

Byte conventions (S = bytes of the tensor this rank hands to the collective):
- allreduce, broadcast: `nbytes` = S (the buffer every rank contributes and receives).
- gather / scatter (rank-0 gather/scatter): `nbytes` = what this rank puts on or takes off the wire: S sent
  (gather) or received (scatter) on a non-root rank, (n-1)*S received or sent on the root (its own slice
  stays local).
- bandwidth uses the nccl-tests buffer size instead (`alg_bytes`): S for allreduce / broadcast, n*S (the
  gathered / scattered total) for gather / scatter / allgather / reduce_scatter.
algbw = alg_bytes / t; busbw = algbw * factor(op, n) with factor 2(n-1)/n for allreduce, (n-1)/n for
allgather / reduce_scatter / gather / scatter, 1 for broadcast; a collective's t is its own interval. A step's (or
a run's) algbw and busbw are total (factor-weighted) bytes over the union of the collective intervals.

Network emulation (`latency_s`, `bandwidth_Bps`) is done on the caller's side: after the real collective
completes, the meter waits until at least count*latency + nbytes/bandwidth has passed since launch, so a
collective never looks faster than the emulated link. For async collectives the wait happens on a timer thread
before the caller's future is completed, so gloo's own threads are never blocked. It emulates a slower network
as the caller experiences it; it does not slow the bytes on the wire.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from scalelab.analysis.bandwidth import bus_factor
from scalelab.analysis.peers import union_seconds

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Collective:
    op: str
    phase: str
    nbytes: int  # payload bytes as defined in the module docstring
    seconds: float  # inside the collective as the caller sees it
    alg_bytes: int  # nccl-tests buffer size S used for algbw
    count: int = 1  # collectives this record stands for (e.g. PowerSGD's three allreduces per bucket)
    end: float = 0.0  # meter clock (perf_counter) when the caller saw it complete: places it on a trace


class CommMeter:
    """Records collectives of one rank; `take_step` returns the step's totals and starts the next step."""

    def __init__(self, world: int, *, latency_s: float = 0.0, bandwidth_Bps: float | None = None,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 devices: list[torch.device] | None = None):
        self.world = world
        self.latency_s = latency_s
        self.bandwidth_Bps = bandwidth_Bps
        self._clock = clock
        self._sleep = sleep
        self._devices = devices  # for futures the meter creates on CUDA
        self._cuda = bool(devices) and any(d.type == "cuda" for d in devices)
        self._lock = threading.Lock()  # async completions arrive on gloo / timer threads
        self._records: list[Collective] = []
        self._pending: list[tuple] = []  # (record, start event, end event): CUDA times read at take_step
        self._landing: list[tuple] = []  # (future, recorded): tracked collectives whose record is not made yet

    @classmethod
    def from_config(cls, cfg, world: int, device: torch.device | None = None) -> "CommMeter":
        bandwidth = cfg.net_bandwidth_gbps * 1e9 / 8 if cfg.net_bandwidth_gbps else None  # Gbit/s -> bytes/s
        devices = [device] if device is not None and device.type == "cuda" else None
        return cls(world, latency_s=cfg.net_latency_ms / 1e3, bandwidth_Bps=bandwidth, devices=devices)

    @property
    def emulating(self) -> bool:
        return self.latency_s > 0 or self.bandwidth_Bps is not None

    def floor_s(self, nbytes: int, count: int = 1) -> float:
        """The least time a collective of `nbytes` may take on the emulated link (0 without emulation)."""
        out = self.latency_s * count
        if self.bandwidth_Bps:
            out += nbytes / self.bandwidth_Bps
        return out

    def now(self) -> float:
        return self._clock()

    def device_mark(self):
        """A CUDA event on the current stream (None off CUDA or when emulating a network): where the next
        collective is enqueued. On CUDA a collective's time comes from events, not the host clock: NCCL returns at
        launch, and gloo's host wait also covers every kernel queued before the collective."""
        if not self._cuda or self.emulating:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def record(self, op: str, nbytes: int, seconds: float, *, phase: str, alg_bytes: int | None = None,
               count: int = 1, events: tuple | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r}; allowed: {', '.join(PHASES)}")
        bus_factor(op, self.world)  # unknown ops fail here, not later in the summary
        rec = Collective(op, phase, int(nbytes), float(seconds), int(nbytes if alg_bytes is None else alg_bytes),
                         count, self._clock())
        with self._lock:
            if events is not None:  # (start, end) CUDA events: their elapsed time replaces `seconds` at take_step
                self._pending.append((rec, *events))
            else:
                self._records.append(rec)

    @contextmanager
    def collective(self, op: str, nbytes: int, *, phase: str, alg_bytes: int | None = None,
                   count: int = 1) -> Iterator[None]:
        """Time a synchronous collective run in the body (plus the emulated remainder) and record it."""
        start, mark = self._clock(), self.device_mark()
        yield
        if self.emulating:
            remaining = self.floor_s(nbytes, count) - (self._clock() - start)
            if remaining > 0:
                self._sleep(remaining)
        # a synchronous collective has made the current stream wait for it: an event now marks its completion
        self.record(op, nbytes, self._clock() - start, phase=phase, alg_bytes=alg_bytes, count=count,
                    events=None if mark is None else (mark, self.device_mark()))

    def track(self, fut: torch.futures.Future, op: str, nbytes: int, *, phase: str, start: float | None = None,
              alg_bytes: int | None = None, count: int = 1, mark=None) -> torch.futures.Future:
        """Record an async collective when `fut` completes; returns the future the caller must wait on.

        Without emulation this is `fut.then(...)` (the completion time is taken in its callback). With emulation
        a new future is completed by a timer thread once the emulated floor has passed since `start`.
        """
        start = self._clock() if start is None else start

        def finish(value):
            # a CUDA future runs `then` callbacks on streams that wait for the collective, so an event recorded
            # here marks its completion on the device, even where the callback runs at launch (NCCL)
            self.record(op, nbytes, self._clock() - start, phase=phase, alg_bytes=alg_bytes, count=count,
                        events=None if mark is None else (mark, self.device_mark()))
            return value

        if not self.emulating:
            recorded = threading.Event()

            def landed(f: torch.futures.Future):
                try:
                    return finish(f.value())
                finally:
                    recorded.set()

            with self._lock:
                self._landing.append((fut, recorded))
            return fut.then(landed)
        out: torch.futures.Future = torch.futures.Future(devices=self._devices)

        def done(f: torch.futures.Future) -> None:
            try:
                value = f.value()
            except Exception as err:  # noqa: BLE001 - hand the collective's failure to the waiter
                out.set_exception(err)
                return
            remaining = self.floor_s(nbytes, count) - (self._clock() - start)
            if remaining <= 0:
                out.set_result(finish(value))
                return
            timer = threading.Timer(remaining, lambda: out.set_result(finish(value)))
            timer.daemon = True
            timer.start()

        fut.add_done_callback(done)
        return out

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait until every tracked collective whose future has completed is recorded: its callback may still be
        waiting for the GIL on the thread that completed it (module docstring). One still running stays in flight
        and is recorded in the step where it completes."""
        with self._lock:
            self._landing = [(f, ev) for f, ev in self._landing if not ev.is_set()]
            waiting = [ev for f, ev in self._landing if f.done()]
        for ev in waiting:  # Event.wait releases the GIL, so the callback can run
            ev.wait(timeout_s)

    def idle(self) -> bool:
        """Whether no collective has been recorded since the last `take_step`."""
        self.settle()
        with self._lock:
            return not self._records and not self._pending

    def take_step(self) -> dict:
        """This step's totals (the per-step record fields) since the previous call; clears the records."""
        return self.close_step().read()

    def close_step(self) -> "EndedComm":
        """End this step's collection (the next one starts empty); read its totals from the returned object, now or
        later: the training loop reads a step's CUDA events when the next step has ended (never waits at its end)."""
        self.settle()
        with self._lock:
            records, self._records = self._records, []
            pending, self._pending = self._pending, []
        return EndedComm(records, pending, self.world)


@dataclass
class EndedComm:
    """One step's collectives; those timed by CUDA events are read by `read`, once their events have completed."""

    records: list[Collective]
    pending: list[tuple]  # (record, start event, end event)
    world: int

    def done(self) -> bool:
        """Whether `read` would not wait (every collective's end event has completed)."""
        return all(end.query() for _, _, end in self.pending)

    def read(self) -> dict:
        """The step's totals (the per-step record fields); waits for the collectives' end events if needed."""
        records, pending = list(self.records), self.pending
        if pending:
            # one device timeline: every interval placed by its events relative to the first launch's event,
            # anchored at that launch's host time (the host clock of the record, less its host-measured length)
            first, anchor = pending[0][1], pending[0][0].end - pending[0][0].seconds
            for rec, begin, end in pending:
                end.synchronize()
                start = anchor + first.elapsed_time(begin) / 1e3
                seconds = begin.elapsed_time(end) / 1e3
                records.append(dataclasses.replace(rec, seconds=seconds, end=start + seconds))
        return step_totals(records, self.world)


def step_totals(records: list[Collective], world: int) -> dict:
    """Per-step record fields: comm_total(s) (union of the intervals), comm_sum(s), collectives, bytes (all and
    per phase), algbw/busbw inputs."""
    out = {
        "comm_total(s)": union_seconds([(r.end - r.seconds, r.end) for r in records]),
        "comm_sum(s)": sum(r.seconds for r in records),
        "collectives": sum(r.count for r in records),
        "comm_bytes": sum(r.nbytes for r in records),
        **{f"comm_bytes_{p}": sum(r.nbytes for r in records if r.phase == p) for p in PHASES},
        "comm_alg_bytes": sum(r.alg_bytes for r in records),
        "comm_bus_bytes": sum(r.alg_bytes * bus_factor(r.op, world) for r in records),
        # [op, phase, start, seconds, bytes] per collective, start on the meter clock: the run's trace reads it
        "comm_events": [[r.op, r.phase, r.end - r.seconds, r.seconds, r.nbytes] for r in records],
    }
    return out
