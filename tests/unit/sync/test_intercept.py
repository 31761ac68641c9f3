"""Collectives metered without scalelab's loop: torch.distributed calls and DDP models, in a one-rank gloo group
(a real process group in this process: DDP and gloo run their real code paths, with nothing to wait for)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from scalelab.sync import intercept
from scalelab.sync.intercept import payload
from scalelab.sync.meter import CommMeter


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


PARAM_BYTES = 4 * (8 * 16 + 16 + 16 * 4 + 4)


def train_step(net: nn.Module) -> None:
    net(torch.ones(2, 8)).sum().backward()


def test_direct_calls_are_metered_with_their_bytes_and_put_back_after(group):
    original = dist.all_reduce
    meter = CommMeter(1)
    intercept.install(meter, phase=lambda: "optimizer")
    dist.all_reduce(torch.ones(10))
    dist.all_reduce(torch.ones(6, dtype=torch.float64), async_op=True).wait()
    dist.broadcast(torch.ones(3), src=0)
    out = [torch.zeros(5)]
    dist.all_gather(out, torch.ones(5))
    totals = meter.take_step()
    assert [(e[0], e[1], e[4]) for e in totals["comm_events"]] == [
        ("allreduce", "optimizer", 40), ("allreduce", "optimizer", 48), ("broadcast", "optimizer", 12),
        ("allgather", "optimizer", 20)]
    intercept.uninstall()
    assert dist.all_reduce is original
    dist.all_reduce(torch.ones(1))
    assert meter.take_step()["collectives"] == 0


@pytest.mark.parametrize("order", ["before", "after"])
def test_the_users_comm_hook_is_kept_whichever_comes_first(group, order):
    """DDP takes one comm hook. `before`: the user's hook was registered before the probe attached (its
    torch.distributed calls are metered); `after`: it goes into the probe's routing slot."""
    calls = []

    def my_hook(state, bucket):
        calls.append(bucket.buffer().numel())
        return default_hooks.allreduce_hook(state, bucket)

    meter = CommMeter(1)
    net = DDP(model())
    if order == "before":
        net.register_comm_hook(None, my_hook)
    intercept.install(meter)  # finds the model alive
    if order == "after":
        net.register_comm_hook(None, my_hook)
    for _ in range(2):
        train_step(net)
        totals = meter.take_step()
        assert totals["comm_bytes_backward"] == PARAM_BYTES
    assert sum(calls) == 2 * PARAM_BYTES // 4


def test_a_model_built_while_installed_is_routed_and_refuses_a_second_hook(group):
    meter = CommMeter(1)
    intercept.install(meter)
    net = DDP(model())
    net.register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # its Python twin, metered
    train_step(net)
    assert meter.take_step()["comm_bytes_backward"] == PARAM_BYTES
    with pytest.raises(RuntimeError, match="only be called once"):
        net.register_comm_hook(None, default_hooks.allreduce_hook)


def test_a_model_without_a_hook_is_metered_as_scalelab_trains_it(group):
    meter = CommMeter(1)
    intercept.install(meter)
    net = DDP(model())
    train_step(net)
    train_step(net)
    assert meter.take_step()["comm_events"][0][4] == PARAM_BYTES  # one bucket: the model is < 25 MiB


@pytest.mark.parametrize("name,args,world,rank,expected", [
    ("all_reduce", {"tensor": torch.ones(4)}, 4, 0, (16, 16)),
    ("all_gather_into_tensor", {"input_tensor": torch.ones(4)}, 4, 1, (16, 64)),
    ("reduce_scatter_tensor", {"input": torch.ones(8)}, 4, 1, (32, 32)),
    ("reduce_scatter", {"input_list": [torch.ones(2)] * 4}, 4, 1, (32, 32)),
    ("gather", {"tensor": torch.ones(4), "dst": 0}, 4, 0, (48, 64)),
    ("gather", {"tensor": torch.ones(4), "dst": 0}, 4, 2, (16, 64)),
    ("scatter", {"tensor": torch.ones(4), "src": 1}, 4, 1, (48, 64)),
])
def test_payload_follows_the_meters_conventions(name, args, world, rank, expected):
    assert payload(name, args, world, rank) == expected


def test_cpu_tensors_are_timed_by_the_clock_even_where_the_meter_times_cuda(group):
    # a script running gloo on CPU tensors on a machine with a GPU: the probe's meter is made for CUDA, but CUDA
    # events would time an idle stream. Here (no GPU needed) making one would fail: the call must not try
    meter = CommMeter(1, devices=[torch.device("cuda", 0)])
    intercept.install(meter)
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(2), async_op=True).wait()
    step = meter.take_step()
    assert step["collectives"] == 2 and step["comm_bytes"] == 24 and step["comm_total(s)"] > 0
    assert not intercept.on_cuda({"tensor": torch.ones(1)}) and not intercept.on_cuda({"input_list": []})
