"""Meter the collectives of code scalelab did not write: a user's script calling `torch.distributed` directly, and
a user's `DistributedDataParallel` model.

While `install(meter, phase)` is in effect (a probe is open, scalelab.run.probe):
- the collectives of `torch.distributed` (all_reduce, broadcast, all_gather, all_gather_into_tensor,
  reduce_scatter, reduce_scatter_tensor, gather, scatter) are replaced by wrappers that record each call in the
  CommMeter, with the byte conventions of scalelab.sync.meter: a synchronous call from the call to its return, an
  asynchronous one (`async_op=True`) from launch to its future's completion. A collective called from inside
  another metered one (`all_gather_object` calling `all_gather`) is the same traffic and is recorded once;
- a `DistributedDataParallel` built while installed (and any one alive when `install` is called) gets a Python
  comm hook that routes every bucket through `torch.distributed.all_reduce`, so the wrappers above see it. DDP
  accepts one comm hook per model: the user's own `register_comm_hook` after that replaces the hook *inside* the
  routing slot instead of failing (their hook runs, its collectives are metered), and a built-in one
  (`register_builtin_comm_hook`) is replaced by its Python twin. A model whose user registered a hook before the
  probe could attach keeps it: its collectives, made through `torch.distributed`, are metered all the same.
  DDP's buffer broadcast before a forward is metered too (scalelab.sync.ddp.meter_buffer_broadcast).

`phase()` names the phase a collective serves (a CommMeter phase); `progress()` is told of every collective
(a collective is progress for the hang watchdog's heartbeat). Names bound before `install`
(`from torch.distributed import all_reduce`) keep the original function and are not metered.

`steps` (scalelab.run.found_steps.FoundSteps, or anything with its four methods) is told of every forward of an
attached DDP model (before it runs, with its inputs, and after) and of every `Optimizer.step` (torch's global
optimizer hooks, begin and end): where a script marks no steps, the probe finds them there.
"""
from __future__ import annotations

import functools
import gc
import inspect
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d

from scalelab.sync.base import tensor_bytes
from scalelab.sync.meter import CommMeter

# torch.distributed function -> the meter's op name
OPS = {"all_reduce": "allreduce", "broadcast": "broadcast", "all_gather": "allgather",
       "all_gather_into_tensor": "allgather", "reduce_scatter": "reduce_scatter",
       "reduce_scatter_tensor": "reduce_scatter", "gather": "gather", "scatter": "scatter"}


def _list_bytes(tensors) -> int:
    return sum(tensor_bytes(t) for t in tensors or [])


def payload(name: str, args: dict, world: int, rank: int) -> tuple[int, int]:
    """(nbytes, alg_bytes) of one call, by scalelab.sync.meter's conventions (S = this rank's tensor)."""
    if name in ("all_reduce", "broadcast"):
        s = tensor_bytes(args["tensor"])
        return s, s
    if name == "all_gather":
        s = tensor_bytes(args["tensor"])
        return s, world * s
    if name == "all_gather_into_tensor":
        s = tensor_bytes(args["input_tensor"])
        return s, world * s
    if name == "reduce_scatter":
        s = _list_bytes(args["input_list"])
        return s, s
    if name == "reduce_scatter_tensor":
        s = tensor_bytes(args["input"])
        return s, s
    s = tensor_bytes(args["tensor"])  # gather / scatter: the root moves everyone's slice but its own
    root = args.get("dst" if name == "gather" else "src")
    return ((world - 1) * s if rank == (root or 0) else s), world * s


def on_cuda(args: dict) -> bool:
    """Whether a call's data is on a CUDA device (its first tensor argument): only then is it timed by CUDA events.
    A script may run gloo on CPU tensors on a machine with a GPU; events would time an idle stream there."""
    for key in ("tensor", "input_tensor", "input", "input_list", "tensor_list"):
        value = args.get(key)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None and hasattr(value, "is_cuda"):
            return bool(value.is_cuda)
    return False


@dataclass
class _Installed:
    meter: CommMeter
    phase: Callable[[], str]
    progress: Callable[[], None]
    originals: dict
    steps: Any = None
    handles: tuple = ()


_state: _Installed | None = None
_inside = threading.local()  # set while a metered collective runs: nested calls are the same traffic


def installed() -> bool:
    return _state is not None


def _metered(name: str, fn: Callable) -> Callable:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        state = _state
        if state is None or getattr(_inside, "busy", False):
            return fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        group = bound.arguments.get("group")
        world = dist.get_world_size(group)
        nbytes, alg = payload(name, bound.arguments, world, dist.get_rank())
        meter, phase = state.meter, state.phase()
        start, mark = meter.now(), meter.device_mark() if on_cuda(bound.arguments) else None
        _inside.busy = True
        try:
            work = fn(*args, **kwargs)
        finally:
            _inside.busy = False
        state.progress()
        if state.steps is not None:
            state.steps.collective()
        if bound.arguments.get("async_op") and work is not None:
            # recorded when the collective completes; the caller keeps waiting on its own Work
            meter.track(work.get_future(), OPS[name], nbytes, phase=phase, start=start, alg_bytes=alg, mark=mark)
        else:
            meter.record(OPS[name], nbytes, meter.now() - start, phase=phase, alg_bytes=alg,
                         events=None if mark is None else (mark, meter.device_mark()))
        return work

    call.__scalelab_original__ = fn
    return call


def install(meter: CommMeter, phase: Callable[[], str] = lambda: "backward",
            progress: Callable[[], None] = lambda: None, steps: Any = None) -> None:
    """Meter torch.distributed's collectives and DDP models into `meter` until `uninstall`; one at a time."""
    global _state
    if _state is not None:
        raise RuntimeError("collectives are already being metered (one probe per process)")
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    originals = {name: getattr(dist, name) for name in OPS}
    originals["DDP.__init__"] = DDP.__init__
    handles = ()
    if steps is not None:  # torch's global hooks: every optimizer's step, whoever built it
        handles = (register_optimizer_step_pre_hook(lambda *_: steps.optimizer_begin()),
                   register_optimizer_step_post_hook(lambda *_: steps.optimizer_end()))
    _state = _Installed(meter, phase, progress, originals, steps, handles)
    for name in OPS:
        wrapped = _metered(name, originals[name])
        setattr(dist, name, wrapped)
        setattr(distributed_c10d, name, wrapped)
    init = originals["DDP.__init__"]

    @functools.wraps(init)
    def ddp_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if _state is not None:
            attach_ddp(self, _state.meter)

    DDP.__init__ = ddp_init
    with warnings.catch_warnings():  # isinstance on every object touches torch's deprecated aliases
        warnings.simplefilter("ignore")
        built = [obj for obj in gc.get_objects() if isinstance(obj, DDP)]
    for net in built:  # models built before the probe opened
        attach_ddp(net, meter)


def stop_finding_steps() -> None:
    """Tell `steps` nothing more (the script marks its own steps: scalelab.probe.open)."""
    if _state is not None:
        for handle in _state.handles:
            handle.remove()
        _state.steps, _state.handles = None, ()


def uninstall() -> None:
    """Put torch.distributed and DDP back as they were (models already attached keep their routing hook)."""
    global _state
    if _state is None:
        return
    from torch.nn.parallel import DistributedDataParallel as DDP

    for name in OPS:
        setattr(dist, name, _state.originals[name])
        setattr(distributed_c10d, name, _state.originals[name])
    DDP.__init__ = _state.originals["DDP.__init__"]
    for handle in _state.handles:
        handle.remove()
    _state = None


class HookSlot:
    """The one comm hook DDP gets from scalelab: it calls the hook in the slot (torch's allreduce_hook until the
    user registers their own), whose collectives go through torch.distributed and so through the meter."""

    def __init__(self, net):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.net = net
        self.state, self.hook = net.process_group, default_hooks.allreduce_hook
        self.user = False  # whether the user put a hook in the slot

        def scalelab_routed_hook(state, bucket):  # DDP checks the parameter is named `bucket`, logs the name
            return self.hook(self.state, bucket)

        self.routed = scalelab_routed_hook

    def register(self, state, hook) -> None:
        """The model's `register_comm_hook` while attached: the user's hook goes into the slot (once, as DDP)."""
        if self.user:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self.net._check_comm_hook(hook)
        self.state, self.hook, self.user = state, hook, True

    def register_builtin(self, comm_hook_type) -> None:
        """A built-in (C++) hook becomes its Python twin, whose collectives can be metered."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        twins = {dist.BuiltinCommHookType.ALLREDUCE: default_hooks.allreduce_hook,
                 dist.BuiltinCommHookType.FP16_COMPRESS: default_hooks.fp16_compress_hook}
        self.register(self.net.process_group, twins[comm_hook_type])


def _forward_pre(net, args, kwargs) -> None:
    state = _state
    if state is not None and state.steps is not None:
        state.steps.forward(net, args, kwargs)


def _forward_post(net, args, output) -> None:
    state = _state
    if state is not None and state.steps is not None:
        state.steps.after_forward(net)


def attach_ddp(net, meter: CommMeter) -> None:
    """Route `net`'s buckets through the slot hook (unless its user registered a hook already), meter its
    buffer broadcast and tell the installed `steps` of its forwards; attaching twice does nothing."""
    from scalelab.sync.ddp import meter_buffer_broadcast

    if getattr(net, "scalelab_hook_slot", None) is not None:
        return
    # the hooks stay on the model after `uninstall` (as the routing hook does) and do nothing then
    net.register_forward_pre_hook(_forward_pre, with_kwargs=True)
    net.register_forward_hook(_forward_post)
    hooks = getattr(net, "_comm_hooks", [])
    if hooks:  # the user's hook is in place: its torch.distributed calls are metered where they are made
        if not all(callable(h) for h, _ in hooks):
            warnings.warn("a built-in DDP comm hook was registered before the probe: its collectives are not metered")
        net.scalelab_hook_slot = False
    else:
        slot = HookSlot(net)
        net.register_comm_hook(None, slot.routed)
        net.register_comm_hook = slot.register  # instance attributes: DDP's own methods stay untouched
        net.register_builtin_comm_hook = slot.register_builtin
        net.scalelab_hook_slot = slot
    meter_buffer_broadcast(net, meter)

