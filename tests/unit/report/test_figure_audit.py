"""Issue 60: a figure records what it drew (report.drawn), the report carries the records (figures.json) and its
audit holds them to the tables (analysis.figure_checks): each check passes on a figure drawn right and fails on its
planted fault."""
from __future__ import annotations

import json

import pandas as pd

from scalelab.analysis.figure_checks import (COMPUTE_LABEL, axis_unit, axis_unit_faults, column_unit,
                                             compute_faults, figure_coverage_faults, figure_faults, legend_faults)
from scalelab.experiments import scale
from scalelab.lab import results as saved
from scalelab.lab.base import Experiment, Result
from scalelab.report import figures
from scalelab.report.audit import report_faults
from scalelab.report.document import FigureBlock, Report, Section, TableBlock
from scalelab.report.drawn import Series, read_record, record_path
from scalelab.report.render import write_report

STRATEGIES = pd.DataFrame({"sync": ["ddp", "allreduce"], "status": ["completed", "completed"],
                           "step(ms)": [30.0, 40.0], "step_ci_low(ms)": [29.0, 38.0], "step_ci_high(ms)": [31.0, 42.0],
                           "compute(ms)": [22.0, 22.5], "exposed_comm(ms)": [8.0, 17.5],
                           "exposed_ci_low(ms)": [7.0, 16.0], "exposed_ci_high(ms)": [9.0, 19.0],
                           "comm(ms)": [9.0, 17.0], "timed_steps": [40, 40],
                           "bytes_forward_per_step": [0.0, 0.0], "bytes_backward_per_step": [4e6, 4e6],
                           "bytes_optimizer_per_step": [0.0, 0.0], "loopback_bytes_per_step": [8.1e6, 8.3e6]})


def drawn(ylabel: str, legend: list[str], series: list[dict] | None) -> dict:
    return {"axes": [{"title": "t", "xlabel": "", "ylabel": ylabel, "legend": legend}], "series": series}


def test_a_saved_figure_records_its_labels_as_drawn_and_the_columns_it_reads(tmp_path):
    png = figures.comm_breakdown_bars(STRATEGIES, tmp_path / "compare_strategies.png", label="sync",
                                      name="compare_strategies")
    record = read_record(png)
    assert record_path(png) == tmp_path / "compare_strategies.figure.json"
    legend = record["axes"][0]["legend"]
    assert COMPUTE_LABEL in legend and "time inside collectives" in legend  # read from the figure, not declared
    assert record["axes"][0]["ylabel"] == "time per step (ms)"
    assert {(s["label"], s["column"]) for s in record["series"]} >= {(COMPUTE_LABEL, "compute(ms)"),
                                                                     ("time inside collectives", "comm(ms)")}
    assert figure_faults("s/f", record, "caption", {"compare_strategies": STRATEGIES}) == []
    png = figures.comm_bytes_bars(STRATEGIES, tmp_path / "b.png", label="sync", name="compare_strategies")
    assert figure_faults("s/b", read_record(png), "", {"compare_strategies": STRATEGIES}) == []


def test_the_scaling_figures_hold_to_their_table(tmp_path):
    table = pd.DataFrame({"workers": [1, 2], "global_batch": [64, 64], "speedup": [1.0, 1.6],
                          "speedup_ci_low": [1.0, 1.5], "speedup_ci_high": [1.0, 1.7], "compute(ms)": [20.0, 22.0],
                          "step(ms)": [20.0, 30.0], "exposed_comm(ms)": [0.0, 8.0], "exposed_ci_low(ms)": [0.0, 6.0],
                          "exposed_ci_high(ms)": [0.0, 10.0], "comm/time(ms)": [0.0, 9.0]})
    for png in (scale.speedup_vs_workers(table, tmp_path / "s.png", mode="strong", name="scale_strong"),
                scale.compute_comm_bars(table, tmp_path / "sb.png", name="scale_strong")):
        assert figure_faults("scaling", read_record(png), "", {"scale_strong": table}) == []
    # the same figure read against a table without its column: the legend names a series the table lacks
    record = read_record(tmp_path / "sb.png")
    assert legend_faults("scaling/sb.png", record, {"scale_strong": table.drop(columns=["comm/time(ms)"])}) == [
        "scaling/sb.png: series 'time inside collectives' reads 'comm/time(ms)', which table 'scale_strong' does "
        "not have"]


def test_every_legend_entry_is_a_declared_series_of_its_table():
    frame = pd.DataFrame({"compute(ms)": [1.0], "empty(ms)": [float("nan")]})
    good = drawn("time (ms)", ["ideal", "c"], [{"label": "ideal"}, {"label": "c", "table": "t", "column": "compute(ms)"}])
    assert legend_faults("x", good, {"t": frame}) == []
    assert legend_faults("x", drawn("time (ms)", ["c", "no-op collectives"], good["series"]), {"t": frame}) == [
        "x: legend entry 'no-op collectives' is no series the figure declares it read"]
    planted = drawn("time (ms)", ["c"], [{"label": "c", "table": "t", "column": "comm(ms)"}])
    assert legend_faults("x", planted, {"t": frame}) == ["x: series 'c' reads 'comm(ms)', which table 't' does not have"]
    assert legend_faults("x", planted, {}) == ["x: series 'c' reads table 't', which its section does not hold"]
    empty = drawn("time (ms)", ["c"], [{"label": "c", "table": "t", "column": "empty(ms)"}])
    assert legend_faults("x", empty, {"t": frame}) == ["x: series 'c' reads 'empty(ms)', which has no value in table 't'"]
    assert legend_faults("x", None, {}) == ["x: the figure has no record of what it drew"]
    assert legend_faults("x", drawn("time (ms)", ["c"], None), {}) == []  # declares no series: texts only


def test_an_axis_label_names_the_unit_of_the_column_it_plots():
    assert (axis_unit("speedup (x, epoch times), bars: 95 % interval"), axis_unit("bytes per step (MB, 10^6 bytes)"),
            axis_unit("ms per step")) == ("x", "MB", None)
    assert (column_unit("step(ms)"), column_unit("bytes_backward_per_step"), column_unit("speedup")) == ("ms", "bytes", "")
    series = [{"label": "step", "table": "t", "column": "step(ms)"}]
    assert axis_unit_faults("x", drawn("time per step (ms)", ["step"], series)) == []
    assert axis_unit_faults("x", drawn("time per step (s)", ["step"], series)) == [
        "x: the axis of 'step' is in s ('time per step (s)'), its column 'step(ms)' drawn in ms"]
    assert axis_unit_faults("x", drawn("time per step (s)", ["step"], [{**series[0], "scale": 1e-3}])) == []
    assert axis_unit_faults("x", drawn("ms per step", ["step"], series)) == [
        "x: the axis of 'step' ('ms per step') names no unit"]
    payload = [{"label": "p", "table": "t", "column": "bytes_backward_per_step", "scale": 1e-6}]
    assert axis_unit_faults("x", drawn("bytes (MB)", ["p"], payload)) == []
    assert axis_unit_faults("x", drawn("bytes (MiB)", ["p"], payload)) == [
        "x: the axis of 'p' is in MiB ('bytes (MiB)'), its column 'bytes_backward_per_step' drawn in MB"]
    accuracy = [{"label": "a", "table": "t", "column": "final_acc", "scale": 100}]
    assert axis_unit_faults("x", drawn("accuracy (%)", ["a"], accuracy)) == []
    assert axis_unit_faults("x", drawn("speedup (x)", ["s"], [{"label": "s", "table": "t", "column": "speedup"}])) == []


def test_a_figure_that_calls_its_interval_95_percent_plots_one():
    series = [{"label": "rule", "table": "lr", "column": "final_acc", "scale": 100}]
    few = pd.DataFrame({"lr_rule": ["linear"], "n": [2], "final_acc": [0.9], "final_acc_ci_low": [0.85]})
    caption = "Final accuracy per rule, bars its 95 % interval."
    assert figure_coverage_faults("lr/f.png", drawn("accuracy (%)", ["rule"], series), caption, {"lr": few}) == [
        "lr/f.png (lr) (lr_rule linear): the caption calls its interval a 95 % interval, but it rests on n = 2 (the "
        "range of 2 values covers 50.0 %)"]
    # said in a legend entry, not the caption: the same fault
    assert len(figure_coverage_faults("f", drawn("accuracy (%)", ["rule, 95 % interval"], series), "", {"lr": few})) == 1
    assert figure_coverage_faults("f", drawn("accuracy (%)", ["rule"], series), caption, {"lr": few.assign(n=8)}) == []


def test_every_text_that_names_compute_uses_the_one_definition():
    assert compute_faults("f", drawn("ms (ms)", [COMPUTE_LABEL], None), f"Per cell: {COMPUTE_LABEL} + exposed") == []
    # the planted case of issue 60 item 7: the caption's compute is not the legend's
    assert compute_faults("f", drawn("ms (ms)", [COMPUTE_LABEL], None), "compute (step with no sync) + exposed") == [
        f"f: 'compute (step with no sync)' is not the one definition of compute ({COMPUTE_LABEL!r})"]
    assert len(compute_faults("f", drawn("ms (ms)", ["compute (no-op collectives)"], None), "")) == 1
    # the bucket sweep's caption until issue 60's figure audit: compute defined in other words than its legend's
    assert compute_faults("f", None, "dashed: compute, the step with no-op collectives.") == [
        f"f: 'compute, the step with no-op collectives' is not the one definition of compute ({COMPUTE_LABEL!r})"]


def test_the_report_carries_the_records_and_its_audit_reads_them(tmp_path):
    png = figures.comm_breakdown_bars(STRATEGIES, tmp_path / "compare_strategies.png", label="sync",
                                      name="compare_strategies")
    table = TableBlock("compare_strategies", STRATEGIES, "One row per strategy.")

    def report(caption: str) -> Report:
        figure = FigureBlock(png, caption, read_record(png))
        return Report(title="r", sections=[Section(id="strategies", title="S", tables=[table], figures=[figure])])

    assert [f for f in report_faults(report(f"Per strategy: {COMPUTE_LABEL}.")) if ".png" in f] == []
    assert [f for f in report_faults(report("Per strategy: compute (step with no sync).")) if ".png" in f] == [
        f"strategies/compare_strategies.png: 'compute (step with no sync)' is not the one definition of compute "
        f"({COMPUTE_LABEL!r})"]
    files = write_report(report("c"), tmp_path / "out")
    records = json.loads(files["figures.json"].read_text())
    entry = records["figures/strategies_compare_strategies.png"]
    assert entry["section"] == "strategies" and entry["caption"] == "c"
    assert COMPUTE_LABEL in entry["drawn"]["axes"][0]["legend"]


def test_a_saved_plot_without_its_record_is_drawn_again(tmp_path):
    experiment = Experiment(name="toy", command=None, title="t", question="q", help="h", section="toy",
                            run=lambda ctx, base, opts: None)
    fig, ax = figures.plt.subplots()
    ax.plot([1, 2], [3, 4], label="a")
    png = figures.save(fig, tmp_path / "toy.png", [Series("a", "toy", "x(ms)")])
    saved.save(experiment, Result("toy", {"toy": pd.DataFrame({"x(ms)": [1.0]})}, files=[png]), tmp_path)
    assert saved.load(experiment, tmp_path) is not None
    record_path(png).unlink()  # a plot saved before figures recorded what they drew
    assert saved.load(experiment, tmp_path) is None


def test_the_busbw_figure_is_drawn_again_for_the_report_with_its_record(tmp_path):
    from scalelab.experiments.comm import busbw_figure, comm_table

    raw = pd.DataFrame({"op": ["allreduce", "allreduce", "broadcast"], "size(B)": [1024, 4096, 1024],
                        "busbw(GB/s)": [0.5, 0.9, float("nan")], "busbw_min(GB/s)": [0.4, 0.8, float("nan")],
                        "busbw_max(GB/s)": [0.6, 1.0, float("nan")], "status": ["ok", "ok", "skipped"]})
    png = busbw_figure(comm_table(raw), tmp_path / "comm_busbw.png", "2 ranks, gloo")
    record = read_record(png)
    assert record["axes"][0]["legend"] == ["allreduce", "broadcast (skipped)"]
    assert record["axes"][0]["title"].startswith("2 ranks, gloo")
    assert figure_faults("comm/comm_busbw.png", record, "Bus bandwidth.", {"comm": comm_table(raw)}) == []


def test_every_figure_of_the_stored_quick_study_holds_to_its_tables(tmp_path):
    """Each experiment's figures drawn from the stored fixture study's tables (tests/fixtures/quick_study_results):
    the audit finds no figure fault. Before figures named their intervals by their n, it found 10 ("95 %
    interval" on the scaling and checkpointing figures, whose rows rest on n = 4 and n = 2)."""
    from conftest import FIXTURES

    from scalelab.lab import registry
    from scalelab.lab.results import frame_of
    from scalelab.report.build import section_for
    from scalelab.store import read_json

    sections, declared = [], 0
    for path in sorted((FIXTURES / "quick_study_results").glob("*.json")):
        experiment = registry.get(path.stem) if path.stem in registry.names() else None
        if experiment is None or experiment.figures is None:
            continue
        data = read_json(path)
        result = Result(data["name"], {k: frame_of(t) for k, t in data["tables"].items()}, notes=data.get("notes", {}),
                        meta=data.get("meta", {}))
        result.files = [p for p in experiment.figures(result, tmp_path) if p is not None]
        section, _ = section_for(experiment, result)
        sections.append(section)
        declared += sum(f.drawn["series"] is not None for f in section.figures)
    assert declared >= 12  # the comparison, scaling, sweep, threads, loader, checkpointing and lr figures
    assert [f for f in report_faults(Report(title="r", sections=sections)) if ".png" in f] == []


def test_a_figure_names_its_intervals_by_the_values_behind_them():
    frame = pd.DataFrame({"x": [1, 2], "n": [2, 8], "step(ms)": [1.0, 2.0], "step_ci_low(ms)": [0.9, 1.9]})
    assert figures.ci_label(frame.assign(n=8)) == "95 % interval"
    assert figures.ci_label(frame) == "50 % interval (range of 2 values)"
    assert figure_coverage_faults("f", drawn(figures.step_ci_label(frame), [], [
        {"label": "", "table": "t", "column": "step(ms)"}]), "", {"t": frame}) == []


def test_the_per_node_bars_name_their_units_and_columns(tmp_path):
    nodes = pd.DataFrame({"nodes": [2, 2], "global_batch": [64, 64], "node": [0, 1], "epoch(s)": [3.0, 3.2],
                          "cpu_user(%)": [80.0, 70.0], "cpu_system(%)": [10.0, 12.0], "net_sent(MB/s)": [5.0, 5.5]})
    png = scale.per_node(nodes, tmp_path / "n.png", name="scale_strong_nodes")
    record = read_record(png)
    assert [ax["ylabel"] for ax in record["axes"]] == ["time per epoch (s)", "CPU (% of one core; hatched: system)",
                                                       "sent (MB/s)"]
    assert figure_faults("scaling/n.png", record, "", {"scale_strong_nodes": nodes}) == []


def test_the_bucket_sweep_figure_holds_to_its_table(tmp_path):
    from scalelab.experiments import bucket_sweep

    t = pd.DataFrame({"bucket_mb": [1.0, 25.0], "status": ["completed", "completed"], "n": [8, 8],
                      "step(ms)": [30.0, 28.0], "step_ci_low(ms)": [29.0, 27.0], "step_ci_high(ms)": [31.0, 29.0],
                      "exposed_comm(ms)": [8.0, 6.0], "exposed_ci_low(ms)": [7.0, 5.0],
                      "exposed_ci_high(ms)": [9.0, 7.0], "compute(ms)": [22.0, 22.0]})
    [png] = bucket_sweep.plot(Result("bucket_sweep", {"bucket_sweep": t}), tmp_path)
    record = read_record(png)
    assert record["axes"][0]["ylabel"] == "time per step (ms)"  # was "ms per step": no unit an audit could read
    assert figure_faults("buckets/b.png", record, "", {"bucket_sweep": t}) == []
    assert record["axes"][0]["title"].endswith("bars: 95 % interval")
    few = t.assign(n=[2, 2])
    [png] = bucket_sweep.plot(Result("bucket_sweep", {"bucket_sweep": few}), tmp_path)
    assert figure_faults("buckets/b.png", read_record(png), "", {"bucket_sweep": few}) == []
    assert read_record(png)["axes"][0]["title"].endswith("bars: 50 % interval (range of 2 values)")


def test_a_comparison_without_its_no_op_baseline_labels_no_bar_compute(tmp_path):
    """Found by the figure audit in the tiny dist study: the engines comparison (no no-op baseline ran) drew each
    row's whole step as a bar labelled compute, and a legend entry for an exposed part no row has."""
    alone = STRATEGIES.assign(**{"compute(ms)": float("nan"), "exposed_comm(ms)": float("nan"),
                                 "exposed_ci_low(ms)": float("nan"), "exposed_ci_high(ms)": float("nan")})
    png = figures.comm_breakdown_bars(alone, tmp_path / "e.png", label="sync", name="compare_engines")
    record = read_record(png)
    legend = record["axes"][0]["legend"]
    assert COMPUTE_LABEL not in legend and figures.NO_BASELINE_LABEL in legend
    assert not any(entry.startswith("exposed") for entry in legend)
    assert figure_faults("engines/e.png", record, "", {"compare_engines": alone}) == []
    # one row with its baseline, one without: both named as what they are
    mixed = STRATEGIES.assign(**{"compute(ms)": [22.0, float("nan")]})
    legend = read_record(figures.comm_breakdown_bars(mixed, tmp_path / "m.png", label="sync"))["axes"][0]["legend"]
    assert COMPUTE_LABEL in legend and figures.NO_BASELINE_LABEL in legend
