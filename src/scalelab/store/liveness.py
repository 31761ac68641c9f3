"""Is the process that owns a run still alive? (pid plus start time, so a reused pid does not count.)"""
from __future__ import annotations

import os


def pid_alive(pid: int, create_time: float | None) -> bool:
    """True while process `pid` runs and started at `create_time` (±1 s; None: any start time)."""
    import psutil
    try:
        p = psutil.Process(pid)
        # A zombie has exited; a process that started at another time merely reused the pid.
        return p.status() != psutil.STATUS_ZOMBIE and (
            create_time is None or abs(p.create_time() - create_time) <= 1.0)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def own_create_time() -> float | None:
    """This process's start time (unix seconds), as psutil reports it; None when it cannot be read."""
    import psutil
    try:
        return psutil.Process(os.getpid()).create_time()
    except psutil.Error:
        return None
