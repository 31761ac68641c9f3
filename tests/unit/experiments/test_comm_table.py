"""The study's comm table (issue 60 item 5): a size column, the loop's busbw apart from the single calls' band
(which holds its own median), and a peak that is one size standing out said as such."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis.shown_checks import band_faults, table_faults
from scalelab.experiments.comm import EXPERIMENT, comm_result, comm_table
from scalelab.lab.base import Result
from scalelab.measure.commbench import busbw_gbps

SIZES = [4096, 65536, 262144, 1048576, 4194304]


def results(loop_us: dict[int, float]) -> pd.DataFrame:
    rows = []
    for size in SIZES:
        loop, med, fast, slow = loop_us[size], 1.5 * loop_us[size], 1.2 * loop_us[size], 3.0 * loop_us[size]
        rows.append({"op": "allgather", "impl": "all_gather", "size(B)": size, "count": size // 4, "dtype": "float32",
                     "ranks": 2, "iters": 10, "time_loop(us)": loop, "time_min(us)": fast, "time_median(us)": med,
                     "time_ci_low(us)": 1.3 * loop, "time_ci_high(us)": 2.0 * loop, "time_max(us)": slow,
                     "algbw(GB/s)": size / loop / 1e3, "busbw(GB/s)": busbw_gbps("allgather", size, loop * 1e-6, 2),
                     "busbw_min(GB/s)": busbw_gbps("allgather", size, slow * 1e-6, 2),
                     "busbw_max(GB/s)": busbw_gbps("allgather", size, fast * 1e-6, 2),
                     "wrong": 0, "status": "ok", "reason": None})
    return pd.DataFrame(rows)


def test_the_loops_busbw_is_not_held_to_the_single_calls_band_and_their_median_is():
    raw = results({s: 1000.0 for s in SIZES})  # the loop is faster than every single call: outside their band
    assert band_faults("comm", raw)  # the planted case: the single calls' band set beside the loop's busbw
    table = comm_table(raw)
    assert list(table["size"]) == ["4K", "64K", "256K", "1M", "4M"]
    assert table_faults("comm", table, [c for c in EXPERIMENT.columns["comm"] if c in table]) == []
    assert (table["busbw_single_min(GB/s)"] <= table["busbw_single(GB/s)"]).all()
    assert (table["busbw_single(GB/s)"] <= table["busbw_single_max(GB/s)"]).all()


def test_one_size_standing_out_is_not_called_a_peak():
    spiky = comm_table(results({4096: 100.0, 65536: 400.0, 262144: 1600.0, 1048576: 800.0, 4194304: 12000.0}))
    words = comm_result(Result("comm", {"comm": spiky}))[0][0]
    assert words.startswith("allgather: largest busbw ") and "at 1M, one size standing out" in words
    smooth = comm_result(Result("comm", {"comm": comm_table(results({s: s / 1000.0 for s in SIZES}))}))[0][0]
    assert smooth.startswith("allgather: peak busbw ") and "at 4K only" in smooth
