"""A real CPU hog beside a real one-rank run: the run is flagged noisy, the run's own CPU is this process's alone
(the hog, a child started before the run, is outside it), and the CPU taken outside the run covers the hog's.

The machine is shared: other processes come and go by more than one hog's share, so "with the hog" is not asserted
to exceed "without" (both are printed); the hog's CPU is read from /proc/<hog>/stat as the known truth instead."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from scalelab.analysis import keys
from scalelab.analysis.noise import OUTSIDE_CPU_THRESHOLD, STEAL_THRESHOLD
from scalelab.config import TrainConfig
from scalelab.measure.machine import read_process_cpu
from scalelab.run.execute import execute
from scalelab.store import read_jsonl

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="noise detection reads Linux /proc")


def tiny_run(store):
    cfg = TrainConfig(model="cnn", dataset="synthetic", samples=256, eval_samples=16, global_batch=16, steps=40,
                      warmup_steps=2, sample_interval_s=0.1)
    return execute(cfg, store, say=lambda s: None)


def run_cpu_seconds(out) -> float:
    """CPU seconds the sampler charged to the run, from its first sample to its last."""
    rows = [s for s in read_jsonl(out.run_dir / "system.rank0.jsonl") if "cpu_run(s)" in s]
    return rows[-1]["cpu_run(s)"] - rows[0]["cpu_run(s)"]


@pytest.mark.timeout(120)
def test_a_cpu_hog_beside_the_run_is_detected(store, record_property):
    quiet = tiny_run(store).summary
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        began, cpu0, own0 = time.time(), read_process_cpu(hog.pid), read_process_cpu(os.getpid())
        out = tiny_run(store)
        own = read_process_cpu(os.getpid()) - own0  # this process ran the rank (one rank, no loader workers)
        hog_cpu = read_process_cpu(hog.pid) - cpu0
        hog_cores = hog_cpu / (time.time() - began)  # the hog's known share
    finally:
        os.kill(hog.pid, signal.SIGKILL)
        hog.wait()
    noisy = out.summary
    outside_quiet, outside_hog = quiet[keys.NOISE_OUTSIDE_CPU_CORES], noisy[keys.NOISE_OUTSIDE_CPU_CORES]
    record_property("outside_cpu", f"quiet {outside_quiet:.2f}, hog {outside_hog:.2f}, hog alone {hog_cores:.2f}")
    print(f"outside CPU (cores): quiet {outside_quiet:.2f}, with hog {outside_hog:.2f}; hog {hog_cores:.2f}")
    assert noisy[keys.QUALITY_NOISY] is True and noisy[keys.QUALITY_NOISE_REASON].startswith("noisy: ")
    assert hog_cpu > 0.2  # the hog really ran beside the run
    assert run_cpu_seconds(out) <= own + 0.05  # the run's CPU is this process's: the hog is not charged to it
    # and its CPU is counted outside the run. The hog's share is measured over the whole run, set-up included,
    # where it has a core to itself; in the timed window it shares the cores with the rank (seen on a quiet
    # machine: 0.72 cores over the run, 0.33 outside in the timed window), so only part of it is required there
    assert outside_hog >= max(OUTSIDE_CPU_THRESHOLD, 0.3 * hog_cores)
    assert quiet[keys.QUALITY_NOISY] == (quiet[keys.NOISE_OUTSIDE_CPU_CORES] > OUTSIDE_CPU_THRESHOLD
                                         or quiet[keys.NOISE_STEAL_PCT] > STEAL_THRESHOLD)
    assert keys.NOISE_STEAL_PCT in noisy and keys.NOISE_LOAD in noisy
