"""Large-batch learning-rate rules: a rule is recommended only from two or more seeds, between rules that learned
(scalelab.analysis.learning), when the best one's seed interval lies clear of the next one's; one seed is said to be
indicative."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import checks
from scalelab.experiments.lr_scaling import lr_scaling_result, lr_table
from scalelab.lab.base import Result

CHANCE = 0.106


def result(finals: dict[tuple[int, str], list[float]]) -> Result:
    """Curves of one evaluation per seed: (batch, rule) -> final accuracy of each seed."""
    rows = [{"lr_rule": rule, "global_batch": batch, "workers": 1, "seed": seed, "epoch": 1, "step": 10,
             "time(s)": 1.0, "eval/acc": acc, "eval/loss": 1.0}
            for (batch, rule), accs in finals.items() for seed, acc in enumerate(accs)]
    table = lr_table(pd.DataFrame(rows), 0.9, CHANCE)
    return Result("lr_scaling", {"lr_scaling": table}, notes={"base_batch": 32, "chance": CHANCE})


def test_the_table_says_whether_each_cell_learned():
    t = result({(256, "lars"): [0.8, 0.82], (256, "linear"): [0.10, 0.11], (256, "sqrt"): [0.9]}).tables["lr_scaling"]
    t = t.set_index("lr_rule")
    assert (t.loc["lars", "chance"], t.loc["lars", "final_acc_ci_low"], t.loc["lars", "final_acc_ci_high"]) == (CHANCE, 0.8, 0.82)
    assert [bool(t.loc[r, "learned"]) for r in ("lars", "linear", "sqrt")] == [True, False, False]  # sqrt: one seed


def test_one_seed_is_indicative_and_recommends_nothing():
    lines, rec = lr_scaling_result(result({(32, "none"): [0.9], (256, "lars"): [0.85], (256, "linear"): [0.6]}))
    assert rec is None
    assert lines[0] == "At the base batch 32 the model reaches 90.0 % test accuracy (chance 10.6 %)."
    assert lines[1].startswith("At batch 256 (8x), indicative, one seed: lars 85.0 %, linear 60.0 % (chance 10.6 %). "
                               "One seed has no interval")
    assert "no rule is recommended" in lines[1]


def test_separated_seeds_recommend_the_best_rule():
    """Three seeds each: the difference's interval from the seed spread pooled over the cells that learned (lars
    and linear, 2 dof each), t(4) at 1 - 0.05 / 6 looks; sqrt did not learn and is left out of the pool."""
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.84, 0.86, 0.85], (256, "linear"): [0.60, 0.65, 0.62],
                                           (256, "sqrt"): [0.10, 0.12, 0.11]}))
    assert rec == ("Use the lars rule for batch 256: lars beats linear: 23 points above linear (99.2 % interval of "
                   "the difference +13.5 to +31.9 points), beyond noise (the seed spread pooled over the experiment's "
                   "cells, 4 degrees of freedom, corrected for 6 looks, n = 3 seeds each). Final test accuracy of "
                   "lars: 85 % (75 % interval (range of 3) 84–86 %, n = 3 seeds); of linear: 62 % (75 % interval "
                   "(range of 3) 60–65 %, n = 3 seeds).")
    assert lines[0].startswith("At batch 256, sqrt did not learn: final accuracy not clear of chance (chance 10.6 %)")
    assert lines[1] == ("At batch 256 (8x), among the rules that learned (ranges over seeds): lars 85.0 % (84.0–86.0 %), "
                        "linear 62.0 % (60.0–65.0 %) over 3 seeds.")


def test_two_seeds_decide_nothing_even_far_apart():
    """Two ranges of 2 seeds that do not meet are two 50 % intervals: no finding; the pooled seed spread has 2 dof,
    whose t at 1 - 0.05 / 6 is about 11: undecided, with the seeds that would decide."""
    _, rec = lr_scaling_result(result({(256, "lars"): [0.84, 0.86], (256, "linear"): [0.60, 0.65]}))
    assert rec.startswith("Undecided after 2 seeds each: the 99.2 % interval of the difference reaches both sides")
    assert "(`scalelab lr-scaling --seeds " in rec


def test_overlapping_seeds_recommend_nothing():
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.80, 0.86], (256, "linear"): [0.78, 0.82]}))
    assert rec == lines[-1] and rec.startswith(
        "Undecided after 2 seeds each: the 99.2 % interval of the difference reaches both sides of 0 and beyond the "
        "2 points margin (the seed spread pooled over the experiment's cells, 2 degrees of freedom")


def test_the_only_rule_that_learned_is_recommended_over_those_at_chance():
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.84, 0.86, 0.85], (256, "linear"): [0.10, 0.11, 0.105]}))
    assert rec == ("Use the lars rule for batch 256 (the only one that learned): lars beats linear: 74.5 points above "
                   "linear (99.2 % interval of the difference +70 to +79 points), beyond noise (paired by seed, 2 "
                   "degrees of freedom, corrected for 6 looks, n = 3 seeds each). Final test accuracy of lars: 85 % "
                   "(75 % interval (range of 3) 84–86 %, n = 3 seeds); of linear: 10.5 % (75 % interval (range of 3) "
                   "10–11 %, n = 3 seeds).")
    # the card names linear as what lars is compared with, not as what it recommends (checks.chosen_part)
    table = result({(256, "lars"): [0.84, 0.86, 0.85], (256, "linear"): [0.10, 0.11, 0.105]}).tables
    assert checks.claim_contradictions(table, [], rec) == []
