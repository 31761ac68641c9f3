"""Experiments that compare configurations on their own (threads, loader, batch size, checkpointing) follow the
one rule of scalelab.lab.decision: a finding between configurations counts launches, and one launch (the quick
study) recommends nothing, and its card says why with both sides' figures."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.experiments.batch_sweep import batch_sweep
from scalelab.experiments.checkpointing import _noise_note
from scalelab.experiments.loader import loader
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
    assert lines[0] == ("With 2 threads a step takes 60 ms (87.5 % interval (range of 4) 59–61 ms), 1.67× faster than "
                        "1 thread (2 cores here).")
    assert rec == lines[-1] == (
        "Undecided after 1 launch each: a comparison between configurations needs 2 or more launches each "
        "(`scalelab threads --launches 2`). No thread count is recommended yet. Median step of 2 threads: 60 ms (87.5 % interval (range of 4) 59–61 ms, n = 1 launch); of 1 "
        "thread: 100 ms (87.5 % interval (range of 4) 99–101 ms, n = 1 launch).")


def test_threads_from_two_launches_each_recommend_with_n():
    lines, rec = interpret_threads(threads(2))
    assert rec.startswith("Use 2 torch threads in a single process on this machine's 2 cores (the layout measured; R "
                          "ranks on it share them, about 2/R threads each): 2 threads beats 1 thread: 1.67× faster "
                          "than 1 thread (")
    assert rec.endswith("beyond noise (the two sides' own intervals, corrected for 6 looks, n = 2 "
                        "launches each). Median step of 2 threads: 60 ms (95 % interval 59–61 ms, n = 2 launches); of "
                        "1 thread: 100 ms (95 % interval 99–101 ms, n = 2 launches).")


def loader_table(launches: int) -> pd.DataFrame:
    return pd.DataFrame([{"num_workers": w, "pin_memory": False, "prefetch_factor": None if w == 0 else 2,
                          "data_wait(%)": d, keys.THROUGHPUT: tp, **step(t, launches)}
                         for w, d, tp, t in ((0, 40.0, 100.0, 100.0), (2, 5.0, 160.0, 62.0))])


def test_loader_from_one_launch_recommends_nothing_from_two_it_does():
    lines, rec = loader(loader_table(1))
    assert rec == lines[-1] and rec.startswith("Undecided after 1 launch each: a comparison between "
                                               "configurations needs 2 or more launches each")
    assert "Keep num_workers=0 (pin_memory=False), the default meanwhile." in rec
    lines, rec = loader(loader_table(2))
    assert rec.startswith("Use num_workers=2 (pin_memory=False, prefetch_factor=2): num_workers=2 (pin_memory=False, "
                          "prefetch_factor=2) beats num_workers=0 (pin_memory=False): 1.61× faster than num_workers=0 "
                          "(pin_memory=False) (")


def test_loader_within_noise_keeps_no_workers():
    table = loader_table(2)
    table.loc[1, [keys.STEP_MEDIAN_MS, LO, HI]] = [97.0, 90.0, 104.0]
    lines, rec = loader(table)
    assert rec.startswith("Undecided after 2 launches each: the 99.2 % interval of the speed ratio reaches both "
                          "sides of 1 and beyond the 10 % margin")
    assert "Keep num_workers=0 (pin_memory=False), the default meanwhile." in rec


def batch_table(launches: int) -> pd.DataFrame:
    return pd.DataFrame([{"global_batch": b, keys.THROUGHPUT: tp, "throughput_ci_low(samples/s)": tp - 5,
                          "throughput_ci_high(samples/s)": tp + 5,
                          keys.EPOCH_S: 10.0, keys.EPOCH_NO_DATA_S: 9.0, "launches": launches, "quality": "ok"}
                         for b, tp in ((16, 100.0), (64, 200.0), (256, 203.0))])


def test_batch_sweep_keeps_the_smallest_batch_within_noise_of_the_best():
    lines, rec = batch_sweep(batch_table(1))
    assert rec.startswith("Undecided after 1 launch each: a comparison between configurations needs 2 or more "
                          "launches each (`scalelab batch-sweep --launches 2`). No batch size is recommended yet.")
    lines, rec = batch_sweep(batch_table(2))
    assert rec.startswith("Keep batch 64, the smallest batch equivalent to the highest throughput (batch 256): "
                          "batch 64 and batch 256 are equivalent within ±10 %")


def test_checkpointing_calls_a_step_ratio_indicative_from_one_launch():
    off, on = step(100.0, 1), step(130.0, 1)
    assert _noise_note(on, off) == " (indicative: 1 launch)"
    assert _noise_note(step(130.0, 2), step(100.0, 2)) == ""
    assert _noise_note(step(100.5, 2), step(100.0, 2)) == " (equivalent within ±10 %)"
    assert _noise_note({**step(110.0, 2), LO: 80.0, HI: 140.0}, step(100.0, 2)) == " (within noise)"
