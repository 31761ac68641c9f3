"""The model-size grid's analysis on synthetic cells with known numbers: the grid table, the 1-vs-N-workers table
and the interpretation sentences (which follow the numbers, including when memory by kind was not recorded)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from scalelab.analysis import keys
from scalelab.experiments import model_grid as interpret
from scalelab.analysis.model_grid import GRID_COLUMNS, grid_table, workers_table
from scalelab.lab.base import Result

MIB = 2**20


def summary(step: float, params: float, grads: float, opt: float, acts: float, peak: float, added: float) -> dict:
    return {keys.STEP_MEDIAN_MS: step, keys.STEP_MIN_MS: step - 1, keys.STEP_MAX_MS: step + 1,
            keys.MEMORY_PARAMETERS_BYTES: params, keys.MEMORY_GRADIENTS_BYTES: grads,
            keys.MEMORY_OPTIMIZER_BYTES: opt, keys.MEMORY_ACTIVATIONS_BYTES: acts,
            keys.MEMORY_ACTIVATIONS_PEAK_BYTES: peak, keys.MEMORY_TRAIN_ADDED_BYTES: added}


def cell(depth, width, workers, status="completed", summary_=None, reason=None, parameters=1000) -> dict:
    return {"depth": depth, "width": width, "workers": workers, "global_batch": 64, "parameters": parameters,
            "status": status, "reason": reason, "run_id": f"r{depth}-{width}-{workers}", "summary": summary_}


OOM = "rank 0 exited with code 1: RuntimeError: DefaultCPUAllocator: can't allocate memory"


def measured_cells() -> list[dict]:
    """depth 2 fits on both (activations halve on 2 workers); depth 4 fits only on 2; depth 8 failed otherwise
    on 1 worker and does not fit on 2."""
    return [
        cell(2, 64, 1, summary_=summary(10.0, 4 * MIB, 4 * MIB, 4 * MIB, 20 * MIB, 24 * MIB, 40 * MIB)),
        cell(2, 64, 2, summary_=summary(13.0, 4 * MIB, 4 * MIB, 4 * MIB, 10 * MIB, 12 * MIB, 36 * MIB)),
        cell(4, 64, 1, "does not fit", reason=OOM, parameters=2000),
        cell(4, 64, 2, summary_=summary(20.0, 8 * MIB, 8 * MIB, 8 * MIB, 20 * MIB, 24 * MIB, 50 * MIB),
             parameters=2000),
        cell(8, 64, 1, "failed", reason="rank 0 exited with code 1: ValueError: boom", parameters=4000),
        cell(8, 64, 2, "does not fit", reason=OOM, parameters=4000),
    ]


def test_grid_table_has_one_exact_row_per_cell():
    t = grid_table(measured_cells()[::-1])  # any input order: sorted by workers, depth, width
    assert list(t.columns) == GRID_COLUMNS
    assert list(zip(t["workers"], t["depth"], t["width"])) == [(1, 2, 64), (1, 4, 64), (1, 8, 64), (2, 2, 64),
                                                               (2, 4, 64), (2, 8, 64)]
    assert list(t["per_worker_batch"]) == [64, 64, 64, 32, 32, 32]
    assert list(t["parameters"]) == [1000, 2000, 4000, 1000, 2000, 4000]
    assert list(t["fits"]) == [True, False, None, True, True, False]
    assert list(t["status"]) == ["completed", "does not fit", "failed", "completed", "completed", "does not fit"]
    assert pd.isna(t["reason"].iloc[0]) and t["reason"].iloc[1] == OOM and "boom" in t["reason"].iloc[2]
    first = t.iloc[0]
    assert (first["step(ms)"], first["step_min(ms)"], first["step_max(ms)"]) == (10.0, 9.0, 11.0)
    assert [first[c] for c in ("parameters(bytes)", "gradients(bytes)", "optimizer_state(bytes)",
                               "activations_saved(bytes)", "activations_backward_peak(bytes)",
                               "peak_added(bytes)")] == [4 * MIB, 4 * MIB, 4 * MIB, 20 * MIB, 24 * MIB, 40 * MIB]
    # a cell without a completed run has no numbers, only its verdict and reason
    assert t.iloc[1][["step(ms)", "gradients(bytes)", "peak_added(bytes)"]].isna().all()


def test_memory_by_kind_not_recorded_is_nan_not_an_error():
    """Runs written before the train loop recorded memory by kind: those columns are NaN, the rest is read."""
    old = {keys.STEP_MEDIAN_MS: 5.0, keys.MEMORY_TRAIN_ADDED_BYTES: 1e6}
    t = grid_table([cell(2, 8, 1, summary_=old), cell(2, 8, 2, summary_=dict(old)), cell(2, 16, 1, summary_=None)])
    assert t["step(ms)"].iloc[0] == 5.0 and math.isnan(t["step(ms)"].iloc[1]) and t["step(ms)"].iloc[2] == 5.0
    assert t[["parameters(bytes)", "gradients(bytes)", "optimizer_state(bytes)", "activations_saved(bytes)",
              "activations_backward_peak(bytes)"]].isna().all().all()
    w = workers_table(t)
    assert len(w) == 1 and w["peak_added(ratio)"].iloc[0] == 1.0 and w["step(ratio)"].iloc[0] == 1.0
    assert w["gradients(ratio)"].isna().all() and w["falls"].iloc[0] == "" and w["rises"].iloc[0] == ""


def test_workers_table_says_which_part_falls_and_the_step_cost():
    w = workers_table(grid_table(measured_cells()))
    assert list(zip(w["depth"], w["workers"])) == [(2, 2), (4, 2), (8, 2)]
    assert list(w["fit"]) == ["fits on both", "fits only on 2 workers", "unknown"]
    assert list(w["fits_1"]) == [True, False, None] and list(w["fits_n"]) == [True, True, False]
    both = w.iloc[0]
    assert both["activations_saved(ratio)"] == 0.5 and both["activations_backward_peak(ratio)"] == 0.5
    assert (both["parameters(ratio)"], both["gradients(ratio)"], both["optimizer_state(ratio)"]) == (1.0, 1.0, 1.0)
    assert both["peak_added(ratio)"] == pytest.approx(0.9) and both["step(ratio)"] == pytest.approx(1.3)
    assert both["falls"] == "activations_saved, activations_backward_peak"  # 0.9x is not below 0.9x
    assert both["rises"] == ""
    assert w.iloc[1][["activations_saved(ratio)", "step(ratio)"]].isna().all() and w.iloc[1]["falls"] == ""


def test_a_part_that_rises_is_named():
    ddp = [cell(2, 64, 1, summary_=summary(10.0, 4, 4, 4, 20, 24, 100)),
           cell(2, 64, 2, summary_=summary(12.0, 4, 8, 4, 10, 12, 130))]  # e.g. DDP's gradient buckets
    row = workers_table(grid_table(ddp)).iloc[0]
    assert row["rises"] == "gradients, peak_added" and row["falls"] == "activations_saved, activations_backward_peak"


def test_interpretation_reports_what_the_measurements_show():
    grid = grid_table(measured_cells())
    sentences, rec = interpret.model_grid_result(
        Result("model_grid", {"model_grid": grid, "model_grid_workers": workers_table(grid)}))
    text = " ".join(sentences)
    assert sentences[:2] == ["On 1 worker, 1 of 3 cells fit (the largest: depth 2 x width 64, 1,000 parameters).",
                             "On 2 workers, 2 of 3 cells fit (the largest: depth 4 x width 64, 2,000 parameters)."]
    assert "Fits on 2 workers but not on 1: depth 4 x width 64." in text
    assert ("per rank (median over the 1 cell that fit on both): saved activations 0.50x, activation peak in "
            "backward 0.50x, parameters 1.00x, gradients 1.00x, optimizer state 1.00x, peak memory added by "
            "training 0.90x.") in text
    assert "What fell below 0.9x: activations_backward_peak, activations_saved; step time 1.30x." in text
    # a second cell that fits on both: medians over two, with the spread of the step's cost
    more = measured_cells() + [cell(2, 128, 1, summary_=summary(10.0, 8, 8, 8, 40, 48, 80)),
                               cell(2, 128, 2, summary_=summary(17.0, 8, 8, 8, 20, 24, 80))]
    grid = grid_table(more)
    sentences, _ = interpret.model_grid_result(
        Result("model_grid", {"model_grid": grid, "model_grid_workers": workers_table(grid)}))
    assert "(median over the 2 cells that fit on both): saved activations 0.50x" in " ".join(sentences)
    assert "peak memory added by training 0.95x." in " ".join(sentences)  # median of 0.9x and 1.0x
    assert "step time 1.50x (1.30x to 1.70x)." in " ".join(sentences)
    assert rec == "Under this memory limit, depth 4 x width 64 needs 2 workers (20 ms per step there)."


def test_interpretation_without_memory_by_kind_and_without_a_fit_change():
    old = [cell(2, 8, 1, summary_={keys.STEP_MEDIAN_MS: 4.0, keys.MEMORY_TRAIN_ADDED_BYTES: 1e6}),
           cell(2, 8, 2, summary_={keys.STEP_MEDIAN_MS: 8.0, keys.MEMORY_TRAIN_ADDED_BYTES: 2e6})]
    grid = grid_table(old)
    sentences, rec = interpret.model_grid_result(
        Result("model_grid", {"model_grid": grid, "model_grid_workers": workers_table(grid)}))
    assert "No cell fits on 2 workers that does not fit on 1: the seed's claim is not seen in this grid." in sentences
    assert "These runs did not record memory by kind, so which part fell is not measured here." in sentences
    assert sentences[-1] == "What fell below 0.9x: nothing; step time 2.00x."
    assert any("peak memory added by training 2.00x" in s for s in sentences) and rec is None
    assert interpret.model_grid_result(Result("model_grid", {"model_grid": pd.DataFrame()})) == ([], None)
