"""A real run end to end in one process: an injected forward delay is measured in the forward stage."""
from __future__ import annotations

import dataclasses
import statistics

import pytest

from scalelab.config import TrainConfig
from scalelab.run.execute import execute
from scalelab.store import read_jsonl

pytestmark = pytest.mark.timeout(240)


def test_injected_forward_delay_is_measured_in_the_forward_stage(store, sleepy_model):
    cfg = TrainConfig(model=sleepy_model(0.05), dataset="synthetic", samples=64, eval_samples=16,
                      global_batch=8, steps=8, warmup_steps=2, sample_interval_s=0.1)
    out = execute(cfg, store, say=lambda s: None)
    steps = [r for r in read_jsonl(out.run_dir / "steps.rank0.jsonl") if not r["warmup"]]
    assert len(steps) == 6
    forward = statistics.median(r["forward(s)"] for r in steps)
    assert abs(forward - 0.05) / 0.05 < 0.05  # the known 50 ms, within 5 %
    for r in steps:
        assert r["other(s)"] <= 0.02 * r["wall(s)"]  # the named stages account for the step
    # the same model without the sleep: the 50 ms shows up in forward and in the step's wall time, nowhere else
    fast = execute(dataclasses.replace(cfg, model=sleepy_model(0.0)), store, say=lambda s: None)
    fast_steps = [r for r in read_jsonl(fast.run_dir / "steps.rank0.jsonl") if not r["warmup"]]

    def added(key):
        return statistics.median(r[key] for r in steps) - statistics.median(r[key] for r in fast_steps)

    # every step's wall time is its forward (the sleep, however long it took) plus the few ms the model takes
    # without sleeping. Margins are half the sleep: a sleep charged to the wrong stage would move 50 ms there,
    # while a loaded machine's noise (seen: 19 ms in one step) stays below it.
    assert 0 <= statistics.median(r["wall(s)"] - r["forward(s)"] for r in steps) < 0.025
    assert added("forward(s)") >= 0.05 * 0.98  # a sleep never returns early
    assert abs(added("wall(s)") - added("forward(s)")) < 0.025
    # evaluation (16 samples through the sleepy model: at least one 50 ms forward) runs after the last step,
    # outside its wall time, and is reported on its own
    last = steps[-1]
    assert "eval(s)" not in last and last["evaluation(s)"] >= 0.05 * 0.98
    assert last["wall(s)"] - last["forward(s)"] < 0.025
    assert out.summary["time/eval(ms)"] == pytest.approx(1e3 * last["evaluation(s)"])
    assert out.summary["evals/count"] == 1
    for stage in ("data", "h2d", "backward", "comm", "optimizer", "other"):
        assert abs(added(f"{stage}(s)")) < 0.025, stage
    assert out.summary["stage/forward(ms)"] == pytest.approx(1e3 * statistics.mean(r["forward(s)"] for r in steps))
    row = store.get(out.run_id)
    assert row["status"] == "completed"
    system = read_jsonl(out.run_dir / "system.rank0.jsonl")
    assert len(system) >= 2 and system[-1]["rss(bytes)"] > 0 and "net_sent(bytes)" in system[-1]
