"""Horovod's exposed communication recovers an injected delay of known length (2 real ranks under horovodrun).

Known truth: with `net_latency_ms` every rank sleeps LATENCY_MS after the optimizer's synchronize() returns, once
per step, on the caller's side (engines/horovod.py), and the baseline (DistributedOptimizer with its hooks, the
allreduce a completed dummy) sleeps nothing. The time inside collectives, from Horovod's timeline, holds the delay
once plus the real allreduce of this tiny model (198 KB, one fused collective, under a millisecond). Exposed = step
- baseline step must hold the delay (never hidden: it follows synchronize()), and no more than the directly
measured blocking wait (last gradient -> end of synchronize() and the sleep): beside the delay and the collective,
that wait holds Horovod's queueing before negotiation (a gradient waits for the background thread's next cycle;
seen 0.5-17 ms a step on 2 busy cores), which the baseline cannot keep and the timeline shows as no span.
Skips, with the reason, where Horovod is not installed.
"""
from __future__ import annotations

import pytest

from conftest import TINY_MLP, run_experiment
from scalelab.config import TrainConfig
from scalelab.engines import registry

MISSING = registry.get("horovod").unavailable()
pytestmark = [pytest.mark.dist, pytest.mark.timeout(400),
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

LATENCY_MS = 25.0
OVERSHOOT_MS = 1.5  # a caller's sleep returns late (seen: < 1 ms idle)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from scalelab.store import Store

    root = tmp_path_factory.mktemp("hvd_exposed")
    (root / "tiny.py").write_text(TINY_MLP)
    base = TrainConfig(model=f"{root / 'tiny.py'}:make", dataset="synthetic", samples=128, eval_samples=16,
                       global_batch=16, steps=14, warmup_steps=2, ranks=2, net_latency_ms=LATENCY_MS,
                       sample_interval_s=0.5)
    return run_experiment("engines", base, Store(root / "store"), "s", root / "out", engines=["horovod"],
                          launches=1, baseline=True)


def test_injected_delay_is_recovered_as_exposed_communication(result):
    row = result.tables["compare_engines"].set_index("engine").loc["horovod"]
    shown = {k: row[k] for k in ("step(ms)", "compute(ms)", "comm(ms)", "comm_critical(ms)", "waiting_for_peers(ms)",
                                 "comm_wait(ms)", "exposed_comm(ms)", "exposed_ci_low(ms)", "exposed_ci_high(ms)",
                                 "fusion_copies(ms)", "quality")}
    assert row["status"] == "completed", shown
    # the time inside collectives holds the delay once per step, not once per tensor (3 tensors here: >= 75 ms),
    # and the real collective on top of it (under a millisecond idle; seen up to 8 ms with a neighbour busy on 2
    # cores). comm(ms) is a mean over steps, so a few stalled steps of a loaded machine raise it above the median
    # step (63.4 ms against a 33.1 ms median once, in a whole suite on 2 cores): the bound is once per tensor
    assert LATENCY_MS <= row["comm(ms)"] < 3 * LATENCY_MS, shown
    assert row["comm_critical(ms)"] == row["comm(ms)"], shown
    # exposed: the whole delay, and no more than the blocking wait measured on the ranks
    assert row["exposed_comm(ms)"] >= 0.9 * LATENCY_MS and row["exposed_ci_high(ms)"] >= LATENCY_MS, shown
    assert row["exposed_ci_low(ms)"] <= row["comm_wait(ms)"] + OVERSHOOT_MS + 0.1 * LATENCY_MS, shown
    assert not str(row["quality"]).startswith("implausible"), shown
    assert row["fusion_copies(ms)"] >= 0.0, shown  # measured from the real run's timeline


def test_the_sentences_say_what_is_not_comparable(result):
    from scalelab.lab import registry as experiments

    lines, _ = experiments.get("engines").interpret(result)
    text = " ".join(lines)
    assert "not fully comparable" in text and "measured from its timeline" in text, text
