"""Peak RSS is the run's own: a run that starts after a bigger one in the same process does not inherit its peak."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from scalelab.measure.memory import peak_memory, training_baseline


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the kernel's VmHWM mark (Linux)")
def test_peak_rss_starts_again_at_each_runs_baseline():
    big = 512 * 2**20
    block = np.ones(big, dtype=np.uint8)  # touched: resident
    del block  # a large allocation goes back to the kernel when freed
    baseline = training_baseline()  # what every run does before training
    peak = peak_memory(torch.device("cpu"))["peak_rss(bytes)"]
    if peak > baseline["rss"] + big / 2:
        pytest.skip("the kernel did not let this process reset its peak mark (/proc/self/clear_refs)")
    assert peak < baseline["rss"] + 64 * 2**20  # the earlier 512 MiB is not this run's peak
    block = np.ones(big // 2, dtype=np.uint8)
    assert peak_memory(torch.device("cpu"))["peak_rss(bytes)"] >= baseline["rss"] + big // 2 * 0.9  # this one is
    del block
