"""Which layouts the warm ranks' zygote may fork (run/warm_zygote.py, `forks`): pure, no process started."""
from scalelab.run.warm_zygote import forks

START = {"PATH": "/usr/bin", "HOME": "/home/u", "OMP_NUM_THREADS": "2"}


def test_variables_read_late_do_not_stop_a_fork():
    env = {**START, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
           "SCALELAB_LOCAL_RANK_PIDS": "1,2",
           "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_u", "MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    assert forks(START, env) is None
    assert forks(START, dict(START)) is None


def test_a_variable_read_at_a_process_start_that_differs_stops_it():
    assert forks(START, {**START, "PYTHONHASHSEED": "7"}) == "PYTHONHASHSEED is read when a process starts"
    assert forks(START, {**START, "HOME": "/tmp"}) == "HOME is read when a process starts"
    assert forks(START, {k: v for k, v in START.items() if k != "PATH"}) == "PATH is read when a process starts"
