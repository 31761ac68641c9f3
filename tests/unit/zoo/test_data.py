"""Datasets: shapes, determinism, learnability, augmentation, on-disk formats and every bad input."""
from __future__ import annotations

import gzip
import os
import pickle
import struct
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from scalelab.errors import ConfigError, DataError
from scalelab.zoo import mnist1d
from scalelab.zoo.data import DataBundle, build_data, crop_flip
from scalelab.zoo.registry import datasets
from scalelab.zoo.spec import DataSpec


def stack(ds, n=None):
    items = [ds[i] for i in range(len(ds) if n is None else n)]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def one_line_error(exc_type, fn, *names):
    """Run fn, expect exc_type with a one-line message mentioning every name; return the message."""
    with pytest.raises(exc_type) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    for name in names:
        assert str(name) in msg, (name, msg)
    return msg


# ---------------------------------------------------------------- synthetic sets

def test_synthetic_shapes_determinism_and_learnable():
    b = build_data("synthetic", samples=600, eval_samples=300, image_size=16, seed=3)
    assert isinstance(b, DataBundle) and b.spec == DataSpec(kind="image", shape=(3, 16, 16), num_classes=10)
    assert (len(b.train), len(b.eval)) == (600, 300)
    x, y = b.train[5]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64 and y.dim() == 0
    xtr, ytr = stack(b.train)
    xte, yte = stack(b.eval)
    assert torch.bincount(ytr, minlength=10).tolist() == [60] * 10  # balanced
    again = build_data("synthetic", samples=600, eval_samples=300, image_size=16, seed=3)
    assert torch.equal(stack(again.train)[0], xtr) and torch.equal(stack(again.eval)[1], yte)
    other = build_data("synthetic", samples=600, eval_samples=300, image_size=16, seed=4)
    assert not torch.equal(stack(other.train)[0], xtr)
    # nearest class mean (from train) classifies eval well above chance (10 %), but not perfectly
    means = torch.stack([xtr[ytr == c].mean(0) for c in range(10)]).flatten(1)
    acc = (torch.cdist(xte.flatten(1), means).argmin(1) == yte).float().mean().item()
    assert 0.4 < acc < 1.0, acc


def test_synthetic_augment_is_crop_and_flip():
    plain = build_data("synthetic", samples=20, eval_samples=10, image_size=8)
    aug = build_data("synthetic", samples=20, eval_samples=10, image_size=8, augment=True)
    x0, y0 = plain.train[3]
    x1, y1 = aug.train[3]
    assert y0 == y1 and x1.shape == x0.shape
    candidates = _crop_flip_candidates(x0.numpy(), fill=0.0)
    assert any(np.array_equal(x1.numpy(), c) for c in candidates)


def test_synthetic_tokens_follow_a_learnable_rule():
    b = build_data("synthetic_tokens", samples=300, eval_samples=100, seq_len=20, vocab=16, seed=1)
    assert b.spec == DataSpec(kind="tokens", shape=(20,), num_classes=16)
    x, y = b.train[0]
    assert x.shape == y.shape == (20,) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[1:], y[:-1])  # y is x shifted by one: next-token targets
    xtr, ytr = stack(b.train)
    assert int(xtr.min()) >= 0 and int(xtr.max()) < 16
    # a bigram table learned on train predicts eval next tokens far above chance (1/16)
    counts = torch.zeros(16, 16)
    counts.index_put_((xtr.flatten(), ytr.flatten()), torch.ones(xtr.numel()), accumulate=True)
    xte, yte = stack(b.eval)
    acc = (counts.argmax(1)[xte] == yte).float().mean().item()
    assert acc > 0.8, acc
    assert torch.equal(stack(build_data("synthetic_tokens", samples=300, eval_samples=100, seq_len=20,
                                         vocab=16, seed=1).eval)[0], xte)


def _crop_flip_candidates(img: np.ndarray, fill: float, pad: int = 4):
    c, h, w = img.shape
    padded = np.full((c, h + 2 * pad, w + 2 * pad), fill, dtype=img.dtype)
    padded[:, pad:pad + h, pad:pad + w] = img
    for i in range(2 * pad + 1):
        for j in range(2 * pad + 1):
            crop = padded[:, i:i + h, j:j + w]
            yield crop
            yield crop[:, :, ::-1]


def test_synthetic_jpeg_decodes_and_augments():
    b = build_data("synthetic_jpeg", samples=24, eval_samples=8, image_size=16, seed=2)
    assert b.spec == DataSpec(kind="image", shape=(3, 16, 16), num_classes=10)
    assert all(isinstance(s, bytes) and s[:2] == b"\xff\xd8" for s in b.train.sources)  # stored as JPEG
    x, y = b.eval[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    # eval: decoded without augmentation, identical every time and on every build
    assert torch.equal(stack(b.eval)[0], stack(b.eval)[0])
    rebuilt = build_data("synthetic_jpeg", samples=24, eval_samples=8, image_size=16, seed=2)
    assert torch.equal(stack(rebuilt.eval)[0], stack(b.eval)[0])
    # the decoded image is close to the synthetic one it was made from (JPEG is lossy)
    ref = stack(build_data("synthetic", samples=24, eval_samples=8, image_size=16, seed=2).eval)[0]
    assert torch.corrcoef(torch.stack([ref.flatten(), stack(b.eval)[0].flatten()]))[0, 1] > 0.8
    # train: two epochs differ, and only by a crop + flip of the same decoded image
    epoch1, labels1 = stack(b.train)
    epoch2, labels2 = stack(b.train)
    assert torch.equal(labels1, labels2) and not torch.equal(epoch1, epoch2)
    unaugmented = type(b.train)(b.train.sources, b.train.y, dataset="synthetic_jpeg", image_size=16,
                                mean=(0.0,) * 3, std=(1.0,) * 3, offset=128.0, scale=40.0, resample=4)
    for i in (0, 7):
        base = unaugmented[i][0].numpy()
        fill = 0.0  # crops pad with the encoding's mid-grey (u8 128), which normalises to 0
        for ep in (epoch1, epoch2):
            assert any(np.allclose(ep[i].numpy(), c, atol=1e-6) for c in _crop_flip_candidates(base, fill))
    # set_epoch makes augmentation a function of (seed, epoch, index): epoch 0 replays exactly
    b.train.set_epoch(0)
    assert torch.equal(stack(b.train)[0], epoch1)
    b.train.set_epoch(1)
    assert not torch.equal(stack(b.train)[0], epoch1)


def test_synthetic_jpeg_same_batches_with_workers():
    from torch.utils.data import DataLoader

    b = build_data("synthetic_jpeg", samples=16, eval_samples=4, image_size=8)
    b.train.set_epoch(0)
    serial = [x for x, _ in DataLoader(b.train, batch_size=4)]
    b.train.set_epoch(0)
    parallel = [x for x, _ in DataLoader(b.train, batch_size=4, num_workers=2)]
    assert all(torch.equal(a, c) for a, c in zip(serial, parallel, strict=True))


# ---------------------------------------------------------------- mnist1d

def test_mnist1d_defaults_shapes_and_determinism():
    b = build_data("mnist1d")
    assert b.spec == DataSpec(kind="seq1d", shape=(1, 40), num_classes=10)
    assert (len(b.train), len(b.eval)) == (4000, 1000)  # the paper's split
    x, y = b.train[0]
    assert x.shape == (1, 40) and x.dtype == torch.float32 and y.dtype == torch.int64
    xtr, ytr = b.train.tensors
    assert sorted(ytr.unique().tolist()) == list(range(10))
    fresh = mnist1d.make_split(4000, 1000, 42)  # no cache: really regenerated
    assert np.array_equal(fresh[0], xtr[:, 0].numpy()) and np.array_equal(fresh[3], b.eval.tensors[1].numpy())
    small = build_data("mnist1d", samples=300, eval_samples=55, seed=1)
    assert (len(small.train), len(small.eval)) == (300, 55)
    assert not torch.equal(small.train.tensors[0][:10], xtr[:10])


def test_mnist1d_linear_is_weak_neighbours_better():
    b = build_data("mnist1d")
    xtr, ytr = b.train.tensors[0].flatten(1), b.train.tensors[1]
    xte, yte = b.eval.tensors[0].flatten(1), b.eval.tensors[1]
    ones = torch.ones(len(xtr), 1)
    w = torch.linalg.lstsq(torch.cat([xtr, ones], 1), torch.nn.functional.one_hot(ytr, 10).float()).solution
    linear = ((torch.cat([xte, torch.ones(len(xte), 1)], 1) @ w).argmax(1) == yte).float().mean().item()
    nearest = (ytr[torch.cdist(xte, xtr).argmin(1)] == yte).float().mean().item()
    assert 0.12 < linear < 0.5, linear  # paper: linear models ~32 %, far below the CNN's ~94 %
    assert nearest > linear + 0.15, (nearest, linear)


def test_mnist1d_matches_reference_recipe():
    """Our numpy port against the reference's scipy-based transform, draw for draw."""
    ndimage = pytest.importorskip("scipy.ndimage")
    interp1d = pytest.importorskip("scipy.interpolate").interp1d

    def interp(x, n):
        return interp1d(np.linspace(0, 1, len(x)), x, kind="linear")(np.linspace(0, 1, n))

    a = mnist1d.Mnist1dArgs(num_samples=100, seed=7)
    rs = np.random.RandomState(a.seed)
    xs, ys = [], []
    for label, tpl in enumerate(mnist1d.templates()):
        for _ in range(10):
            p = a.padding[0] + int(rs.rand() * (a.padding[1] - a.padding[0] + 1))
            x = interp(np.concatenate([tpl + 1e-8, np.zeros(p)]), a.template_len + a.padding[1])
            x = x * (1 + a.scale_coeff * (rs.rand() - 0.5))
            k = rs.choice(a.max_translation)
            x = np.concatenate([x[-k:], x[:-k]])
            mask = x != 0
            x = mask * x + (1 - mask) * ndimage.gaussian_filter(a.corr_noise_scale * rs.randn(*x.shape), 2)
            x = x + a.iid_noise_scale * rs.randn(*x.shape)
            x = x - a.shear_scale * (rs.rand() - 0.5) * np.linspace(-0.5, 0.5, len(x))
            xs.append(interp(x, a.final_seq_length))
            ys.append(label)
    order = rs.permutation(100)
    ref = np.stack(xs)[order]
    ref = (ref - ref.mean()) / ref.std()
    xtr, ytr, xte, yte = mnist1d.make_mnist1d(a)
    assert np.allclose(np.concatenate([xtr, xte]), ref, atol=1e-5)
    assert np.array_equal(np.concatenate([ytr, yte]), np.asarray(ys)[order])


# ---------------------------------------------------------------- cifar10

def write_cifar(root, sizes=(6, 5), test=4, protocol=pickle.DEFAULT_PROTOCOL):
    """A cifar-10-batches-py lookalike: dicts with bytes keys, uint8 (N, 3072) data, list labels."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    written = {}
    names = [f"data_batch_{i + 1}" for i in range(len(sizes))] + ["test_batch"]
    for name, n in zip(names, [*sizes, test]):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        (root / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        written[name] = (data, labels)
    return written


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL, 5])
def test_cifar10_reads_batches(tmp_path, protocol):
    written = write_cifar(tmp_path / "c", protocol=protocol)
    b = build_data("cifar10", path=str(tmp_path / "c"))
    assert b.spec == DataSpec(kind="image", shape=(3, 32, 32), num_classes=10)
    assert (len(b.train), len(b.eval)) == (11, 4)
    x, y = b.train[7]  # second batch, index 1
    data, labels = written["data_batch_2"]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and int(y) == labels[1] and y.dtype == torch.int64
    # channel-major layout: the first 1024 bytes are red; normalised with the CIFAR mean/std
    red = data[1, :1024].reshape(32, 32) / 255.0
    assert np.allclose(x[0].numpy(), (red - 0.4914) / 0.2470, atol=1e-5)
    assert [int(b.eval[i][1]) for i in range(4)] == written["test_batch"][1]
    aug = build_data("cifar10", path=str(tmp_path / "c"), augment=True)
    assert not torch.equal(stack(aug.train)[0], stack(b.train)[0])
    assert torch.equal(stack(aug.eval)[0], stack(b.eval)[0])  # eval is never augmented


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar10_refuses_malicious_pickle(tmp_path):
    root = tmp_path / "c"
    write_cifar(root)
    marker = tmp_path / "pwned"
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": _Evil(marker), b"labels": [0]}))
    assert os.system("true") == 0  # a shell exists, so a missing marker below means nothing ran
    msg = one_line_error(DataError, lambda: build_data("cifar10", path=str(root)),
                         "cifar10: refusing to unpickle", "system", root / "data_batch_1")
    assert not marker.exists(), msg
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": eval, b"labels": [0]}))
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), "builtins.eval")


def test_cifar10_bad_inputs(tmp_path):
    root = tmp_path / "c"
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), root, "does not exist")
    write_cifar(root)
    (root / "test_batch").unlink()
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), root / "test_batch", "missing")
    write_cifar(root)
    raw = (root / "data_batch_2").read_bytes()
    (root / "data_batch_2").write_bytes(raw[: len(raw) // 2])
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), root / "data_batch_2")
    write_cifar(root)
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), "data_batch_1", "(N, 3072)")
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}))
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), "data_batch_1", "label 10")
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}))
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), "data_batch_1", "1 labels for 2")
    (root / "data_batch_1").write_bytes(b"not a pickle at all")
    one_line_error(DataError, lambda: build_data("cifar10", path=str(root)), "data_batch_1")


# ---------------------------------------------------------------- mnist IDX

def idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    magic = (0x800 | arr.ndim) if magic is None else magic
    return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes()


def write_mnist(root, n_train=7, n_test=3, gz=False):
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test)}
    for name, arr in arrays.items():
        raw = idx_bytes(arr)
        if gz:
            (root / (name + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (root / name).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_idx(tmp_path, gz):
    arrays = write_mnist(tmp_path / "m", gz=gz)
    b = build_data("mnist", path=str(tmp_path / "m"))
    assert b.spec == DataSpec(kind="image", shape=(1, 28, 28), num_classes=10)
    assert (len(b.train), len(b.eval)) == (7, 3)
    x, y = b.train[2]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert int(y) == arrays["train-labels-idx1-ubyte"][2]
    expect = (arrays["train-images-idx3-ubyte"][2] / 255.0 - 0.1307) / 0.3081
    assert np.allclose(x[0].numpy(), expect, atol=1e-5)
    assert [int(b.eval[i][1]) for i in range(3)] == arrays["t10k-labels-idx1-ubyte"].tolist()


def test_mnist_bad_inputs(tmp_path):
    root = tmp_path / "m"
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), root, "does not exist")
    write_mnist(root)
    (root / "t10k-labels-idx1-ubyte").unlink()
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), "t10k-labels-idx1-ubyte", "missing")
    write_mnist(root)
    f = root / "train-images-idx3-ubyte"
    f.write_bytes(idx_bytes(np.zeros((7, 28, 28)), magic=0x00000801))
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), f, "magic 0x00000801", "0x00000803")
    f.write_bytes(idx_bytes(np.zeros((7, 28, 28)))[:-10])
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), f, "truncated")
    f.write_bytes(b"\x00\x00\x08")
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), f, "truncated")
    f.write_bytes(idx_bytes(np.zeros((6, 28, 28))))
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), f, "6 images", "7 labels")
    write_mnist(root)
    lab = root / "train-labels-idx1-ubyte"
    lab.write_bytes(idx_bytes(np.array([0, 1, 2, 3, 4, 5, 12])))
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), lab, "label 12")
    write_mnist(root)
    f.unlink()
    gz = root / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(idx_bytes(np.zeros((7, 28, 28))))[:-20])
    one_line_error(DataError, lambda: build_data("mnist", path=str(root)), gz)


# ---------------------------------------------------------------- image folders

def write_folder(root, classes=("dog", "cat"), per_class=3, size=(10, 12)):
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = np.full((size[1], size[0], 3), (40 * c + 10 * i) % 256, dtype=np.uint8)
            Image.fromarray(arr).save(root / name / f"{i}.png")


def test_imagefolder_split_resize_and_determinism(tmp_path):
    write_folder(tmp_path / "f")
    (tmp_path / "f" / "cat" / "notes.txt").write_text("not an image, ignored")
    b = build_data("imagefolder", path=str(tmp_path / "f"), image_size=16)
    assert b.spec == DataSpec(kind="image", shape=(3, 16, 16), num_classes=2)
    assert (len(b.train), len(b.eval)) == (4, 2)  # 90/10 per class, at least one eval image each
    assert sorted(int(b.eval[i][1]) for i in range(2)) == [0, 1]
    # classes are sorted by name: cat -> 0, dog -> 1
    for ds in (b.train, b.eval):
        for path, label in zip(ds.sources, ds.y.tolist()):
            assert path.parent.name == ("cat", "dog")[label]
    x, _ = b.train[0]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32
    again = build_data("imagefolder", path=str(tmp_path / "f"), image_size=16)
    assert again.train.sources == b.train.sources and torch.equal(stack(again.train)[0], stack(b.train)[0])


def test_imagefolder_train_val_folders(tmp_path):
    write_folder(tmp_path / "f" / "train")
    write_folder(tmp_path / "f" / "val", per_class=1)
    b = build_data("imagefolder", path=str(tmp_path / "f"), image_size=8, augment=True)
    assert (len(b.train), len(b.eval), b.spec.num_classes) == (6, 2, 2)
    assert b.train[0][0].shape == (3, 8, 8)


def test_imagefolder_bad_inputs(tmp_path):
    root = tmp_path / "f"
    one_line_error(DataError, lambda: build_data("imagefolder", path=str(root)), root, "does not exist")
    root.mkdir()
    one_line_error(DataError, lambda: build_data("imagefolder", path=str(root)), root, "no class folders")
    write_folder(root)
    (root / "empty").mkdir()
    one_line_error(DataError, lambda: build_data("imagefolder", path=str(root)), "'empty'", "no images")
    (root / "empty").rmdir()
    bad = root / "cat" / "0.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)  # PNG signature, corrupt body
    b = None
    try:
        b = build_data("imagefolder", path=str(root))
    except DataError as exc:  # the corrupt file may be the one checked at build time
        assert "\n" not in str(exc) and str(bad) in str(exc)
    if b is not None:
        idx = [i for i, p in enumerate(b.train.sources) if p == bad]
        ds, i = (b.train, idx[0]) if idx else (b.eval, b.eval.sources.index(bad))
        one_line_error(DataError, lambda: ds[i], bad, "imagefolder: cannot decode")


# ---------------------------------------------------------------- config errors and user datasets

def test_config_errors():
    one_line_error(ConfigError, lambda: build_data("nope"), "dataset", "nope", "allowed:", "synthetic")
    one_line_error(ConfigError, lambda: build_data("synthetic", path="/tmp/x"), "data_path", "/tmp/x")
    for name in ("cifar10", "mnist", "imagefolder"):
        one_line_error(ConfigError, lambda: build_data(name), "data_path", name)
    one_line_error(ConfigError, lambda: build_data("synthetic", samples=0), "samples")
    one_line_error(ConfigError, lambda: build_data("synthetic", eval_samples=-1), "eval_samples")
    one_line_error(ConfigError, lambda: build_data("synthetic_tokens", vocab=1), "vocab")
    one_line_error(ConfigError, lambda: build_data("mnist1d", augment=True), "augment", "mnist1d")
    assert set(datasets.names()) == {"synthetic", "synthetic_tokens", "synthetic_jpeg", "mnist1d", "cifar10",
                                     "mnist", "imagefolder"}


USER_DATA = """
import torch
from torch.utils.data import TensorDataset

def images(seed=0, samples=8):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(samples, 3, 5, 5, generator=g), torch.zeros(samples, dtype=torch.long)), \\
        TensorDataset(torch.randn(2, 3, 5, 5), torch.zeros(2, dtype=torch.long)), 4

def tokens():
    x = torch.randint(0, 7, (4, 9))
    return TensorDataset(x, x), TensorDataset(x, x), 7

def seq():
    return TensorDataset(torch.randn(3, 2, 11), torch.zeros(3, dtype=torch.long)), [], 3

def bundle():
    from scalelab.zoo.data import build_data
    return build_data("synthetic_tokens", samples=2, eval_samples=2)

def broken():
    raise RuntimeError("disk on fire")

def wrong():
    return 42
"""


def test_user_datasets(tmp_path):
    f = tmp_path / "mydata.py"
    f.write_text(textwrap.dedent(USER_DATA))
    b = build_data(f"{f}:images", samples=5)
    assert b.spec == DataSpec(kind="image", shape=(3, 5, 5), num_classes=4) and len(b.train) == 5
    assert build_data(f"{f}:tokens").spec == DataSpec(kind="tokens", shape=(9,), num_classes=7)
    assert build_data(f"{f}:seq").spec == DataSpec(kind="seq1d", shape=(2, 11), num_classes=3)
    assert build_data(f"{f}:bundle").spec.kind == "tokens"
    one_line_error(DataError, lambda: build_data(f"{f}:broken"), "broken", "disk on fire")
    one_line_error(DataError, lambda: build_data(f"{f}:wrong"), "wrong", "int")
    one_line_error(DataError, lambda: build_data(f"{f}:missing"), "missing")
    one_line_error(DataError, lambda: build_data(f"{tmp_path}/nofile.py:make"), "nofile.py")
    one_line_error(DataError, lambda: build_data("no_such_module_xyz:make"), "no_such_module_xyz")


def test_crop_flip_keeps_shape_and_content():
    import random

    img = np.arange(2 * 6 * 6, dtype=np.uint8).reshape(2, 6, 6)
    out = crop_flip(img, random.Random(0), pad=2)
    assert out.shape == img.shape and out.dtype == img.dtype
    assert any(np.array_equal(out, c) for c in _crop_flip_candidates(img, fill=0, pad=2))
