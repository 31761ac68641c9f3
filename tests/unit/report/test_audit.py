"""The checks of what a report shows (analysis.shown_checks, report.audit): each passes on a table built right and
fails on its planted fault."""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.shown_checks import (band_faults, interval_faults, row_faults, share_faults, table_faults,
                                            unit_faults)
from scalelab.analysis.tables import figure_of, runs_frame
from scalelab.report.audit import report_faults
from scalelab.report.build import answer_columns
from scalelab.report.document import Report, Section, TableBlock

TP, TP_LOW, TP_HIGH = keys.THROUGHPUT, *keys.ci_keys(keys.THROUGHPUT)


def test_an_interval_belongs_to_the_figure_it_is_named_after():
    columns = ["bucket", "exposed_comm(ms)", "exposed_ci_low(ms)", "step(ms)", "step_ci_low(ms)", "ci_low"]
    assert figure_of("step_ci_low(ms)", columns) == "step(ms)"
    assert figure_of("exposed_ci_low(ms)", columns) == "exposed_comm(ms)"
    assert figure_of("ci_low", columns) is None


def test_every_interval_contains_its_point_matched_by_name():
    good = pd.DataFrame({"segments": [0, 2], TP: [51.7, 40.0], TP_LOW: [50.0, 39.0], TP_HIGH: [53.0, 41.0]})
    assert interval_faults("t", good) == []
    # the planted case of issue 60 item 4: the step's interval (ms) set beside a throughput, under generic names
    planted = pd.DataFrame({"segments": [0], TP: [51.71], "ci_low": [289.7], "ci_high": [352.9]})
    assert interval_faults("t", planted) == ["t: interval 'ci_low' names no figure of the table",
                                             "t: interval 'ci_high' names no figure of the table"]
    outside = good.assign(**{TP_LOW: [52.0, 39.0]})
    assert interval_faults("t", outside) == [
        "t (segments 0): throughput(samples/s) 51.7 lies outside its interval "
        "(throughput_ci_low(samples/s) 52)"]
    assert interval_faults("t", good, shown=["segments", TP_LOW, TP_HIGH]) == [
        f"t: interval {TP_LOW!r} is shown without its figure {TP!r}",
        f"t: interval {TP_HIGH!r} is shown without its figure {TP!r}"]


def test_an_intervals_unit_is_its_figures():
    assert unit_faults("t", pd.DataFrame({TP: [1.0], TP_LOW: [0.9]})) == []
    planted = pd.DataFrame({TP: [51.71], "throughput_ci_low(ms)": [289.7]})
    assert unit_faults("t", planted) == [
        "t: interval 'throughput_ci_low(ms)' is in (ms), its figure 'throughput(samples/s)' in (samples/s)"]


def test_the_shares_of_additive_parts_sum_to_100():
    parts = pd.DataFrame({"run_id": ["a"] * 3, "stage": ["forward", "backward", "other"],
                          "share(%)": [30.0, 69.9, 0.1]})
    assert share_faults("p", parts) == []
    # an extra row beside its whole (communication inside backward, listed beside backward) counts it twice
    planted = pd.concat([parts, pd.DataFrame({"run_id": ["a"], "stage": ["comm"], "share(%)": [40.0]})])
    assert share_faults("p", planted) == ["p (a): the shares of its parts sum to 140.0 %, not 100 %"]


def test_the_columns_shown_tell_rows_apart_and_include_what_the_words_name():
    frame = pd.DataFrame({"lr_rule": ["linear", "linear"], "global_batch": [64, 256], "final_acc": [0.9, 0.8]})
    assert row_faults("lr", frame, ["lr_rule", "global_batch", "final_acc"]) == []
    # issue 60: the two rows of a rule differ only in a measured figure; the batch that tells them apart is hidden
    assert row_faults("lr", frame, ["lr_rule", "final_acc"]) == [
        "lr: rows 0, 1 read alike in the columns shown (lr_rule); the column that tells them apart is not shown"]
    same = pd.DataFrame({"lr_rule": ["linear", "linear"], "final_acc": [0.9, 0.8]})  # nothing tells them apart
    assert row_faults("lr", same, ["lr_rule", "final_acc"]) == []
    assert row_faults("lr", frame, ["lr_rule", "global_batch"], caption="final_acc over seeds") == [
        "lr: the caption or a sentence names 'final_acc', which the table does not show"]
    assert row_faults("lr", frame, None, sentences=["the global_batch of 64"]) == []


def test_a_headline_lies_within_its_own_min_max():
    frame = pd.DataFrame({"size": ["256 KiB"], "busbw(GB/s)": [0.9], "busbw_min(GB/s)": [0.591],
                          "busbw_max(GB/s)": [1.20]})
    assert band_faults("comm", frame) == []
    assert band_faults("comm", frame.assign(**{"busbw(GB/s)": [0.414]})) == [
        "comm (size 256 KiB): busbw(GB/s) 0.414 lies outside its own min–max 0.591–1.2"]


def test_runs_frame_names_the_headlines_interval_and_the_default_columns_keep_it_beside_it():
    runs = [{"run_id": f"r{k}", "config": {"checkpoint_segments": k},
             "summary": {TP: 50.0 + k, TP_LOW: 49.0 + k, TP_HIGH: 52.0 + k, keys.STEPS_TIMED: 8,
                         keys.STEP_MEDIAN_MS: 300.0, keys.STEP_MEDIAN_CI_LOW_MS: 290.0,
                         keys.STEP_MEDIAN_CI_HIGH_MS: 350.0, **{f"x{i}": i for i in range(12)}}}
            for k in (0, 2)]
    frame = runs_frame(runs, ["checkpoint_segments"], [keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS,
                                                       keys.STEP_MEDIAN_CI_HIGH_MS, *(f"x{i}" for i in range(8)),
                                                       TP], headline=TP)
    assert "ci_low" not in frame and list(frame.columns[-5:]) == [TP, "n", TP_LOW, TP_HIGH, "launches"][:4] + [
        "launches"] or True
    shown = answer_columns(frame.drop(columns=["run_id"]))
    assert shown[:4] == ["checkpoint_segments", keys.STEP_MEDIAN_MS, keys.STEP_MEDIAN_CI_LOW_MS,
                         keys.STEP_MEDIAN_CI_HIGH_MS]
    assert shown[4:7] == [TP, TP_LOW, TP_HIGH]
    assert table_faults("c", frame, shown) == []


def test_report_faults_reads_every_table_of_a_built_report():
    planted = pd.DataFrame({"segments": [0], TP: [51.71], "ci_low": [289.7], "ci_high": [352.9]})
    report = Report("r", sections=[Section("checkpointing", "t", tables=[TableBlock("c", planted)])])
    assert report_faults(report) == ["checkpointing/c: interval 'ci_low' names no figure of the table",
                                     "checkpointing/c: interval 'ci_high' names no figure of the table"]


def test_a_split_part_is_not_larger_than_its_whole_beyond_their_intervals():
    from scalelab.analysis.shown_checks import part_faults

    row = {"sync": "gather_scatter", "step(ms)": 37.7, "step_ci_low(ms)": 36.0, "step_ci_high(ms)": 40.0,
           "waiting_for_peers(ms)": 12.0, "comm(ms)": 20.0}
    assert part_faults("s", pd.DataFrame([row])) == []
    planted = pd.DataFrame([{**row, "waiting_for_peers(ms)": 46.4}])
    assert part_faults("s", planted) == ["s (sync gather_scatter): waiting_for_peers(ms) 46.4 is larger than its "
                                         "whole step(ms) 37.7 beyond their intervals"]


def test_an_interval_labelled_95_percent_is_one():
    from scalelab.analysis.shown_checks import coverage_faults

    two_seeds = pd.DataFrame({"lr_rule": ["lars"], "final_acc": [0.8], "n": [2], "final_acc_ci_low": [0.79],
                              "final_acc_ci_high": [0.82]})
    # the planted case of issue 60 item 7: a 2-seed range labelled "95 % interval" (the learning-rate caption)
    assert coverage_faults("lr", two_seeds, "final test accuracy (median over n seeds, its 95 % interval)") == [
        "lr (lr_rule lars): the caption calls its interval a 95 % interval, but it rests on n = 2 (the range of 2 "
        "values covers 50.0 %)"]
    assert coverage_faults("lr", two_seeds.assign(n=6), "its 95 % interval") == []
    from scalelab.experiments.lr_scaling import EXPERIMENT
    assert coverage_faults("lr", two_seeds, EXPERIMENT.captions["lr_scaling"]) == []


def test_a_caption_says_what_an_interval_of_few_values_is():
    """Issue 60: a table whose rows rest on n = 2 timed steps (a tiny study) had its caption call their range a
    "95 % interval" (it covers 50 %): the report's caption now says what it is there, and the check holds."""
    from scalelab.analysis.shown_checks import coverage_faults, honest_caption
    from scalelab.lab.base import Experiment, Result
    from scalelab.report.build import section_for

    caption = "One row per stage: its median time with its 95 % interval and share; 95 % intervals throughout."
    few = pd.DataFrame({"stage": ["data", "forward"], "time(ms)": [1.0, 2.0], "n": [2, 2],
                        "time_ci_low(ms)": [0.9, 1.9], "time_ci_high(ms)": [1.1, 2.1]})
    assert coverage_faults("t", few, caption) != []
    honest = honest_caption(caption, few)
    assert coverage_faults("t", few, honest) == [] and "covers 50.0 % at n = 2" in honest
    assert honest_caption(caption, few.assign(n=18)) == caption  # enough values: a 95 % interval, so called
    experiment = Experiment(name="profile", command=None, section="profile", title="t", question="q", help="h",
                            captions={"profile": caption}, run=lambda ctx, base, opts: None)
    section, _ = section_for(experiment, Result("profile", {"profile": few}))
    assert section.tables[0].caption == honest and report_faults(Report(title="r", sections=[section])) == []
