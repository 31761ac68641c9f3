"""The checkpointing table and its interpretation from fixed runs: ratios to no checkpointing, and the CPU note
only where the process's RSS fell less than the saved activations."""
from __future__ import annotations

import pytest

from scalelab.analysis import keys
from scalelab.experiments import checkpointing as interpret
from scalelab.experiments.checkpointing import checkpointing_table


def runs(rss_gib: dict[int, float]) -> list[dict]:
    saved = {0: 800.0 * 2**20, 1: 100.0 * 2**20, 2: 200.0 * 2**20}
    peak = {0: 800.0 * 2**20, 1: 800.0 * 2**20, 2: 500.0 * 2**20}
    step = {0: 10.0, 1: 14.0, 2: 13.0}
    return [{"run_id": f"r{k}", "config": {"checkpoint_segments": k, "global_batch": 64},
             "summary": {keys.MEMORY_ACTIVATIONS_BYTES: saved[k], keys.MEMORY_ACTIVATIONS_PEAK_BYTES: peak[k],
                         keys.MEMORY_PEAK_RSS_GIB: rss_gib[k], keys.STEP_MIN_MS: step[k] - 1,
                         keys.STEP_MEDIAN_MS: step[k], keys.STEP_MAX_MS: step[k] + 1, keys.THROUGHPUT: 1.0}}
            for k in saved]


def test_ratios_to_no_checkpointing():
    table = checkpointing_table(runs({0: 2.0, 1: 1.9, 2: 1.95}))
    assert list(table["checkpoint_segments"]) == [0, 1, 2]
    assert list(table["activations_vs_off"]) == [1.0, 0.125, 0.25]
    assert list(table["backward_peak_vs_off"]) == [1.0, 1.0, 0.625]
    assert list(table["step_time_vs_off"]) == pytest.approx([1.0, 1.4, 1.3])


def test_interpretation_names_the_activations_and_when_rss_hides_them():
    hidden, _ = interpret.checkpointing(checkpointing_table(runs({0: 2.0, 1: 1.9, 2: 1.95})))
    assert hidden[0] == ("1 segments: saved activations 100 MiB (0.12× of no checkpointing), backward peak "
                         "800 MiB (1.00×), peak RSS 0.95×, steps 0.71× the speed of no checkpointing (1.40× slower) "
                         "(no interval).")
    assert "hides the activations" in hidden[-1] and "0.95×..0.97×" in hidden[-1]
    shown, _ = interpret.checkpointing(checkpointing_table(runs({0: 2.0, 1: 0.2, 2: 0.4})))
    assert len(shown) == 2 and not any("hides" in s for s in shown)  # RSS fell as far as the activations
