"""The model, dataset and hardware-preset registries: every entry builds, names are unique, a registered entry is
accepted and listed everywhere, and the errors name the registry's names."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from scalelab.analysis.hardware import Hardware
from scalelab.perf.hardware import PRESETS, hardware_from_dict, presets
from scalelab.cli.options import config_flags
from scalelab.errors import ConfigError
from scalelab.zoo.data import DataBundle, EncodedImages, build_data
from scalelab.zoo.models import build_model
from scalelab.zoo.registry import DatasetEntry, ModelEntry, datasets, models
from scalelab.zoo.spec import DataSpec

SMALL = {"image": DataSpec(kind="image", shape=(3, 32, 32), num_classes=4),
         "seq1d": DataSpec(kind="seq1d", shape=(1, 40), num_classes=4),
         "tokens": DataSpec(kind="tokens", shape=(8,), num_classes=16)}
KINDS = tuple(SMALL)


def test_names_are_unique_and_plain():
    for registry in (models, datasets, presets):
        names = registry.names()
        assert names and len(names) == len(set(names)) and all(n and ":" not in n for n in names)
        assert all(e.description.strip() and "\n" not in e.description for e in registry.entries())


@pytest.mark.parametrize("entry", models.entries(), ids=lambda e: e.name)
def test_every_model_builds_for_the_inputs_it_takes_and_refuses_the_others(entry):
    assert entry.inputs and set(entry.inputs) <= set(KINDS)
    for kind in KINDS:
        spec = SMALL[kind]
        if kind not in entry.inputs:
            with pytest.raises(ConfigError, match=f"{entry.name} needs .* data; dataset gives {kind}"):
                build_model(entry.name, spec)
            continue
        model = build_model(entry.name, spec).eval()
        x = torch.randint(0, spec.num_classes, (2, *spec.shape)) if kind == "tokens" else torch.randn(2, *spec.shape)
        with torch.no_grad():
            assert model(x).shape[-1] == spec.num_classes


def write_cifar(root):
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"labels": [int(v) for v in rng.integers(0, 10, 2)],
                 b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8)}
        (root / name).write_bytes(pickle.dumps(batch))


def write_mnist(root):
    import struct

    root.mkdir()
    rng = np.random.default_rng(0)
    for name, arr in {"train-images-idx3-ubyte": rng.integers(0, 256, (3, 28, 28)),
                      "train-labels-idx1-ubyte": rng.integers(0, 10, 3),
                      "t10k-images-idx3-ubyte": rng.integers(0, 256, (2, 28, 28)),
                      "t10k-labels-idx1-ubyte": rng.integers(0, 10, 2)}.items():
        head = struct.pack(">I", 0x800 | arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
        (root / name).write_bytes(head + arr.astype(np.uint8).tobytes())


def write_folder(root):
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), 50 * c + i, dtype=np.uint8)).save(root / name / f"{i}.png")


ON_DISK = {"cifar10": write_cifar, "mnist": write_mnist, "imagefolder": write_folder}


@pytest.mark.parametrize("entry", datasets.entries(), ids=lambda e: e.name)
def test_every_dataset_builds_with_few_samples_as_its_entry_says(entry, tmp_path):
    path = None
    if entry.on_disk:
        assert entry.name in ON_DISK, f"add a tiny on-disk fixture for {entry.name}"
        ON_DISK[entry.name](tmp_path / "d")
        path = str(tmp_path / "d")
        with pytest.raises(ConfigError, match="data_path"):
            build_data(entry.name)
    else:
        with pytest.raises(ConfigError, match="data_path"):
            build_data(entry.name, path=str(tmp_path))
    bundle = build_data(entry.name, path=path, samples=6, eval_samples=4, image_size=8, seq_len=5, vocab=7,
                        augment=entry.augments)
    assert isinstance(bundle, DataBundle) and bundle.spec.kind == entry.kind
    x, y = bundle.train[0]
    assert tuple(x.shape) == bundle.spec.shape and len(bundle.eval) > 0
    assert entry.decodes == isinstance(bundle.train, EncodedImages)
    if not entry.augments:
        with pytest.raises(ConfigError, match="augment"):
            build_data(entry.name, path=path, augment=True)


class Tiny(nn.Module):
    def __init__(self, spec, *, hidden: int = 3):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(spec.shape)), hidden),
                                 nn.Linear(hidden, spec.num_classes))

    def forward(self, x):
        return self.net(x)


@pytest.fixture
def registered():
    """A model and a dataset registered for one test (like a plug-in would), removed afterwards."""
    model = models.register(ModelEntry(name="tiny_test", builder=Tiny, description="a test model", inputs=("seq1d",)))
    data = datasets.register(DatasetEntry(
        name="ones_test", kind="seq1d", description="a test dataset",
        builder=lambda *, samples, eval_samples, **_: DataBundle(
            torch.utils.data.TensorDataset(torch.ones(samples, 1, 3), torch.zeros(samples, dtype=torch.long)),
            torch.utils.data.TensorDataset(torch.ones(eval_samples, 1, 3), torch.zeros(eval_samples, dtype=torch.long)),
            DataSpec(kind="seq1d", shape=(1, 3), num_classes=2))))
    config_flags.cache_clear()
    yield model, data
    models.unregister(model.name)
    datasets.unregister(data.name)
    config_flags.cache_clear()


def test_a_registered_model_and_dataset_are_built_listed_and_checked(registered):
    model, data = registered
    assert model.options == ("hidden",) and models.get("tiny_test") is model
    bundle = build_data("ones_test", samples=5, eval_samples=2)
    net = build_model("tiny_test", bundle.spec, hidden=4)
    assert net(bundle.train[0][0][None]).shape == (1, 2)
    with pytest.raises(ConfigError, match="tiny_test accepts: hidden"):
        build_model("tiny_test", bundle.spec, width=3)
    with pytest.raises(ConfigError, match="tiny_test needs seq1d data; dataset gives image"):
        build_model("tiny_test", SMALL["image"])
    help_of = {f.field: f.help for f in config_flags()}
    assert "tiny_test" in help_of["model"] and "ones_test" in help_of["dataset"]
    assert "ones_test" not in help_of["data_path"] and "cifar10" in help_of["data_path"]
    assert "tiny_test" in _message(lambda: build_model("nope", SMALL["image"]))
    assert "ones_test" in _message(lambda: build_data("nope"))
    with pytest.raises(ValueError, match="already registered"):
        models.register(model)
    with pytest.raises(ValueError, match="already registered"):
        datasets.register(DatasetEntry(name="mnist", builder=data.builder, description="x", kind="image"))


def test_unregistered_names_are_gone_from_help_and_errors():
    models.register(ModelEntry(name="gone_test", builder=Tiny, description="d", inputs=("seq1d",)))
    models.unregister("gone_test")
    config_flags.cache_clear()
    try:
        assert "gone_test" not in {f.field: f.help for f in config_flags()}["model"]
    finally:
        config_flags.cache_clear()
    with pytest.raises(ConfigError, match="gone_test"):
        build_model("gone_test", SMALL["seq1d"])


def _message(fn) -> str:
    with pytest.raises(ConfigError) as err:
        fn()
    return str(err.value)


def test_errors_and_help_name_every_registered_name():
    help_of = {f.field: f.help for f in config_flags()}
    for registry, fail, field in ((models, lambda: build_model("nope", SMALL["image"]), "model"),
                                  (datasets, lambda: build_data("nope"), "dataset")):
        message = _message(fail)
        assert "nope" in message and all(n in message for n in registry.names()) and "module:function" in message
        assert all(n in help_of[field] for n in registry.names())
    assert all(e.name in help_of["data_path"] for e in datasets.entries() if e.on_disk)
    message = _message(lambda: hardware_from_dict({"preset": "nope"}))
    assert "hardware.preset" in message and all(n in message for n in presets.names())


def test_hardware_presets_registry():
    for entry in presets.entries():
        assert isinstance(entry.hardware, Hardware) and presets.get(entry.name) is entry
        assert PRESETS[entry.name] is entry.hardware
        assert hardware_from_dict({"preset": entry.name}) == entry.hardware
    assert tuple(PRESETS) == presets.names()
    with pytest.raises(TypeError):
        PRESETS["mine"] = PRESETS["10gbe"]  # a read-only view; the registry is the one place
    message = _message(lambda: presets.get("nope"))
    assert all(n in message for n in presets.names())
