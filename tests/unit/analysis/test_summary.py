import pytest

from scalelab.analysis.summary import summarize


def rec(step, rank, wall, data=0.0, ev=0.0, warmup=False, samples=8, loss=1.0):
    other = wall - data - ev
    return {"step": step, "epoch": 0, "rank": rank, "warmup": warmup, "samples": samples, "targets": samples,
            "wall(s)": wall, "data(s)": data, "eval(s)": ev, "forward(s)": other, "loss": loss, "acc": 0.5}


def test_throughput_and_epoch_time_are_exact_on_fixed_records():
    records = [
        rec(1, 0, 9.0, warmup=True), rec(1, 1, 9.0, warmup=True),  # warm-up: excluded from every timing
        rec(2, 0, 0.10, data=0.02), rec(2, 1, 0.12, data=0.01),  # slowest rank sets the step: 0.12 s
        rec(3, 0, 0.70, data=0.05, ev=0.5), rec(3, 1, 0.68, data=0.0, ev=0.5),  # eval is not training time
    ]
    s = summarize(records, steps_per_epoch=10)
    t2, t3 = 0.12, 0.20  # per step: max over ranks of (wall - eval)
    assert s["steps/timed"] == 2
    assert s["time/epoch(s)"] == pytest.approx((t2 + t3) / 2 * 10)
    assert s["throughput(samples/s)"] == pytest.approx(32 / (t2 + t3))


def test_epoch_time_without_data_subtracts_the_data_wait():
    records = [rec(1, 0, 0.10, data=0.04), rec(2, 0, 0.20, data=0.06), rec(3, 0, 0.30, data=0.02)]
    s = summarize(records, steps_per_epoch=3)
    assert s["time/epoch(s)"] == pytest.approx(0.60)
    assert s["time/epoch_no_data(s)"] == pytest.approx(0.60 - 0.12)
    assert s["throughput(samples/s)"] == pytest.approx(24 / 0.60)
    assert s["throughput_no_data(samples/s)"] == pytest.approx(24 / 0.48)
    assert s["time/step_median(ms)"] == pytest.approx(200)
    assert s["stage/data(ms)"] == pytest.approx(40)


def test_skew_is_slowest_over_median_rank():
    records = [rec(1, r, w) for r, w in enumerate([0.1, 0.1, 0.1, 0.2])]
    assert summarize(records, steps_per_epoch=1)["time/skew(slowest/median)"] == pytest.approx(2.0)


def test_memory_and_eval_are_taken_from_results():
    s = summarize([rec(1, 0, 0.1)], steps_per_epoch=1, evals=[{"loss": 2.0, "acc": 0.1}, {"loss": 1.0, "acc": 0.7}],
                  memory=[{"peak_rss(bytes)": 2**30}, {"peak_rss(bytes)": 2**31}])
    assert s["eval/acc"] == 0.7 and s["eval/loss"] == 1.0
    assert s["memory/peak_rss(GiB)"] == pytest.approx(2.0)


def test_memory_by_kind_keeps_the_largest_rank():
    ranks = [{"parameters(bytes)": 100.0, "gradients(bytes)": 100.0, "optimizer_state(bytes)": 200.0,
              "activations_saved(bytes)": 30.0, "activations_backward_peak(bytes)": 50.0},
             {"parameters(bytes)": 100.0, "gradients(bytes)": 100.0, "optimizer_state(bytes)": 200.0,
              "activations_saved(bytes)": 40.0, "activations_backward_peak(bytes)": 45.0}]
    s = summarize([rec(1, 0, 0.1), rec(1, 1, 0.1)], steps_per_epoch=1, memory=ranks)
    assert (s["memory/parameters(bytes)"], s["memory/gradients(bytes)"], s["memory/optimizer_state(bytes)"]) == (
        100.0, 100.0, 200.0)
    assert s["memory/activations_saved(bytes)"] == 40.0 and s["memory/activations_backward_peak(bytes)"] == 50.0
    assert "memory/activations_saved(bytes)" not in summarize([rec(1, 0, 0.1)], steps_per_epoch=1, memory=[{}])


def test_precision_is_judged_on_the_slowest_rank_of_each_timed_step():
    # rank 0 is steady at 0.1 s; rank 1 alternates 0.1 / 0.2 s: the step times are rank 1's, far from +-3 %
    records = [rec(1, 0, 5.0, warmup=True), rec(1, 1, 5.0, warmup=True)]
    records += [r for step in range(2, 12) for r in (rec(step, 0, 0.1), rec(step, 1, 0.1 if step % 2 else 0.2))]
    s = summarize(records, steps_per_epoch=20, target_precision=0.03)
    assert s["precision/target(%)"] == 3.0 and s["precision/reached"] is False
    # median 0.15 s, interval [0.1, 0.2] s (alternation is negative correlation: not widened): +-1/3
    assert s["quality"] == "precision not reached" and s["precision/half_width(%)"] == pytest.approx(100 / 3)
    steady = summarize([rec(step, 0, 0.1) for step in range(1, 11)], steps_per_epoch=20, target_precision=0.03)
    assert steady["precision/reached"] is True and steady["precision/half_width(%)"] == pytest.approx(0.0)
    assert "precision/reached" not in summarize(records, steps_per_epoch=20)  # fixed length: no target to reach
