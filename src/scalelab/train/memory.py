"""Memory by kind of one rank's training run, read around its first step (issue 12 item 4).

- parameters: distinct storages of the trainable parameters;
- gradients: distinct storages of their .grad after the first step's backward and gradient sync (before
  zero_grad); with accumulation, after the last micro-step, so the accumulated gradients;
- optimizer state: distinct storages of the tensors in `optimizer.state`, read when the run ends (a GradScaler may
  skip the first steps, which then create no state; the size does not change once it exists);
- activations: `ActivationProbe` over the FIRST micro-step's forward + backward of the first step (with
  accumulation, one micro-batch's activations: the memory a micro-step needs; the micro-batches are views of the
  rank's batch, so a saved input counts the whole batch's storage, which the loop holds anyway).

Not measured under nn.DataParallel over several GPUs: its replicas run forward in threads of their own, which
saved-tensor hooks (thread-local) do not reach, so the probe would see almost nothing.

The probed step is the run's first, a warm-up step when warmup_steps > 0; with warmup_steps = 0 its timing
includes the probe's hooks (a few Python calls per saved tensor). No other step carries a hook.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from scalelab.measure.activations import ActivationProbe, storage_bytes


class MemoryByKind:
    """One rank's memory by kind: `probe()` around the first micro-step, `read_gradients()` after the first
    step's gradient sync, `result()` at the end (the keys of the rank result's "memory" dict)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device, *,
                 net: torch.nn.Module | None = None):
        """`model` is the unwrapped model, `net` what the loop calls (a wrapper of it, or it)."""
        self.model, self.optimizer, self.device = model, optimizer, device
        self.hooks_reach = not (isinstance(net, torch.nn.DataParallel) and len(net.device_ids) > 1)
        self.activations: ActivationProbe | None = None
        self.gradients: int | None = None

    @contextmanager
    def probe(self) -> Iterator[None]:
        """Measure the activations of the forward + backward inside; the model's checkpointed segments (zoo
        models: their `recompute_context`) report their recomputation to it."""
        if not self.hooks_reach:
            yield
            return
        self.activations = ActivationProbe(self.model, device=self.device)
        reports = hasattr(self.model, "recompute_context")
        if reports:
            previous = self.model.recompute_context
            self.model.recompute_context = self.activations.recompute_context
        try:
            with self.activations:
                yield
        finally:
            if reports:
                self.model.recompute_context = previous  # no hook on any other step

    def read_gradients(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        self.gradients = storage_bytes(grads)

    def result(self) -> dict[str, float]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        out = {"parameters(bytes)": float(storage_bytes(params)),
               "optimizer_state(bytes)": float(storage_bytes(state))}
        if self.gradients is not None:
            out["gradients(bytes)"] = float(self.gradients)
        if self.activations is not None:
            act = self.activations.result()
            out["activations_saved(bytes)"] = float(act.saved)
            if act.backward_peak is not None:
                out["activations_backward_peak(bytes)"] = float(act.backward_peak)
            if act.cuda_max_allocated is not None:  # the CUDA allocator over the probed micro-step: a cross-check
                out["probe_cuda_max_allocated(bytes)"] = float(act.cuda_max_allocated)
                out["probe_cuda_allocated_before(bytes)"] = float(act.cuda_allocated_before)
        return out
