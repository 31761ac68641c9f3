import math

import pytest
import torch

from scalelab.train.lr import LARS, lr_at, target_lr


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8)),
                                           ("linear_warmup", 0.8), ("lars", 0.8)])
def test_target_lr_at_8x_the_base_batch(rule, expected):
    assert target_lr(rule, 0.1, 64, 512) == pytest.approx(expected)


def test_linear_warmup_ramps_from_base_to_target():
    lrs = [lr_at(s, rule="linear_warmup", base_lr=0.1, base_batch=32, batch=128, warmup=4) for s in range(6)]
    assert lrs == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert lr_at(0, rule="linear", base_lr=0.1, base_batch=32, batch=128, warmup=4) == pytest.approx(0.4)


def test_unknown_rule():
    with pytest.raises(ValueError, match="allowed"):
        target_lr("cosine", 0.1, 1, 1)


def test_lars_trust_ratio_and_update_match_a_hand_computation():
    w = torch.tensor([[3.0, 4.0]])  # ||w|| = 5
    g = torch.tensor([[0.6, 0.8]])  # ||g|| = 1
    trust, wd, lr = 0.01, 0.1, 2.0
    # local = 0.01 * 5 / (1 + 0.1 * 5) = 0.05 / 1.5
    assert LARS.trust_ratio(w, g, wd, trust) == pytest.approx(0.05 / 1.5)
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    opt = LARS([p], lr=lr, momentum=0.9, weight_decay=wd, trust=trust, clip=False)
    opt.step()
    expected = w - lr * (0.05 / 1.5) * (g + wd * w)
    assert torch.allclose(p.detach(), expected)
    p.grad = g.clone()
    opt.step()  # second step: momentum carries the first update
    v1 = lr * (0.05 / 1.5) * (g + wd * w)
    w1 = w - v1
    local2 = trust * float(w1.norm()) / (1 + wd * float(w1.norm()))
    v2 = 0.9 * v1 + lr * local2 * (g + wd * w1)
    assert torch.allclose(p.detach(), w1 - v2, atol=1e-6)


@pytest.mark.parametrize("lr,layer_lr", [(2.0, 0.05 / 1.5), (0.01, 0.01)])
def test_larc_clips_the_layer_lr_at_the_trust_ratio(lr, layer_lr):
    """LARC: the layer's lr is min(lr, trust * ||w|| / (||g|| + wd * ||w||)), never lr times the ratio."""
    w, g = torch.tensor([[3.0, 4.0]]), torch.tensor([[0.6, 0.8]])
    p = torch.nn.Parameter(w.clone())
    p.grad = g.clone()
    LARS([p], lr=lr, momentum=0.9, weight_decay=0.1, trust=0.01).step()  # ratio = 0.05 / 1.5
    assert torch.allclose(p.detach(), w - layer_lr * (g + 0.1 * w))


def test_lars_leaves_1d_parameters_unadapted():
    b = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    b.grad = torch.tensor([0.5, 0.5])
    LARS([b], lr=0.1, momentum=0.0, weight_decay=0.5).step()
    assert torch.allclose(b.detach(), torch.tensor([0.95, 1.95]))
