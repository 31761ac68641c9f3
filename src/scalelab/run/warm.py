"""Warm ranks: consecutive multi-rank cells of one process (a study, a comparison, a test session) run in rank
processes that stay up between cells, instead of a torchrun launch per cell.

Why: a cold 2-rank cell starts torchrun's agent and a Python process per rank, each importing torch and scalelab
(seconds on a 2-core machine, most of a short cell; benchmarks/cell_cost.py). Inside `with ranks():` the first
cell of a layout (ranks per node, the launch environment: threads, interfaces) starts that many rank processes,
forked from the block's zygote, which imported torch and scalelab once and never runs a torch op
(scalelab.run.warm_zygote; `python -m scalelab.run.warm_rank` for a layout it cannot fork); each later cell with the
same layout is a job sent to them. A job runs the same
worker entry point torchrun would (`scalelab.run.worker`, `scalelab.measure.commbench_worker`) with the same
environment torchrun gives a rank, and a fresh rendezvous store on loopback, hosted here as for a torchrun run
(launch.loopback_store). The worker builds everything a cell measures from its config: process group, model,
optimizer, loader, seed, meter, sampler, heartbeat; and destroys its process group at the end. What outlives a
job is what Python and torch keep per process: imported modules, thread pools, the allocator's cache.

What a warm rank must not carry from one job to the next, and how it does not:
- environment: each job gets the launching process's environment as it is at the job's start, the spec's and the
  rank's variables, and nothing of the previous job's (`warm_rank.apply_env`);
- the process group: the worker destroys it; the rank checks and destroys a leftover one;
- peak memory: the worker resets the kernel's peak-RSS mark at its baseline (measure.memory);
- CPU counters behind noise detection: the sampler differences them over the run's window; the job names its
  peers' pids (SCALELAB_LOCAL_RANK_PIDS), which torchrun's ranks find from their command lines;
- anything after a failure: a rank whose job failed exits, and the pool is started again (its peers may be stuck in
  a collective).

Cells that need a fresh process (`fresh_reason`) get one forked for them by a fork pool (scalelab.run.warm_rank,
`--fork`): rank processes that imported torch and scalelab but never ran a torch op, each forking a child per job,
so the child starts where a fresh process would, its imports done: a memory cap (RLIMIT_AS cannot be raised again
by a user who is not root, and the cap's baseline is a fresh process's) and an isolated cell (a max-batch trial
or a model-grid cell, whose out-of-memory must not touch anything else; a thread count, which torch fixes at its
first parallel op). Cells that keep torchrun (`cold_reason` says why): Horovod (horovodrun starts its own ranks),
several nodes, namespaced nodes, a resumed run, a run with a CUDA device (its memory fraction and context are per
process), and a module other than the workers.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from scalelab.measure.machine import RANK_PIDS_ENV as PIDS_ENV  # the job's ranks, for local_rank_pids
from scalelab.run.launch import LOOPBACK, Launcher, LaunchFailed, LaunchSpec, bound_store, torchrun_launch
from scalelab.run.warm_rank import died
from scalelab.run.warm_zygote import START_TIMEOUT_S, Forked, Zygote, forks, ready_message
from scalelab.store import RunDir

STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL, as torchrun's agent and the watchdog
MAX_POOLS = 6  # layouts kept at once: a study has about 6 (1 and 2 threads per rank, 1 and 2 ranks, warm and forked;
# an idle fork server holds its imports, about 250 MB, shared with the zygote it was forked from until written; an
# idle warm rank more, its warm-up and allocator cache)


def cold_reason(cfg: Any, spec: LaunchSpec | None = None) -> str | None:
    """Why this run's ranks must start fresh (None: it can run in warm ranks); without `spec`, what the config
    alone says."""
    if spec is not None and spec.module not in WARM_MODULES:
        return f"{spec.module} is not a worker warm ranks run"
    if spec is not None and spec.args:
        return "a resumed run"
    if (spec is not None and spec.nnodes > 1) or getattr(cfg, "nnodes", 1) > 1 or getattr(cfg, "local_nodes", 0):
        return "a run across nodes"
    if getattr(cfg, "engine", "ddp") != "ddp":
        return f"engine {cfg.engine} starts its own ranks"
    if getattr(cfg, "resolved_device", "cpu") != "cpu":
        return "a CUDA run (its context and memory fraction are per process)"
    return None


def fresh_reason(cfg: Any, spec: LaunchSpec) -> str | None:
    """Why this run's ranks need a fresh process, which a fork pool gives (None: warm ranks will do)."""
    if getattr(cfg, "memory_limit", None):
        return "a memory cap (RLIMIT_AS cannot be raised again in the process it capped)"
    if spec.quiet:
        return "an isolated cell (an out-of-memory must not reach other cells; a thread count torch fixes once)"
    return None


# the worker modules a warm rank runs, as torchrun would (`python -m MODULE --run-dir DIR`)
WARM_MODULES = ("scalelab.run.worker", "scalelab.measure.commbench_worker")


class Pool:
    """`nproc` rank processes of one launch environment, waiting for jobs; each talks to this process over its own
    socket pair (a private descriptor: nothing else can send it a job)."""

    def __init__(self, nproc: int, env: dict[str, str], *, fork: bool = False, zygote: Zygote | None = None):
        self.nproc = nproc
        self.fork = fork  # a fork pool: each job in a child forked for it (module docstring)
        self.children: list[int] = []  # a fork pool's children of the job running
        self.conns: list[Connection] = []
        self.procs: list[subprocess.Popen | Forked] = []
        self.busy = False  # a job is running: closing then stops the ranks at once
        self.closed = False
        # unix times of this pool's start, per rank: asked, spawned (here), main, imported, warmed (the rank's),
        # ready (here): where a new layout's start goes (benchmarks/cell_cost.py --layouts)
        self.start_phases: list[dict[str, float]] = []
        asked = time.time()
        # forked from the zygote (imports done) unless a variable read at a process's start differs from its
        env = {**os.environ, **env}
        self.zygote = zygote if zygote is not None and forks(zygote.env, env) is None else None
        try:
            for local_rank in range(nproc):
                mine, theirs = socket.socketpair()
                self.conns.append(Connection(mine.detach()))
                fd = theirs.fileno()
                if self.zygote is not None:
                    self.procs.append(self.zygote.fork(fd, fork=fork, env=env))
                else:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-m", "scalelab.run.warm_rank", str(fd), str(local_rank),
                         *(["--fork"] if fork else [])], env=env, stdin=subprocess.DEVNULL, pass_fds=(fd,)))
                self.start_phases.append({"asked": asked, "spawned": time.time()})
                theirs.close()
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        """Each rank says it is ready once it has imported what its jobs need."""
        deadline = time.monotonic() + START_TIMEOUT_S
        for local_rank, conn in enumerate(self.conns):
            stamps = ready_message(conn, self.procs[local_rank], f"warm rank {local_rank}",
                                   lambda code, rank=local_rank: died(rank, code), deadline)
            self.start_phases[local_rank].update(stamps, ready=time.time())

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def run(self, spec: LaunchSpec) -> None:
        """One job on every rank; returns when all finished, raises LaunchFailed (the pool then closed) when one
        failed."""
        logs = RunDir(spec.run_dir).logs
        if spec.quiet:
            logs.mkdir(parents=True, exist_ok=True)
        with bound_store(LOOPBACK, 0, any_port=True) as port, _terminate_as_interrupt():
            self.busy = True
            for local_rank, conn in enumerate(self.conns):
                # what torchrun gives a rank: this process's environment as it is now (a test or a user may have
                # set a variable since the ranks started), the spec's, and the rank's place
                conn.send({"module": spec.module, "argv": ["--run-dir", str(spec.run_dir), *spec.args],
                           "env": {**os.environ, **spec.env, **_rank_env(local_rank, self.nproc, port),
                                   PIDS_ENV: ",".join(map(str, self.pids))},
                           "log": str(logs / f"rank{local_rank}.log") if spec.quiet else None})
            if self.fork:
                self._start_children()
            failures = self._collect()
            self.busy, self.children = False, []
        if failures:
            if not self.fork:  # a fork pool's servers ran nothing themselves: they serve the next job
                self.close()
            _, _, reason, trace = min(failures)  # the root cause: a rank's own error before its peers' consequences
            raise LaunchFailed(reason, trace)

    def _start_children(self) -> None:
        """A fork pool's children start once each knows its peers (their pids exist only once all forked)."""
        self.children = children = []
        for local_rank, conn in enumerate(self.conns):
            try:
                children.append(conn.recv()["pid"])
            except (EOFError, OSError):
                raise LaunchFailed(f"fork server {local_rank} ended: {died(local_rank, self.procs[local_rank].wait())}",
                                   "") from None
        for conn in self.conns:
            conn.send(",".join(map(str, children)))

    def _collect(self) -> list[tuple[bool, int, str, str]]:
        """Every rank's answer; the failures as (a consequence?, arrival, reason, traceback)."""
        from scalelab.run.execute import is_consequence

        waiting = {conn: i for i, conn in enumerate(self.conns)}
        failures: list[tuple[bool, int, str, str]] = []
        while waiting:
            for conn in wait(list(waiting)):
                rank = waiting.pop(conn)
                try:
                    answer = conn.recv()
                except (EOFError, OSError):
                    answer = {"ok": False, "reason": died(rank, self.procs[rank].wait()), "trace": ""}
                if not answer["ok"]:
                    failures.append((is_consequence(answer["reason"]), len(failures), answer["reason"],
                                     answer["trace"]))
                    self._stop_others(rank)
        return failures

    def _stop_others(self, failed: int) -> None:
        """After a rank failed its peers may wait in a collective forever: end them (records flushed on SIGTERM).
        In a fork pool the ranks are the children (their servers, idle, would end instead)."""
        if self.fork:
            for i, child in enumerate(self.children):
                if i != failed:
                    with contextlib.suppress(ProcessLookupError):  # it ended already (its server reaps it)
                        os.kill(child, signal.SIGTERM)
            return
        for i, proc in enumerate(self.procs):
            if i != failed and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """End the ranks: an idle rank reads the end of its connection and exits; a busy one (the launching process
        was interrupted mid-job) gets SIGTERM at once and flushes its records on the way out."""
        if self.closed:
            return
        self.closed = True
        for conn in self.conns:
            conn.close()
        if self.busy:
            self._stop_others(-1)
        for proc in self.procs:
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM to the launching process during a job ends the run as interrupted, as torchrun's agent does (it
    raises its SignalException, which run.execute.marking_failures reads as an interrupt)."""
    import threading

    from torch.distributed.elastic.multiprocessing.api import SignalException

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_signal(signum, _frame):
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

    previous = signal.signal(signal.SIGTERM, raise_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _rank_env(local_rank: int, nproc: int, port: int) -> dict[str, str]:
    """What torchrun puts in a rank's environment on one node; the store is hosted by the launching process."""
    return {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "ROLE_RANK": str(local_rank), "ROLE_NAME": "default",
            "MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


class Pools:
    """The pools of one `ranks()` block, one per launch environment (warm or forked); a launcher for the kinds'
    runs."""

    def __init__(self) -> None:
        self.pools: dict[tuple, Pool] = {}
        self.cold: list[str] = []  # why runs went cold, for the caller's record
        self.forked: list[str] = []  # why runs needed a fresh process (forked for them)
        self.warm = 0  # runs that ran in warm ranks
        self.started = 0  # pools started
        self.zygote: Zygote | None = None  # forks the pools' rank processes (run/warm_zygote.py); started with the
        # first pool, closed after the last
        self.zygote_forked = 0  # pools whose rank processes the zygote forked

    def tally(self) -> str:
        """One line: how many multi-rank runs went warm, forked or cold, and why."""
        from collections import Counter

        def why(reasons: list[str]) -> str:
            text = "; ".join(f"{n} {reason}" for reason, n in Counter(reasons).most_common())
            return f" ({text})" if text else ""

        return (f"warm ranks: {self.warm} run(s) warm, {len(self.forked)} in fresh forks{why(self.forked)}, "
                f"in {self.started} start(s) of rank processes ({self.zygote_forked} forked from the zygote); "
                f"{len(self.cold)} cold{why(self.cold)}")

    def launcher(self, cfg: Any, fallback: Launcher) -> Launcher:
        def launch(spec: LaunchSpec) -> None:
            reason = cold_reason(cfg, spec)
            if reason is not None:
                self.cold.append(reason)
                fallback(spec)
                return
            fresh = fresh_reason(cfg, spec)
            key = (fresh is not None, spec.nproc_per_node, tuple(sorted(spec.env.items())))
            pool = self.pools.get(key)
            if pool is not None and not pool.alive():
                pool.close()
                pool = None
            if pool is None:
                while len(self.pools) >= MAX_POOLS:  # idle ranks hold memory (torch, the allocator's cache)
                    self.pools.pop(next(iter(self.pools))).close()
                pool = self.pools[key] = Pool(spec.nproc_per_node, spec.env, fork=fresh is not None,
                                              zygote=self._zygote())
                self.started += 1
                self.zygote_forked += pool.zygote is not None
            self.pools[key] = self.pools.pop(key)  # the most recently used last
            if fresh is not None:
                self.forked.append(fresh)
            try:
                pool.run(spec)
            except BaseException as err:
                # a fork pool's servers outlive a failed job (its children ran it); anything else ends the pool
                if not (pool.fork and isinstance(err, LaunchFailed)):
                    self.pools.pop(key, None)
                    pool.close()
                raise
            if fresh is None:
                self.warm += 1
        return launch

    def start_zygote(self) -> None:
        """Start the block's zygote now, without waiting for it: it imports on another core while this process does
        its own start-up. Call `zygote_ready` before measuring anything."""
        if self.zygote is None:
            self.zygote = Zygote()

    def zygote_ready(self) -> None:
        """Wait until the zygote started by `start_zygote` has made its imports (a process importing on the other
        core would slow what this process measures). One that fails to start is dropped: the first pool starts
        another (and fails there, naming why, if it fails again)."""
        if self.zygote is None or self.zygote.ready is not None:
            return
        try:
            self.zygote.wait_ready()
        except LaunchFailed:
            self.zygote.close()
            self.zygote = None

    def _zygote(self) -> Zygote:
        """The block's zygote, started now if none runs (the first pool, or after it died)."""
        if self.zygote is not None and not self.zygote.alive():
            self.zygote.close()
            self.zygote = None
        if self.zygote is None:
            self.zygote = Zygote()
        return self.zygote

    def close(self) -> None:
        """End every pool's ranks, then the zygote (their parent, which reaps them)."""
        try:
            for pool in self.pools.values():
                pool.close()
            self.pools.clear()
        finally:
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None


_ACTIVE: Pools | None = None


@contextlib.contextmanager
def ranks() -> Iterator[Pools]:
    """Run the multi-rank cells of this block in warm ranks (module docstring); nested blocks share the outer's."""
    global _ACTIVE
    if _ACTIVE is not None:
        yield _ACTIVE
        return
    _ACTIVE = Pools()
    try:
        yield _ACTIVE
    finally:
        pools, _ACTIVE = _ACTIVE, None
        pools.close()


_PAUSED: list[bool] = []  # inside `paused()` blocks


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Runs of this block start cold, also inside a `ranks()` block (the warm ranks stay up for later runs): what
    compares the two paths side by side (benchmarks/warm_cold.py, tests/dist/test_warm_dist.py)."""
    _PAUSED.append(True)
    try:
        yield
    finally:
        _PAUSED.pop()


def launcher_for(cfg: Any, given: Launcher) -> Launcher:
    """The warm launcher inside a `ranks()` block, for runs that would go through torchrun; `given` otherwise."""
    if _ACTIVE is None or _PAUSED or given is not torchrun_launch:
        return given
    reason = cold_reason(cfg)
    if reason is not None:  # the launcher as it was: namespaced nodes hand it to their own agents
        _ACTIVE.cold.append(reason)
        return given
    return _ACTIVE.launcher(cfg, given)
