"""/proc readers against fixed /proc text: exact CPU seconds, steal, load, and the run's own CPU."""
from __future__ import annotations

import os

import pytest

from scalelab.measure.machine import RunCpu, machine_sample, read_boot_id, read_cpu_times, read_load, read_process_cpu, \
    read_process_times

STAT = """cpu  1000 50 300 8000 100 20 30 40 7 0
cpu0 500 25 150 4000 50 10 15 20 7 0
intr 12345
"""
# pid 42, a name with a space and a parenthesis; utime 250, stime 50 ticks (fields 14, 15)
PID_STAT = "42 (my (odd) name) R 1 42 42 0 -1 4194304 100 0 0 0 250 50 3 4 20 0 1 0 100 1000 10\n"


def fake_proc(tmp_path, stat=STAT, pids=None, load="1.50 0.80 0.40 2/300 4242\n"):
    (tmp_path / "stat").write_text(stat)
    (tmp_path / "loadavg").write_text(load)
    for pid, text in (pids or {}).items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text)
    return tmp_path


def test_machine_cpu_seconds_from_proc_stat(tmp_path):
    cpu = read_cpu_times(fake_proc(tmp_path), ticks_per_s=100)
    assert cpu.busy == pytest.approx((1000 + 50 + 300 + 20 + 30) / 100)  # user nice system irq softirq
    assert cpu.steal == pytest.approx(0.40)
    assert cpu.total == pytest.approx((1400 + 8000 + 100 + 40) / 100)  # busy + idle + iowait + steal
    assert cpu.cpus == 1  # one cpuN line


def test_missing_or_odd_proc_reads_as_none(tmp_path):
    assert read_cpu_times(tmp_path) is None
    assert read_load(tmp_path) is None
    assert read_process_cpu(7, tmp_path) is None
    assert read_cpu_times(fake_proc(tmp_path, stat="intr 1\n")) is None


def test_process_cpu_is_utime_plus_stime_whatever_its_name(tmp_path):
    root = fake_proc(tmp_path, pids={42: PID_STAT})
    assert read_process_cpu(42, root, ticks_per_s=100) == pytest.approx(3.0)
    assert read_process_times(42, root, ticks_per_s=100) == pytest.approx((2.5, 0.5))  # utime, stime apart


def test_the_boot_id_names_the_machine(tmp_path):
    root = fake_proc(tmp_path)
    assert read_boot_id(root) is None
    (root / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text("5f0c-boot\n")
    assert read_boot_id(root) == "5f0c-boot"
    assert machine_sample(RunCpu(lambda: set(), since=0.0, root=root), root)["host"] == "5f0c-boot"


def test_load_average(tmp_path):
    assert read_load(fake_proc(tmp_path)) == 1.5


def test_run_cpu_keeps_the_last_reading_of_a_process_that_ended(tmp_path):
    root = fake_proc(tmp_path, pids={42: PID_STAT, 43: PID_STAT.replace("42 (", "43 (")})
    pids = {42, 43}
    run = RunCpu(lambda: pids, since=0.0, root=root)
    # the pids are not real processes here: RunCpu finds no children and reads the fake /proc/<pid>/stat
    first = run.seconds()
    # each: utime 250 + stime 50 + its reaped children's 3 + 4 ticks
    assert first == pytest.approx(2 * (250 + 50 + 3 + 4) / os.sysconf("SC_CLK_TCK"))
    (root / "43" / "stat").unlink()  # 43 ended
    pids.discard(43)
    assert run.seconds() == pytest.approx(first)


def test_a_reaped_loader_worker_counts_once_in_its_parents_children_time(tmp_path):
    """A DataLoader worker read once (1 s), then ending and reaped by its rank between two samples: the rank's
    cutime grows by the worker's whole time (1.5 s), the worker's own reading is dropped, nothing counts twice
    and its last half second is not lost (it used to read as CPU busy outside the run)."""
    tick = os.sysconf("SC_CLK_TCK")
    rank = "42 (python) S 1 42 42 0 -1 0 0 0 0 0 {u} 0 {cu} 0 20 0 1 0 100 1000 10\n"
    worker = "44 (pt_data_worker) S 42 42 42 0 -1 0 0 0 0 0 {u} 0 0 0 20 0 1 0 100 1000 10\n"
    root = fake_proc(tmp_path, pids={42: rank.format(u=2 * tick, cu=0), 44: worker.format(u=tick)})
    run = RunCpu(lambda: {42}, since=0.0, root=root)
    assert run.seconds({42, 44}) == pytest.approx(3.0)  # the rank's 2 s and the live worker's 1 s
    (root / "44" / "stat").unlink()  # the worker ran 0.5 s more, ended and was reaped
    (root / "42" / "stat").write_text(rank.format(u=2 * tick, cu=int(1.5 * tick)))
    assert run.seconds({42}) == pytest.approx(3.5)
    assert read_process_times(42, root, ticks_per_s=tick) == pytest.approx((2.0, 0.0))  # own time alone
    assert read_process_times(42, root, ticks_per_s=tick, children=True) == pytest.approx((3.5, 0.0))


def test_machine_sample_fields(tmp_path):
    root = fake_proc(tmp_path, pids={42: PID_STAT})
    sample = machine_sample(RunCpu(lambda: {42}, since=0.0, root=root), root)
    assert set(sample) == {"time", "cpu_busy(s)", "cpu_steal(s)", "cpu_total(s)", "cpus", "cpu_run(s)",
                           "cpu_run_user(s)", "cpu_run_system(s)", "load1"}  # no boot id in the fake /proc
    ticks = os.sysconf("SC_CLK_TCK")
    # its own 250 + 50 ticks and its reaped children's 3 + 4
    assert (sample["cpu_run_user(s)"], sample["cpu_run_system(s)"]) == pytest.approx((253 / ticks, 54 / ticks))
    assert sample["cpu_run(s)"] == pytest.approx(307 / ticks)
    assert sample["load1"] == 1.5


def test_ranks_under_their_own_parents_are_found_by_the_run_directory(tmp_path):
    """horovodrun starts each rank under its own shell: not a sibling, found by scanning the host."""
    import subprocess
    import sys

    from scalelab.measure.machine import local_rank_pids

    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "scalelab.run.worker",
                             "--run-dir", str(tmp_path)])
    try:
        assert rank.pid not in local_rank_pids(tmp_path)  # a child of this process, not its sibling
        assert rank.pid in local_rank_pids(tmp_path, siblings_only=False)
        assert rank.pid not in local_rank_pids(tmp_path / "other", siblings_only=False)
    finally:
        rank.kill()
        rank.wait()


def test_child_pids_from_proc_match_psutil_and_runcpu_keeps_only_children_started_during_the_run():
    """A child started right after the run began (as a loader worker of a warm rank is) is the run's, one started
    before is not, on time.time() as the ranks pass it. psutil's create_time reads up to a second early (btime in
    whole seconds): on it the first child looked older than the run and its CPU counted as outside."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from scalelab.measure.machine import RunCpu, child_pids

    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.05)  # start times have 10 ms ticks
        since = time.time()
        during = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert sorted(child_pids(os.getpid())) == sorted(c.pid for c in psutil.Process().children())
            assert {before.pid, during.pid} <= set(child_pids(os.getpid()))
            pids = RunCpu(lambda: {os.getpid()}, since=since).pids()
            assert during.pid in pids and before.pid not in pids and os.getpid() in pids
        finally:
            during.kill()
            during.wait()
    finally:
        before.kill()
        before.wait()


def test_a_start_time_is_read_in_seconds_since_boot_from_the_stat_file(tmp_path):
    from scalelab.measure.machine import started_at

    (tmp_path / "7").mkdir()
    fields = ["S"] + ["0"] * 18 + ["12345"] + ["0"] * 10  # field 22 (starttime) is the 20th after "(comm)"
    (tmp_path / "7" / "stat").write_text("7 (a (b) c) " + " ".join(fields) + "\n")
    assert started_at(7, tmp_path, ticks_per_s=100) == 123.45
    assert started_at(8, tmp_path) is None


def test_warm_ranks_are_the_pids_their_launcher_names(tmp_path, monkeypatch):
    """A warm rank's command line does not carry the run directory (it runs many runs): its launcher names the
    job's ranks (run/warm.py), and those are the run's processes whatever else runs beside them."""
    from scalelab.measure.machine import local_rank_pids
    from scalelab.run.warm import PIDS_ENV

    monkeypatch.setenv(PIDS_ENV, "101,202")
    assert local_rank_pids(tmp_path) == {101, 202}
    monkeypatch.delenv(PIDS_ENV)
    assert 101 not in local_rank_pids(tmp_path)
