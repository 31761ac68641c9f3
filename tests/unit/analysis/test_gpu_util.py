"""GPU utilisation over the timed steps: NVML samples inside the window only, their mean and count; launches pool
their samples; the batch sweep and the profile show it beside throughput (seed 002 Q1). Known truth: samples with
fixed times and values around a window of known steps."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.analysis.repeats import pool
from scalelab.analysis.summary import gpu_utilisation


def steps(t0: float, n: int, wall: float, warmup: int = 2) -> list[dict]:
    """Rank 0's records of n steps of `wall` seconds from unix time t0, the first `warmup` untimed."""
    return [{"step": i + 1, "rank": 0, "warmup": i < warmup, "wall(s)": wall, "t_end(unix_s)": t0 + (i + 1) * wall}
            for i in range(n)]


def test_only_the_samples_inside_the_timed_steps_count():
    records = steps(100.0, 12, 0.5)  # timed steps from 101.0 (end of the warm-up) to 106.0
    samples = [{"time": 100.5, "gpu_util(%)": 5.0},  # warm-up: left out
               {"time": 101.5, "gpu_util(%)": 90.0}, {"time": 103.0, "gpu_util(%)": 80.0},
               {"time": 106.0, "gpu_util(%)": 70.0},
               {"time": 107.0, "gpu_util(%)": 1.0},  # after the last step: left out
               {"time": 102.0, "cpu_process(%)": 50.0}]  # no GPU reading (a CPU rank's sample)
    assert gpu_utilisation(samples, records) == {keys.GPU_UTIL: pytest.approx(80.0), keys.GPU_UTIL_SAMPLES: 3}


def test_no_gpu_samples_no_figure():
    records = steps(100.0, 6, 0.5)
    assert gpu_utilisation([{"time": 102.0, "cpu_process(%)": 50.0}], records) == {}
    assert gpu_utilisation([{"time": 102.0, "gpu_util(%)": 50.0}], steps(100.0, 2, 0.5, warmup=2)) == {}


def test_launches_pool_their_samples_not_their_means():
    a = {keys.STEP_MEDIAN_MS: 10.0, keys.GPU_UTIL: 90.0, keys.GPU_UTIL_SAMPLES: 3}
    b = {keys.STEP_MEDIAN_MS: 11.0, keys.GPU_UTIL: 50.0, keys.GPU_UTIL_SAMPLES: 1}
    out = pool([a, b], [[10.0, 10.0], [11.0, 11.0]])
    assert out[keys.GPU_UTIL] == pytest.approx(80.0) and out[keys.GPU_UTIL_SAMPLES] == 4


def test_the_batch_sweep_and_the_profile_show_it_beside_throughput():
    from scalelab.experiments.batch_sweep import batch_sweep_table
    from scalelab.experiments.profile import profile, rates_table, stage_profile_table

    def run(batch, util, n):
        summary = {keys.THROUGHPUT: 1000.0 * batch, keys.GPU_UTIL: util, keys.GPU_UTIL_SAMPLES: n,
                   keys.STEPS_TIMED: 20, keys.EPOCH_S: 1.0, keys.EPOCH_NO_DATA_S: 0.9,
                   keys.stage_ms("forward"): 1.0, keys.stage_ms("backward"): 2.0}
        return {"run_id": f"r{batch}", "config": {"global_batch": batch, "ranks": 1}, "summary": summary}

    runs = [run(128, 20.0, 4), run(1024, 54.0, 9)]
    table = batch_sweep_table(runs)
    cols = list(table.columns)
    at = cols.index(keys.GPU_UTIL)
    assert cols.index(keys.THROUGHPUT) < at and cols[at + 1] == keys.GPU_UTIL_SAMPLES  # beside throughput, with n
    assert list(table[keys.GPU_UTIL]) == [20.0, 54.0] and list(table[keys.GPU_UTIL_SAMPLES]) == [4, 9]
    lines, _ = profile(stage_profile_table(runs[:1]), rates_table(runs[:1]))
    assert any("20 % of the time" in line and "(4 samples)" in line and "not the share of the chip" in line
               for line in lines), lines
    cpu = [{**runs[0], "summary": {k: v for k, v in runs[0]["summary"].items() if not k.startswith("gpu/")}}]
    assert keys.GPU_UTIL not in batch_sweep_table(cpu) and keys.GPU_UTIL not in rates_table(cpu)
    assert not any("NVML" in line for line in profile(stage_profile_table(cpu), rates_table(cpu))[0])
