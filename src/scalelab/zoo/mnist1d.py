"""MNIST-1D, generated procedurally (Greydanus 2020, "Scaling down deep learning").

A re-implementation in numpy of the reference recipe (github.com/greydanus/mnist1d): ten hand-made
templates of length 12 are padded, dilated, scaled, translated, given correlated noise in the
background and iid noise everywhere, sheared, and subsampled to length 40. The random draws are
made in the reference's order from ``np.random.RandomState(seed)``, so with the defaults the data
match the reference's to floating-point rounding (the reference uses scipy's ``gaussian_filter``
and ``interp1d``; the numpy equivalents below compute the same thing).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Mnist1dArgs:
    """The reference's dataset arguments (``get_dataset_args``); defaults give 4000 train / 1000 test."""

    num_samples: int = 5000
    train_split: float = 0.8
    template_len: int = 12
    padding: tuple[int, int] = (36, 60)
    scale_coeff: float = 0.4
    max_translation: int = 48
    corr_noise_scale: float = 0.25
    iid_noise_scale: float = 2e-2
    shear_scale: float = 0.75
    final_seq_length: int = 40
    seed: int = 42


def templates() -> np.ndarray:
    """The ten digit templates, shape (10, 12): whitened, starting at 0, divided by 6 as in the paper."""
    d = np.asarray([
        [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
        [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
        [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
        [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
        [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
        [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
        [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
        [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
    ], dtype=np.float64)
    d -= d.mean(1, keepdims=True)
    d /= d.std(1, keepdims=True)
    d -= d[:, :1]  # every signal starts (and ends) at 0, so padding joins it smoothly
    return d / 6.0


def _interpolate(x: np.ndarray, n: int) -> np.ndarray:
    """Linear resampling of x onto n evenly spaced points (scipy interp1d kind='linear')."""
    return np.interp(np.linspace(0, 1, n), np.linspace(0, 1, len(x)), x)


def _gaussian_smooth(x: np.ndarray, sigma: float = 2.0, truncate: float = 4.0) -> np.ndarray:
    """scipy.ndimage.gaussian_filter(x, sigma) for 1-D x, with its default 'reflect' boundary."""
    radius = int(truncate * sigma + 0.5)
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    # scipy's 'reflect' repeats the edge sample (d c b a | a b c d), which is numpy's 'symmetric'
    padded = np.pad(x, radius, mode="symmetric")
    return np.convolve(padded, k, mode="valid")


def _transform(x: np.ndarray, args: Mnist1dArgs, rng: np.random.RandomState) -> np.ndarray:
    """One sample from one template; the order of the rng draws follows the reference."""
    low, high = args.padding
    p = low + int(rng.rand() * (high - low + 1))
    new_x = np.concatenate([x + 1e-8, np.zeros(p)])  # eps keeps the template distinct from the padding
    new_x = _interpolate(new_x, args.template_len + high)  # dilate: shorter padding -> wider digit
    new_x = new_x * (1 + args.scale_coeff * (rng.rand() - 0.5))
    k = rng.choice(args.max_translation)
    new_x = np.concatenate([new_x[-k:], new_x[:-k]])  # roll right by k (k == 0 leaves x as is)
    # correlated noise only where the signal is absent (the background), iid noise everywhere
    mask = new_x != 0
    corr = _gaussian_smooth(args.corr_noise_scale * rng.randn(*new_x.shape))
    new_x = mask * new_x + (1 - mask) * corr
    new_x = new_x + args.iid_noise_scale * rng.randn(*new_x.shape)
    coeff = args.shear_scale * (rng.rand() - 0.5)
    new_x = new_x - coeff * np.linspace(-0.5, 0.5, len(new_x))
    return _interpolate(new_x, args.final_seq_length)


def make_mnist1d(args: Mnist1dArgs | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate (x_train, y_train, x_test, y_test): x float32 (N, L), y int64 (N,).

    ``num_samples // 10`` samples per class are made class by class, shuffled, standardised over
    the whole set (mean 0, std 1, as the reference does) and split at ``int(N * train_split)``.
    """
    args = args or Mnist1dArgs()
    rng = np.random.RandomState(args.seed)  # legacy RandomState: same stream as the reference
    tpl = templates()
    per_class = args.num_samples // len(tpl)
    xs, ys = [], []
    for label in range(len(tpl)):
        for _ in range(per_class):
            xs.append(_transform(tpl[label], args, rng))
            ys.append(label)
    order = rng.permutation(len(ys))
    x = np.stack(xs)[order]
    y = np.asarray(ys, dtype=np.int64)[order]
    x = (x - x.mean()) / x.std()
    split = int(len(y) * args.train_split)
    return x[:split].astype(np.float32), y[:split], x[split:].astype(np.float32), y[split:]


def make_split(train: int, test: int, seed: int = 42) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``train`` + ``test`` samples; (4000, 1000, 42) is exactly the paper's dataset.

    Other sizes generate ceil((train+test)/10) samples per class and keep the first train+test
    after the shuffle, so class counts are balanced to within the rounding.
    """
    total = train + test
    per_class = -(-total // 10)
    n = per_class * 10
    args = Mnist1dArgs(num_samples=n, train_split=train / n, seed=seed)
    xtr, ytr, xte, yte = make_mnist1d(args)
    # int(n * train/n) can round one below train; fix the split from the concatenated arrays
    x = np.concatenate([xtr, xte])[:total]
    y = np.concatenate([ytr, yte])[:total]
    return x[:train], y[:train], x[train:], y[train:]
