"""What the rest of the machine does while a run is measured: /proc readings for noise detection (Linux).

Every reader takes the /proc root as an argument, so tests feed fixed /proc/stat and /proc/<pid>/stat text and
get exact figures. Units are seconds of CPU (the kernel's clock ticks / SC_CLK_TCK), cumulative since boot or
since a process started: callers difference them over a window (scalelab.analysis.noise).

- busy = user + nice + system + irq + softirq of the first `cpu` line of /proc/stat (guest time is already
  inside user); total = busy + idle + iowait + steal; steal = time the hypervisor ran someone else on our CPUs.
- A process's CPU = utime + stime of /proc/<pid>/stat (its threads included, its children not); user and system
  apart as well (seed 003's per-node table).
- The run's processes: this host's ranks and their descendants started since the sampler started (DataLoader
  workers). A child the caller had before the run began (a one-rank run in the caller's process) is outside.
- A run process's CPU includes its reaped children's (cutime + cstime, fields 16 and 17): DataLoader workers are
  started anew each epoch and often live and end between two samples, so reading them alone missed their last
  stretch (or all of them), and that CPU read as "busy outside the run" (a loader cell with 2 workers was flagged
  noisy, 0.37-0.55 cores outside, in 4 of 4 studies on a quiet machine). A descendant that is gone is dropped from
  the sum: reaping it moved its whole time into its parent's reaped-children time.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuTimes:
    """Machine-wide cumulative CPU seconds (all cores summed)."""
    busy: float
    steal: float
    total: float
    cpus: int  # the cpuN lines: what `total` would advance by per wall second if no tick were lost


def read_cpu_times(root: Path = PROC, ticks_per_s: float = TICKS_PER_S) -> CpuTimes | None:
    """The machine's CPU seconds from ROOT/stat; None where it cannot be read (not Linux)."""
    try:
        lines = (root / "stat").read_text().splitlines()
        line = lines[0]
    except (OSError, IndexError):
        return None
    cpus = sum(1 for x in lines[1:] if x.startswith("cpu"))
    name, *fields = line.split()
    if name != "cpu" or len(fields) < 4:
        return None
    v = [int(x) for x in fields[:8]] + [0] * (8 - min(8, len(fields)))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    busy = user + nice + system + irq + softirq
    return CpuTimes(busy / ticks_per_s, steal / ticks_per_s, (busy + idle + iowait + steal) / ticks_per_s, cpus)


def read_process_times(pid: int, root: Path = PROC, ticks_per_s: float = TICKS_PER_S, *,
                       children: bool = False) -> tuple[float, float] | None:
    """(utime, stime) of one process in seconds, from ROOT/<pid>/stat, with its reaped children's (cutime, cstime)
    added when `children`; None when it is gone."""
    try:
        text = (root / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the name may hold spaces and parentheses: split after the last ")"
    user, system = int(rest[11]), int(rest[12])  # fields 14 and 15 of proc(5); rest[0] is 3
    if children:  # fields 16 and 17: the reaped children's user and system time
        user, system = user + int(rest[13]), system + int(rest[14])
    return user / ticks_per_s, system / ticks_per_s


def read_process_cpu(pid: int, root: Path = PROC, ticks_per_s: float = TICKS_PER_S) -> float | None:
    """utime + stime of one process in seconds; None when it is gone."""
    times = read_process_times(pid, root, ticks_per_s)
    return None if times is None else sum(times)


def read_load(root: Path = PROC) -> float | None:
    """The 1-minute load average from ROOT/loadavg."""
    try:
        return float((root / "loadavg").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


RANK_PIDS_ENV = "SCALELAB_LOCAL_RANK_PIDS"  # a run's ranks on this host, where a launcher names them


def local_rank_pids(run_dir: Path, *, siblings_only: bool = True) -> set[int]:
    """This process and the other ranks of the same run on this host (`scalelab.run.worker` or
    `scalelab.run.script_rank` with `--run-dir RUN_DIR`): its siblings (torchrun starts every rank itself), or
    with `siblings_only` False every such process of the host (horovodrun starts each rank under its own shell and
    middleman process)."""
    listed = os.environ.get(RANK_PIDS_ENV)  # warm ranks (scalelab.run.warm): their launcher names them
    if listed:
        return {int(p) for p in listed.split(",")}
    me = psutil.Process()
    pids = {me.pid}
    parent = me.parent()
    if parent is None:
        return pids
    marker = str(run_dir)
    for sibling in parent.children() if siblings_only else psutil.process_iter():
        try:
            cmd = sibling.cmdline()
        except psutil.Error:
            continue
        if any(c.startswith("scalelab.run.") for c in cmd) and any(marker in c for c in cmd):  # worker, script_rank
            pids.add(sibling.pid)
    return pids


def child_pids(pid: int, root: Path = PROC) -> list[int]:
    """The children of `pid`, from /proc/PID/task/*/children: one small read per thread of that process, where
    psutil's children() reads the stat file of every process on the machine (most of a sample's cost, every
    sample). Falls back to psutil where the kernel has no such file."""
    tasks = root / str(pid) / "task"
    try:
        files = [t / "children" for t in tasks.iterdir()]
    except OSError:
        return []
    if files and not files[0].exists():
        try:
            return [c.pid for c in psutil.Process(pid).children()] if root == PROC else []
        except psutil.Error:
            return []
    out = []
    for f in files:
        try:
            out += [int(p) for p in f.read_text().split()]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return out


def start_ticks(pid: int, root: Path = PROC) -> int | None:
    """A process's start in clock ticks since boot (field 22 of ROOT/<pid>/stat); None when it is gone. With the
    pid it names one process for good (a reused pid starts later): run.netns tags its namespaces with it."""
    try:
        text = (root / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[19])  # the name may hold spaces and ")": split after the last


def started_at(pid: int, root: Path = PROC, ticks_per_s: float = TICKS_PER_S) -> float | None:
    """A process's start in seconds since boot (`start_ticks`); None when it is gone.
    Not psutil's create_time: that adds the boot time of /proc/stat's btime, whole seconds, so it reads up to a
    second early against time.time() (0.44 s on this machine), and a loader worker started in the run's first
    0.44 s looked older than the run: its CPU was counted as busy outside the run, and the quick study's loader
    cell was flagged noisy (0.39-0.43 cores outside, every study)."""
    ticks = start_ticks(pid, root)
    return None if ticks is None else ticks / ticks_per_s


def boot_clock(unix_s: float) -> float:
    """A unix time on the clock of process start times (seconds since boot, CLOCK_BOOTTIME)."""
    return unix_s - time.time() + time.clock_gettime(time.CLOCK_BOOTTIME)


class RunCpu:
    """Cumulative CPU seconds of the run's processes, also of those that have ended (their last reading stays)."""

    def __init__(self, rank_pids: Callable[[], Iterable[int]], since: float, root: Path = PROC):
        """`since`: the run's start, unix seconds; a descendant started before it is not the run's."""
        self.rank_pids, self.root = rank_pids, root
        # on the clock start times are read on (started_at), which counts whole ticks: a child started in the
        # run's first tick reads up to one tick before `since`
        self.since = boot_clock(since) - 1 / TICKS_PER_S
        self._ranks: set[int] | None = None  # asked once: torchrun starts a host's ranks together, before any samples
        self._last: dict[int, tuple[float, float]] = {}  # pid -> (user, system) seconds

    def pids(self) -> set[int]:
        if self._ranks is None:
            self._ranks = set(self.rank_pids())
        out = set(self._ranks)
        todo = list(out)
        while todo:  # the ranks' descendants started during the run: loader workers, not hogs
            for child in child_pids(todo.pop(), self.root):
                began = started_at(child, self.root)
                if child not in out and began is not None and began >= self.since:
                    out.add(child)
                    todo.append(child)
        return out

    def user_system(self, pids: Iterable[int] | None = None) -> tuple[float, float]:
        """The run's (user, system) CPU seconds now; PIDS (from `pids()`) lets a caller find the processes before
        it reads the clocks, so the slow part is not between the machine's reading and the run's."""
        alive = self.pids() if pids is None else pids
        for pid in set(alive) | set(self._last):
            times = read_process_times(pid, self.root, children=True)
            if times is None:
                if pid not in (self._ranks or ()):  # reaped: its time is in its parent's reaped-children time now
                    self._last.pop(pid, None)
                continue  # a rank keeps its last reading (its parent, the launcher, is not the run's)
            last = self._last.get(pid, (0.0, 0.0))
            self._last[pid] = (max(times[0], last[0]), max(times[1], last[1]))
        return sum(u for u, _ in self._last.values()), sum(s for _, s in self._last.values())

    def seconds(self, pids: Iterable[int] | None = None) -> float:
        """The run's CPU seconds (user + system) now."""
        return sum(self.user_system(pids))


def read_boot_id(root: Path = PROC) -> str | None:
    """The kernel's boot id: the same for every network namespace of one machine (the nodes of --local-nodes),
    different on another machine."""
    try:
        return (root / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def machine_sample(run_cpu: RunCpu, root: Path = PROC) -> dict:
    """One sample's machine-wide fields (absent where /proc cannot be read), with the unix `time` they were read at.

    The machine's and the run's counters are read back to back, after the run's processes are found: outside CPU
    is their difference, and the sampler thread waits for the training thread's GIL between any two Python
    statements, so a slow step between the two readings (or between the clock and them) would move CPU seconds
    from one side to the other (seen: a hog's 0.5 cores read as 0.2 over a one-second window)."""
    pids = run_cpu.pids()
    out: dict = {"time": time.time()}
    cpu = read_cpu_times(root)
    if cpu is not None:
        user, system = run_cpu.user_system(pids)
        out.update({"cpu_busy(s)": cpu.busy, "cpu_steal(s)": cpu.steal, "cpu_total(s)": cpu.total,
                    "cpus": cpu.cpus, "cpu_run(s)": user + system, "cpu_run_user(s)": user,
                    "cpu_run_system(s)": system})
    load = read_load(root)
    if load is not None:
        out["load1"] = load
    boot = read_boot_id(root)
    if boot is not None:
        out["host"] = boot
    return out
