"""Memory by kind around one step of a zoo model: the probe sees the checkpointed segments' recomputation only
inside `probe()`, and the optimizer state appears with the first optimizer step."""
from __future__ import annotations

import torch

from scalelab.train.memory import MemoryByKind
from scalelab.zoo.models import build_model, set_checkpoint_segments
from scalelab.zoo.spec import DataSpec

SPEC = DataSpec(kind="seq1d", shape=(1, 40), num_classes=10)
F32 = 4


def test_one_probed_step_of_a_checkpointed_mlp():
    torch.manual_seed(0)
    model = build_model("mlp", SPEC, width=8, depth=2).train()
    set_checkpoint_segments(model, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    memory = MemoryByKind(model, optimizer, torch.device("cpu"))
    x, batch = torch.randn(3, 1, 40), 3
    with memory.probe():
        assert model.recompute_context == memory.activations.recompute_context
        model(x).sum().backward()
    assert model.recompute_context is None  # the next steps run without the probe
    memory.read_gradients()
    assert memory.result()["optimizer_state(bytes)"] == 0  # SGD makes its momentum buffers on the first step
    optimizer.step()
    out = memory.result()
    params = ((40 * 8 + 8) + (8 * 8 + 8) + (8 * 10 + 10)) * F32
    assert out["parameters(bytes)"] == out["gradients(bytes)"] == out["optimizer_state(bytes)"] == params
    assert memory.activations.result().recomputations == 2
    # two segments of one (Linear, ReLU) block: forward keeps each segment's input, x (flattened: a view) and r1
    # (B x 8), and the head's input r2 (B x 8); backward recomputes segment 2 (r2' while x, r1 live: the head has
    # freed r2), then segment 1 (r1' while x live)
    x_bytes, r = batch * 40 * F32, batch * 8 * F32
    assert out["activations_saved(bytes)"] == x_bytes + 2 * r
    assert out["activations_backward_peak(bytes)"] == x_bytes + 2 * r


def test_no_activations_under_data_parallel_over_several_gpus():
    model = build_model("mlp", SPEC, width=8, depth=1)
    net = torch.nn.DataParallel(model)
    net.device_ids = [0, 1]  # as on a two-GPU node: replicas would run forward in threads the hooks do not reach
    memory = MemoryByKind(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"), net=net)
    with memory.probe():
        model(torch.randn(2, 1, 40)).sum().backward()
    out = memory.result()
    assert "activations_saved(bytes)" not in out and out["parameters(bytes)"] > 0
