"""Activation memory of one forward + backward, exactly: what autograd keeps for backward, in bytes.

    probe = ActivationProbe(model, device=device)
    model.recompute_context = probe.recompute_context  # only where checkpoint(..., context_fn=...) reads it
    with probe:
        loss = loss_fn(model(x), y)
        loss.backward()
    probe.result().saved, probe.result().backward_peak

Definitions:
- saved: the distinct storages saved for backward during forward (`torch.autograd.graph.saved_tensors_hooks`),
  excluding the storages of the module's parameters and buffers; a storage saved twice counts once (the key is
  its device and `untyped_storage().data_ptr()`, its bytes `untyped_storage().nbytes()`). With non-reentrant
  checkpointing the probe sees a segment's inputs (torch 2.13 saves them with `_make_saved_tensor`, under the
  current hooks) but not the segment's internal saves: those go to checkpoint's own hooks, which is the memory
  checkpointing saves. Under autocast, the low-precision weight copies that ops save count too (they are not
  the parameters' storages, and live until backward like activations).
- backward_peak: the largest live saved-for-backward bytes at any moment of backward, including what
  checkpointing recomputes. Live bytes fall as autograd frees each node's saved tensors (the probe's pack returns
  a holder that only autograd's SavedVariable owns; freeing it releases the storage's count). A non-reentrant
  segment's recomputation materialises all of its saved tensors at once (early stop) and releases them during
  that segment's backward, so that segment's peak is the live bytes at recomputation plus the recomputed storages
  not already live; they are taken as released before the next segment recomputes (backward runs segments in
  reverse order; checked on torch 2.13: at each recomputation no checkpoint frame still holds recomputed tensors).
  Saves made during backward outside a recompute context (reentrant checkpointing recomputes under the probe's
  own hooks) are tracked as live, not counted as saved.

Private torch API: recomputed saves are seen inside torch's `_recomputation_hook`, by `recompute_context`
(checkpoint's `context_fn` enters it there), which reads the current top hooks with
`torch._C._autograd._top_saved_tensors_default_hooks` and pushes a counting pass-through pair. Where that
function is missing, a recomputation makes `backward_peak` None (with a one-time warning); `saved` stays exact.
Checkpoints not given `recompute_context` recompute unseen.

Under the probe, as under any saved-tensor hooks, autograd does not check saved tensors for in-place changes.
"""
from __future__ import annotations

import itertools
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.autograd.graph import saved_tensors_hooks

_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
_warned_no_top_hooks = False
_no_storage = itertools.count()  # keys for tensors without a storage (sparse, some subclasses): each counts alone


def storage_key(t: torch.Tensor) -> tuple[object, int]:
    """(device, storage address): equal for every view of one storage."""
    try:
        return t.device, t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return "no storage", next(_no_storage)


def storage_nbytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and repeats count once)."""
    seen: dict[tuple[object, int], int] = {}
    for t in tensors:
        seen.setdefault(storage_key(t), storage_nbytes(t))
    return sum(seen.values())


@dataclass(frozen=True)
class ActivationMemory:
    saved: int  # bytes saved for backward during forward (distinct storages, parameters and buffers excluded)
    backward_peak: int | None  # bytes; None when backward was not seen or a recomputation could not be observed
    recomputations: int  # checkpointed segments recomputed under the probe's recompute context
    cuda_max_allocated: int | None = None  # torch.cuda.max_memory_allocated over the probe (bytes), a cross-check
    cuda_allocated_before: int | None = None  # torch.cuda.memory_allocated when the probe was entered (bytes)


class _Saved:
    """What autograd's SavedVariable holds instead of the tensor: freeing it releases the storage's count."""

    __slots__ = ("tensor", "key", "probe")

    def __init__(self, tensor: torch.Tensor, key: tuple[object, int], probe: ActivationProbe):
        # detached: an output saved as itself would form a cycle (tensor -> grad_fn -> holder -> tensor) that
        # keeps the graph alive when backward never runs
        self.tensor, self.key, self.probe = tensor.detach(), key, probe

    def __del__(self) -> None:
        self.probe._release(self.key)


class ActivationProbe:
    """Measures `ActivationMemory` of the forward + backward run inside `with probe:` (see the module docstring)."""

    def __init__(self, module: torch.nn.Module | None = None, *, device: torch.device | None = None):
        self.module, self.device = module, device
        # on CUDA, backward's hooks run in autograd's device thread; reentrant: a holder freed by the garbage
        # collector while the lock is held releases its count in the same thread
        self._lock = threading.RLock()
        self._excluded: set[tuple[object, int]] = set()
        self._count: dict[tuple[object, int], int] = {}  # live holders per storage
        self._nbytes: dict[tuple[object, int], int] = {}
        self._live = 0
        self._saved = 0
        self._in_backward = False
        self._peak: int | None = None
        self._unseen_recompute = False
        self._recomputations = 0
        self._cuda: tuple[int, int] | None = None
        self._cuda_before: int | None = None
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> ActivationProbe:
        if self.module is not None:
            tensors = itertools.chain(self.module.parameters(), self.module.buffers())
            self._excluded = {storage_key(t) for t in tensors}
        self._cuda_before = None
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)  # host-side allocator counters: no device sync
            self._cuda_before = torch.cuda.memory_allocated(self.device)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        if self._cuda_before is not None:
            self._cuda = (torch.cuda.max_memory_allocated(self.device), self._cuda_before)

    def result(self) -> ActivationMemory:
        with self._lock:
            if self._unseen_recompute:
                peak = None
            elif self._peak is None:  # no unpack seen: backward did not run, unless nothing was saved
                peak = 0 if self._saved == 0 else None
            else:
                peak = self._peak
            cuda = self._cuda or (None, None)
            return ActivationMemory(self._saved, peak, self._recomputations, *cuda)

    # ------------------------------------------------------------ outer hooks
    def _pack(self, t: torch.Tensor):
        key = storage_key(t)
        if key in self._excluded:
            return t  # a parameter or buffer: alive anyway, not an activation
        with self._lock:
            count = self._count.get(key, 0)
            self._count[key] = count + 1
            if count == 0:
                nbytes = storage_nbytes(t)
                self._nbytes[key] = nbytes
                self._live += nbytes
                if self._in_backward:
                    self._peak = max(self._peak or 0, self._live)
                else:
                    self._saved += nbytes
        return _Saved(t, key, self)

    def _unpack(self, packed):
        if not isinstance(packed, _Saved):
            return packed
        with self._lock:
            self._enter_backward()
        return packed.tensor

    def _enter_backward(self) -> None:
        """At the first unpack or recomputation (lock held): backward has freed nothing yet, so the live bytes now
        are backward's starting level."""
        if not self._in_backward:
            self._in_backward = True
            self._peak = max(self._peak or 0, self._live)

    def _release(self, key: tuple[object, int]) -> None:
        with self._lock:
            count = self._count.get(key, 0) - 1
            if count > 0:
                self._count[key] = count
            elif count == 0:
                del self._count[key]
                self._live -= self._nbytes.pop(key)

    # ------------------------------------------------------------ recomputation
    def recompute_context(self):
        """For checkpoint(..., context_fn=lambda: (nullcontext(), probe.recompute_context())): the recompute
        context is entered inside torch's `_recomputation_hook`, whose pack sees every recomputed save."""
        return self._recompute()

    @contextmanager
    def _recompute(self) -> Iterator[None]:
        global _warned_no_top_hooks
        if _top_hooks is None:
            with self._lock:
                self._unseen_recompute = True
            if not _warned_no_top_hooks:
                _warned_no_top_hooks = True
                warnings.warn("this torch has no torch._C._autograd._top_saved_tensors_default_hooks: "
                              "recomputed activations cannot be counted, backward peak not reported")
            yield
            return
        top = _top_hooks(False)
        if top is None:  # no hooks to wrap: not inside a recomputation, nothing is saved through here
            yield
            return
        pack, unpack = top
        with self._lock:
            self._recomputations += 1
            self._enter_backward()
        seen: set[tuple[object, int]] = set()
        extra = 0  # recomputed bytes not already live

        def counting_pack(t: torch.Tensor):
            nonlocal extra
            key = storage_key(t)
            if key not in self._excluded and key not in seen:
                seen.add(key)
                with self._lock:
                    if key not in self._count:
                        extra += storage_nbytes(t)
                    self._peak = max(self._peak or 0, self._live + extra)
            return pack(t)  # may raise torch's early-stop signal: counted first, on purpose

        with saved_tensors_hooks(counting_pack, unpack):
            yield
