"""Mixed precision's sentences: accuracy is compared, and a precision recommended, only between runs that learned
(accuracy above chance by more than its seed interval, scalelab.analysis.learning); a faster precision whose runs
stayed at chance is said to be faster, nothing more."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.experiments.amp import precision, precision_table, study_options
from scalelab.lab.base import StudyPlan

CHANCE = 0.106  # MNIST-1D's test set: its largest class holds 10.6 % of the labels


def table(fp32: list[float], bf16: list[float], *, bf16_step: float = 3.9) -> pd.DataFrame:
    """Two precisions, each a run per seed with these final accuracies (bf16 faster beyond noise unless its
    `bf16_step` says otherwise; fp32's step is 4.5 ms)."""
    def run(p: str, seed: int, acc: float, step: float, thr: float) -> dict:
        return {"run_id": f"{p}-{seed}", "config": {"precision": p, "device": "cpu", "seed": seed},
                "summary": {keys.EVAL_ACC: acc, keys.THROUGHPUT: thr, keys.STEP_MEDIAN_MS: step,
                            keys.STEP_MEDIAN_CI_LOW_MS: step - 0.1, keys.STEP_MEDIAN_CI_HIGH_MS: step + 0.1,
                            "launches": 2}}  # cells launched twice: their own pooled time stands
    runs = [run("fp32", s, a, 4.5, 100.0) for s, a in enumerate(fp32)]
    runs += [run("bf16", s, a, bf16_step, 118.0 * 3.9 / bf16_step) for s, a in enumerate(bf16)]
    return precision_table(runs, CHANCE)


def test_the_table_says_chance_and_whether_each_precision_learned():
    t = table([0.85, 0.88], [0.104, 0.12]).set_index("precision")
    assert t.loc["fp32", keys.EVAL_ACC] == 0.865
    assert (t.loc["fp32", "eval/acc_ci_low"], t.loc["fp32", "eval/acc_ci_high"]) == (0.85, 0.88)
    assert t.loc["fp32", "chance"] == CHANCE and t.loc["fp32", "seeds"] == 2
    assert bool(t.loc["fp32", "learned"]) and not bool(t.loc["bf16", "learned"])


def test_runs_that_did_not_learn_give_no_recommendation():
    lines, rec = precision(table([0.109, 0.102], [0.104, 0.12]))  # the old default study's 40 steps: at chance
    assert rec.startswith("Undecided after 2 launches each: bf16 is faster beyond noise, but accuracy is not compared")
    assert "Keep fp32, the default meanwhile." in rec
    assert lines[0] == "bf16 runs 1.15× faster than fp32 (median step)."  # no accuracy beside it
    assert lines[1:3] == ["fp32 did not learn: 10.5 % (range 10.2–10.9 % over 2 seeds) is not clear of chance "
                          "10.6 %.",
                          "bf16 did not learn: 11.2 % (range 10.4–12.0 % over 2 seeds) is not clear of chance "
                          "10.6 %."]
    assert lines[3].startswith("Accuracy is not compared: accuracies are compared only between runs that learned: a "
                               "run at chance guesses")


def test_fp32_faster_is_not_recommended_when_a_precision_did_not_learn():
    """On CPU bf16 is often the slower one: fp32 then wins on speed, and its card would name fp32 as the choice.
    Where the runs stayed at chance that is a recommendation of a precision that did not learn (analysis.checks'
    audit flags it): fp32 is kept as the default, with why, and recommended only where every precision learned."""
    from scalelab.analysis.checks import recommends

    _, rec = precision(table([0.109, 0.102], [0.104, 0.12], bf16_step=5.5))
    assert not recommends(rec) and rec.startswith("Undecided after 2 launches each: fp32 is faster beyond noise, but "
                                                  "accuracy is not compared"), rec
    assert "Keep fp32, the default meanwhile." in rec
    _, rec = precision(table([0.90, 0.92], [0.895, 0.915], bf16_step=5.5))  # both learned: fp32 is the choice
    assert recommends(rec) and rec.startswith("Use fp32"), rec


def test_one_seed_compares_no_accuracy():
    lines, rec = precision(table([0.9], [0.9]))
    assert rec.startswith("Undecided after 2 launches each: bf16 is faster beyond noise, but accuracy is not compared")
    assert any("fp32 is not known to have learned: 90.0 % from one seed" in line for line in lines)


def test_runs_that_learned_are_compared():
    lines, rec = precision(table([0.90, 0.92], [0.895, 0.915]))
    assert lines[0] == ("bf16 runs 1.15× faster than fp32 (median step) and ends at accuracy 90.5 % (range 89.5–91.5 "
                        "%, 2 seeds) vs 91.0 % (range 90.0–92.0 %, 2 seeds) (fp32).")
    assert rec.startswith("Use bf16 (accuracy within 1 point of fp32's): bf16 beats fp32: 1.15× faster than fp32 (")
    lines, rec = precision(table([0.90, 0.92], [0.84, 0.86]))  # faster, but 6 points less accurate
    assert "Keep fp32, the default" in rec and not rec.startswith("Use")


def test_the_study_trains_a_model_that_learns():
    for quick in (True, False):
        opts = study_options(StudyPlan(quick=quick, gpus=0, comm_model={}))
        assert opts["set"]["dataset"] == "mnist1d" and opts["seeds"] >= 2
        assert opts["set"]["steps"] >= 400
