"""Measure your own training script: a few lines in your loop, the same run as `scalelab train` records.

    from scalelab import probe                        # 1
    run = probe.open()                                # 2  before the model is wrapped in DDP
    for x, y in run.data(loader):                     # 3  a step per batch; the wait for it is "data"
        with run.stage("forward"):                    # 4
            loss = F.cross_entropy(model(x), y)
        with run.stage("backward"):                   # 5  DDP's gradient all-reduce is metered here
            loss.backward()
        with run.stage("optimizer"):                  # 6
            opt.step(); opt.zero_grad()

Under `scalelab run -- python train.py ARGS` the run directory is the one `scalelab run` made (`open()` returns
the probe it opened before your script started); run alone (`python train.py`, or your own `torchrun`), `open()`
records a new run in the store (`--store` / $SCALELAB_STORE / ./scalelab-runs) and finishes it when the process
exits. Rank and world size come from torchrun's environment. Any stage name of yours works
(`run.stage("augment")`); `run.step(samples=n)` marks a step without a loader; `run.mark(samples=n, loss=x)`
sets the step's samples or keeps a number in its record. Collectives are metered while the probe is open: a DDP
model's buckets (your own comm hook is kept, registered before or after), and `torch.distributed` calls.
"""
from __future__ import annotations

from scalelab.run.probe import Probe, current
from scalelab.run.standalone import open_standalone

__all__ = ["Probe", "open", "current"]


def open(*, store: str | None = None, warmup_steps: int = 2, sample_interval_s: float = 0.5) -> Probe:  # noqa: A001
    """This rank's probe: the one `scalelab run` opened, else a new run in the store (see the module docstring)."""
    found = current()
    if found is not None:
        found.instrumented = True
        return found

    return open_standalone(store=store, warmup_steps=warmup_steps, sample_interval_s=sample_interval_s)
