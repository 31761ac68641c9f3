"""A study's time budget: how long the rest will take on this machine, and what to reduce to finish within it.

Machines of one kind differ about 2x in speed, so a fixed plan that fits one does not fit the other. The study
measures its own pace as it goes: `pace` = the seconds its finished parts took / the seconds they took on the
reference machine (`REFERENCE_S`, measured with `scalelab study` and `--quick`, warm ranks, nothing else running).
The reference cell runs first, so the pace is known before the first experiment. The rest is predicted as
pace x its reference seconds; where that exceeds the time left, the plan is cut, in this order, until it fits:

1. compared cells launched fewer times: `launches` above 2 down to 2 (never below 2: a comparison needs at least two
   launches for its launch-level interval; experiments the plan launches once, as the quick study does, stay so);
2. whole experiments left out, the least central first (`LEAVE_OUT_ORDER`: the ones no other answer depends on;
   profile, scale, strategies and comm, the seeds' core questions, are never left out).

A reduced experiment's cells have fewer launches in the store; a later study with a larger budget asks for the full
count and launches the missing ones (lab/cells.py), so nothing reduced is reused as if it were complete. Every
decision is said as the study goes and listed in the report's environment section (`Budget.notes`).

The same prediction is the study's ETA (`eta_s`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from scalelab.errors import ConfigError

# Seconds each part of the built-in study took on the reference machine: `benchmarks/study_time.py` (2 rounds of the
# full and of the quick study, medians) on a 2-core machine of the kind CI uses, warm ranks and fork pools, Horovod
# installed (engines runs its Horovod cells: 7-8 s; about 1 s without Horovod), 2026-11-27; (full, quick). threads,
# max_batch, model_grid, amp, lr_scaling and the report re-measured after the fork servers' torch._dynamo import,
# the TensorBoard export's one event a step and the ranks' quick exit (3 full studies, 4 quick ones, that day);
# threads, max_batch, model_grid and scale again after the zygote (2 full, 2 quick, that evening: the zygote's own
# start now falls in the first experiment with 2 ranks, scale). Only their ratios matter: the pace scales them to
# the machine at hand.
REFERENCE_S: dict[str, tuple[float, float]] = {
    "reference": (1.0, 1.0),  # one launch of the reference cell
    # after the last experiment: the pools closed, the report written, the command's exit; the quick study's was
    # 0.5-0.6 s on 2026-11-28 (timed lines of `study --quick`; at 2.0 its ETA at predict, the last experiment, was
    # 22-25 % long in 4 of 4 studies, 2 s of 9)
    "report": (2.0, 0.6),
    "profile": (1.0, 0.4), "threads": (2.5, 1.0), "batch_sweep": (3.0, 1.0), "max_batch": (18.0, 0.0),
    "model_grid": (6.0, 3.0), "scale": (12.0, 4.0), "strategies": (8.0, 1.0), "bucket_sweep": (4.0, 0.0),
    "backends": (0.5, 0.3), "engines": (8.5, 0.0), "comm": (6.0, 2.0), "loader": (7.0, 2.0), "amp": (9.0, 3.0),
    "checkpointing": (11.0, 4.0), "lr_scaling": (28.5, 2.5), "predict": (11.5, 7.7),
}
# The plan's launches of each experiment on the reference machine (a user's study file may set others).
REFERENCE_LAUNCHES: dict[str, tuple[int, int]] = {
    "threads": (2, 1), "batch_sweep": (2, 1), "scale": (3, 1), "strategies": (3, 1), "bucket_sweep": (3, 3),
    "backends": (3, 1), "loader": (2, 1), "checkpointing": (2, 1), "engines": (1, 1), "amp": (1, 1),
}
LEAVE_OUT_ORDER = ("max_batch", "lr_scaling", "engines", "bucket_sweep", "checkpointing", "amp", "model_grid",
                   "predict", "loader", "threads", "batch_sweep", "backends")
MIN_LAUNCHES = 2
PRIOR_S = 5.0  # reference seconds of prior at pace 1.0 (the reference cell alone is 1)
DEFAULT_S = 20.0  # an experiment the reference machine never ran (a user's own study file)


def parse_duration(text: str | float | int) -> float:
    """'10m', '150s', '90', '1h' -> seconds (> 0)."""
    value = str(text).strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(value[-1:], None)
    number = value[:-1] if scale is not None else value
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds != seconds:
        raise ConfigError("budget", text, "allowed: a duration > 0 such as 10m, 150s, 90 (seconds) or 1h")
    return seconds


@dataclass(frozen=True)
class Decision:
    experiment: str
    action: str  # "as planned", "reduced" or "left out"
    why: str = ""
    options: dict = field(default_factory=dict)  # the experiment's options as it runs

    def line(self) -> str:
        return f"{self.experiment}: {self.action}" + (f" ({self.why})" if self.why else "")


class Budget:
    """The study's budget, its pace and its plan for the rest (module docstring)."""

    def __init__(self, seconds: float | None, experiments: list[str], options: dict[str, dict], *, quick: bool,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds, self.quick, self.clock = seconds, quick, clock
        self.remaining = list(experiments)  # not started yet, in order
        self.planned = {name: dict(options.get(name) or {}) for name in experiments}
        self.options = {name: dict(options) for name, options in self.planned.items()}  # as the plan has it now
        self.final: set[str] = set()  # experiments decided (run, reduced or left out)
        self.started = clock()
        self.spent_ref = 0.0  # reference seconds of what has finished
        self.spent = 0.0  # seconds it took here
        self.decisions: list[Decision] = []
        self.reduced: set[str] = set()
        self.left_out: set[str] = set()
        self.took: dict[str, float] = {}  # seconds each experiment took here (its top-ups added: lab.study.top_up)

    # ------------------------------------------------------------ pace

    def reference_s(self, name: str) -> float:
        """An experiment's reference seconds at its current launches."""
        if name in self.left_out:
            return 0.0
        full, quick = REFERENCE_S.get(name, (DEFAULT_S, DEFAULT_S))
        ref = quick if self.quick else full
        planned = REFERENCE_LAUNCHES.get(name, (1, 1))[1 if self.quick else 0]
        launches = self.options.get(name, {}).get("launches")
        return ref * (launches / planned if isinstance(launches, int) and launches > 0 else 1.0)

    def finished(self, name: str, seconds: float) -> None:
        """A part of the study took `seconds` here."""
        if name in self.remaining:
            self.remaining.remove(name)
        self.spent_ref += self.reference_s(name) if name != "reference" else REFERENCE_S["reference"][0]
        self.spent += seconds

    @property
    def pace(self) -> float:
        """Seconds here per reference second: what has finished, with `PRIOR_S` reference seconds at the reference
        machine's pace (1.0) added, so that one short noisy part (the reference cell alone) cannot swing it far."""
        return (self.spent + PRIOR_S) / (self.spent_ref + PRIOR_S)

    def predicted_s(self) -> float:
        """Seconds the rest of the study takes at the current pace and plan."""
        rest = sum(self.reference_s(n) for n in self.remaining) + REFERENCE_S["reference"][0]  # its second launch, at the end
        return self.pace * (rest + REFERENCE_S["report"][1 if self.quick else 0])

    def eta_s(self) -> float:
        return self.predicted_s()

    def left_s(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - (self.clock() - self.started)

    # ------------------------------------------------------------ plan

    def plan(self, current: str) -> None:
        """Cut the rest of the plan until its prediction fits the time left (module docstring's order). Only the
        current experiment's cut is final: the later ones are planned again at their turn, at the pace then known
        (one slow cell early on must not leave out what a later, better estimate keeps)."""
        for name in self.remaining:
            if name not in self.final:
                self.options[name] = dict(self.planned[name])
                self.reduced.discard(name)
                self.left_out.discard(name)
        if self.seconds is None:
            return
        for name in self.remaining:
            if self.predicted_s() <= self.left_s():
                return
            launches = self.options[name].get("launches")
            if name not in self.final and isinstance(launches, int) and launches > MIN_LAUNCHES:
                self.options[name]["launches"] = MIN_LAUNCHES
                self.reduced.add(name)
        for name in LEAVE_OUT_ORDER:
            if self.predicted_s() <= self.left_s():
                return
            if name in self.remaining and name not in self.final:
                self.left_out.add(name)

    def _why(self, name: str) -> str:
        rest = self.predicted_s()
        self.left_out.discard(name)
        self.options[name] = dict(self.planned[name])
        full = self.predicted_s()
        return (f"the rest of the study with {name} as planned: {full:.0f} s at this machine's pace "
                f"({self.pace:.2f}x the reference machine's time), {max(0.0, self.left_s()):.0f} s of the "
                f"{self.seconds:.0f} s budget left; {rest:.0f} s with the cuts, which are made in order: fewer "
                "launches first, then experiments left out")

    def decide(self, name: str) -> Decision:
        """What to do with the next experiment: its options as planned or reduced, or leave it out."""
        self.plan(name)
        self.final.add(name)
        if name in self.left_out:
            decision = Decision(name, "left out", self._why(name))
            self.left_out.add(name)
        elif name in self.reduced:
            options = dict(self.options[name])
            why = self._why(name)
            self.options[name] = options
            decision = Decision(name, "reduced", f"{self.planned[name]['launches']} -> {MIN_LAUNCHES} launches per "
                                                 f"cell; {why}", options)
        else:
            return Decision(name, "as planned", "", dict(self.options[name]))
        self.decisions.append(decision)
        return decision

    def notes(self) -> list[str]:
        """The reductions, one line each (empty: the study ran as planned)."""
        return [d.line() for d in self.decisions]
