"""Whether a run learned: chance for classification and tokens, and the seed interval against it, on exact
numbers."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from scalelab.analysis.learning import Learning, chance_over, labels_of, majority_share, over_seeds, task_chance, \
    uniform_loss
from scalelab.zoo.data import DataBundle
from scalelab.zoo.spec import DataSpec


def test_chance_of_classification_is_the_majority_share():
    assert majority_share([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0.1
    assert majority_share([3, 3, 3, 1]) == 0.75
    assert math.isnan(majority_share([]))


def test_chance_of_tokens_is_a_uniform_guess():
    assert uniform_loss(10) == pytest.approx(2.302585, abs=1e-6)
    assert uniform_loss(64) == pytest.approx(4.158883, abs=1e-6)
    with pytest.raises(ValueError, match="vocab"):
        uniform_loss(1)


def bundle(kind: str, labels: list[int], classes: int) -> DataBundle:
    ds = TensorDataset(torch.zeros(len(labels), 2), torch.tensor(labels))
    return DataBundle(ds, ds, DataSpec(kind=kind, shape=(2,), num_classes=classes))


def test_task_chance_reads_the_evaluation_labels_or_the_vocabulary():
    assert labels_of(TensorDataset(torch.zeros(3, 1), torch.tensor([2, 0, 2]))) == [2, 0, 2]
    assert task_chance(bundle("seq1d", [0, 0, 1, 2], 3)) == (0.5, True)
    loss, higher = task_chance(bundle("tokens", [0, 1], 64))
    assert (loss, higher) == (pytest.approx(math.log(64)), False)
    # over seeds: the highest chance accuracy, so a run counts as learned against every seed's data
    assert chance_over([bundle("seq1d", [0, 1, 2, 3], 4), bundle("seq1d", [0, 0, 1, 2], 4)]) == (0.5, True)


def test_learned_means_the_seed_interval_is_clear_of_chance():
    fit = over_seeds([0.85, 0.88], 0.106)  # the range of 2 seeds is their interval
    assert (fit.median, fit.low, fit.high, fit.seeds) == (pytest.approx(0.865), 0.85, 0.88, 2)
    assert fit.learned
    assert fit.verdict() == "learned: 86.5 % (range 85.0–88.0 % over 2 seeds) against chance 10.6 %"
    at_chance = over_seeds([0.109, 0.102, 0.115], 0.106)  # the default study's old 40 steps: around chance
    assert not at_chance.learned
    assert at_chance.verdict().startswith("did not learn: 10.9 % (range 10.2–11.5 % over 3 seeds)")
    # above chance on average, but one seed's run sits below it: not clear of chance
    assert not over_seeds([0.30, 0.10], 0.106).learned


def test_one_seed_is_never_learned():
    fit = over_seeds([0.9], 0.1)
    assert (fit.seeds, fit.learned) == (1, False)
    assert math.isnan(fit.low)
    assert "one seed" in fit.verdict()


def test_a_token_model_learned_when_its_loss_is_below_ln_v():
    assert over_seeds([1.2, 1.4], math.log(64), higher_is_better=False).learned
    assert not over_seeds([4.1, 4.2], math.log(64), higher_is_better=False).learned  # 4.2 > ln 64 = 4.159
    assert not Learning(1.0, 0.9, 1.1, 2, math.nan).learned  # chance unknown: not learned
