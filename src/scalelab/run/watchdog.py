"""Hang detection: each rank publishes a heartbeat (train/heartbeat.py); the launching process watches them and fails a stuck run.

A rank that sleeps or skips a collective does not crash: it leaves the other ranks blocked in a collective
that gloo only times out after 30 minutes. So every rank runs a `Heartbeat` thread that writes, about once a
second, where its main thread is (step, stage) and a progress counter bumped at every stage boundary. The
launching process runs a `Watchdog` thread: when no rank has made progress for `timeout_s`, it names the rank
that is furthest behind (the others are waiting for it), records that verdict and ends the run — SIGTERM, then
SIGKILL, to the ranks on this host; torchrun then stops the rest and the run is marked failed with the verdict
as its reason.

The heartbeat thread keeps writing while the main thread sleeps, so staleness is judged on *progress*, not on
the file's age; a rank whose heartbeat file stops changing altogether (a wedged interpreter) is stuck the same way.
A single stage longer than the timeout (a huge forward, a long evaluation) would be a false alarm: the timeout
must exceed the longest stage (default 300 s; 0 turns the watchdog off).
"""
from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from scalelab.measure.timer import STAGES
from scalelab.store.rundir import RunDir

ORDER = {name: i for i, name in enumerate(("setup", *STAGES, "done"))}


def diagnose(beats: dict[int, dict | None], idle_s: dict[int, float], timeout_s: float,
             ranks: list[int]) -> str | None:
    """The verdict when every unfinished rank has been idle for `timeout_s`, else None.

    beats: the last heartbeat of each rank (None: never seen); idle_s: seconds since each rank's progress last
    changed (or since the watch began, for a rank never seen)."""
    live = [r for r in ranks if not (beats.get(r) and beats[r]["stage"] == "done")]
    if not live or any(idle_s.get(r, 0.0) < timeout_s for r in live):
        return None
    missing = [r for r in live if beats.get(r) is None]
    if missing:
        return (f"rank {_names(missing)} never started (no heartbeat for {timeout_s:g} s; "
                f"hang timeout {timeout_s:g} s)")

    def position(r: int) -> tuple[int, int]:
        return beats[r]["step"], ORDER.get(beats[r]["stage"], 0)

    behind = min(position(r) for r in live)
    culprits = [r for r in live if position(r) == behind]
    where = ", ".join(f"rank {r} at step {beats[r]['step']} ({beats[r]['stage']})" for r in ranks if beats.get(r))
    idle = min(idle_s[r] for r in culprits)
    return (f"rank {_names(culprits)} hung: no progress for {idle:.0f} s (hang timeout {timeout_s:g} s); "
            f"{where}")


def _names(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class Watchdog:
    """Launcher side: watch the ranks' heartbeats in `run_dir`; on a hang record `verdict` and call `abort`.

    `abort` defaults to ending every rank process of this host that published its pid; the launcher then sees
    failed ranks and stops the rest. `explain`, when given, is asked once on a hang for what the launcher knows
    of its cause (a node that cannot be reached) and leads the verdict. `clock` is injectable for tests."""

    def __init__(self, run_dir: Path, ranks: list[int], timeout_s: float, *, poll_s: float = 0.5,
                 abort: Callable[[dict[int, dict | None]], None] | None = None,
                 explain: Callable[[], str | None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.run_dir, self.ranks, self.timeout_s, self.poll_s = run_dir, ranks, timeout_s, poll_s
        self.abort = abort or kill_local_ranks
        self.explain = explain
        self.clock = clock
        self.verdict: str | None = None
        self._seen: dict[int, tuple[tuple | None, float]] = {}  # rank -> (progress marker, when it changed)
        self._start = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scalelab-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        if self.timeout_s > 0:
            self._start = self.clock()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def check(self) -> str | None:
        """One look at the heartbeats; returns (and keeps) the verdict when the run is stuck."""
        now = self.clock()
        beats = {r: _read_beat(RunDir(self.run_dir), r) for r in self.ranks}
        idle: dict[int, float] = {}
        for r, beat in beats.items():
            # Progress is (counter, stage); a wedged interpreter stops it changing just as a sleeping rank does.
            marker = None if beat is None else (beat["progress"], beat["stage"])
            last = self._seen.get(r)
            if last is None:
                self._seen[r] = (marker, self._start if marker is None else now)
            elif last[0] != marker:
                self._seen[r] = (marker, now)
            idle[r] = now - self._seen[r][1]
        self.verdict = diagnose(beats, idle, self.timeout_s, self.ranks)
        if self.verdict:
            cause = self.explain() if self.explain else None
            if cause:
                self.verdict = f"{cause}; {self.verdict}"
            self.abort(beats)
        return self.verdict

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check():
                return


def _read_beat(rundir: RunDir, rank: int) -> dict | None:
    try:
        return rundir.read_heartbeat(rank)
    except Exception:  # noqa: BLE001 - not written yet, or being replaced: no news this round
        return None


def kill_local_ranks(beats: dict[int, dict | None], grace_s: float = 5.0) -> None:
    """SIGTERM every unfinished rank of this host that published a pid, so a sleeping rank flushes its records
    on the way out; SIGKILL what is left after `grace_s` (a rank blocked inside a collective may not get back to
    the interpreter to handle SIGTERM)."""
    import psutil

    host = socket.gethostname()
    procs = []
    for beat in beats.values():
        if beat and beat.get("host") == host and beat.get("stage") != "done":
            try:
                proc = psutil.Process(int(beat["pid"]))
                proc.send_signal(signal.SIGTERM)
                procs.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
