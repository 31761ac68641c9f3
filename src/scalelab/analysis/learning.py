"""Whether a run learned (pure): chance for its task, and its figure against chance with the seed interval.

A model that did not learn sits at chance, and two runs at chance differ only by noise: comparing their accuracies
(fp32 against bf16, one learning-rate rule against another) says nothing about precision or rule. So a comparison of
accuracies is made only between runs that learned:

- chance is what a guess that ignores the input gets. For classification it is the majority class's share of the
  evaluation labels (always guessing that class): 0.10 on 10 balanced classes, 0.106 on MNIST-1D's test set. For a
  token model it is the loss of a uniform guess over the vocabulary, ln V (2.30 for V = 10, 4.16 for V = 64).
- a run learned when its figure is above chance by more than its seed interval: the whole interval over seeds
  (scalelab.analysis.intervals.median_interval; the seeds' range below 6 seeds) lies above chance accuracy, or below
  the chance loss. With one seed there is no seed interval, so whether it learned cannot be told from noise: one
  seed never counts as learned (`verdict` says so).
"""
from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scalelab.analysis.intervals import median_interval


def majority_share(labels: Iterable[int]) -> float:
    """Chance accuracy of a classifier: the most frequent label's share of `labels` (nan when there are none)."""
    counts = Counter(int(y) for y in labels)
    total = sum(counts.values())
    return max(counts.values()) / total if total else math.nan


def uniform_loss(vocab: int) -> float:
    """Chance cross-entropy of a token model: a uniform guess over `vocab` tokens, ln V (nats)."""
    if vocab < 2:
        raise ValueError(f"vocab: {vocab!r}; allowed: an integer >= 2")
    return math.log(vocab)


@dataclass(frozen=True)
class Learning:
    """A figure over seeds against chance. `higher_is_better`: accuracy (True) or loss (False)."""
    median: float
    low: float  # the seed interval (nan with one seed)
    high: float
    seeds: int
    chance: float
    higher_is_better: bool = True

    @property
    def learned(self) -> bool:
        """Above chance by more than the seed interval: the whole interval on the good side of chance."""
        if self.seeds < 2 or not math.isfinite(self.chance):
            return False
        return self.low > self.chance if self.higher_is_better else self.high < self.chance

    def verdict(self) -> str:
        """Why it learned or not, in words: "learned: 91.0 % (range 90.2–91.5 % over 2 seeds) against chance
        10.6 %" (accuracy); losses in nats."""
        what = (lambda x: f"{100 * x:.1f} %") if self.higher_is_better else (lambda x: f"{x:.3g}")
        chance = f"chance {what(self.chance)}"
        if self.seeds < 2:
            return (f"is not known to have learned: {what(self.median)} from one seed against {chance}; one seed has "
                    "no seed interval to tell it from noise")
        band = (f"{100 * self.low:.1f}–{100 * self.high:.1f} %" if self.higher_is_better
                else f"{self.low:.3g}–{self.high:.3g}")
        seeds = f"{what(self.median)} ({seed_band(self.seeds)} {band} over {self.seeds} seeds)"
        if self.learned:
            return f"learned: {seeds} against {chance}"
        return f"did not learn: {seeds} is not clear of {chance}"


def labels_of(dataset) -> list[int]:
    """Every label of a dataset (`ds[i] -> (x, y)`): from its label tensor where it holds one (TensorDataset's last
    tensor, an image set's `y`), else read sample by sample."""
    tensors = getattr(dataset, "tensors", None)
    held = tensors[-1] if tensors else getattr(dataset, "y", None)
    if held is not None:
        return [int(v) for v in held.reshape(-1).tolist()]
    return [int(dataset[i][1]) for i in range(len(dataset))]


def task_chance(bundle) -> tuple[float, bool]:
    """Chance for a data bundle (scalelab.zoo.data.DataBundle) and whether it is an accuracy (True) or a loss
    (False): ln V for tokens (`spec.num_classes` is the vocabulary), else the majority class's share of the
    evaluation labels."""
    if bundle.spec.kind == "tokens":
        return uniform_loss(bundle.spec.num_classes), False
    return majority_share(labels_of(bundle.eval)), True


def chance_over(bundles: Iterable) -> tuple[float, bool]:
    """Chance over several data bundles (one per seed: a generated dataset depends on the seed, MNIST-1D's test set
    does): the highest chance accuracy, or the lowest chance loss, so a run counts as learned against all of them."""
    found = [task_chance(b) for b in bundles]
    higher = found[0][1]
    values = [c for c, _ in found]
    return (max(values) if higher else min(values)), higher


def seed_band(seeds: int) -> str:
    """What a seed interval is called in words: below 6 seeds it is the seeds' range (scalelab.analysis.intervals),
    whose real coverage is less than 95 %, so it is called a range."""
    return "range" if seeds < 6 else "95 % interval"


def over_seeds(values: Sequence[float], chance: float, *, higher_is_better: bool = True) -> Learning:
    """`values` (one per seed, nan-free) against `chance`: their median and seed interval."""
    values = [float(v) for v in values if v == v]
    if not values:
        return Learning(math.nan, math.nan, math.nan, 0, chance, higher_is_better)
    median = statistics.median(values)
    low, high = median_interval(values) if len(values) > 1 else (math.nan, math.nan)
    return Learning(float(median), float(low), float(high), len(values), chance, higher_is_better)


COMPARE_ONLY_LEARNED = ("accuracies are compared only between runs that learned: a run at chance guesses, and the "
                        "difference between two guessing runs is noise, not an effect of what was varied")
