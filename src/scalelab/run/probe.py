"""The probe: scalelab's measurement inside a training loop it did not write (the public face is scalelab.probe).

One `Probe` per rank process. While it is open it
- times steps and stages with the StepTimer of scalelab.measure.timer: a step is opened by `data(loader)` (at the
  request for a batch: the "data" stage is the wait for it) or by `step()`, and a stage by `stage(name)`; stages
  outside any step open an implicit one, which ends when the first stage of that step comes round again;
- meters collectives through scalelab.sync.intercept (torch.distributed calls and DDP models) into a CommMeter;
  collectives inside a step go into that step's record, the others (before the first step, between steps, a
  script without any step) into the rank's result, as totals of the same fields;
- runs the system sampler and the heartbeat the hang watchdog reads (a stage or a collective is progress);
- with `find_steps` (a script under `scalelab run`), finds the steps of a script that marks none at its DDP
  model's forward or its optimizer's step (scalelab.run.found_steps); the script's own `scalelab.probe.open()`
  turns that off, and its marks are the steps (`boundary`: "probe");
- writes what `scalelab train`'s ranks write: steps.rank<r>.jsonl (the same fields) and, when closed without an
  error, result.rank<r>.json; so the run's summary, trace and report are built by the same code.

On CUDA (the script has initialised CUDA by its first step) stages are bounded by CUDA events, one wait per step,
as in scalelab's own loop; a collective on CUDA tensors is timed by events around it on the stream
(sync/intercept.py), as the meter of scalelab's own strategies does. Nothing here reads the environment: the
caller passes the rank's DistContext.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scalelab.analysis.sketch import Running
from scalelab.distenv import DistContext
from scalelab.measure.machine import RunCpu, local_rank_pids
from scalelab.measure.memory import peak_memory
from scalelab.measure.system import SystemSampler
from scalelab.measure.timer import CudaMarks, StepTimer
from scalelab.run.found_steps import FoundSteps, batch_samples, first_tensor  # noqa: F401 (imported from here)
from scalelab.store.files import write_jsonl_atomic
from scalelab.store.rundir import RunDir
from scalelab.sync import intercept
from scalelab.sync.meter import PHASES, CommMeter
from scalelab.train.heartbeat import Heartbeat

FLUSH_EVERY_S = 2.0  # how often step records reach disk (a killed run keeps what was flushed)
FOLD_EVERY = 4096  # steps whose stage times are folded into the whole-run figures at once (numpy, not per step)


@dataclass(frozen=True)
class Detail:
    """Which steps keep their full record (steps file, trace), in the spirit of torch.profiler.schedule: the
    first `first`, then a window of `length` steps every `every` steps, at most `windows` windows (0: no limit).
    Every timed step, kept or not, feeds the whole-run aggregates (sums and quantile sketches per stage), so a run
    of any length leaves at most first + length x windows records per rank (4,200 by default)."""

    first: int = 200
    every: int = 1000
    length: int = 20
    windows: int = 200

    def __post_init__(self) -> None:
        for name in ("first", "every", "length", "windows"):
            if getattr(self, name) < 0 or name == "every" and self.every < 1:
                raise ValueError(f"{name}: {getattr(self, name)} is not allowed; an integer >= "
                                 f"{1 if name == 'every' else 0}")

    def keeps(self, step: int) -> bool:
        """Whether step `step` (1-based) keeps its full record."""
        if step <= self.first:
            return True
        window, position = divmod(step - self.first - 1, self.every)
        return position < self.length and (not self.windows or window < self.windows)


def add_totals(acc: dict, totals: dict) -> dict:
    """CommMeter.take_step totals accumulated over several takes: numbers summed, events concatenated."""
    for key, value in totals.items():
        if isinstance(value, list):
            acc.setdefault(key, []).extend(value)
        else:
            acc[key] = acc.get(key, 0) + value
    return acc


class Probe:
    """One rank's measurement of a user's loop; see the module docstring. `start()` before use, `close()` after."""

    def __init__(self, run_dir: Path | str, ctx: DistContext, *, warmup_steps: int = 2,
                 sample_interval_s: float = 0.5, heartbeat_s: float | None = 1.0,
                 rank_pids: Callable[[], Iterable[int]] | None = None, detail: Detail = Detail(),
                 clock: Callable[[], float] = time.perf_counter, find_steps: bool = False):
        self.rundir, self.ctx = RunDir(run_dir), ctx
        self.warmup_steps, self.detail = warmup_steps, detail
        self.figures: dict[str, Running] = {}  # every timed step's stage seconds, kept or not
        self._pending: list[dict[str, float]] = []  # timed steps not yet folded into the figures
        self.timed = self.samples_timed = 0
        self.dropped_comm: dict = {}  # collectives of steps whose record was not kept (totals, no events)
        # on CUDA a collective is timed by events on the stream (NCCL returns at launch); CPU tensors by the clock
        self.meter = CommMeter(ctx.world, devices=[ctx.device] if ctx.device.type == "cuda" else None)
        self._no_comm = self.meter.take_step()  # a step without collectives: its fields, all zero
        self.heartbeat = Heartbeat(self.rundir.path, ctx.rank, interval_s=heartbeat_s) if heartbeat_s else None
        pids = rank_pids or (lambda: local_rank_pids(self.rundir.path))
        machine = RunCpu(pids, since=time.time()) if ctx.local_rank == 0 else None
        self.sampler = SystemSampler(self.rundir.system_file(ctx.rank), sample_interval_s, rank=ctx.rank,
                                     gpu_index=ctx.device.index if ctx.device.type == "cuda" else None,
                                     machine=machine)
        self._clock = clock
        self.timer: StepTimer | None = None  # made at the first step: by then the script has chosen its device
        self.clock = "host"  # what times the steps: "host" (perf_counter) or "cuda_events"
        self.clock_steps: dict[str, int] = {}  # steps per clock
        self.steps = 0
        self.records: list[dict] = []
        self.outside: dict = {}  # collectives outside every step
        self._instrumented = False  # the script itself opened the probe (scalelab.probe.open)
        self.found = (FoundSteps(self.record, clock=clock, on_enter=self.heartbeat.enter if self.heartbeat else None,
                                 beginning=self._between_steps) if find_steps else None)
        self._in_step = False
        self._implicit_first: str | None = None  # first stage of an implicit step
        self._stage: str | None = None
        self._samples: int | None = None
        self._entered: set[str] = set()  # stages entered in the step in progress
        self._extra: dict = {}
        self._opened = self._last_flush = time.monotonic()
        self._closed = False

    # ------------------------------------------------------------ life cycle
    def start(self) -> "Probe":
        self.sampler.start()
        if self.heartbeat:
            self.heartbeat.start()
        intercept.install(self.meter, phase=self._phase, progress=self._progress, steps=self.found)
        return self

    @property
    def instrumented(self) -> bool:
        """The script opened the probe itself (scalelab.probe.open): its marks are the steps, none are found."""
        return self._instrumented

    @instrumented.setter
    def instrumented(self, value: bool) -> None:
        self._instrumented = bool(value)
        if value and self.found is not None:
            intercept.stop_finding_steps()
            self.found = None

    @property
    def boundary(self) -> str:
        """What bounded the steps (found_steps.BOUNDARIES): the script's marks, a found signal, or none."""
        if self.found is not None:
            return self.found.boundary
        return "probe" if self.steps or self._instrumented else "none"

    def close(self, *, failed: bool = False) -> None:
        """End an open step, write the step records and (unless `failed`) the rank's result; stop metering and
        sampling. Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.found is not None:
                self.found.close()
            self.leave_step()
            add_totals(self.outside, self.meter.take_step())
            self.flush()
            if not failed:
                self.rundir.write_result(self.ctx.rank, self.result())
        finally:
            intercept.uninstall()
            self.sampler.stop()
            if self.heartbeat:
                self.heartbeat.stop(done=not failed)

    def result(self) -> dict:
        """This rank's result file: what `scalelab train`'s ranks write, plus the script's wall time and the
        collectives outside steps. One epoch is the whole run (the probe does not know the user's epochs)."""
        return {"rank": self.ctx.rank, "steps": self.steps, "steps_per_epoch": max(1, self.steps), "epochs": 1,
                "evals": [], "memory": peak_memory(self.ctx.device), "threads": torch.get_num_threads(),
                "wall(s)": time.monotonic() - self._opened, "comm_outside": self.outside,
                "detailed": len(self.records)}

    def aggregates(self) -> dict:
        """The whole run's figures (aggregates.rank<r>.json): analysis.sketch.whole_run_figures reads them."""
        return {"rank": self.ctx.rank, "steps": self.steps, "timed": self.timed, "samples": self.samples_timed,
                "detailed": len(self.records), "clock_steps": dict(self.clock_steps), "boundary": self.boundary,
                "figures": {f"{k}(s)": v.to_dict() for k, v in self.figures.items()},
                "comm_dropped": self.dropped_comm}

    # ------------------------------------------------------------ steps
    @property
    def in_step(self) -> bool:
        """A step is open (started and not yet ended)."""
        return self._in_step

    def _timer(self) -> StepTimer:
        """The step timer, made when a step starts: CUDA events once the script has initialised CUDA (a script
        that does so lazily, after its first steps, moves from the host clock to events at that point), else the
        host clock. Each step's record names its clock, and the aggregates count the steps of each."""
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self.timer is None or (cuda and self.clock == "host"):
            on_enter = self.heartbeat.enter if self.heartbeat else None
            if cuda:
                self.timer = StepTimer(on_enter=on_enter, marks=CudaMarks(torch.cuda.current_device()))
                self.clock = "cuda_events"
            else:
                self.timer = StepTimer(self._clock, on_enter=on_enter)
                self.clock = "host"
        return self.timer

    def _between_steps(self) -> None:
        if not self.meter.idle():
            add_totals(self.outside, self.meter.take_step())  # what came before belongs to no step

    def start_step(self) -> None:
        if self._in_step:
            self.end_step()
        self._between_steps()
        self._timer().start_step()
        self._in_step, self._samples, self._extra, self._entered = True, None, {}, set()

    def leave_step(self) -> None:
        """End the step in progress when the loop is left: one that only waited for a batch (the loop broke out
        right after asking for it) is no step and is dropped."""
        if self._in_step and self._entered <= {"data"}:
            self._in_step, self._implicit_first = False, None
            self.timer.cancel_step()
        else:
            self.end_step()

    def end_step(self) -> None:
        if not self._in_step:
            return
        self._in_step, self._implicit_first = False, None
        self.record(self.timer.end_step(), self._samples or 0)

    def record(self, times: dict[str, float], samples: int, ended: float | None = None) -> None:
        """The recorder: one finished step's stage seconds (the timer's `end_step`: every stage, `wall`, `other`)
        and samples into the whole-run figures, its full record when the step is kept, and its collectives.
        `ended`: when the step ended (perf_counter seconds) where that was before now (a found step)."""
        self.steps += 1
        if self.found is not None:
            self.clock = self.found.clock
        self.clock_steps[self.clock] = self.clock_steps.get(self.clock, 0) + 1
        if self.heartbeat:
            self.heartbeat.step = self.steps
        warmup = self.steps <= self.warmup_steps
        comm = self.meter.take_step() if not self.meter.idle() else self._no_comm
        if not warmup:
            self._aggregate(times, samples)
        if self.detail.keeps(self.steps):
            comm = dict(comm)
            self.records.append({
                "step": self.steps, "epoch": 0, "rank": self.ctx.rank, "warmup": warmup, "samples": samples,
                "targets": samples, **{f"{k}(s)": v for k, v in times.items()},
                **_ends(ended), "clock": self.clock, **comm, **self._extra})
        elif comm["collectives"]:
            comm.pop("comm_events")
            add_totals(self.dropped_comm, comm)
        if time.monotonic() - self._last_flush >= FLUSH_EVERY_S:
            self.flush()

    @contextmanager
    def step(self, samples: int | None = None) -> Iterator["Probe"]:
        """One training step (from the request for its batch to the end of the optimizer update)."""
        self.start_step()
        if samples is not None:
            self._samples = int(samples)
        try:
            yield self
        finally:
            self.end_step()

    def data(self, batches: Iterable) -> Iterator:
        """Iterate over `batches` (a DataLoader), one step per batch: the wait for a batch is the "data" stage and
        its samples are its first tensor's length (`mark(samples=...)` overrides). The step ends when the next
        batch is asked for, or when the loop ends or is left."""
        it = iter(batches)
        while True:
            self.start_step()
            try:
                with self.stage("data"):
                    batch = next(it)
            except StopIteration:
                self.leave_step()  # no batch: no step
                return
            self._samples = batch_samples(batch)
            try:
                yield batch
            except GeneratorExit:  # the loop was left (break, an exception) while this step was open
                self.leave_step()
                raise
            self.end_step()

    def stage(self, name: str) -> "_Stage":
        """Time the block as stage `name` (data, h2d, forward, backward, comm, optimizer, or a name of yours)."""
        return _Stage(self, name)

    def mark(self, *, samples: int | None = None, **values: float) -> None:
        """The current step's samples (this rank's), and any number to keep in its record (e.g. loss=...)."""
        if samples is not None:
            self._samples = int(samples)
        self._extra.update({k: float(v) for k, v in values.items()})

    def _aggregate(self, times: dict[str, float], samples: int) -> None:
        """Every timed step into the whole-run figures, folded in chunks (`_fold`): per step only an append."""
        self._pending.append(times)
        self.samples_timed += samples
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """The pending steps into the figures, a stage at a time with numpy. A stage never entered so far (h2d in
        most scripts) has no figure; one first entered in step i counts 0 s for the steps before (in its mean, not
        in its sketch); one entered before but not in a step counts 0 s for it."""
        chunk, self._pending = self._pending, []
        if not chunk:
            return
        before = self.timed
        self.timed += len(chunk)
        names = dict.fromkeys(self.figures)
        for times in chunk:  # every step has the timer's stages; user-named ones may come and go
            if times.keys() - names.keys():
                names.update(dict.fromkeys(times))
        for name in names:
            values = np.fromiter((t.get(name, 0.0) for t in chunk), float, len(chunk))
            fig = self.figures.get(name)
            if fig is None:
                entered = np.flatnonzero(values)
                if not len(entered):
                    continue
                first = int(entered[0])
                fig = self.figures[name] = Running()
                fig.count, values = before + first, values[first:]
            fig.extend(values)

    def flush(self) -> None:
        self._fold()
        write_jsonl_atomic(self.rundir.steps_file(self.ctx.rank), self.records)
        self.rundir.write_aggregates(self.ctx.rank, self.aggregates())
        self._last_flush = time.monotonic()

    # ------------------------------------------------------------ for the intercept
    def _phase(self) -> str:
        """The phase a collective serves: the stage it runs in when that is a phase, else gradient sync."""
        return self._stage if self._stage in PHASES else "backward"

    def _progress(self) -> None:
        if self.heartbeat:
            self.heartbeat.progress += 1


def _ends(ended: float | None) -> dict[str, float]:
    """A step record's end on the wall clock and on perf_counter (the clock of the collectives' stamps)."""
    unix, perf = time.time(), time.perf_counter()
    if ended is None:
        return {"t_end(unix_s)": unix, "t_end(perf_s)": perf}
    return {"t_end(unix_s)": unix - (perf - ended), "t_end(perf_s)": ended}


class _Stage:
    """`Probe.stage`'s context manager (a class: it runs twice per stage of every step, where a generator-based
    one costs several microseconds more)."""

    __slots__ = ("probe", "name", "outer", "begin")

    def __init__(self, probe: Probe, name: str):
        self.probe, self.name = probe, name

    def __enter__(self) -> None:
        probe, name = self.probe, self.name
        if not probe._in_step or (probe._implicit_first == name and probe._stage is None):
            probe.start_step()  # an implicit step: it ends when this stage comes round again
            probe._implicit_first = name
        self.outer, probe._stage = probe._stage, name
        probe._entered.add(name)
        self.begin = probe.timer.begin(name)

    def __exit__(self, *exc) -> bool:
        probe = self.probe
        probe.timer.end(self.name, self.begin)
        probe._stage = self.outer
        return False


# ---------------------------------------------------------------- the process's probe
_current: Probe | None = None


def current() -> Probe | None:
    """The probe open in this process (one per rank), or None."""
    return _current


def set_current(probe: Probe | None) -> None:
    global _current
    _current = probe
