"""Noise figures over the timed window from injected machine samples: exact outside CPU, steal, load and verdict;
the reference drift and its interval."""
from __future__ import annotations

import math

import pytest

from scalelab.analysis import keys
from scalelab.analysis.noise import (OUTSIDE_CPU_THRESHOLD, drift, drift_sentence, noise_reason, noise_summary,
                                     resolution, timed_window)
from scalelab.analysis.summary import summarize


def records(t0=100.0, steps=6, warmup=2, wall=1.0):
    """Rank 0's steps back to back from t0: the timed window is [t0 + warmup * wall, t0 + steps * wall]."""
    return [{"rank": 0, "step": i, "warmup": i < warmup, "wall(s)": wall, "t_end(unix_s)": t0 + (i + 1) * wall,
             "samples": 8} for i in range(steps)]


def samples(t0=99.0, n=9, busy_rate=2.0, run_rate=1.5, steal_rate=0.0, cores=2, rank=0, load=1.0):
    """Machine samples once a second from t0 with constant rates (CPU seconds per wall second)."""
    return [{"rank": rank, "time": t0 + i, "cpu_busy(s)": 10 + busy_rate * i, "cpu_run(s)": 5 + run_rate * i,
             "cpu_steal(s)": steal_rate * i, "cpu_total(s)": 50 + cores * i, "load1": load + i} for i in range(n)]


def test_timed_window_is_rank0s_timed_steps():
    assert timed_window(records()) == (102.0, 106.0)
    assert timed_window(records(steps=2)) is None


def test_outside_cpu_steal_and_load_over_the_window():
    out = noise_summary(samples(busy_rate=1.8, run_rate=1.0, steal_rate=0.2), records())
    assert out[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.8)  # 1.8 - 1.0 cores
    assert out[keys.NOISE_STEAL_PCT] == pytest.approx(10.0)  # 0.2 of 2 cores
    # load1 = 1 + (t - 99): at 102 .. 106 it is 4 .. 8; samples inside at 103, 104, 105: mean of 4..8 = 6
    assert out[keys.NOISE_LOAD] == pytest.approx(6.0)
    assert out[keys.QUALITY_NOISY] is True
    assert out[keys.QUALITY_NOISE_REASON] == ("noisy: 0.80 cores busy outside the run, "
                                              "10.0 % CPU stolen by the hypervisor")


def test_a_quiet_machine_is_ok_and_interpolation_is_exact_between_samples():
    half = samples(t0=99.5, busy_rate=1.1, run_rate=1.0)  # samples at x.5: the window's ends fall between them
    out = noise_summary(half, records())
    assert out[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.1)
    assert out[keys.QUALITY_NOISY] is False and out[keys.QUALITY_NOISE_REASON] == "ok"


def test_busy_cores_are_a_share_of_the_ticks_counted_when_ticks_are_lost():
    """/proc/stat advanced 1.6 s per wall second on 2 cores (ticks lost), 1.2 of them busy: the machine was busy
    2 x 1.2 / 1.6 = 1.5 cores, and the run's exact 1.0 core leaves 0.5 outside (not 1.2 - 1.0 = 0.2)."""
    lossy = [{**s, "cpu_total(s)": 50 + 1.6 * (s["time"] - 99.0), "cpus": 2}
             for s in samples(busy_rate=1.2, run_rate=1.0)]
    assert noise_summary(lossy, records())[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.5)
    unscaled = [{k: v for k, v in s.items() if k != "cpus"} for s in lossy]  # an older run: busy / wall
    assert noise_summary(unscaled, records())[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.2)


def test_the_run_using_more_than_the_machine_counts_as_zero_outside():
    out = noise_summary(samples(busy_rate=1.0, run_rate=1.2), records())  # sampling jitter: never negative
    assert out[keys.NOISE_OUTSIDE_CPU_CORES] == 0.0


def test_the_busiest_host_counts():
    quiet, busy = samples(rank=0, busy_rate=1.0, run_rate=1.0), samples(rank=2, busy_rate=2.0, run_rate=1.0)
    assert noise_summary(quiet + busy, records())[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(1.0)


def test_nodes_on_one_machine_are_one_host_whose_run_is_all_of_theirs():
    # two namespace nodes of one machine (one boot id): each sampler sees the machine 1.8 cores busy and its own
    # node's run at 0.8 cores; the other node's 0.8 is the run's too, not noise
    one = [{**s, "host": "boot-a"} for s in samples(rank=0, busy_rate=1.8, run_rate=0.8)]
    two = [{**s, "host": "boot-a"} for s in samples(rank=1, busy_rate=1.8, run_rate=0.8)]
    assert noise_summary(one + two, records())[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.2)
    # two machines (two boot ids): each its own host, the busier one counts
    apart = [{**s, "host": "boot-b"} for s in two]
    assert noise_summary(one + apart, records())[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(1.0)


def test_no_machine_samples_or_an_uncovered_window_gives_no_keys():
    assert noise_summary([], records()) == {}
    old = [{k: v for k, v in s.items() if k != "cpu_run(s)"} for s in samples()]  # a run of an older scalelab
    assert noise_summary(old, records()) == {}
    assert noise_summary(samples(t0=103.0), records()) == {}  # the window starts before the first sample


def test_threshold():
    assert noise_reason(OUTSIDE_CPU_THRESHOLD, 0.0) == "ok"
    assert noise_reason(OUTSIDE_CPU_THRESHOLD + 0.01, 0.0).startswith("noisy: ")
    # beyond the threshold by less than what the counters resolve: not a finding
    assert noise_reason(OUTSIDE_CPU_THRESHOLD + 0.005, 0.0, resolution(2.0)) == "ok"
    assert noise_reason(OUTSIDE_CPU_THRESHOLD + 0.02, 0.0, resolution(2.0)).startswith("noisy: ")


def test_a_window_too_short_for_the_ticks_is_not_flagged():
    """The quick study's threads cell: a timed window of ~25 ms inside 0.126 s between the rank's two machine
    samples, busy 0.23 s and the run's 0.21 s in 10 ms ticks: 0.25 cores 'outside', one tick's worth. A tick of
    each counter over 0.126 s is 0.16 cores: not a finding. A hog's 0.67 cores over a 0.1 s sampling interval is."""
    assert resolution(0.025, 0.126) == pytest.approx(0.1587, abs=1e-4)
    assert resolution(2.0, 0.1) == pytest.approx(0.01)
    assert noise_reason(0.2507, 0.0, resolution(0.025, 0.126)) == "ok"
    assert noise_reason(0.67, 0.0, resolution(0.09, 0.1)).startswith("noisy: 0.67 cores")
    assert noise_reason(0.30, 0.0, resolution(10.0)).startswith("noisy: 0.30 cores")


def test_summarize_carries_the_noise_keys():
    out = summarize(records(), steps_per_epoch=6, system=samples(busy_rate=1.5, run_rate=1.0))
    assert out[keys.NOISE_OUTSIDE_CPU_CORES] == pytest.approx(0.5) and out[keys.QUALITY_NOISY] is True
    assert keys.QUALITY_NOISY not in summarize(records(), steps_per_epoch=6)


def test_drift_and_its_interval():
    d = drift((100.0, (95.0, 105.0)), (110.0, (104.0, 114.0)))
    assert d["drift"] == pytest.approx(0.10)
    assert d["ci_low"] == pytest.approx(104 / 105 - 1) and d["ci_high"] == pytest.approx(114 / 95 - 1)
    assert math.isnan(drift((0.0, (0.0, 0.0)), (1.0, (1.0, 1.0)))["drift"])
    assert drift_sentence(d, 100.0, 110.0).startswith("+10.0 % (95 % interval -1.0 .. +20.0 %)")


def test_the_pooled_model_of_a_study_s_tables_counts_a_shared_cell_once_and_leaves_flagged_rows_out():
    import pandas as pd

    from scalelab.analysis.noise import model_of_tables

    row = lambda label, launches, q="ok": {"x": label, "step_launch_medians(ms)": launches,  # noqa: E731
                                           "step_log_var_within": 0.01, "step_log_var_within_dof": 10, "quality": q}
    a = pd.DataFrame([row("ddp", [10.0, 11.0]), row("gather", [20.0, 22.0]), row("bad", [5.0, 50.0], "noisy: x")])
    b = pd.DataFrame([row("ddp", [10.0, 11.0])])  # the same cell in a second experiment
    model = model_of_tables([a, b])
    assert model.cells == 2 and model.dof == 2
    assert model.launch_var == pytest.approx((math.log(11 / 10) ** 2 / 2 + math.log(22 / 20) ** 2 / 2) / 2)
    assert model.within_var == pytest.approx(0.01) and model.within_dof == 20
