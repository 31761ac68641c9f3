"""Experiments that compare configurations on their own (threads, loader, batch size, checkpointing) follow the
one rule of scalelab.analysis.interpret: a finding between configurations counts launches, and one launch (the
quick study) is indicative, ranks nothing and recommends nothing."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.experiments.batch_sweep import batch_sweep
from scalelab.experiments.checkpointing import _noise_note
from scalelab.experiments.loader import best_loader_setting, loader
from scalelab.experiments.threads import interpret_threads
from scalelab.lab.base import Result

LO, HI = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS


def step(t: float, launches: int, n: int = 12) -> dict:
    return {keys.STEP_MEDIAN_MS: t, LO: t - 1, HI: t + 1, "n": n, "launches": launches, "quality": "ok"}


def threads(launches: int, n: int = 12) -> Result:
    table = pd.DataFrame([{"threads": k, **step(t, launches, n), "speedup": 100.0 / t, "cores": 2,
                           "oversubscribed": k > 2} for k, t in ((1, 100.0), (2, 60.0), (4, 90.0))])
    return Result("threads", {"threads": table})


def test_threads_from_one_launch_recommend_nothing():
    lines, rec = interpret_threads(threads(1, n=4))
    assert rec is None
    assert lines[0] == ("With 2 threads a step takes 60 ms (87.5 % interval (range of 4) 59–61 ms), 1.67x the "
                        "1-thread step (2 cores here).")
    assert lines[-1].startswith("The shortest step is 2 threads': indicative: 1 launch, not ranked")


def test_threads_from_two_launches_each_recommend_with_n():
    lines, rec = interpret_threads(threads(2))
    assert rec == ("Use 2 torch threads per process: 60 ms per step (95 % interval 59–61 ms; shorter than every "
                   "other thread count in each of 2 launches).")


def loader_table(launches: int) -> pd.DataFrame:
    return pd.DataFrame([{"num_workers": w, "pin_memory": False, "prefetch_factor": None if w == 0 else 2,
                          "data_wait(%)": d, keys.THROUGHPUT: tp, **step(t, launches)}
                         for w, d, tp, t in ((0, 40.0, 100.0, 100.0), (2, 5.0, 160.0, 62.0))])


def test_loader_from_one_launch_recommends_nothing_from_two_it_does():
    table = loader_table(1)
    lines, rec = loader(table, best_loader_setting(table))
    assert rec is None and lines[-1] == (
        "num_workers=2's step (95 % interval 61–63 ms) against no workers' (95 % interval 99–101 ms): indicative: "
        "1 launch, not ranked (a difference between configurations counts only when each was launched at least 2 "
        "times and every launch agrees).")
    table = loader_table(2)
    lines, rec = loader(table, best_loader_setting(table))
    assert rec == "Use num_workers=2, pin_memory=False, prefetch_factor=2: step 62 ms (95 % interval 61–63 ms)."


def batch_table(launches: int) -> pd.DataFrame:
    return pd.DataFrame([{"global_batch": b, keys.THROUGHPUT: tp, "ci_low": tp - 5, "ci_high": tp + 5,
                          keys.EPOCH_S: 10.0, keys.EPOCH_NO_DATA_S: 9.0, "launches": launches, "quality": "ok"}
                         for b, tp in ((16, 100.0), (64, 200.0))])


def test_batch_sweep_from_one_launch_recommends_nothing():
    lines, rec = batch_sweep(batch_table(1))
    assert rec is None and lines[-1].startswith("Batch 64 has the highest throughput: indicative: 1 launch")
    lines, rec = batch_sweep(batch_table(2))
    assert rec == "Use batch 64 for throughput (200 samples/s, 95 % interval 195–205 samples/s)."


def test_checkpointing_calls_a_step_ratio_indicative_from_one_launch():
    off, on = step(100.0, 1), step(130.0, 1)
    assert _noise_note(on, off) == " (indicative: 1 launch)"
    assert _noise_note(step(130.0, 2), step(100.0, 2)) == ""
    assert _noise_note(step(100.5, 2), step(100.0, 2)) == " (within noise)"
