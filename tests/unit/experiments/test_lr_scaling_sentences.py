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
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.84, 0.86], (256, "linear"): [0.60, 0.65],
                                           (256, "sqrt"): [0.10, 0.12]}))
    assert rec == ("Use the lars rule for batch 256: lars beats linear: 22.5 points above linear (98.3 % interval of "
                   "the difference +19.2 to +25.8 points), beyond noise (the two sides' own intervals, corrected for 3 "
                   "looks, n = 2 seeds each). Final test accuracy of lars: 85 % (50 % interval (range of 2) 84–86 %, "
                   "n = 2 seeds); of linear: 62.5 % (50 % interval (range of 2) 60–65 %, n = 2 seeds).")
    assert lines[0].startswith("At batch 256, sqrt did not learn: final accuracy not clear of chance (chance 10.6 %)")
    assert lines[1] == ("At batch 256 (8x), among the rules that learned (ranges over seeds): lars 85.0 % (84.0–86.0 %), linear 62.5 % "
                        "(60.0–65.0 %) over 2 seeds.")


def test_overlapping_seeds_recommend_nothing():
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.80, 0.86], (256, "linear"): [0.78, 0.82]}))
    assert rec == lines[-1] and rec.startswith(
        "Undecided after 2 seeds each: the 98.3 % interval of the difference reaches both sides of 0 and beyond the "
        "2 points margin")


def test_the_only_rule_that_learned_is_recommended_over_those_at_chance():
    lines, rec = lr_scaling_result(result({(256, "lars"): [0.84, 0.86], (256, "linear"): [0.10, 0.11]}))
    assert rec == ("Use the lars rule for batch 256 (the only one that learned): lars beats linear: 74.5 points above "
                   "linear (98.3 % interval of the difference +73.1 to +75.9 points), beyond noise (the two sides' own "
                   "intervals, corrected for 3 looks, n = 2 seeds each). Final test "
                   "accuracy of lars: 85 % (50 % interval (range of 2) 84–86 %, n = 2 seeds); of linear: 10.5 % (50 % "
                   "interval (range of 2) 10–11 %, n = 2 seeds).")
    # the card names linear as what lars is compared with, not as what it recommends (checks.chosen_part)
    table = result({(256, "lars"): [0.84, 0.86], (256, "linear"): [0.10, 0.11]}).tables
    assert checks.claim_contradictions(table, [], rec) == []
