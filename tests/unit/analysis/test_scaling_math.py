import pytest

from scalelab.analysis.compare import trusted

from scalelab.analysis.scaling import add_exposed_comm, scaling_table


def run(rid, ranks, gb, epoch, thr, step, comm=None):
    s = {"time/epoch(s)": epoch, "throughput(samples/s)": thr, "time/step_median(ms)": step,
         "time/step_median_ci_low(ms)": step - 1.0, "time/step_median_ci_high(ms)": step + 1.0,
         "time/epoch_ci_low(s)": epoch * 0.9, "time/epoch_ci_high(s)": epoch * 1.1,
         "throughput_ci_low(samples/s)": thr / 1.1, "throughput_ci_high(samples/s)": thr / 0.9,
         "stage/forward(ms)": 1.0, "stage/backward(ms)": 2.0, "stage/optimizer(ms)": 0.5}
    if comm is not None:
        s["comm/time(ms)"] = comm
    return {"run_id": rid, "config": {"ranks": ranks, "nnodes": 1, "global_batch": gb}, "summary": s}


def test_strong_speedup_and_efficiency_are_exact():
    runs = [run("a", 1, 64, 10.0, 100, 50), run("b", 2, 64, 6.0, 166, 30), run("c", 4, 64, 4.0, 250, 20)]
    t = scaling_table(runs, "strong")
    assert list(t["workers"]) == [1, 2, 4]
    assert list(t["speedup"]) == pytest.approx([1.0, 10 / 6, 2.5])
    assert list(t["efficiency"]) == pytest.approx([1.0, 10 / 12, 0.625])
    # no 1-worker run of that global batch: no baseline, no speedup
    alone = scaling_table([run("d", 2, 128, 5.0, 200, 30)], "strong")
    assert alone["speedup"].isna().all() and alone["efficiency"].isna().all()


def test_weak_efficiency_compares_throughput():
    runs = [run("a", 1, 32, 1, 100.0, 10), run("b", 2, 64, 1, 180.0, 11), run("c", 4, 128, 1, 300.0, 13)]
    t = scaling_table(runs, "weak")
    assert list(t["per_worker_batch"]) == [32, 32, 32]
    assert list(t["efficiency"]) == pytest.approx([1.0, 0.9, 0.75])
    assert list(t["speedup"]) == pytest.approx([1.0, 1.8, 3.0])


def test_exposed_comm_by_ablation_and_overlap():
    runs = [run("a", 1, 64, 1, 1, 50), run("b", 2, 64, 1, 1, 40.0, comm=20.0)]
    t = add_exposed_comm(scaling_table(runs, "strong"), runs, [run("n", 2, 64, 1, 1, 30.0)])
    row = t[t["workers"] == 2].iloc[0]
    assert row["compute(ms)"] == 30.0 and row["baseline_run_id"] == "n"
    assert row["exposed_comm(ms)"] == pytest.approx(10.0)
    assert (row["exposed_ci_low(ms)"], row["exposed_ci_high(ms)"]) == (8.0, 12.0)
    assert row["overlap"] == pytest.approx(0.5)
    assert row["quality"] == "ok"
    one = t[t["workers"] == 1].iloc[0]  # a single worker has no sync and no baseline
    assert one.isna()[["compute(ms)", "exposed_comm(ms)", "overlap"]].all()


def test_exposed_comm_is_never_clipped_and_flagged_only_beyond_its_interval():
    runs = [run("s2", 2, 32, 6.0, 150.0, 30.0, comm=10.0), run("s4", 4, 32, 4.0, 250.0, 20.0, comm=8.0),
            run("s8", 8, 32, 4.0, 250.0, 10.0, comm=8.0)]
    t = add_exposed_comm(scaling_table(runs, "strong"), runs, [run("n2", 2, 32, 5.0, 160.0, 25.0),
                                                                run("n4", 4, 32, 3.0, 300.0, 22.0),
                                                                run("n8", 8, 32, 3.0, 300.0, 22.0)])
    assert list(t["compute(ms)"]) == [25.0, 22.0, 22.0]
    assert list(t["exposed_comm(ms)"]) == [5.0, -2.0, -12.0]  # reported as measured
    assert list(t["overlap"]) == [0.5, 1.25, 2.5]
    # -2 ms lies within noise (interval -4..0); -12 ms (interval -14..-10) does not
    assert list(t["quality"]) == ["ok", "ok", "implausible: the sync is faster than its no-op baseline beyond noise"]


def test_efficiency_carries_an_interval_and_above_1_beyond_it_is_flagged_superlinear():
    # strong scaling: the same work; the epoch times' (±10 %) intervals give speedup T1/TN and efficiency / N
    runs = [run("a", 1, 64, 5.0, 100, 50.0), run("b", 2, 64, 2.0, 250, 20.0), run("c", 4, 64, 1.5, 333, 15.0)]
    t = scaling_table(runs, "strong").set_index("workers")
    assert (t.at[2, "speedup_ci_low"], t.at[2, "speedup_ci_high"]) == (pytest.approx(4.5 / 2.2), pytest.approx(5.5 / 1.8))
    assert (t.at[2, "efficiency_ci_low"], t.at[2, "efficiency_ci_high"]) == (pytest.approx(4.5 / 2.2 / 2), pytest.approx(5.5 / 1.8 / 2))
    # 1.02..1.53: not noise; superlinear is a finding (caches), flagged but trusted: never dropped silently
    assert t.at[2, "quality"] == "superlinear: speedup above the worker count beyond its interval (efficiency 102 % at least)"
    assert trusted(t.at[2, "quality"])
    assert t.at[4, "quality"] == "ok"  # 4.5/1.65/4 = 0.68 .. 5.5/1.35/4 = 1.02
    assert t.at[1, "quality"] == "ok" and t.at[1, "efficiency"] == 1.0
    assert list(t["n"].isna()) == [True] * 3  # the fixtures have no step count
    # weak scaling: throughputs' intervals, XN / X1
    weak = scaling_table([run("a", 1, 32, 1, 100.0, 10.0), run("b", 2, 64, 1, 180.0, 11.0)], "weak")
    assert weak["efficiency_ci_high"].iloc[1] == pytest.approx(180 / 0.9 / (100 / 1.1) / 2)


def test_a_noisy_run_is_flagged_in_the_scaling_table():
    runs = [run("a", 1, 64, 5.0, 100, 50.0), run("b", 2, 64, 3.0, 170, 30.0)]
    runs[1]["summary"].update({"quality/noisy": True, "quality/noise_reason": "noisy: steal 9 %"})
    t = scaling_table(runs, "strong").set_index("workers")
    assert (t.at[1, "quality"], t.at[2, "quality"]) == ("ok", "noisy: steal 9 %")


def test_every_interval_of_the_scaling_tables_is_named_after_its_figure():
    """Issue 60: a bare `ci_low` belongs to no figure (analysis.tables.figure_of), so a reader (or the column
    choice) cannot tell which figure it bounds; efficiency's interval is `efficiency_ci_low`, and the table as the
    report shows it passes the interval checks (each interval beside its figure, containing it)."""
    from scalelab.analysis.shown_checks import interval_faults, unit_faults
    from scalelab.analysis.tables import figure_of
    from scalelab.experiments.scale import EXPERIMENT

    runs = [run("a", 1, 64, 5.0, 100, 50.0), run("b", 2, 64, 3.0, 170, 30.0)]
    for mode in ("strong", "weak"):
        t = scaling_table(runs, mode)
        assert figure_of("efficiency_ci_low", t.columns) == "efficiency"
        shown = [c for c in EXPERIMENT.columns[f"scale_{mode}"] if c in t]
        assert "efficiency_ci_low" in shown and "efficiency_ci_high" in shown
        assert interval_faults(mode, t, shown) == [] and unit_faults(mode, t) == []
