"""A stored run's own arithmetic (checks.run_failures) on planted runs: a sound 2-rank run passes; a negative time
interval, parts that do not sum to the step, a split that does not add up, a stored aggregate that is not its
definition's and bytes off theory each fail, with a sentence naming what broke."""
from __future__ import annotations

import pytest

from scalelab.analysis.checks import (bytes_off_theory, negative_figures, run_failures, unsplit_collectives,
                                      unsummed_steps)
from scalelab.analysis.peers import union_seconds
from scalelab.analysis.summary import summarize
from scalelab.store import RunDir

GRAD_BYTES = 4000


def record(rank: int, step: int, events: list, warmup: bool = False) -> dict:
    """A step record whose stages sum to its wall time (40 ms: 1 + 14 + 20 + 5) and whose collective fields
    are those the meter writes for `events`."""
    return {"rank": rank, "step": step, "epoch": 0, "warmup": warmup, "samples": 4, "data(s)": 0.001,
            "h2d(s)": 0.0, "forward(s)": 0.014, "backward(s)": 0.020, "comm(s)": 0.0, "optimizer(s)": 0.005,
            "other(s)": 0.0, "wall(s)": 0.040, "comm_total(s)": union_seconds((e[2], e[2] + e[3]) for e in events),
            "comm_sum(s)": sum(e[3] for e in events), "collectives": len(events),
            "comm_bytes": sum(e[4] for e in events), "comm_bytes_forward": 0,
            "comm_bytes_backward": sum(e[4] for e in events), "comm_bytes_optimizer": 0,
            "comm_alg_bytes": sum(e[4] for e in events), "comm_bus_bytes": sum(e[4] for e in events),
            "comm_events": events}


def two_rank_records() -> list[dict]:
    """2 ranks, a warm-up step and 4 timed ones; two buckets a step (GRAD_BYTES together). Rank 1 is late by
    2, 4, 6, 8 ms at the first bucket; the buckets overlap."""
    out = []
    for step in range(1, 6):
        t, late = float(step), 0.002 * (step - 1)
        out.append(record(0, step, [["allreduce", "backward", t, 0.004 + late, 3000],
                                    ["allreduce", "backward", t + 0.002, 0.004 + late, 1000]], warmup=step == 1))
        out.append(record(1, step, [["allreduce", "backward", t + late, 0.004, 3000],
                                    ["allreduce", "backward", t + 0.002 + late, 0.004, 1000]], warmup=step == 1))
    return out


CONFIG = {"sync": "ddp", "ddp_hook": "none", "engine": "ddp", "noop_collectives": False, "ranks": 2}


def stored_run(tmp_path, records=None, summary_edit=None, config=None):
    """A run directory as the runner leaves it, then parsed (RunDir.load)."""
    records = records if records is not None else two_rank_records()
    summary = summarize(records, steps_per_epoch=10)
    summary["memory/gradients(bytes)"] = float(GRAD_BYTES)
    (summary_edit or (lambda s: None))(summary)
    files = RunDir(tmp_path / "run-1")
    files.path.mkdir()
    files.write_config(config or CONFIG)
    files.write_summary(summary)
    for rank in (0, 1):
        files.write_steps(rank, [r for r in records if r["rank"] == rank])
    return files.load()


def test_a_sound_run_obeys_its_arithmetic(tmp_path):
    run = stored_run(tmp_path)
    assert run_failures(run) == []
    assert run.summary["comm/waiting_for_peers(ms)"] == pytest.approx(5.0)  # rank 0's 2, 4, 6, 8 ms
    assert run.summary["comm/waiting_for_peers_ci_low(ms)"] > 0


def test_a_negative_time_interval_fails(tmp_path):
    def plant(s):
        s["comm/time_ci_low(ms)"], s["comm/time_ci_high(ms)"] = -20.48, 62.62  # issue 43's first run, as it was
    assert run_failures(stored_run(tmp_path, summary_edit=plant)) == [
        "comm/time(ms)'s interval reaches below 0 (-20.48 to 62.62)"]


def test_negative_figures_and_what_may_be_negative():
    assert negative_figures({"stage/other(ms)": -0.5}) == [
        "stage/other(ms) = -0.5: a time, a byte count or a rate is never below 0"]
    assert negative_figures({"comm/bytes_per_step": -1.0})  # a count, no unit in its key
    assert negative_figures({"comm/algbw(GB/s)": 1.0, "comm/algbw_ci_low(GB/s)": 2.0,
                             "comm/algbw_ci_high(GB/s)": 1.5}) == [
        "comm/algbw(GB/s)'s interval is upside down (2 > 1.5)"]
    assert negative_figures({"memory/train_added(bytes)": -4096.0}) == []  # a difference: training freed memory
    assert negative_figures({"stage/other(ms)": -1e-12, "comm/time(ms)": float("nan")}) == []  # rounding; NaN


def test_parts_that_do_not_sum_to_the_step_fail(tmp_path):
    records = two_rank_records()
    records[3]["forward(s)"] += 0.003  # rank 1, step 2: 3 ms of forward from nowhere
    failures = run_failures(stored_run(tmp_path, records))
    assert failures == ["rank 1 step 2: its parts sum to 43.0000 ms, its wall time is 40.0000 ms"]
    assert unsummed_steps([{"wall(s)": 0.04}]) == []  # no `other`: not a loop's step record


def test_waiting_plus_critical_is_each_ranks_time_inside_collectives(tmp_path):
    records = two_rank_records()
    records[4]["comm_total(s)"] += 0.001  # rank 0, step 3: a millisecond the events do not hold
    assert run_failures(stored_run(tmp_path, records)) == [
        "rank 0 step 3: waiting 4.0000 + critical 6.0000 ms != its time inside collectives 11.0000 ms"]


def test_the_stored_aggregates_are_the_ones_their_definitions_name():
    records = two_rank_records()
    summary = summarize(records, steps_per_epoch=10)
    assert unsplit_collectives(records, summary) == []
    summary["comm/waiting_for_peers(ms)"] = 2.5  # e.g. a mean over ranks where the definition says the largest
    assert unsplit_collectives(records, summary) == [
        "comm/waiting_for_peers(ms) = 2.5, but the mean over timed steps of the largest waiting over ranks is 5"]
    assert unsplit_collectives(records, {**summary, "comm/source": "horovod timeline, rank 0"}) == []


def test_bytes_per_step_equal_theory_where_it_is_known():
    summary = {"comm/bytes_per_step": 4100.0, "comm/bytes_backward_per_step": 4000.0,
               "memory/gradients(bytes)": 4000.0}
    assert bytes_off_theory(CONFIG, summary) is None  # the 100 bytes of forward broadcasts are not gradients
    assert bytes_off_theory(CONFIG, {**summary, "comm/bytes_backward_per_step": 2000.0}) == (
        "comm/bytes_backward_per_step = 2000, but a full-gradient allreduce (ddp) sends the gradients' 4000 bytes a "
        "step")
    assert bytes_off_theory({**CONFIG, "ddp_hook": "fp16"}, {**summary, "comm/bytes_backward_per_step": 2000.0}) is None
    assert bytes_off_theory({**CONFIG, "sync": "noop"}, {"comm/bytes_per_step": 0.0}) is None
    assert bytes_off_theory({**CONFIG, "noop_collectives": True}, summary) == (
        "comm/bytes_per_step = 4100 of a sync that sends nothing")
    assert bytes_off_theory({**CONFIG, "engine": "horovod"}, {**summary, "comm/bytes_backward_per_step": 1.0}) is None


def test_a_run_without_a_summary_is_not_checked(tmp_path):
    run = stored_run(tmp_path)
    run.summary = None
    assert run_failures(run) == []


def test_the_suites_check_reads_every_stored_run_and_names_the_broken_ones(tmp_path):
    """tests/conftest.py's check_runs, which fails a session of dist tests: the committed store's 10 runs and a
    sound planted run pass; a planted run with a negative interval is named."""
    from conftest import FIXTURES, check_runs

    sound = stored_run(tmp_path)
    assert check_runs([FIXTURES / "store_v0", sound.rundir.path.parent]) == (11, [])
    (tmp_path / "other").mkdir()
    broken = stored_run(tmp_path / "other", summary_edit=lambda s: s.update({"throughput_ci_low(samples/s)": -3.0}))
    runs, failures = check_runs([broken.rundir.path.parent])
    assert runs == 1 and len(failures) == 1
    assert failures[0].startswith(str(broken.rundir.path)) and "throughput(samples/s)'s interval reaches below 0" in \
        failures[0]
