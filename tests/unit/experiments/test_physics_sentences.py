"""Sentences that must survive the physics (issue 28): a blocking sync hides nothing, waiting for a peer is not
communication, a step that loses more than its collectives take shows interference, a speedup above N is reported
as superlinear, never dropped; the overlap interval in words is the one measured, so it contains its point (issue
60: clipped to 0-100 %, "overlap -1 % (interval 0 to 63 %)" excluded its own point)."""
from __future__ import annotations

import pandas as pd

from scalelab.experiments.scale import scale_result
from scalelab.experiments.strategies import overlap_sentences


def row(sync, **figures):
    base = {"sync": sync, "status": "completed", "step(ms)": 80.0, "step_ci_low(ms)": 78.0, "step_ci_high(ms)": 82.0,
            "comm(ms)": 40.0, "comm_critical(ms)": 30.0, "waiting_for_peers(ms)": 0.0, "exposed_comm(ms)": 30.0,
            "overlap": 0.0, "overlap_ci_low": -0.2, "overlap_ci_high": 0.2, "interference(ms)": 0.0,
            "blocks": True, "quality": "ok"}
    return {**base, **figures}


def test_a_blocking_strategy_is_never_said_to_hide_communication():
    words = overlap_sentences(pd.DataFrame([row("gather_scatter"),
                                            row("allreduce", overlap=0.05, overlap_ci_low=-0.1)]))
    assert not any("hides the largest share" in w for w in words)
    assert ("gather_scatter waits for its collectives after backward: it hides nothing by construction, and the "
            "measurement agrees (its overlap interval -20 to 20 % reaches 0).") in words
    assert words[-1].startswith("No strategy hides communication behind compute beyond noise")


def test_a_blocking_strategy_whose_interval_lies_below_0_is_not_said_to_agree():
    """Issue 60: "gather_scatter ... the measurement agrees (its overlap interval reaches 0)" beside an
    overlap_ci_high of -0.014: the sentence must follow the interval, not the row's being blocking."""
    words = overlap_sentences(pd.DataFrame([row("gather_scatter", overlap=-0.3, overlap_ci_low=-0.6,
                                                overlap_ci_high=-0.014, **{"exposed_comm(ms)": 39.0})]))
    assert words[0] == ("gather_scatter waits for its collectives after backward: it hides nothing by construction; "
                        "its overlap -30 % (interval -60 to -1 %) lies below 0: the step lost more than its 30 ms "
                        "of communication, waiting + wire (exposed 39 ms): interference, not hiding.")
    assert not any("agrees" in w for w in words)


def test_waiting_for_a_peer_is_said_apart_from_communication():
    words = overlap_sentences(pd.DataFrame([row("gather_scatter", **{"waiting_for_peers(ms)": 12.0})]))
    assert any("gather_scatter: a rank stood up to 12 ms per step inside collectives waiting for a peer still "
               "computing, which is not communication; the rank that set the step spent 30 ms inside them after "
               "every peer had arrived (on average over ranks 40 ms inside collectives)." == w for w in words), words


def test_waiting_longer_than_a_whole_step_without_collectives_is_not_called_computing():
    """Issue 60: "waiting for a peer still computing" 46.4 ms beside a whole no-op step of 37.7 ms."""
    words = overlap_sentences(pd.DataFrame([row("gather_scatter", **{"waiting_for_peers(ms)": 46.4,
                                                                      "compute(ms)": 37.7})]))
    said = next(w for w in words if "stood up to" in w)
    assert "still computing" not in said
    assert "longer than a whole step without collectives (37.7 ms), so the peers it waited for were inside the " \
           "sync's own work" in said


def test_an_overlapping_strategy_hides_with_its_interval_as_measured():
    ddp = row("ddp", blocks=False, overlap=0.7, overlap_ci_low=0.4, overlap_ci_high=1.03)
    words = overlap_sentences(pd.DataFrame([ddp, row("allreduce")]))
    assert words[-1] == ("ddp hides 70 % of its 30 ms of communication (waiting + wire) behind compute "
                         "(interval 40 to 103 %).")


def test_interference_is_a_measured_figure_with_its_strategy():
    words = overlap_sentences(pd.DataFrame([row("allreduce", **{"exposed_comm(ms)": 45.0, "interference(ms)": 15.0,
                                                                "overlap": -0.5})]))
    assert any(w.startswith("allreduce costs the step 15 ms beyond the time its collectives take") for w in words)


def test_a_flagged_row_gets_no_sentence_that_relies_on_it():
    bad = row("gather_scatter", overlap=0.5, overlap_ci_low=0.3, overlap_ci_high=0.7,
              quality="implausible: a blocking sync hides nothing, yet its overlap interval (30–70 %) excludes 0")
    words = overlap_sentences(pd.DataFrame([bad]))
    assert words == ["gather_scatter's overlap is not used: implausible: a blocking sync hides nothing, yet its "
                     "overlap interval (30–70 %) excludes 0."]


def test_a_superlinear_speedup_is_reported_not_dropped():
    class Result:
        tables = {"scale_strong": pd.DataFrame([
            {"workers": 1, "global_batch": 64, "per_worker_batch": 64, "speedup": 1.0, "efficiency": 1.0,
             "efficiency_ci_low": 0.9, "efficiency_ci_high": 1.1, "speedup_ci_low": 0.9, "quality": "ok", "step(ms)": 10.0,
             "step_ci_low(ms)": 9.8, "step_ci_high(ms)": 10.2, "launches": 3},
            {"workers": 2, "global_batch": 64, "per_worker_batch": 32, "speedup": 2.5, "efficiency": 1.25,
             "efficiency_ci_low": 1.05, "efficiency_ci_high": 1.4, "speedup_ci_low": 2.1, "step(ms)": 4.0, "launches": 3,
             "step_ci_low(ms)": 3.9, "step_ci_high(ms)": 4.1,
             "quality": "superlinear: speedup above the worker count beyond its interval"}])}
    words, rec = scale_result(Result())
    assert any(w.startswith("2 workers at batch 64 scale superlinearly: speedup 2.5x") for w in words)
    assert rec.startswith("Use 2 workers at global batch 64 (strong-scaling efficiency 125 % (95 % interval 105–140 "
                          "%)): 2 workers beats 1 worker: 2.50× faster than 1 worker (")


def test_a_worker_count_from_one_launch_is_not_recommended():
    class Result:
        tables = {"scale_strong": pd.DataFrame([
            {"workers": 1, "global_batch": 64, "per_worker_batch": 64, "speedup": 1.0, "efficiency": 1.0,
             "efficiency_ci_low": 0.9, "efficiency_ci_high": 1.1, "quality": "ok", "step(ms)": 10.0, "launches": 1},
            {"workers": 2, "global_batch": 64, "per_worker_batch": 32, "speedup": 1.8, "efficiency": 0.9,
             "efficiency_ci_low": 0.8, "efficiency_ci_high": 0.95, "quality": "ok", "step(ms)": 5.5, "launches": 1}])}
    words, rec = scale_result(Result())
    assert rec.startswith("Undecided after 1 launch each: a comparison between configurations needs 2 or more "
                          "launches each (`scalelab scale --launches 2`). No worker count is recommended yet.")
    assert rec in words


def test_a_flagged_backend_or_engine_gets_no_figures_in_words():
    from scalelab.experiments.backends import backends_result

    class Result:
        tables = {"compare_backends": pd.DataFrame([
            {"backend": "gloo", "status": "completed", "step(ms)": 50.0, "comm(ms)": 20.0, "busbw(GB/s)": 9.0,
             "quality": "implausible: collectives faster than this host allows"}])}
    words, rec = backends_result(Result())
    assert words == ["gloo's figures are not used: implausible: collectives faster than this host allows."]
    assert rec is None
