"""Built-in models, activation checkpointing and user-model loading."""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scalelab.errors import ConfigError, ModelError
from scalelab.zoo.models import (build_model, count_parameters, parameter_bytes, run_blocks, segment_bounds,
                                 set_checkpoint_segments)
from scalelab.zoo.registry import models
from scalelab.zoo.spec import DataSpec
from scalelab.zoo.user import build_user_model, load_callable

IMAGE = DataSpec(kind="image", shape=(3, 32, 32), num_classes=10)
SEQ1D = DataSpec(kind="seq1d", shape=(1, 40), num_classes=10)
TOKENS = DataSpec(kind="tokens", shape=(16,), num_classes=32)
SPECS = {"image": IMAGE, "seq1d": SEQ1D, "tokens": TOKENS}
COMPATIBLE = {"mlp": ["image", "seq1d", "tokens"], "cnn": ["image", "seq1d"], "resnet18": ["image"],
              "vgg11": ["image"], "vit_tiny": ["image"], "gpt_tiny": ["tokens"]}
CASES = [(name, kind) for name, kinds in COMPATIBLE.items() for kind in kinds]
# Small sizes for the float64 checkpoint comparison; defaults are covered by the shape/grad test.
TINY = {"mlp": dict(width=32, depth=4), "cnn": {}, "resnet18": dict(width=8), "vgg11": dict(width=8),
        "vit_tiny": dict(dim=24, depth=4, heads=3), "gpt_tiny": dict(dim=16, depth=4, heads=2)}


def batch(spec, n=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if spec.kind == "tokens":
        x = torch.randint(0, spec.num_classes, (n, *spec.shape), generator=g)
        return x, torch.randint(0, spec.num_classes, (n, *spec.shape), generator=g)
    return torch.randn(n, *spec.shape, generator=g, dtype=dtype), torch.randint(0, spec.num_classes, (n,), generator=g)


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def test_registry_names():
    assert set(models.names()) == set(COMPATIBLE)
    assert {e.name: list(e.inputs) for e in models.entries()} == COMPATIBLE


@pytest.mark.parametrize("name,kind", CASES)
def test_default_model_shape_and_finite_grads(name, kind):
    spec = SPECS[kind]
    torch.manual_seed(0)
    model = build_model(name, spec).train()
    assert isinstance(model.blocks, nn.Sequential) and len(model.blocks) >= 2
    assert model.checkpoint_segments == 0
    x, y = batch(spec)
    logits = model(x)
    expected = (2, *spec.shape, spec.num_classes) if kind == "tokens" else (2, spec.num_classes)
    assert tuple(logits.shape) == expected
    loss_of(logits, y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
    assert count_parameters(model) > 0
    assert parameter_bytes(model) == 4 * count_parameters(model)


@pytest.mark.parametrize("name,kind", CASES)
def test_checkpointing_gives_same_loss_and_grads(name, kind):
    spec = SPECS[kind]
    torch.manual_seed(0)
    model = build_model(name, spec, **TINY[name]).double().train()  # train: BatchNorm uses batch stats
    x, y = batch(spec, dtype=torch.float64)

    def run(segments):
        set_checkpoint_segments(model, segments)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = loss_of(model(x), y)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_off, grads_off = run(0)
    loss_on, grads_on = run(2)
    torch.testing.assert_close(loss_on, loss_off, rtol=1e-10, atol=1e-12)
    for n in grads_off:  # running stats differ (recompute updates them twice), so only grads are compared
        torch.testing.assert_close(grads_on[n], grads_off[n], rtol=1e-8, atol=1e-10, msg=n)


def test_run_blocks_actually_checkpoints():
    calls = []

    class Count(nn.Module):
        def forward(self, x):
            calls.append(1)
            return torch.sin(x)  # saves its input, so backward must recompute it

    blocks = nn.Sequential(Count(), Count(), Count(), Count())
    x = torch.ones(2, requires_grad=True)
    run_blocks(blocks, x, 2).sum().backward()
    assert len(calls) == 4 + 4  # both segments, the last one too, are recomputed in backward
    calls.clear()
    run_blocks(blocks, x, 1).sum().backward()
    assert len(calls) == 4 + 4  # one segment checkpoints everything (torch's checkpoint_sequential: nothing)
    calls.clear()
    with torch.no_grad():
        run_blocks(blocks, x, 2)
    blocks.eval()
    run_blocks(blocks, x, 2).sum().backward()
    assert len(calls) == 8  # no recompute when not training / without grad


def test_segments_are_contiguous_and_as_even_as_possible():
    assert segment_bounds(5, 2) == [(0, 3), (3, 5)]
    assert segment_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert segment_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert segment_bounds(8, 1) == [(0, 8)]


def test_recompute_context_is_entered_once_per_segment_in_backward():
    entered = []

    @contextmanager
    def recompute():
        entered.append(torch.is_grad_enabled())
        yield

    blocks = nn.Sequential(*[nn.Linear(3, 3) for _ in range(5)])
    out = run_blocks(blocks, torch.ones(2, 3), 3, recompute)
    assert entered == []  # forward: not yet
    out.sum().backward()
    assert entered == [True, True, True]


def test_gpt_tiny_is_causal():
    torch.manual_seed(0)
    model = build_model("gpt_tiny", TOKENS, dim=16, depth=2, heads=2).eval()
    x, _ = batch(TOKENS)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % TOKENS.num_classes
    with torch.no_grad():
        a, b = model(x), model(x2)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_mlp_on_tokens_does_not_see_future():
    model = build_model("mlp", TOKENS, width=16, depth=2).eval()
    x, _ = batch(TOKENS)
    x2 = x.clone()
    x2[:, 5] = (x2[:, 5] + 1) % TOKENS.num_classes
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], model(x2)[:, :5])


def test_default_parameter_counts():
    assert count_parameters(build_model("cnn", SEQ1D)) == 5210  # the MNIST-1D paper's ConvBase
    assert count_parameters(build_model("resnet18", IMAGE)) == 11_173_962
    assert count_parameters(build_model("vgg11", IMAGE)) == 9_231_114


def test_set_checkpoint_segments_errors():
    model = build_model("cnn", SEQ1D)
    set_checkpoint_segments(model, 3)
    assert model.checkpoint_segments == 3
    for bad in (4, -1):
        with pytest.raises(ModelError) as err:
            set_checkpoint_segments(model, bad)
        assert "SmallCNN" in str(err.value) and str(bad) in str(err.value) and "0..3" in str(err.value)
    with pytest.raises(ModelError, match="Linear.*blocks"):
        set_checkpoint_segments(nn.Linear(2, 2), 1)


@pytest.mark.parametrize("name,kind", [("gpt_tiny", "image"), ("resnet18", "seq1d"), ("vgg11", "tokens"),
                                       ("vit_tiny", "seq1d"), ("cnn", "tokens")])
def test_incompatible_kind(name, kind):
    with pytest.raises(ConfigError) as err:
        build_model(name, SPECS[kind])
    assert err.value.field == "model" and f"dataset gives {kind}" in str(err.value) and name in str(err.value)


def test_unknown_model_and_option():
    with pytest.raises(ConfigError) as err:
        build_model("resnet50", IMAGE)
    msg = str(err.value)
    assert "resnet50" in msg and all(n in msg for n in models.names()) and "module:function" in msg
    with pytest.raises(ConfigError, match="colour.*dim, depth"):
        build_model("gpt_tiny", TOKENS, colour=3)
    with pytest.raises(ConfigError, match="32x32"):
        build_model("vgg11", DataSpec(kind="image", shape=(1, 28, 28), num_classes=10))


USER_FILE = """
from torch import nn
def make(spec):
    return nn.Linear(spec.shape[-1], spec.num_classes)
def make_plain():
    return nn.Linear(4, 2)
def boom(spec):
    raise RuntimeError("bad\\nthing")
def not_module():
    return 42
def two(a, b):
    return nn.Linear(1, 1)
VALUE = 3
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "mymodels.py"
    path.write_text(USER_FILE)
    return path


def test_user_model_from_file(user_file, monkeypatch):
    model = build_model(f"{user_file}:make", SEQ1D)
    assert isinstance(model, nn.Linear) and model.in_features == 40
    monkeypatch.chdir(user_file.parent)  # relative path, function without a spec argument
    assert build_model("./mymodels.py:make_plain", SEQ1D).in_features == 4
    assert build_model("mymodels.py:make_plain", SEQ1D).in_features == 4


def test_user_model_from_module(tmp_path, monkeypatch):
    pkg = tmp_path / "userpkg_scalelab_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(USER_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert build_model("userpkg_scalelab_test.nets:make", IMAGE).in_features == 32
    assert load_callable("userpkg_scalelab_test.nets:make_plain", "model")().out_features == 2


def _error(ref, exc=ModelError):
    with pytest.raises(exc) as err:
        build_user_model(ref, SEQ1D)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("model: ")
    return msg


def test_user_model_failures(user_file, tmp_path):
    msg = _error(f"{tmp_path}/missing.py:make")
    assert "file not found" in msg and "missing.py:make" in msg
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n\ndef make(:\n    pass\n")
    msg = _error(f"{bad}:make")
    assert "SyntaxError at line 3" in msg
    crash = tmp_path / "crash.py"
    crash.write_text("raise ValueError('import\\ntime')\n")
    assert "ValueError: import time" in _error(f"{crash}:make")
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    assert "SystemExit" in _error(f"{exits}:make")
    assert "no function 'nope' in mymodels.py" in _error(f"{user_file}:nope")
    assert "not callable" in _error(f"{user_file}:VALUE")
    msg = _error(f"{user_file}:boom")
    assert "raised RuntimeError: bad thing" in msg
    assert "returned int" in _error(f"{user_file}:not_module") and "nn.Module" in _error(f"{user_file}:not_module")
    assert "no arguments or one" in _error(f"{user_file}:two")
    assert "ImportError: No module named 'no_such_pkg_xyz'" in _error("no_such_pkg_xyz.mod:make")
    for ref in ("justaname", "mod:", ":make", "mod:not-ident"):
        assert "module:function or path/file.py:function" in _error(ref, ConfigError)
