"""Activation memory against byte counts worked out by hand: what each op saves for backward is known."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conftest import TINY_MLP
from scalelab.analysis import keys
from scalelab.config import TrainConfig
from scalelab.measure.activations import ActivationProbe, storage_bytes
from scalelab.run.execute import execute
from scalelab.zoo.models import run_blocks

F32 = 4
B, D0, D1, D2, D3 = 4, 8, 32, 12, 4  # distinct widths, so a wrong term cannot give the right total


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D0, D1), nn.ReLU(), nn.Linear(D1, D2), nn.ReLU(), nn.Linear(D2, D3))


def measure(blocks: nn.Module, segments: int, device: str = "cpu"):
    blocks = blocks.to(device)
    x = torch.randn(B, D0, device=device)
    probe = ActivationProbe(blocks, device=torch.device(device))
    with probe:
        run_blocks(blocks, x, segments, probe.recompute_context).sum().backward()  # sum() saves nothing
    return probe.result()


# What each op saves (fp32; weights are parameters, excluded; ReLU is not in place):
#   Linear(D0,D1) saves its input x: B*D0
#   ReLU saves its output r1: B*D1, which Linear(D1,D2) saves as its input: the same storage, once
#   Linear(D1,D2)'s output h2 (B*D2) is saved by nobody without checkpointing
#   ReLU saves its output r2: B*D2, the same storage as Linear(D2,D3)'s input
X, R1, H2, R2 = B * D0 * F32, B * D1 * F32, B * D2 * F32, B * D2 * F32
EXPECTED = {
    # off: x, r1, r2 saved; all of them live when backward starts
    0: (X + R1 + R2, X + R1 + R2),
    # one segment of all 5 blocks: forward keeps only its input x; backward recomputes r1 and r2 at once, x live
    1: (X, X + R1 + R2),
    # two segments, [Linear ReLU Linear] [ReLU Linear]: forward keeps both inputs, x and h2. Backward recomputes
    # segment 2 first (r2, with x and h2 live), then frees h2 with segment 2 and recomputes segment 1 (x, live
    # already, and r1): max(x + h2 + r2, x + r1)
    2: (X + H2, max(X + H2 + R2, X + R1)),
}


@pytest.mark.parametrize("segments", [0, 1, 2])
def test_mlp_saved_and_backward_peak_by_hand(segments):
    result = measure(mlp(), segments)
    assert (result.saved, result.backward_peak) == EXPECTED[segments]
    assert result.recomputations == segments


@pytest.mark.parametrize("segments", [1, 2])
def test_reentrant_checkpointing_recomputes_under_the_probes_own_hooks(segments):
    blocks, x = mlp(), torch.randn(B, D0, requires_grad=True)  # reentrant checkpoint needs an input with grad
    probe = ActivationProbe(blocks)
    with probe:
        for start, stop in ((0, 5),) if segments == 1 else ((0, 3), (3, 5)):
            x = checkpoint(blocks[start:stop], x, use_reentrant=True)
        x.sum().backward()
    assert (probe.result().saved, probe.result().backward_peak) == EXPECTED[segments]


def test_two_segment_peak_sees_the_second_segment_input_freed():
    # max(x + h2 + r2, x + r1) = x + r1 here; had h2 stayed live into segment 1's recompute it would be larger
    assert EXPECTED[2][1] == X + R1 < X + H2 + R1


def test_the_same_storage_saved_twice_counts_once():
    a = torch.randn(100, requires_grad=True)
    probe = ActivationProbe()
    with probe:
        (a * a).sum().backward()  # mul saves both operands: one storage
    assert probe.result().saved == 100 * F32
    probe = ActivationProbe()
    with probe:
        (a.view(10, 10) * a.view(10, 10).t()).sum().backward()  # two views of one storage
    assert probe.result().saved == 100 * F32
    probe = ActivationProbe()
    with probe:
        (a * a.clone()).sum().backward()  # equal values, two storages
    assert probe.result().saved == 2 * 100 * F32


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((5,), 2.0))
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(x * self.scale)  # mul saves the buffer (x needs grad); Linear saves x*scale and its weight


def test_parameters_and_buffers_are_excluded():
    model, x = Scaled(), torch.randn(7, 5, requires_grad=True)
    probe = ActivationProbe(model)
    with probe:
        model(x).sum().backward()
    assert probe.result().saved == 7 * 5 * F32  # x*scale only
    unaware = ActivationProbe()  # told no module: the weight (3x5) and the buffer (5) count too
    with unaware:
        model(x).sum().backward()
    assert unaware.result().saved == 7 * 5 * F32 + 3 * 5 * F32 + 5 * F32


def test_no_backward_no_peak_and_nothing_leaks():
    blocks = mlp()
    probe = ActivationProbe(blocks)
    with probe:
        out = blocks(torch.randn(B, D0))
    assert probe.result().saved == X + R1 + R2 and probe.result().backward_peak is None
    del out  # the probe's holders must not keep the graph alive (a cycle through the saved output)
    assert probe._live == 0


def test_without_torchs_private_top_hooks_the_peak_is_not_reported(monkeypatch):
    from scalelab.measure import activations

    monkeypatch.setattr(activations, "_top_hooks", None)
    monkeypatch.setattr(activations, "_warned_no_top_hooks", False)
    with pytest.warns(UserWarning, match="_top_saved_tensors_default_hooks"):
        checkpointed = measure(mlp(), 2)
    assert (checkpointed.saved, checkpointed.backward_peak) == (EXPECTED[2][0], None)  # saved stays exact
    plain = measure(mlp(), 0)  # nothing recomputed: the peak needs no private API
    assert (plain.saved, plain.backward_peak) == EXPECTED[0]


def test_storage_bytes_counts_distinct_storages():
    w = torch.zeros(6, 4)
    assert storage_bytes([w, w.t(), w[1:3], torch.zeros(2)]) == 6 * 4 * F32 + 2 * F32


def test_a_training_run_records_memory_by_kind(store, tmp_path):
    path = tmp_path / "tiny_mlp.py"
    path.write_text(TINY_MLP)
    batch = 8
    cfg = TrainConfig(model=f"{path}:make", dataset="synthetic", samples=32, eval_samples=8, global_batch=batch,
                      steps=2, warmup_steps=1, optimizer="sgd", momentum=0.9)
    summary = execute(cfg, store, say=lambda s: None).summary
    params = (3 * 32 * 32 * 16 + 16 * 16 + 16 * 10) * F32  # the bias-free Linear weights of TINY_MLP
    assert summary[keys.MEMORY_PARAMETERS_BYTES] == params
    assert summary[keys.MEMORY_GRADIENTS_BYTES] == params
    assert summary[keys.MEMORY_OPTIMIZER_BYTES] == params  # SGD momentum: one buffer per parameter
    # the model saves its flattened input (the batch), r1 and r2 (B x 16 each); the loss (cross-entropy =
    # log_softmax + nll_loss) saves log_softmax's output (B x 10), the int64 targets and nll's 0-dim total weight
    saved = batch * 3 * 32 * 32 * F32 + 2 * batch * 16 * F32 + batch * 10 * F32 + batch * 8 + F32
    assert summary[keys.MEMORY_ACTIVATIONS_BYTES] == saved
    assert summary[keys.MEMORY_ACTIVATIONS_PEAK_BYTES] == saved  # no checkpointing: all live as backward starts
    # accumulation: the first micro-step (half the batch) is probed; its input and targets are views of the
    # whole batch, whose storages count whole
    half = batch // 2
    micro = batch * 3 * 32 * 32 * F32 + 2 * half * 16 * F32 + half * 10 * F32 + batch * 8 + F32
    summary = execute(dataclasses.replace(cfg, accumulate=2), store, say=lambda s: None).summary
    assert summary[keys.MEMORY_ACTIVATIONS_BYTES] == micro
    assert summary[keys.MEMORY_GRADIENTS_BYTES] == params


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("segments", [0, 1, 2])
def test_mlp_by_hand_on_cuda(segments):
    result = measure(mlp(), segments, "cuda")
    assert (result.saved, result.backward_peak) == EXPECTED[segments]
    # the allocator's view of the same step: at least the saved bytes were allocated at once beyond what was there
    assert result.cuda_max_allocated - result.cuda_allocated_before >= result.saved
