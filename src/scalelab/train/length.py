"""How long a run's timed part lasts with `steps: auto`: until the median step is known precisely enough, or the
time budget is spent (in the spirit of torch.utils.benchmark's `blocked_autorange`, which times blocks until the
interquartile range is small or a time budget runs out).

- The sample is the slowest rank's wall time of every timed step (warm-up excluded): the step time the summary
  reports (scalelab.analysis.summary), so the loop and the summary judge the same numbers.
- Stop for precision: at least `min_steps` timed steps and the 95 % interval of their median
  (scalelab.analysis.precision.relative_half_width) within +-target of the median, on its wider side.
- Stop for the budget: the timed steps' wall times (the slowest rank's) add up to `budget_s`. Warm-up, evaluation,
  set-up and the agreement below are not counted.
- With several ranks every rank must stop at the same step. Every `every` timed steps, after the step has ended
  (outside every timed span), one all_reduce(MAX) of those steps' wall times gives every rank the same slowest-rank
  times, and each rank applies the same rule to the same numbers: one small collective per `every` steps and no
  broadcast. One process decides after every step with no collective.
- On CUDA a step's wall time is read when the next step has ended (scalelab.train.late), so the rule sees step k
  after step k+1 has run and a run stops one step later than the same times would stop it on the CPU; the steps
  read, and where, depend on step counts alone, so every rank still decides on the same steps at the same step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from scalelab.analysis.precision import relative_half_width

AGREE_EVERY = 4  # timed steps between two agreements of the ranks (a stop comes up to AGREE_EVERY - 1 steps late)


@dataclass
class AutoLength:
    """The stop rule of an auto-length run; `after_step` is fed every timed step's wall time on every rank."""

    target: float  # fraction of the median (0.03 = +-3 %)
    budget_s: float
    min_steps: int
    reduce: Callable[[list[float]], list[float]] | None = None  # element-wise MAX over ranks; None: one process
    every: int = 1  # timed steps between two decisions (between two calls of `reduce`)
    walls: list[float] = field(default_factory=list)  # the slowest rank's timed step times decided on so far
    reason: str | None = None  # "precision" or "budget" once the rule said stop
    _pending: list[float] = field(default_factory=list)

    def after_step(self, wall_s: float) -> bool:
        """One more timed step of `wall_s` seconds (this rank's); True when the run stops after it."""
        self._pending.append(wall_s)
        if self.reason is not None or len(self._pending) < self.every:
            return self.reason is not None
        self.walls.extend(self.reduce(self._pending) if self.reduce else self._pending)
        self._pending = []
        if len(self.walls) >= self.min_steps and relative_half_width(self.walls) <= self.target:
            self.reason = "precision"
        elif sum(self.walls) >= self.budget_s:
            self.reason = "budget"
        return self.reason is not None

    def result(self) -> dict:
        """What the rank's result records about the length (the summary recomputes precision from the records)."""
        return {"target_precision": self.target, "time_budget(s)": self.budget_s, "stopped_by": self.reason or "epochs"}


def max_over_ranks(device) -> Callable[[list[float]], list[float]]:
    """Element-wise MAX of a few floats over all ranks of the default group (one all_reduce; on `device`, which
    must be the CUDA device for nccl). Reading the result back is a CPU-GPU sync point, outside the timed spans."""
    import torch
    import torch.distributed as dist

    def reduce(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    return reduce
