"""Progress of studies and experiments, driven by the cell engine: cells done / total, the current cell, elapsed
time and an ETA. A live rich display on a terminal; plain lines otherwise (CI, logs, pipes).

The ETA is the mean time of the cells run so far in this experiment times the cells still to run; reused cells
take no time and do not count. Before the first cell of an experiment has finished, a run of auto length
(`steps: auto`) gives the estimate instead: its warm-up (the time from the cell's start until the run's heartbeat
passed the warm-up steps, set-up included; 0 until seen) plus its time budget, the most its timed steps take. The
cells of an experiment are taken to share their length settings.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Protocol

from scalelab.config import TrainConfig
from scalelab.lab.terminal import terminal_width, wrapped


class Progress(Protocol):
    def experiment(self, name: str, index: int, total: int, eta_s: float | None = None) -> None: ...
    def experiment_done(self, name: str, seconds: float, failure: str | None = None) -> None: ...
    def group(self, name: str, to_run: int) -> None: ...
    def cell_started(self, label: str) -> None: ...
    def cell_waiting(self, label: str) -> None: ...
    def cell_done(self, label: str, outcome: str, *, seconds: float | None = None, reused: bool = False) -> None: ...
    def run_line(self, line: str) -> None: ...
    def run_started(self, files) -> None: ...
    def say(self, line: str) -> None: ...
    def close(self) -> None: ...


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class PlainProgress:
    """One line per event: `[study/group 3/8] batch 64: done in 12 s (elapsed 0:40, ETA 1:15)`."""

    def __init__(self, write: Callable[[str], None] = print, *, quiet_runs: bool = True):
        self.write, self.quiet_runs = write, quiet_runs
        self.name, self.to_run, self.done, self.spent = "", 0, 0, 0.0
        self.budget_s: float | None = None  # time budget of the auto-length run of the current cell
        self.warmup_s = 0.0  # set-up and warm-up of the current cell's run, once seen
        self.started = time.monotonic()
        self.study_eta_s: float | None = None  # the study's ETA when the current experiment started
        self.study_eta_at = self.started

    def experiment(self, name: str, index: int, total: int, eta_s: float | None = None) -> None:
        """An experiment starts; `eta_s`: the whole study's remaining seconds at its measured pace (lab/budget.py)."""
        self.study_eta_s, self.study_eta_at = eta_s, time.monotonic()
        self.write(f"== [{index}/{total}] {name}" + (f" (study ETA {_clock(eta_s)})" if eta_s is not None else ""))

    def experiment_done(self, name: str, seconds: float, failure: str | None = None) -> None:
        self.write(f"== {name} failed: {failure}" if failure else f"== {name} done in {seconds:.0f} s")

    def group(self, name: str, to_run: int) -> None:
        self.name, self.to_run, self.done, self.spent = name, to_run, 0, 0.0
        self.budget_s, self.warmup_s = None, 0.0

    def _prefix(self) -> str:
        return f"[{self.name} {self.done}/{self.to_run}]" if self.to_run else f"[{self.name}]"

    def eta(self) -> float | None:
        """Seconds until the experiment's cells are done, counted from the current cell's start."""
        if self.done >= self.to_run:
            return None
        if self.done:
            return self.spent / self.done * (self.to_run - self.done)
        if self.budget_s is not None:  # nothing finished yet: the auto-length budget bounds a cell's timed steps
            return (self.warmup_s + self.budget_s) * self.to_run
        return None

    def cell_started(self, label: str) -> None:
        self.write(f"{self._prefix()} {label}: running (elapsed {_clock(time.monotonic() - self.started)})")

    def cell_waiting(self, label: str) -> None:
        self.write(f"{self._prefix()} {label}: another process is running this cell; waiting for it")

    def cell_done(self, label: str, outcome: str, *, seconds: float | None = None, reused: bool = False) -> None:
        if seconds is not None:
            self.done += 1
            self.spent += seconds
            eta = self.eta()
            outcome += f" in {seconds:.0f} s" + (f" (ETA {_clock(eta)})" if eta is not None else "")
        self.write(f"{self._prefix()} {label}: {outcome}")

    def run_line(self, line: str) -> None:
        if not self.quiet_runs:
            self.write(line)

    def run_started(self, files) -> None:
        """The current cell's run has its directory (`files`: its RunDir): a live display follows its step; an
        auto-length run's budget becomes the estimate of a cell."""
        self.budget_s = auto_budget(files) or self.budget_s

    def say(self, line: str) -> None:
        self.write(line)

    def close(self) -> None:
        pass


class LiveProgress(PlainProgress):
    """A rich live display: the finished lines scroll above one status line that is redrawn in place."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        super().__init__(lambda line: [self.console.print(part, markup=False, highlight=False, soft_wrap=True)
                                       for part in wrapped(line, self.console.width)])
        self.current = ""
        self.files = None  # RunDir of the cell's run, once it exists
        self.warmup_steps = 0
        self.cell_began = time.monotonic()
        self.live = Live(self._status(), console=self.console, refresh_per_second=2, transient=True,
                         get_renderable=self._status)
        self.live.start()

    def _status(self):
        from rich.text import Text

        now = time.monotonic()
        eta = self.eta()
        parts = [f"{self.name or 'study'}: {self.done}/{self.to_run} cells",
                 f"elapsed {_clock(now - self.started)}"]
        if self.current:
            parts.insert(1, f"now: {self.current}{self._step()} ({_clock(now - self.cell_began)})")
        if eta is not None:
            parts.append(f"ETA {_clock(max(0.0, eta - (now - self.cell_began)))}")
        if self.study_eta_s is not None:
            parts.append(f"study ETA {_clock(max(0.0, self.study_eta_s - (now - self.study_eta_at)))}")
        return Text(" · ".join(parts), style="bold")

    def _step(self) -> str:
        """", step 12 (backward)" from rank 0's heartbeat, when the run writes one."""
        try:
            beat = self.files.read_heartbeat(0) if self.files is not None else None
        except Exception:  # noqa: BLE001 - not written yet, or being replaced: show no step this time
            beat = None
        if not beat or beat.get("step") is None:
            return ""
        if beat["step"] > self.warmup_steps and not self.warmup_s:
            self.warmup_s = time.monotonic() - self.cell_began
        return f", step {beat['step']} ({beat['stage']})"

    def run_started(self, files) -> None:
        self.files = files
        super().run_started(files)
        self.warmup_steps = _config(files).get("warmup_steps", 0)

    def cell_started(self, label: str) -> None:
        self.current, self.cell_began, self.files = label, time.monotonic(), None

    def cell_done(self, label: str, outcome: str, *, seconds: float | None = None, reused: bool = False) -> None:
        self.current, self.files = "", None
        super().cell_done(label, outcome, seconds=seconds, reused=reused)

    def close(self) -> None:
        self.live.stop()


def _config(files) -> dict:
    try:
        return files.read_config()
    except Exception:  # noqa: BLE001 - a run without a readable config: no estimate from it
        return {}


def auto_budget(files) -> float | None:
    """The time budget (s) of a run of auto length, from its stored config; None for a fixed length."""
    config = _config(files)

    return float(config.get("time_budget_s", TrainConfig.time_budget_s)) if config.get("steps") == "auto" else None


def progress_for_output() -> Progress:
    """Live on a terminal, plain lines when the output is not one."""
    return LiveProgress() if sys.stdout.isatty() else PlainProgress(
        lambda line: print("\n".join(wrapped(line, terminal_width())), flush=True))
