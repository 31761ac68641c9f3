"""Rank side of hang detection: a thread that publishes where this rank's main thread is, about once a second.

The loop calls `enter(stage)` at every stage boundary and sets `step`; the file is heartbeat.rank<r>.json in the
run directory, which the launching process's watchdog (run/watchdog.py) reads.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from scalelab.store.rundir import RunDir


class Heartbeat:
    """Rank side: the loop calls `enter(stage)` and sets `step`; a daemon thread publishes them."""

    def __init__(self, run_dir: Path, rank: int, interval_s: float = 1.0):
        self.rundir = RunDir(run_dir)
        self.path = self.rundir.heartbeat_file(rank)
        self.rank, self.interval_s = rank, interval_s
        self.step, self.stage, self.progress = 0, "setup", 0
        self.cpu_s = 0.0  # CPU seconds of the publishing thread: what this costs (benchmarks/overhead*)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{rank}", daemon=True)

    def enter(self, stage: str) -> None:
        # Plain attribute writes: the GIL makes them atomic, and the writer thread only reads them.
        self.stage = stage
        self.progress += 1

    def start(self) -> "Heartbeat":
        self._write()
        self._thread.start()
        return self

    def stop(self, done: bool = True) -> None:
        if done:
            self.enter("done")
        self._stop.set()
        self._thread.join(timeout=5)
        self._write()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            began = time.thread_time()
            self._write()
            self.cpu_s += time.thread_time() - began

    def _write(self) -> None:
        try:
            self.rundir.write_heartbeat(self.rank, {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                                          "step": self.step, "stage": self.stage, "progress": self.progress,
                                          "t(unix_s)": time.time()})
        except OSError:
            pass  # a full disk must not kill training; the watchdog then sees a stale heartbeat
