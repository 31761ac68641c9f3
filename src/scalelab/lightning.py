"""Measure a PyTorch Lightning training run: one callback, the same run as `scalelab train` records.

    from scalelab.lightning import ScalelabCallback
    trainer = lightning.Trainer(..., callbacks=[ScalelabCallback()])

Under `scalelab run -- python train.py` the callback uses the probe `scalelab run` opened; run alone (`python
train.py`, Lightning's own launcher, or torchrun) it records a new run in the store (`store=`, $SCALELAB_STORE or
./scalelab-runs), as `scalelab.probe.open()` does, with the trainer's ranks (Lightning's launcher does not set
RANK) and a run id its rank 0 broadcasts.

A training batch is one step, its stages read from Lightning's hooks:
- data: from the end of the previous batch (or the start of the epoch) to `on_train_batch_start`: fetching the
  batch, and Lightning's own work between batches;
- forward: `on_train_batch_start` to `on_before_backward` (training_step; with automatic optimisation also
  zero_grad, which Lightning runs after training_step);
- backward: `on_before_backward` to `on_after_backward` (DDP's gradient all-reduce is metered here);
- optimizer: `on_before_optimizer_step` to `on_train_batch_end`;
- the rest of the batch (gradient clipping, logging) is the step's `other`.
Validation inside fit is outside every step. With gradient accumulation a step is a batch, and only the
batches that step the optimizer have an optimizer stage.
"""
from __future__ import annotations

import os
import sys

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # a user's script: one line saying what to install, exit 2, as the CLI does for bad input
    print("error: scalelab.lightning needs PyTorch Lightning, which is not installed: "
          "pip install 'scalelab[lightning]'", file=sys.stderr)
    raise SystemExit(2) from None

from scalelab.distenv import DistContext
from scalelab.run.probe import Probe, batch_samples, current
from scalelab.run.standalone import open_standalone, shared_run_id


class ScalelabCallback(Callback):
    """Records the fit as a scalelab run (module docstring)."""

    def __init__(self, *, store: str | None = None, warmup_steps: int = 2, sample_interval_s: float = 0.5):
        self.store, self.warmup_steps, self.sample_interval_s = store, warmup_steps, sample_interval_s
        self.run: Probe | None = None
        self._open_stage = None  # the probe stage entered and not yet left

    # ------------------------------------------------------------ the run
    def setup(self, trainer, pl_module, stage: str) -> None:
        # after the process group is up, before Lightning wraps the model in DDP (so its buckets are metered)
        if stage != "fit" or self.run is not None:
            return
        found = current()
        if found is not None:
            found.instrumented = True
            self.run = found
            return

        ctx = DistContext(trainer.global_rank, trainer.world_size, trainer.local_rank,
                          max(1, trainer.world_size // max(1, trainer.num_nodes)), trainer.strategy.root_device)
        run_id = None
        if ctx.world > 1:  # every rank needs the id rank 0 records
            run_id = trainer.strategy.broadcast(shared_run_id(dict(os.environ)) if ctx.rank == 0 else None, src=0)
        self.run = open_standalone(store=self.store, warmup_steps=self.warmup_steps,
                                   sample_interval_s=self.sample_interval_s, ctx=ctx, run_id=run_id)

    # ------------------------------------------------------------ stages
    def _enter(self, name: str) -> None:
        self._leave()
        self._open_stage = self.run.stage(name)
        self._open_stage.__enter__()

    def _leave(self) -> None:
        if self._open_stage is not None:
            self._open_stage.__exit__(None, None, None)
            self._open_stage = None

    def _wait_for_batch(self) -> None:
        self._leave()
        self.run.start_step()
        self._enter("data")

    def _outside_steps(self) -> None:
        """Leave the step in progress: one that only waited for a batch is dropped (the probe's rule)."""
        self._leave()
        self.run.leave_step()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._wait_for_batch()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.run is None:
            return
        self._leave()
        if not self.run.in_step:  # after a validation inside the epoch: this step did not wait for its batch
            self.run.start_step()
        samples = batch_samples(batch)
        if samples is not None:
            self.run.mark(samples=samples)
        self._enter("forward")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self.run is not None and self.run.in_step:
            self._enter("backward")

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._leave()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.run is not None and self.run.in_step:
            self._enter("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.run is not None:
            self._leave()
            self.run.end_step()
            self._wait_for_batch()

    def on_validation_start(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._outside_steps()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._outside_steps()

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            self._outside_steps()
