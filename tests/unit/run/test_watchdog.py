"""The hang watchdog: its verdict on fixed heartbeats and a fixed clock, and the heartbeat a rank publishes."""
from __future__ import annotations

import time

from scalelab.store import write_json_atomic
from scalelab.run.watchdog import Watchdog, diagnose
from scalelab.store import RunDir
from scalelab.train.heartbeat import Heartbeat


def beat(step, stage, progress=1):
    return {"rank": 0, "pid": 1, "host": "h", "step": step, "stage": stage, "progress": progress, "t(unix_s)": 0.0}


def test_no_verdict_while_any_rank_progresses():
    beats = {0: beat(5, "backward"), 1: beat(5, "forward")}
    assert diagnose(beats, {0: 100.0, 1: 3.0}, 30, [0, 1]) is None


def test_the_rank_furthest_behind_is_named():
    # rank 0 waits in backward (DDP's allreduce) for rank 1, which never leaves forward
    beats = {0: beat(5, "backward"), 1: beat(5, "forward")}
    verdict = diagnose(beats, {0: 31.0, 1: 40.0}, 30, [0, 1])
    assert verdict.startswith("rank 1 hung: no progress for 40 s (hang timeout 30 s)")
    assert "rank 0 at step 5 (backward)" in verdict and "rank 1 at step 5 (forward)" in verdict


def test_a_rank_a_step_behind_is_named_and_finished_ranks_are_ignored():
    beats = {0: beat(7, "comm"), 1: beat(6, "comm"), 2: beat(9, "done")}
    verdict = diagnose(beats, {0: 50.0, 1: 50.0, 2: 50.0}, 30, [0, 1, 2])
    assert verdict.startswith("rank 1 hung")
    assert diagnose({0: beat(9, "done")}, {0: 99.0}, 30, [0]) is None


def test_a_rank_that_never_started_is_named():
    verdict = diagnose({0: beat(0, "setup"), 1: None}, {0: 31.0, 1: 31.0}, 30, [0, 1])
    assert verdict.startswith("rank 1 never started")


def test_watchdog_measures_idle_time_on_its_own_clock(tmp_path):
    now = [100.0]
    aborted = []
    dog = Watchdog(tmp_path, [0, 1], 10, abort=aborted.append, clock=lambda: now[0])
    for r in (0, 1):
        write_json_atomic(RunDir(tmp_path).heartbeat_file(r), {**beat(3, "forward", progress=4), "rank": r})
    assert dog.check() is None
    now[0] = 109.0
    write_json_atomic(RunDir(tmp_path).heartbeat_file(0), {**beat(3, "backward", progress=5), "rank": 0})
    assert dog.check() is None  # rank 0 moved at 109
    now[0] = 115.0
    assert dog.check() is None  # rank 0 idle only 6 s
    now[0] = 119.5
    verdict = dog.check()
    assert verdict.startswith("rank 1 hung: no progress for 20 s") and len(aborted) == 1


def test_heartbeat_publishes_progress(tmp_path):
    hb = Heartbeat(tmp_path, 3, interval_s=0.05).start()
    hb.enter("forward")
    hb.step = 2
    time.sleep(0.3)
    from scalelab.store import read_json

    seen = read_json(RunDir(tmp_path).heartbeat_file(3))
    assert (seen["rank"], seen["step"], seen["stage"], seen["progress"]) == (3, 2, "forward", 1)
    hb.stop()
    assert read_json(RunDir(tmp_path).heartbeat_file(3))["stage"] == "done"


def test_the_launcher_s_explanation_leads_the_verdict(tmp_path):
    now = [0.0]
    dog = Watchdog(tmp_path, [0], 10, abort=lambda beats: None, explain=lambda: "node 1 (rank 1) unreachable",
                   clock=lambda: now[0])
    write_json_atomic(RunDir(tmp_path).heartbeat_file(0), {**beat(3, "comm", progress=4), "rank": 0})
    assert dog.check() is None
    now[0] = 11.0
    assert dog.check().startswith("node 1 (rank 1) unreachable; rank 0 hung")
