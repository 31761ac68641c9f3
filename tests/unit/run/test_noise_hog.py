"""A real CPU hog beside a real one-rank run: the run is flagged noisy, the run's own CPU is this process's alone
(the hog, a child started before the run, is outside it), and the CPU taken outside the run covers the hog's.

The machine is shared: other processes come and go by more than one hog's share, so "with the hog" is not asserted
to exceed "without" (both are printed); the hog's CPU is read from /proc/<hog>/stat as the known truth instead,
sampled beside the run and interpolated at the run's own timed window (the window the noise figure covers)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from scalelab.analysis import keys
from scalelab.analysis.noise import OUTSIDE_CPU_THRESHOLD, STEAL_THRESHOLD, timed_window
from scalelab.config import TrainConfig
from scalelab.measure.machine import read_process_cpu
from scalelab.run.execute import execute
from scalelab.store import RunDir, read_jsonl

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="noise detection reads Linux /proc")


def tiny_run(store):
    cfg = TrainConfig(model="cnn", dataset="synthetic", samples=256, eval_samples=16, global_batch=16, steps=150,
                      warmup_steps=2, sample_interval_s=0.1)
    return execute(cfg, store, say=lambda s: None)


def run_cpu_seconds(out) -> float:
    """CPU seconds the sampler charged to the run, from its first sample to its last."""
    rows = [s for s in read_jsonl(out.run_dir / "system.rank0.jsonl") if "cpu_run(s)" in s]
    return rows[-1]["cpu_run(s)"] - rows[0]["cpu_run(s)"]


def cores_in_window(trace: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Cores a process kept busy over WINDOW from its (time, cumulative CPU seconds) samples."""
    t, cpu = np.array([x[0] for x in trace]), np.array([x[1] for x in trace])
    begin, end = window
    return float((np.interp(end, t, cpu) - np.interp(begin, t, cpu)) / (end - begin))


@pytest.mark.timeout(120)
def test_a_cpu_hog_beside_the_run_is_detected(store, record_property):
    quiet = tiny_run(store).summary
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    trace: list[tuple[float, float]] = []
    done = threading.Event()

    def sample_hog():  # one small read per 50 ms: the hog's cumulative CPU, the known truth
        while not done.wait(0.05):
            trace.append((time.time(), read_process_cpu(hog.pid)))

    sampler = threading.Thread(target=sample_hog, daemon=True)
    try:
        time.sleep(0.3)
        sampler.start()
        own0 = read_process_cpu(os.getpid())
        out = tiny_run(store)
        own = read_process_cpu(os.getpid()) - own0  # this process ran the rank (one rank, no loader workers)
    finally:
        done.set()
        sampler.join()
        os.kill(hog.pid, signal.SIGKILL)
        hog.wait()
    hog_cores = cores_in_window(trace, timed_window(RunDir(out.run_dir).read_steps()))
    noisy = out.summary
    outside_quiet, outside_hog = quiet[keys.NOISE_OUTSIDE_CPU_CORES], noisy[keys.NOISE_OUTSIDE_CPU_CORES]
    record_property("outside_cpu", f"quiet {outside_quiet:.2f}, hog {outside_hog:.2f}, hog alone {hog_cores:.2f}")
    print(f"outside CPU (cores): quiet {outside_quiet:.2f}, with hog {outside_hog:.2f}; hog {hog_cores:.2f}")
    assert run_cpu_seconds(out) <= own + 0.05  # the run's CPU is this process's: the hog is not charged to it
    # and the hog's CPU in the timed window is counted outside the run: seen within 0.01 cores over 6 runs once
    # busy cores are a share of the ticks /proc/stat counted (scalelab.analysis.noise); 0.08 leaves room for
    # the 0.1 s sampling and the 10 ms ticks over a window of about 2 s. Other processes only add to it.
    assert outside_hog >= hog_cores - 0.08
    if hog_cores > OUTSIDE_CPU_THRESHOLD + 0.05:  # the hog got a share above the threshold: the run is flagged
        assert noisy[keys.QUALITY_NOISY] is True and noisy[keys.QUALITY_NOISE_REASON].startswith("noisy: ")
    assert quiet[keys.QUALITY_NOISY] == (quiet[keys.NOISE_OUTSIDE_CPU_CORES] > OUTSIDE_CPU_THRESHOLD
                                         + quiet[keys.NOISE_RESOLUTION_CORES]
                                         or quiet[keys.NOISE_STEAL_PCT] > STEAL_THRESHOLD)
    assert keys.NOISE_STEAL_PCT in noisy and keys.NOISE_LOAD in noisy

