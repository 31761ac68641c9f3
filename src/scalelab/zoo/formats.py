"""Readers for on-disk datasets: CIFAR-10 python batches, MNIST IDX files, image folders.

Every problem with the files is a one-line DataError naming the dataset, the file and what was
expected, so the CLI can print it as is.
"""
from __future__ import annotations

import gzip
import io
import os
import pickle
import random
import zlib
from pathlib import Path

import numpy as np

from scalelab.errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff")


def one_line(text: object) -> str:
    """Collapse an exception text onto one line (messages from OSError/pickle may hold newlines)."""
    return " ".join(str(text).split())


def _need_dir(dataset: str, path: str | os.PathLike) -> Path:
    root = Path(path)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DataError(f"{dataset}: data path {root} {what}")
    return root


# ---------------------------------------------------------------- CIFAR-10

def _allowed_globals() -> dict[tuple[str, str], object]:
    """The few globals a CIFAR batch pickle needs, taken from numpy itself (works on numpy 1 and 2)."""
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy(._)core.multiarray._reconstruct
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]  # numpy(._)core.numeric._frombuffer (protocol 5)
    import _codecs  # protocol-2 pickles written by Python 3 encode bytes through _codecs.encode

    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _codecs.encode,
    }
    for core in ("numpy.core", "numpy._core"):  # numpy 1 and numpy 2 spell the module differently
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy array globals; anything else (os.system...) is refused."""

    def __init__(self, fh, file: Path):
        super().__init__(fh, encoding="bytes")  # the real batches were pickled by Python 2
        self._file = file
        self._allowed = _allowed_globals()

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle API
        obj = self._allowed.get((module, name))
        if obj is None:
            raise DataError(f"cifar10: refusing to unpickle {module}.{name} in {self._file}")
        return obj


def _read_cifar_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(file, "rb") as fh:
            batch = _CifarUnpickler(fh, file).load()
    except DataError:
        raise
    except Exception as exc:  # truncated/corrupt pickles raise many different types
        raise DataError(f"cifar10: cannot read {file}: {type(exc).__name__}: {one_line(exc)}") from None
    if not isinstance(batch, dict):
        raise DataError(f"cifar10: {file} holds a {type(batch).__name__}; expected a dict with b'data' and b'labels'")
    # keys are bytes in the real (Python 2) files; accept str keys too
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DataError(f"cifar10: {file} lacks the b'data' or b'labels' key")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"cifar10: {file}: b'data' is {got}; expected uint8 of shape (N, 3072)")
    try:
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"cifar10: {file}: b'labels' is not a list of integers") from None
    if len(y) != len(data):
        raise DataError(f"cifar10: {file}: {len(y)} labels for {len(data)} images")
    if len(y) and (y.min() < 0 or y.max() > 9):
        raise DataError(f"cifar10: {file}: label {int(y.min() if y.min() < 0 else y.max())} out of range 0..9")
    return data.reshape(-1, 3, 32, 32), y


def read_cifar10(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) from cifar-10-batches-py; x uint8 (N, 3, 32, 32).

    Uses every data_batch_<k> present (the real set has 1..5), in order; data_batch_1 and
    test_batch must exist.
    """
    root = _need_dir("cifar10", path)
    batches = sorted((p for p in root.glob("data_batch_*") if p.name[11:].isdecimal()), key=lambda p: int(p.name[11:]))
    for required in ("data_batch_1", "test_batch"):
        if not (root / required).is_file():
            raise DataError(f"cifar10: missing file {root / required}; expected data_batch_1..5 and test_batch")
    train = [_read_cifar_batch(p) for p in batches]
    xte, yte = _read_cifar_batch(root / "test_batch")
    return np.concatenate([b[0] for b in train]), np.concatenate([b[1] for b in train]), xte, yte


# ---------------------------------------------------------------- MNIST IDX

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_idx(root: Path, name: str, ndim: int) -> tuple[np.ndarray, Path]:
    """One IDX file of unsigned bytes with ``ndim`` dimensions, plain or ``.gz``."""
    file = root / name
    if not file.is_file():
        file = root / (name + ".gz")
    if not file.is_file():
        raise DataError(f"mnist: missing file {root / name} (or {name}.gz)")
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as fh:
                raw = fh.read()
        else:
            raw = file.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:  # truncated/corrupt .gz raise all three
        raise DataError(f"mnist: cannot read {file}: {one_line(exc)}") from None
    magic = 0x800 | ndim  # 0x08 = unsigned byte data, last byte = number of dimensions
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"mnist: {file} is truncated: {len(raw)} bytes, shorter than the {header}-byte IDX header")
    got = int.from_bytes(raw[:4], "big")
    if got != magic:
        raise DataError(f"mnist: {file} has magic 0x{got:08x}; expected 0x{magic:08x}")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "too long"
        raise DataError(f"mnist: {file} is {what}: {len(raw)} bytes; header {dims} needs {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims), file


def read_mnist(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) from the four IDX files; x uint8 (N, 1, H, W), y int64."""
    root = _need_dir("mnist", path)
    out = []
    for split, (img_name, lab_name) in _IDX_FILES.items():
        x, xfile = _read_idx(root, img_name, 3)
        y, yfile = _read_idx(root, lab_name, 1)
        if len(x) != len(y):
            raise DataError(f"mnist: {xfile} has {len(x)} images but {yfile} has {len(y)} labels")
        if len(y) == 0:
            raise DataError(f"mnist: {xfile} holds no images")
        if y.max() > 9:
            raise DataError(f"mnist: {yfile}: label {int(y.max())} out of range 0..9")
        out += [x[:, None].copy(), y.astype(np.int64)]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise DataError(f"mnist: train images are {out[0].shape[2:]} but test images are {out[2].shape[2:]}")
    return out[0], out[1], out[2], out[3]


# ---------------------------------------------------------------- image folders

Items = list[tuple[Path, int]]  # (image file, label)


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS)


def _class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _scan_split(folder: Path, classes: list[str]) -> Items:
    items = []
    for label, name in enumerate(classes):
        if (folder / name).is_dir():
            items += [(p, label) for p in _images_in(folder / name)]
    extra = [d.name for d in _class_dirs(folder) if d.name not in classes]
    if extra:
        raise DataError(f"imagefolder: {folder} has class folder {extra[0]!r} that the train split lacks")
    return items


def scan_imagefolder(path: str | os.PathLike, seed: int) -> tuple[Items, Items, list[str]]:
    """(train items, eval items, class names) for root/<class>/<images>.

    With root/train and root/val (or root/test) those are the splits; otherwise each class is
    split 90/10 by a shuffle seeded with ``seed`` (at least one eval image per class of 2+).
    Classes are the sorted folder names, labels their index.
    """
    root = _need_dir("imagefolder", path)
    eval_dir = next((root / n for n in ("val", "test") if (root / n).is_dir()), None)
    if (root / "train").is_dir() and eval_dir is not None:
        classes = [d.name for d in _class_dirs(root / "train")]
        if not classes:
            raise DataError(f"imagefolder: {root / 'train'} has no class folders; expected train/<class>/<images>")
        train, evals = _scan_split(root / "train", classes), _scan_split(eval_dir, classes)
    else:
        classes = [d.name for d in _class_dirs(root)]
        if not classes:
            raise DataError(f"imagefolder: {root} has no class folders; expected {root}/<class>/<images>")
        train, evals = [], []
        rnd = random.Random(seed)
        for label, name in enumerate(classes):
            files = _images_in(root / name)
            rnd.shuffle(files)
            n_eval = max(1, round(len(files) * 0.1)) if len(files) >= 2 else 0
            evals += [(p, label) for p in sorted(files[:n_eval])]
            train += [(p, label) for p in sorted(files[n_eval:])]
    for label, name in enumerate(classes):
        if not any(lab == label for _, lab in train):
            raise DataError(f"imagefolder: class folder {name!r} under {root} has no images "
                            f"(looked for {', '.join(IMAGE_EXTENSIONS)})")
    if not evals:
        raise DataError(f"imagefolder: {root} yields no eval images; add more images or a val/ folder")
    return train, evals, classes


def decode_image(data: bytes | Path, dataset: str, what: object):
    """Decode image bytes or a file to an RGB PIL image; DataError naming ``what`` if it cannot."""
    from PIL import Image, UnidentifiedImageError  # local: only the image datasets need Pillow

    try:
        src = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
        with Image.open(src) as img:
            return img.convert("RGB")  # convert() loads the pixels, so truncation is caught here
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise DataError(f"{dataset}: cannot decode image {what}: {one_line(exc)}") from None
