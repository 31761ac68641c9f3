"""The physics checks on exact rows, the host-peak mark, and sentences audited against them: a planted
contradiction is found (the stored fixture study has none: tests/cli/test_store_fixture.py)."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import checks


def test_each_check_on_exact_rows():
    assert checks.hides_while_blocking({"blocks": True, "overlap_ci_low": 0.3, "overlap_ci_high": 0.7}) == \
        "a blocking sync hides nothing, yet its overlap interval (30–70 %) excludes 0"
    assert checks.hides_while_blocking({"blocks": True, "overlap_ci_low": 0.04, "overlap_ci_high": 0.7}) is None
    assert checks.hides_while_blocking({"blocks": False, "overlap_ci_low": 0.3, "overlap_ci_high": 0.7}) is None
    assert checks.faster_than_baseline({"exposed_ci_high(ms)": -0.1}) is not None
    assert checks.faster_than_baseline({"exposed_ci_high(ms)": 0.0}) is None
    assert checks.overlap_above_one({"overlap_ci_low": 1.06}) is not None
    assert checks.overlap_above_one({"overlap_ci_low": 1.05}) is None
    peak = checks.HostPeak(2.0, 4 * 2**20)  # the benchmark's fastest call, its largest message 4 MiB
    one = {"bytes_per_step": 2**20, "collectives_per_step": 1}
    assert checks.beyond_host_peak({"busbw(GB/s)": 2.11, **one}, peak) is not None  # above 2.0 * (1 + 5 %)
    assert checks.beyond_host_peak({"busbw(GB/s)": 2.1, **one}, peak) is None
    assert checks.beyond_host_peak({"busbw(GB/s)": 9.0, **one}, None) is None  # no benchmark in the study
    # 25 MiB buckets: larger than anything the benchmark sent, so its peak is no ceiling for them
    assert checks.beyond_host_peak({"busbw(GB/s)": 9.0, "bytes_per_step": 25 * 2**20, "collectives_per_step": 1},
                                   peak) is None
    assert checks.superlinear({"workers": 2, "speedup_ci_low": 2.2, "quality": "ok"}) is not None
    assert checks.superlinear({"workers": 2, "speedup_ci_low": 2.2, "quality": "superlinear: ..."}) is None
    assert checks.superlinear({"workers": 2, "speedup_ci_low": 1.9, "quality": "ok"}) is None


def test_the_host_peak_marks_rows_faster_than_the_benchmark_measured():
    bench = pd.DataFrame({"op": ["allreduce", "broadcast"], "status": ["ok", "ok"], "busbw_max(GB/s)": [1.5, 3.0],
                          "size(B)": [2**20, 4 * 2**20]})
    table = pd.DataFrame({"sync": ["ddp", "allreduce"], "busbw(GB/s)": [1.0, 4.0], "quality": ["ok", "ok"],
                          "bytes_per_step": [2**20, 2**20], "collectives_per_step": [1, 4]})
    peak = checks.host_peak({"comm": bench})
    assert peak == checks.HostPeak(3.0, 4 * 2**20)
    marked = checks.mark_host_peak({"comm": bench, "compare_strategies": table}, peak)["compare_strategies"]
    assert list(marked["quality"]) == ["ok", "implausible: collectives faster than this host allows: busbw 4 GB/s, "
                                             "the collective benchmark's fastest call here 3 GB/s"]
    assert list(table["quality"]) == ["ok", "ok"]  # the given table is left as it was


def _strategies(quality: str) -> pd.DataFrame:
    return pd.DataFrame([{"sync": "gather_scatter", "blocks": True, "overlap": 0.5, "overlap_ci_low": 0.3,
                          "overlap_ci_high": 0.7, "quality": quality}])


def test_a_planted_contradiction_is_found_and_a_set_aside_row_is_not_one():
    claim = "gather_scatter hides the largest share of its communication behind compute: overlap 50 %."
    found = checks.contradictions({"compare_strategies": _strategies("ok")}, [claim], "Use the gather_scatter sync.")
    assert len(found) == 3  # its quality passes it, the recommendation rests on it, a sentence relies on it
    aside = "gather_scatter's overlap is not used: implausible: a blocking sync hides nothing."
    assert checks.contradictions({"compare_strategies": _strategies("implausible: x")}, [aside], None) == []
    # another strategy's name that contains this one is not this one
    assert checks.contradictions({"compare_strategies": _strategies("implausible: x")},
                                 ["gather_scatter+x is fine."], None) == []


def test_a_quick_studys_results_have_no_sentence_a_check_contradicts():
    """tests/fixtures/quick_study_results: the saved results of `scalelab study --quick` on this machine (issue 28's
    code). Every check over every row of its tables, against the sentences and recommendations today's code
    writes from them: none relies on a failing row."""
    from conftest import FIXTURES
    from scalelab.lab import registry
    from scalelab.lab.base import Result
    from scalelab.lab.results import frame_of
    from scalelab.lab.study import audit, held_to_host_peak
    from scalelab.store import read_json

    answered = []
    for path in sorted((FIXTURES / "quick_study_results").glob("*.json")):
        if path.stem in registry.names():
            data = read_json(path)
            tables = {k: frame_of(t) for k, t in data["tables"].items()}
            answered.append((registry.get(path.stem), Result(data["name"], tables, notes=data.get("notes", {}),
                                                               meta=data.get("meta", {}))))
    assert len(answered) == 13
    rows = sum(len(t) for _, r in answered for t in r.tables.values())
    assert rows > 100  # the checks saw real tables
    assert audit(held_to_host_peak(answered)) == []


def test_claims_that_rest_on_what_cannot_carry_them():
    amp = pd.DataFrame([{"run_id": "a", "precision": "fp32", "learned": True},
                        {"run_id": "b", "precision": "bf16", "learned": False}])
    compared = "bf16 runs at 1.2x the fp32 throughput and ends at accuracy 10.2 % vs 10.9 % (fp32)."
    assert checks.contradictions({"amp": amp}, [compared], "Train in bf16: 1.2x fp32's throughput.") == [
        "amp: the recommendation names bf16, which did not learn: Train in bf16: 1.2x fp32's throughput.",
        f"amp: {compared}"]
    aside = "bf16 did not learn: 10.5 % (range 10.2–10.9 % over 2 seeds) is not clear of chance 10.6 %."
    assert checks.contradictions({"amp": amp}, [aside], None) == []
    prediction = pd.DataFrame({"workers": [2, 16, 4096], "extrapolation": [False, False, True]})
    assert checks.contradictions({"prediction": prediction}, [], "bucketed keeps 50 % on 16 workers") == []
    assert checks.contradictions({"prediction": prediction}, [], "bucketed keeps 50 % on 4,096 workers") == [
        "prediction: the recommendation rests on an extrapolation (4096 workers): bucketed keeps 50 % on 4,096 workers"]
    batch = pd.DataFrame({"variant": ["base"], "limit": ["demonstration"]})
    assert checks.contradictions({"max_batch": batch}, [], "use as configured: 5 samples fit.") != []
    assert checks.contradictions({"max_batch": batch}, ["No batch is recommended: ..."], None) == []


def test_a_predicted_efficiency_or_speedup_past_its_bound_is_a_fault():
    """The planted case is the study's card of issue 61 ("efficiency 97 % (95 %: 66–143 %)") and its options row,
    a prediction row with speedup above n; the same tables within the bounds have no fault, and a measured table
    (scale) is not held to it."""
    options = pd.DataFrame([{"strategy": "bucketed", "per_rank_batch": 4096, "workers": 16, "efficiency": 0.97,
                             "efficiency_ci_low": 0.66, "efficiency_ci_high": 1.43}])
    prediction = pd.DataFrame([{"workers": 2, "hardware": "10gbe", "speedup": 2.04, "efficiency": 1.02}])
    card = ("For larger clusters (10gbe): keep the default (the best: bucketed with per-rank batch 4096 at "
            "efficiency 97 % (95 %: 66–143 %))")
    faults = checks.contradictions({"options": options, "prediction": prediction}, ["predicted efficiency 58 %"],
                                   card)
    assert sum("predicted efficiency above 100 %" in f for f in faults) == 3  # options row, prediction row, card
    assert sum("predicted speedup 2.04 above its 2 workers" in f for f in faults) == 1
    within = {"options": options.assign(efficiency_ci_high=1.0),
              "prediction": prediction.assign(speedup=2.0, efficiency=1.0)}
    assert checks.predicted_beyond_bounds(within, [], card.replace("143", "100")) == []
    measured = {"scale": pd.DataFrame([{"workers": 2, "speedup": 2.1, "efficiency": 1.05}])}
    assert checks.predicted_beyond_bounds(measured, ["efficiency 105 %"], None) == []
