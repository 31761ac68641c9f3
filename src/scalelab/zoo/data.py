"""Built-in datasets and their registry entries (`ENTRIES`, read by `scalelab.zoo.registry`): ``build_data(name, ...)``
gives a DataBundle of train/eval datasets and their DataSpec.

Every dataset is deterministic for a given seed and identical on every process that builds it, so
data-parallel ranks can each build their own copy. Samples are ``(x, y)`` tensors.
"""
from __future__ import annotations

import functools
import inspect
import io
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from scalelab.errors import ConfigError, DataError, ModelError
from scalelab.zoo import formats, mnist1d
from scalelab.zoo.registry import DatasetEntry, datasets
from scalelab.zoo.spec import DataSpec


# synthetic images: per-pixel signal amplitude and noise std (calibrated so a small CNN reaches
# roughly 70-95 % in a few hundred SGD steps, not 100 % at once)
SYN_AMPLITUDE, SYN_NOISE = 0.08, 1.0
# synthetic_jpeg stores u8 = 128 + JPEG_SCALE * x, so decoding inverts it with mean 128, std JPEG_SCALE.
# Images are stored at JPEG_UPSCALE x the training size and resized back after decoding, as real
# pipelines decode larger photos: a sample then costs ~0.2 ms of CPU, so num_workers matter.
JPEG_SCALE, JPEG_QUALITY, JPEG_UPSCALE = 40.0, 90, 2
TOKEN_NOISE = 0.1  # probability that a token is random instead of following the rule
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DataBundle:
    """Train and eval datasets (``ds[i] -> (x, y)``) and the spec of one input sample."""

    train: Dataset
    eval: Dataset
    spec: DataSpec


def _seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from integers (Python's hash() is salted per process, so not that)."""
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]) >> 1


# ---------------------------------------------------------------- augmentation

class _Augmented(Dataset):
    """Base for datasets with per-sample random augmentation.

    The RNG of sample i is seeded by (seed, epoch, i, visits of i since set_epoch), so a run is
    reproducible and independent of batch order. Without DataLoader workers, repeated epochs
    differ through the visit count. Worker processes get a fresh copy each epoch (unless
    persistent), so the trainer should call ``set_epoch(e)`` before each epoch, like
    DistributedSampler, for epochs to differ there too.
    """

    def __init__(self, n: int, augment: bool, seed: int):
        self.augment, self.seed, self.epoch = augment, seed, 0
        self._visits = np.zeros(n if augment else 0, dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._visits[:] = 0

    def _rng(self, index: int) -> random.Random:
        visit = int(self._visits[index])
        self._visits[index] += 1
        return random.Random(_mix(self.seed, self.epoch, index, visit))


def _mix(*parts: int) -> int:
    # cheap deterministic mixing for the per-sample seed (SeedSequence costs ~20 us per call)
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def crop_flip(img: np.ndarray, rng: random.Random, pad: int = 4, fill: float = 0) -> np.ndarray:
    """Random crop of the (C, H, W) image padded with ``fill`` back to (H, W), then a horizontal flip half the time."""
    c, h, w = img.shape
    i, j = rng.randrange(2 * pad + 1), rng.randrange(2 * pad + 1)
    padded = np.full((c, h + 2 * pad, w + 2 * pad), fill, dtype=img.dtype)
    padded[:, pad:pad + h, pad:pad + w] = img
    out = padded[:, i:i + h, j:j + w]
    if rng.random() < 0.5:
        out = out[:, :, ::-1]
    return np.ascontiguousarray(out)


def _affine(mean: tuple[float, ...], std: tuple[float, ...], offset: float = 0.0, scale: float = 255.0):
    """(a, b) per channel so that x_u8 * a + b == ((x_u8 - offset) / scale - mean) / std."""
    m, s = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    return (1.0 / (scale * s)).reshape(-1, 1, 1), (-(offset / scale + m) / s).reshape(-1, 1, 1)


class ArrayImages(_Augmented):
    """Images held in one (N, C, H, W) array (uint8 from disk, or float32 already normalised)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, *, mean=None, std=None, augment=False, seed=0):
        super().__init__(len(x), augment, seed)
        self.x, self.y = x, torch.as_tensor(y, dtype=torch.int64)
        self.a, self.b = _affine(mean, std) if mean is not None else (None, None)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        index = int(index) % len(self.x)
        img = self.x[index]
        if self.augment:
            img = crop_flip(img, self._rng(index))
        out = img * self.a + self.b if self.a is not None else np.array(img, dtype=np.float32)
        return torch.from_numpy(out.astype(np.float32, copy=False)), self.y[index]


class EncodedImages(_Augmented):
    """Images decoded with Pillow on every access: JPEG/PNG bytes held in memory, or image files."""

    def __init__(self, sources: list, y, *, dataset: str, image_size: int, mean, std, augment=False, seed=0,
                 offset: float = 0.0, scale: float = 255.0, resample: int = 2):
        super().__init__(len(sources), augment, seed)
        self.sources, self.y = sources, torch.as_tensor(y, dtype=torch.int64)
        self.dataset, self.image_size, self.resample = dataset, image_size, resample  # Pillow filter id
        self.fill = int(offset)  # pad crops with the "zero" of the encoding (black for real images)
        self.a, self.b = _affine(mean, std, offset, scale)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, index: int):
        index = int(index) % len(self.sources)
        src = self.sources[index]
        what = src if isinstance(src, Path) else f"#{index}"
        img = formats.decode_image(src, self.dataset, what)
        if img.size != (self.image_size, self.image_size):
            img = img.resize((self.image_size, self.image_size), resample=self.resample)
        arr = np.asarray(img).transpose(2, 0, 1)  # HWC -> CHW
        if self.augment:
            arr = crop_flip(arr, self._rng(index), fill=self.fill)
        return torch.from_numpy((arr * self.a + self.b).astype(np.float32, copy=False)), self.y[index]


# ---------------------------------------------------------------- synthetic sets

def _synthetic_images(n: int, seed: int, split: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x = SYN_AMPLITUDE * template[y] + noise; templates are smooth (upsampled 4x4) so convs can find them."""
    gen = torch.Generator().manual_seed(_seed(seed, 0))
    base = torch.randn(10, 3, 4, 4, generator=gen)
    tpl = F.interpolate(base, size=(size, size), mode="bilinear", align_corners=False)
    tpl = (tpl - tpl.mean(dim=(1, 2, 3), keepdim=True)) / tpl.std(dim=(1, 2, 3), keepdim=True)
    gen = torch.Generator().manual_seed(_seed(seed, split))  # train and eval: same templates, own noise
    y = torch.randperm(n, generator=gen) % 10  # balanced classes in random order
    x = SYN_AMPLITUDE * tpl[y] + SYN_NOISE * torch.randn(n, 3, size, size, generator=gen)
    return x, y


def _synthetic_tokens(n: int, seed: int, split: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(n, seq_len + 1) sequences: next = perm[prev], except a random token with prob TOKEN_NOISE."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(_seed(seed, 0)))
    gen = torch.Generator().manual_seed(_seed(seed, split))
    seq = torch.empty(n, seq_len + 1, dtype=torch.int64)
    seq[:, 0] = torch.randint(vocab, (n,), generator=gen)
    noise = torch.rand(n, seq_len, generator=gen) < TOKEN_NOISE
    rand = torch.randint(vocab, (n, seq_len), generator=gen)
    for t in range(seq_len):
        seq[:, t + 1] = torch.where(noise[:, t], rand[:, t], perm[seq[:, t]])
    return seq


def _encode_images(x: torch.Tensor) -> list[bytes]:
    """Upscale normalised float images by JPEG_UPSCALE, quantise to uint8 and JPEG-encode each one."""
    from PIL import Image

    # pixel replication, so the BOX downscale after decoding gives back the image up to JPEG loss
    x = x.repeat_interleave(JPEG_UPSCALE, dim=2).repeat_interleave(JPEG_UPSCALE, dim=3)
    u8 = (128 + JPEG_SCALE * x).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    out = []
    for img in u8:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=JPEG_QUALITY)
        out.append(buf.getvalue())
    return out


@functools.lru_cache(maxsize=4)
def _mnist1d_cached(train: int, test: int, seed: int):
    # generation takes ~1 s for 5000 samples; ranks in one process (tests, threads) share it
    return mnist1d.make_split(train, test, seed)


# ---------------------------------------------------------------- registry

def _check_args(samples, eval_samples, image_size, seq_len, vocab, seed) -> None:
    for field, value, low in (("samples", samples, 1), ("eval_samples", eval_samples, 1),
                              ("image_size", image_size, 4), ("seq_len", seq_len, 1), ("vocab", vocab, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(field, value, f"an integer >= {low}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("seed", seed, "an integer >= 0")


def build_data(name: str, *, path: str | None = None, samples: int = 4096, eval_samples: int = 1024,
               seed: int = 0, image_size: int = 32, seq_len: int = 64, vocab: int = 64,
               augment: bool = False) -> DataBundle:
    """Build a registered dataset (`registry.datasets`) or a user one (``module:function`` /
    ``path/file.py:function``).

    - samples / eval_samples size the synthetic sets. mnist1d treats the defaults (4096 / 1024) as
      "the paper's split" and makes 4000 / 1000; any other value is used as given. On-disk sets
      (cifar10, mnist, imagefolder) always use all their files and ignore both.
    - seed fixes the data and augmentation; mnist1d uses RandomState(42 + seed), so seed 0 is the
      paper's dataset.
    - image_size sets synthetic/synthetic_jpeg sizes and the size imagefolder images are resized
      to; cifar10 and mnist keep their native 32x32 / 28x28.
    - augment (random crop with 4-px padding + horizontal flip, train split only) applies to image
      sets; synthetic_jpeg always augments its train split, since that is its purpose.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError("dataset", name, datasets.allowed())
    _check_args(samples, eval_samples, image_size, seq_len, vocab, seed)
    options = dict(path=path, samples=samples, eval_samples=eval_samples, seed=seed, image_size=image_size,
                   seq_len=seq_len, vocab=vocab, augment=augment)
    if ":" in name:
        return _user_data(name, options)
    entry = datasets.get(name)
    if entry.on_disk and not path:
        raise ConfigError("data_path", path, f"{name} needs {entry.data_path}")
    if not entry.on_disk and path:
        raise ConfigError("data_path", path, f"{name} is generated in memory and takes no data path")
    if augment and not entry.augments:
        raise ConfigError("augment", augment, f"augmentation exists for image datasets only, not {name}")
    return entry.builder(**options)


# ---------------------------------------------------------------- registry entries: one builder per dataset
# Each takes build_data's checked options as keywords and ignores the ones it has no use for.

def _synthetic(*, samples, eval_samples, seed, image_size, augment, **_) -> DataBundle:
    xtr, ytr = _synthetic_images(samples, seed, 1, image_size)
    xte, yte = _synthetic_images(eval_samples, seed, 2, image_size)
    train = ArrayImages(xtr.numpy(), ytr, augment=True, seed=seed) if augment else TensorDataset(xtr, ytr)
    return DataBundle(train, TensorDataset(xte, yte), DataSpec(kind="image", shape=(3, image_size, image_size),
                                                               num_classes=10))


def _synthetic_token_set(*, samples, eval_samples, seed, seq_len, vocab, **_) -> DataBundle:
    tr, te = (_synthetic_tokens(n, seed, s, seq_len, vocab) for n, s in ((samples, 1), (eval_samples, 2)))
    return DataBundle(TensorDataset(tr[:, :-1], tr[:, 1:]), TensorDataset(te[:, :-1], te[:, 1:]),
                      DataSpec(kind="tokens", shape=(seq_len,), num_classes=vocab))


def _synthetic_jpeg(*, samples, eval_samples, seed, image_size, **_) -> DataBundle:
    norm = dict(dataset="synthetic_jpeg", image_size=image_size, mean=(0.0,) * 3, std=(1.0,) * 3, offset=128.0,
                scale=JPEG_SCALE, seed=seed, resample=4)  # 4 = Image.BOX: 2x2 block mean
    (xtr, ytr), (xte, yte) = (_synthetic_images(n, seed, s, image_size) for n, s in ((samples, 1),
                                                                                      (eval_samples, 2)))
    return DataBundle(EncodedImages(_encode_images(xtr), ytr, augment=True, **norm),
                      EncodedImages(_encode_images(xte), yte, augment=False, **norm),
                      DataSpec(kind="image", shape=(3, image_size, image_size), num_classes=10))


def _mnist1d(*, samples, eval_samples, seed, **_) -> DataBundle:
    n_train = 4000 if samples == 4096 else samples
    n_test = 1000 if eval_samples == 1024 else eval_samples
    if 42 + seed >= 2**32:  # numpy's RandomState takes 32-bit seeds only
        raise ConfigError("seed", seed, f"mnist1d seeds RandomState(42 + seed); allowed: 0..{2**32 - 43}")
    xtr, ytr, xte, yte = _mnist1d_cached(n_train, n_test, 42 + seed)
    return DataBundle(TensorDataset(torch.tensor(xtr[:, None]), torch.tensor(ytr)),
                      TensorDataset(torch.tensor(xte[:, None]), torch.tensor(yte)),
                      DataSpec(kind="seq1d", shape=(1, xtr.shape[1]), num_classes=10))


def _array_files(read, mean, std):
    """Builder of an on-disk set read whole into (N, C, H, W) uint8 arrays by `read(path)`."""
    def build(*, path, seed, augment, **_) -> DataBundle:
        xtr, ytr, xte, yte = read(path)
        return DataBundle(ArrayImages(xtr, ytr, mean=mean, std=std, augment=augment, seed=seed),
                          ArrayImages(xte, yte, mean=mean, std=std),
                          DataSpec(kind="image", shape=tuple(xtr.shape[1:]), num_classes=10))
    return build


def _imagefolder(*, path, seed, image_size, augment, **_) -> DataBundle:
    train, evals, classes = formats.scan_imagefolder(path, seed)
    formats.decode_image(train[0][0], "imagefolder", train[0][0])  # fail now, not mid-epoch, if images are not images
    common = dict(dataset="imagefolder", image_size=image_size, mean=IMAGENET_MEAN, std=IMAGENET_STD, seed=seed,
                  resample=2)  # 2 = Image.BILINEAR (antialiased when shrinking)
    return DataBundle(EncodedImages([p for p, _ in train], [y for _, y in train], augment=augment, **common),
                      EncodedImages([p for p, _ in evals], [y for _, y in evals], **common),
                      DataSpec(kind="image", shape=(3, image_size, image_size), num_classes=len(classes)))


# The built-in datasets, in listing order.
ENTRIES = (
    DatasetEntry(name="synthetic", builder=_synthetic, kind="image",
                 description="generated 10-class images: a smooth template per class under noise"),
    DatasetEntry(name="synthetic_tokens", builder=_synthetic_token_set, kind="tokens",
                 description="generated token sequences: next = a fixed permutation of the previous, with noise"),
    DatasetEntry(name="synthetic_jpeg", builder=_synthetic_jpeg, kind="image", decodes=True,
                 description="the synthetic images stored as JPEG, decoded and augmented per sample"),
    DatasetEntry(name="mnist1d", builder=_mnist1d, kind="seq1d",
                 description="MNIST-1D (Greydanus 2020): 40-step 1-D digit signals, generated"),
    DatasetEntry(name="cifar10", builder=_array_files(formats.read_cifar10, CIFAR_MEAN, CIFAR_STD), kind="image",
                 data_path="a directory holding data_batch_1..5 and test_batch (cifar-10-batches-py)",
                 description="CIFAR-10 from its Python pickles"),
    DatasetEntry(name="mnist", builder=_array_files(formats.read_mnist, MNIST_MEAN, MNIST_STD), kind="image",
                 data_path="a directory holding the four MNIST IDX files (optionally .gz)",
                 description="MNIST from its IDX files"),
    DatasetEntry(name="imagefolder", builder=_imagefolder, kind="image", decodes=True,
                 data_path="a directory root/<class>/<images> (optionally root/train and root/val)",
                 description="image files in one folder per class, decoded and resized per sample"),
)


# ---------------------------------------------------------------- user datasets

def _user_data(ref: str, options: dict) -> DataBundle:
    """Call the user's function with the build_data options its signature names; check what it gives."""
    from scalelab.zoo.user import load_callable

    try:
        fn = load_callable(ref, "dataset")
    except ModelError as exc:
        raise DataError(str(exc)) from None
    try:
        params = inspect.signature(fn).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        kwargs = {k: v for k, v in options.items() if takes_all or k in params}
    except (TypeError, ValueError):
        kwargs = {}
    try:
        result = fn(**kwargs)
    except (Exception, SystemExit) as exc:
        raise DataError(f"dataset: {ref!r} raised {type(exc).__name__}: {formats.one_line(exc)}") from None
    if isinstance(result, DataBundle):
        return result
    if not (isinstance(result, tuple) and len(result) == 3):
        raise DataError(f"dataset: {ref!r} returned {type(result).__name__}; expected a DataBundle or "
                        "(train_dataset, eval_dataset, num_classes)")
    train, evals, num_classes = result
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise DataError(f"dataset: {ref!r} returned num_classes={num_classes!r}; expected an integer >= 1")
    return DataBundle(train, evals, _infer_spec(ref, train, num_classes))


def _infer_spec(ref: str, train, num_classes: int) -> DataSpec:
    """DataSpec from the first train sample: 3 dims image, 2 dims seq1d, 1 dim of integers tokens."""
    try:
        if len(train) < 1:
            raise DataError(f"dataset: {ref!r} returned an empty train dataset")
        sample = train[0]
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"dataset: {ref!r}: reading train[0] failed: {type(exc).__name__}: "
                        f"{formats.one_line(exc)}") from None
    if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
        raise DataError(f"dataset: {ref!r}: train[0] is a {type(sample).__name__}; expected an (x, y) pair")
    x = torch.as_tensor(np.asarray(sample[0])) if not isinstance(sample[0], torch.Tensor) else sample[0]
    shape = tuple(x.shape)
    if x.dim() == 3:
        return DataSpec(kind="image", shape=shape, num_classes=num_classes)
    if x.dim() == 2:
        return DataSpec(kind="seq1d", shape=shape, num_classes=num_classes)
    if x.dim() == 1 and not x.is_floating_point() and not x.is_complex():
        return DataSpec(kind="tokens", shape=shape, num_classes=num_classes)
    raise DataError(f"dataset: {ref!r}: train[0] x has shape {shape} ({x.dtype}); expected (C, H, W) image, "
                    "(C, L) sequence or (T,) integer tokens")
