"""The performance model (F14): exact formulas on hand-computed numbers, fits that recover known truths, and the
monotonicity a correct model cannot break."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from scalelab.analysis.hardware import Hardware, collective_cost, collective_time, cost_terms, hierarchical_allreduce
from scalelab.perf.hardware import LINKS, PRESETS, fit_alpha_beta, hardware_from_dict, hardware_from_fit
from scalelab.perf.perfmodel import (COLUMNS, DDP_FIRST_BUCKET_BYTES, MIB, STRATEGIES, ComputeModel, Linear,
                                         bucket_sizes, compute_frame, efficiency_threshold, exposed_after_overlap,
                                         Emulation, fit_compute, fit_compute_model, launch_times,
                                         options_for_efficiency, predict, sync_cost, validate)
from scalelab.errors import ConfigError

A, B, S = 10e-6, 1e-9, 1e6  # α = 10 µs, β = 1 ns/byte (1 GB/s), S = 1 MB


@pytest.mark.parametrize("op, n, algorithm, expected", [
    # gloo's segmented ring: a segment (S/8) takes 125 µs on the wire, more than α, so one latency per phase shows
    ("allreduce", 4, "ring", 2 * A + 2 * 3 / 4 * S * B),  # 20 µs + 1.5 ms
    ("allreduce", 5, "binomial_tree", 2 * 3 * (A + S * B)),  # ⌈log2 5⌉ = 3
    ("allreduce", 8, "double_binary_tree", 2 * 3 * A + 2 * S * B),
    ("allreduce", 8, "rabenseifner", 2 * 3 * A + 2 * 7 / 8 * S * B),
    ("allreduce", 8, "recursive_doubling", 3 * (A + S * B)),
    ("allgather", 4, None, 3 * A + 3 / 4 * S * B),
    ("reduce_scatter", 4, None, 3 * A + 3 / 4 * S * B),
    ("broadcast", 8, None, 3 * (A + S * B)),
    ("gather", 4, None, A + 3 / 4 * S * B),  # every piece posted at once: one latency
    ("gather", 4, "linear", 3 * A + 3 / 4 * S * B),
    ("scatter", 4, "concurrent", A + 3 / 4 * S * B),
])
def test_collective_formulas_are_exact_on_fixed_inputs(op, n, algorithm, expected):
    assert collective_cost(op, S, n, A, B, algorithm) == pytest.approx(expected, rel=1e-12)


def test_ring_allreduce_hand_computed_and_one_rank_costs_nothing():
    assert collective_cost("allreduce", S, 4, A, B) == pytest.approx(1.52e-3, rel=1e-12)
    for op in ("allreduce", "allgather", "reduce_scatter", "broadcast", "gather", "scatter"):
        assert cost_terms(op, 1) == (0.0, 0.0)
    assert collective_time("allreduce", S, 1, PRESETS["10gbe"]) == 0.0


def test_hierarchical_allreduce_on_fixed_inputs():
    hw = Hardware(name="t", alpha_intra=1e-6, beta_intra=1e-10, alpha_inter=10e-6, beta_inter=1e-9, gpus_per_node=4)
    # inside: reduce-scatter + allgather on 4 ranks = 2·(3·1 µs + 3/4·1e6·1e-10 s) = 156 µs
    # across 2 nodes on S/4 per rank, the node's link carrying S: 2·10 µs + 2·(1/2)·1e6·1e-9 s = 1.02 ms
    assert hierarchical_allreduce(S, 2, 4, hw) == pytest.approx(156e-6 + 1.02e-3, rel=1e-12)
    assert collective_time("allreduce", S, 8, hw) == pytest.approx(156e-6 + 1.02e-3, rel=1e-12)
    # one node: the intra-node ring; a flat algorithm across nodes runs at the slowest link
    assert collective_time("allreduce", S, 4, hw) == pytest.approx(collective_cost("allreduce", S, 4, 1e-6, 1e-10))
    assert collective_time("allreduce", S, 8, hw, "ring") == pytest.approx(collective_cost("allreduce", S, 8, A, B))


def test_unknown_op_or_algorithm_is_a_config_error():
    with pytest.raises(ConfigError, match="algorithm"):
        cost_terms("broadcast", 4, "ring")
    with pytest.raises(ConfigError, match="op"):
        cost_terms("alltoall", 4)


SIZES = 2.0 ** np.arange(10, 27)  # 1 KiB .. 64 MiB, as `bench comm` sweeps


def timings(op, n, alpha, beta, sizes=SIZES):
    a, b = cost_terms(op, n)
    return a * alpha + sizes * b * beta


@pytest.mark.parametrize("op, n", [("allreduce", 4), ("allgather", 8), ("broadcast", 2), ("reduce_scatter", 3)])
def test_fit_recovers_alpha_beta_exactly_without_noise(op, n):
    alpha, beta = fit_alpha_beta(SIZES, timings(op, n, 25e-6, 1 / 1.25e9), n, op)
    assert alpha == pytest.approx(25e-6, rel=1e-9) and beta == pytest.approx(1 / 1.25e9, rel=1e-9)


def test_fit_recovers_alpha_beta_closely_with_two_percent_noise():
    rng = np.random.default_rng(0)
    times = timings("allreduce", 4, 25e-6, 1 / 1.25e9) * (1 + 0.02 * rng.standard_normal(len(SIZES)))
    alpha, beta = fit_alpha_beta(SIZES, times, 4)
    assert alpha == pytest.approx(25e-6, rel=0.05) and beta == pytest.approx(1 / 1.25e9, rel=0.05)


def test_fit_reads_bench_tables_in_both_spellings_and_mixed_rank_counts():
    rows = [{"op": "allreduce", "size(bytes)": s, "ranks": n, "time_median(s)": t, "status": "ok"}
            for n in (2, 4) for s, t in zip(SIZES, timings("allreduce", n, 5e-6, 1e-10))]
    rows.append({"op": "allreduce", "size(bytes)": 1.0, "ranks": 2, "time_median(s)": None, "status": "skipped"})
    rows.append({"op": "broadcast", "size(bytes)": 1.0, "ranks": 2, "time_median(s)": 9.0, "status": "ok"})
    table = pd.DataFrame(rows)
    assert fit_alpha_beta(table) == pytest.approx((5e-6, 1e-10), rel=1e-9)
    commbench = table.rename(columns={"size(bytes)": "size(B)", "time_median(s)": "time_median(us)"})
    commbench["time_median(us)"] *= 1e6
    assert fit_alpha_beta(commbench) == pytest.approx((5e-6, 1e-10), rel=1e-9)


def test_fit_keeps_alpha_and_beta_non_negative():
    # pure bandwidth timings with a dip at small sizes would want a negative α; the fit clamps it to 0
    times = timings("allreduce", 2, 0.0, 1e-9) * np.where(SIZES < 5000, 0.5, 1.0)
    alpha, beta = fit_alpha_beta(SIZES, times, 2, weight="absolute")
    assert alpha == 0.0 and beta > 0


def test_compute_fit_recovers_known_constants():
    batch = np.array([8, 16, 32, 64, 128])
    assert fit_compute(batch, 3.0 + 0.25 * batch) == Linear(pytest.approx(3.0), pytest.approx(0.25))
    assert fit_compute(batch, np.array([5.0, 5.2, 4.8, 5.0, 5.0]), constant=True) == Linear(pytest.approx(5.0), 0.0)
    # a negative intercept is not physical: the fit goes through the origin instead
    assert fit_compute([1, 2, 3], [0.5, 2.5, 4.5]).c0 == 0.0


def test_compute_model_from_summaries_divides_micro_steps_out():
    fwd, bwd = Linear(1.0, 0.1), Linear(2.0, 0.3)
    runs = []
    for gb, k in ((64, 1), (128, 1), (256, 2), (512, 4)):  # 2 ranks
        m = gb / 2 / k
        runs.append({"config": {"global_batch": gb, "ranks": 2, "accumulate": k},
                     "summary": {"stage/forward(ms)": k * fwd(m), "stage/backward(ms)": k * bwd(m),
                                 "stage/optimizer(ms)": 4.0, "stage/data(ms)": 0.5 + 0.01 * gb / 2}})
    model = fit_compute_model(compute_frame(runs))
    assert model.forward == Linear(pytest.approx(1.0), pytest.approx(0.1))
    assert model.backward == Linear(pytest.approx(2.0), pytest.approx(0.3))
    assert model.optimizer == Linear(pytest.approx(4.0), 0.0)
    assert model.overhead == Linear(pytest.approx(0.5), pytest.approx(0.01))
    assert model.step_ms(128, 4) == pytest.approx(4 * (fwd(32) + bwd(32)) + 4.0 + 0.5 + 1.28)


# n = 2, ring allreduce: T(S) = 2α + Sβ; α = 1 ms, β = 1 µs/byte
TOY = Hardware(name="toy", alpha_intra=1e-3, beta_intra=1e-6, alpha_inter=1e-3, beta_inter=1e-6, gpus_per_node=8)
PARAMS = [1000, 2000, 3000]  # registration order; buckets take them in reverse


def test_allreduce_strategy_exposes_everything_and_pays_latency_per_parameter():
    cost = sync_cost("allreduce", param_bytes=PARAMS, n=2, hardware=TOY, backward_s=1.0)
    assert cost.comm_s == pytest.approx(3e-3 + 4e-3 + 5e-3) and cost.exposed_s == cost.comm_s
    assert cost.collectives == 3


def test_gather_scatter_goes_through_the_root_and_is_not_hidden():
    cost = sync_cost("gather_scatter", param_bytes=PARAMS, n=2, hardware=TOY, backward_s=1.0)
    assert cost.comm_s == pytest.approx(2 * (2e-3 + 3e-3 + 4e-3)) and cost.exposed_s == cost.comm_s
    # the root's bandwidth term grows with n: (n−1)·S_p·β per gather, unlike the ring's 2(n−1)/n·S_p·β
    big = sync_cost("gather_scatter", param_bytes=[1e6], n=8, hardware=TOY, backward_s=0).comm_s
    assert big == pytest.approx(2 * (1e-3 + 7 * 1e6 * 1e-6))  # latency once per op: every piece posted at once


def test_bucketed_exposes_only_the_last_bucket_when_backward_is_long():
    cost = sync_cost("bucketed", param_bytes=PARAMS, n=2, hardware=TOY, backward_s=1.0, bucket_bytes=1000)
    assert cost.comm_s == pytest.approx(12e-3) and cost.collectives == 3
    assert cost.exposed_s == pytest.approx(3e-3)  # the last bucket (1000 B) is ready as backward ends


def test_bucketed_exposes_the_backlog_when_communication_is_the_bottleneck():
    # backward 6 ms: buckets of 3000, 2000, 1000 B ready at 3, 5, 6 ms, taking 5, 4, 3 ms → done at 15 ms
    cost = sync_cost("bucketed", param_bytes=PARAMS, n=2, hardware=TOY, backward_s=6e-3, bucket_bytes=1000)
    assert cost.exposed_s == pytest.approx(9e-3)
    assert exposed_after_overlap([3e-3, 5e-3, 6e-3], [5e-3, 4e-3, 3e-3], 6e-3) == pytest.approx(9e-3)


def test_noop_one_rank_and_compression():
    assert sync_cost("noop", param_bytes=PARAMS, n=8, hardware=TOY, backward_s=1.0).comm_s == 0.0
    assert sync_cost("allreduce", param_bytes=PARAMS, n=1, hardware=TOY, backward_s=1.0).comm_s == 0.0
    half = sync_cost("allreduce", param_bytes=PARAMS, n=2, hardware=TOY, backward_s=1.0, compression="fp16")
    assert half.comm_s == pytest.approx(3 * 2e-3 + 3e-3)  # latency unchanged, bytes halved


def test_buckets_close_at_the_cap_in_reverse_order_and_ddp_caps_the_first():
    assert bucket_sizes([1, 2, 3, 4], 5) == [7, 3]  # reversed: 4+3 >= 5, then 2+1
    assert bucket_sizes([MIB] * 4, 25 * MIB, first_bucket_bytes=DDP_FIRST_BUCKET_BYTES) == [MIB, 3 * MIB]


COMPUTE = ComputeModel(forward=Linear(2.0, 0.05), backward=Linear(4.0, 0.1), optimizer=Linear(3.0))
RESNETISH = [4 * 1_000_000] * 12 + [4 * 10_000] * 50  # 48 MB of fp32 gradients in 62 tensors
WORKERS = list(range(1, 65)) + [128, 512, 1024]


def run(hw, strategy, **kw):
    kw.setdefault("global_batch", 65536)
    return predict(COMPUTE, hw, WORKERS, param_bytes=RESNETISH, strategy=strategy, **kw)


def test_predict_columns_speedup_one_and_efficiency_at_most_one():
    for name, hw in PRESETS.items():
        for strategy in STRATEGIES:
            for mode, batch in (("strong", {"global_batch": 65536}), ("weak", {"per_rank_batch": 32})):
                p = predict(COMPUTE, hw, WORKERS, param_bytes=RESNETISH, strategy=strategy, mode=mode, **batch)
                assert list(p.columns) == COLUMNS
                assert p.loc[p["workers"] == 1, "speedup"].item() == pytest.approx(1.0)
                assert (p["efficiency"] <= 1 + 1e-12).all()
                assert (p["exposed_comm(ms)"] <= p["comm(ms)"] + 1e-12).all()


def test_more_bandwidth_or_lower_latency_is_never_slower():
    for hw in PRESETS.values():
        faster = [dataclasses.replace(hw, beta_intra=hw.beta_intra / 2, beta_inter=hw.beta_inter / 2),
                  dataclasses.replace(hw, alpha_intra=hw.alpha_intra / 2, alpha_inter=hw.alpha_inter / 2)]
        for strategy in STRATEGIES:
            base = run(hw, strategy)["step(ms)"].to_numpy()
            for fast in faster:
                assert (run(fast, strategy)["step(ms)"].to_numpy() <= base + 1e-12).all()


def test_strong_scaling_throughput_per_worker_never_grows_with_comm():
    for hw in PRESETS.values():
        for strategy in ("ddp", "bucketed", "allreduce", "gather_scatter"):
            p = run(hw, strategy)
            per_worker = (p["throughput(samples/s)"] / p["workers"]).to_numpy()
            assert (np.diff(per_worker) <= 1e-9).all(), (hw.name, strategy)
            assert (p["comm(ms)"].iloc[1:] > 0).all()


def test_noop_scales_perfectly_in_weak_mode_and_accumulation_amortises_sync():
    p = predict(COMPUTE, PRESETS["10gbe"], [1, 8, 64], param_bytes=RESNETISH, per_rank_batch=32, mode="weak",
                strategy="noop")
    assert p["efficiency"].to_list() == pytest.approx([1.0, 1.0, 1.0])
    one = predict(COMPUTE, PRESETS["10gbe"], [8], param_bytes=RESNETISH, per_rank_batch=32, mode="weak",
                  strategy="allreduce")
    four = predict(COMPUTE, PRESETS["10gbe"], [8], param_bytes=RESNETISH, per_rank_batch=128, mode="weak",
                   strategy="allreduce", accumulate=4)
    # the same micro-batch of 32: one sync per 4× the samples
    assert four["comm(ms)"].item() == pytest.approx(one["comm(ms)"].item())
    assert four["efficiency"].item() > one["efficiency"].item()


def test_efficiency_threshold_and_options():
    pred = pd.DataFrame({"workers": [1, 2, 4, 8], "efficiency": [1.0, 0.8, 0.49, 0.3]})
    assert efficiency_threshold(pred, 0.5) == 4 and efficiency_threshold(pred, 0.1) is None
    p = run(PRESETS["10gbe"], "gather_scatter")
    first = efficiency_threshold(p, 0.5)
    assert p.loc[p["workers"] < first, "efficiency"].min() >= 0.5
    opts = options_for_efficiency(COMPUTE, PRESETS["10gbe"], 64, target=0.7, per_rank_batches=[8, 64, 512, 4096],
                                  param_bytes=RESNETISH)
    assert opts.iloc[0]["meets_target"] and opts.iloc[0]["efficiency"] >= 0.7
    met = opts[opts["meets_target"]]
    assert (met["per_rank_batch"] >= opts.iloc[0]["per_rank_batch"]).all()
    assert not opts[(opts["per_rank_batch"] == 8)]["meets_target"].any()


def test_strong_scaling_refuses_less_than_one_sample_per_rank():
    with pytest.raises(ConfigError, match="workers"):
        predict(COMPUTE, TOY, [1, 128], param_bytes=RESNETISH, global_batch=64)


def test_validate_computes_errors_exactly():
    pred = pd.DataFrame({"workers": [1, 2, 4, 8], "step(ms)": [10.0, 20.0, 30.0, 99.0]})
    meas = pd.DataFrame({"workers": [1, 2, 4], "time/step_median(ms)": [8.0, 25.0, 30.0]})
    out = validate(pred, meas, ["workers"])
    assert out["error(%)"].to_list() == pytest.approx([25.0, -20.0, 0.0])
    assert out.attrs["median_abs_error(%)"] == pytest.approx(20.0)
    assert list(out.columns) == ["workers", "predicted", "measured", "error(%)"]


def test_hardware_from_dict_presets_links_and_numbers():
    hw = hardware_from_dict({"preset": "pcie4_x16", "inter": "ib_hdr"})
    assert hw.beta_inter == LINKS["ib_hdr"].beta and hw.gpus_per_node == 4
    hw = hardware_from_dict({"latency_intra(us)": 5, "bandwidth_intra(GB/s)": "10", "gpus_per_node": 2})
    assert (hw.alpha_intra, hw.alpha_inter) == (pytest.approx(5e-6), pytest.approx(5e-6))
    assert hw.beta_inter == pytest.approx(1e-10)
    assert hardware_from_dict({"intra": "nvlink3", "inter": "ib_hdr", "inter_links": 8}).beta_inter == pytest.approx(1 / 200e9)
    assert hardware_from_fit(1e-5, 1e-9).beta_inter == 1e-9
    assert hardware_from_dict({"preset": "10gbe", "overlap": 0.25}).overlap == 0.25
    for preset in PRESETS.values():
        assert preset.source and (preset.beta_intra > 0) and preset.overlap == 1


@pytest.mark.parametrize("bad, field", [
    ({"preset": "nvlink9"}, "hardware.preset"),
    ({"intra": "nvlink3", "inter": "carrier_pigeon"}, "hardware.inter"),
    ({"bandwidth_inter(GB/s)": 0, "intra": "nvlink3"}, "hardware.bandwidth_inter(GB/s)"),
    ({"alpha_intra": -1, "beta_intra": 1e-9}, "hardware.alpha_intra"),
    ({"preset": "10gbe", "gpus_per_node": 0}, "hardware.gpus_per_node"),
    ({"preset": "10gbe", "speed": 3}, "hardware.speed"),
    ({"gpus_per_node": 8}, "hardware.alpha_intra"),
    ({"preset": "10gbe", "inter_links": 2}, "hardware.inter_links"),
    ({"preset": "10gbe", "overlap": 1.5}, "hardware.overlap"),
    ({"preset": "10gbe", "overlap": "most"}, "hardware.overlap"),
])
def test_bad_hardware_is_a_one_line_config_error(bad, field):
    with pytest.raises(ConfigError) as err:
        hardware_from_dict(bad)
    assert err.value.field == field and "\n" not in str(err.value) and "allowed" in str(err.value)


def test_overlap_moves_exposed_comm_between_hidden_and_serial():
    """Three equal buckets, each 4 ms of comm, ready at 2, 4 and 6 ms of a 6 ms backward: overlap 1 hides what
    the queue of collectives allows (4 of 12 ms); overlap 0 hides nothing (exposed = all 12 ms); in between,
    each collective starts that share of the way from its ready time to backward's end."""
    assert launch_times([1.0, 1.0, 1.0], 6e-3, 0.5) == (pytest.approx([2e-3, 4e-3, 6e-3]),
                                                        pytest.approx([4e-3, 5e-3, 6e-3]))
    # α = 2 ms, β = 0: every 2-rank ring allreduce of a bucket costs 2·(n−1)·α = 4 ms; buckets 1 byte each
    hw = hardware_from_fit(2e-3, 0.0)
    cost = {o: sync_cost("bucketed", param_bytes=[1.0] * 3, n=2, hardware=dataclasses.replace(hw, overlap=o),
                         backward_s=6e-3, bucket_bytes=1.0) for o in (0.0, 0.5, 1.0)}
    assert {o: c.comm_s for o, c in cost.items()} == pytest.approx({0.0: 12e-3, 0.5: 12e-3, 1.0: 12e-3})
    # ends: 1.0: 2+4=6, 10, 14 -> 8 exposed; 0.5: 4+4=8, 12, 16 -> 10; 0.0: 6+4, 14, 18 -> 12 (= all comm)
    assert {o: c.exposed_s for o, c in cost.items()} == pytest.approx({0.0: 12e-3, 0.5: 10e-3, 1.0: 8e-3})
    # under emulation the floors are timers from each launch, whatever the overlap: a 20 ms floor per bucket
    emu = Emulation(latency_s=20e-3)
    late = sync_cost("bucketed", param_bytes=[1.0] * 3, n=2, hardware=dataclasses.replace(hw, overlap=0.0),
                     backward_s=6e-3, bucket_bytes=1.0, emulation=emu)
    assert late.exposed_s == pytest.approx(6e-3 + 20e-3 - 6e-3)
