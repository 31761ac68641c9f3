"""The zygote of a `warm.ranks()` block: one process that has imported what warm ranks need (torch, scalelab,
torch._dynamo: `warm_rank.import_for_jobs`) and forks every rank process of the block's pools on demand, so that a
pool of a new layout starts in a fork instead of a fresh interpreter importing all of it again (2-4 s a layout on
2 cores, benchmarks/cell_cost.py --layouts).

`python -m scalelab.run.warm_zygote FD`: after its imports it says it is ready on FD (its end of a socket pair with
the launching process), then answers requests until that connection closes:
- fork: the request names the pool's mode (warm or fork server) and the rank's environment, and passes the rank's
  end of its socket pair with the pool (SCM_RIGHTS); the child applies the environment and serves that pool as a
  rank process started by `python -m scalelab.run.warm_rank` would (`warm_rank.serve`); the zygote answers its pid;
- wait: a child's exit status (the zygote is its parent: only it can reap it), waiting at most a given time.

The zygote never runs a torch op and never starts a thread: OpenMP's thread pool and a CUDA context are not
fork-safe (a child of a process that used either can hang or fail in its first parallel op or CUDA call), so what
it forks must not have used them yet; torch's intra-op thread count, read from OMP_NUM_THREADS at the first
parallel op, is then the child's own. Variables read only when a process starts (the interpreter's, the C
libraries') are the zygote's in every child: a layout whose environment differs from the zygote's in one is
started as a process of its own (`forks`), except glibc's malloc settings, which the child sets with mallopt
before its first allocation of its own (the zygote's heap is one arena: it allocated from one thread).

Its lifetime is its launching process's `warm.Pools` (one per `ranks()` block): started with the block's first
pool, closed after the block's pools (their ranks end when their connections close; the zygote reaps them), and
when the launching process dies every connection closes, so the zygote and the idle ranks end by themselves.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle

from scalelab.distenv import exit_without_teardown
from scalelab.run.launch import LaunchFailed

START_TIMEOUT_S = 120.0  # for a rank process or the zygote to start and connect (imports on a loaded 2-core machine)
STOP_GRACE_S = 5.0
UNKNOWN_EXIT = 255  # a child's status once its zygote is gone (its new parent reaped it)

# read after a process starts, by torch (OMP_NUM_THREADS at the first parallel op; TORCHINDUCTOR_CACHE_DIR at each
# look-up of inductor's cache, which sets it to its default in the environment of the process that first looks:
# the study's own process, once it built an optimizer), gloo/NCCL (at the process group) or scalelab's Python code
# (SCALELAB_*): a child that sets them in its environment gets their effect
LATE_ENV = ("OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
LATE_PREFIXES = ("SCALELAB_",)
# glibc's malloc settings from the environment, read at the first allocation; mallopt sets the same (malloc.h)
MALLOPT = {"MALLOC_ARENA_MAX": -8, "MALLOC_MMAP_THRESHOLD_": -3}  # M_ARENA_MAX, M_MMAP_THRESHOLD


def forks(start_env: dict[str, str], env: dict[str, str]) -> str | None:
    """Why a rank with environment `env` cannot be forked from a zygote started with `start_env` (None: it can):
    a variable read when a process starts differs."""
    for key in sorted(set(start_env) | set(env)):
        late = key in LATE_ENV or key in MALLOPT or key.startswith(LATE_PREFIXES)
        if not late and start_env.get(key) != env.get(key):
            return f"{key} is read when a process starts"
    return None


def ready_message(conn: Connection, proc, name: str, why: Callable[[int], str], deadline: float):
    """What a starting process (a warm rank, the zygote) sends once it is ready; LaunchFailed if `proc` ends first
    (`why` its exit code in words) or nothing came by `deadline` (time.monotonic)."""
    while not conn.poll(0.2):
        code = proc.poll()
        if code is not None:
            raise LaunchFailed(f"{name} ended while starting: {why(code)}", "")
        if time.monotonic() > deadline:
            raise LaunchFailed(f"{name} did not start in {START_TIMEOUT_S:g} s", "")
    try:
        return conn.recv()
    except (EOFError, OSError):  # it ended (its end of the connection closed) between two polls
        try:
            code = proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            raise LaunchFailed(f"{name} closed its connection while starting", "") from None
        raise LaunchFailed(f"{name} ended while starting: {why(code)}", "") from None


class Zygote:
    """The launching process's side: starts the zygote, asks it for rank processes and their exit statuses."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.lock = threading.Lock()  # one request at a time (a watchdog thread may ask while a job runs)
        self.started = time.time()
        mine, theirs = socket.socketpair()
        self.conn = Connection(mine.detach())
        fd = theirs.fileno()
        self.proc = subprocess.Popen([sys.executable, "-m", "scalelab.run.warm_zygote", str(fd)], env=self.env,
                                     stdin=subprocess.DEVNULL, pass_fds=(fd,))
        theirs.close()
        self.ready: dict[str, float] | None = None  # its stamps (main, imported), once it said it is ready

    def wait_ready(self) -> None:
        self.ready = ready_message(self.conn, self.proc, "the warm ranks' zygote", lambda code: f"exit {code}",
                                   time.monotonic() + START_TIMEOUT_S)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, fd: int, *, fork: bool, env: dict[str, str]) -> "Forked":
        """A rank process serving the pool whose end of the socket pair is `fd` (a warm rank or, `fork`, a fork
        server), with environment `env`."""
        with self.lock:
            if self.ready is None:
                self.wait_ready()
            self.conn.send({"fork": fork, "env": env})
            send_handle(self.conn, fd, self.proc.pid)
            return Forked(self, self.conn.recv())

    def wait(self, pid: int, timeout: float) -> int | None:
        """A child's exit code (negative: the signal that ended it), or None if it still runs after `timeout` s."""
        with self.lock:
            try:
                self.conn.send({"wait": pid, "timeout": timeout})
                return self.conn.recv()
            except (EOFError, OSError):  # the zygote is gone: its children were handed to another parent
                return _status_without_parent(pid)

    def close(self) -> None:
        """End the zygote (after the pools: their ranks are its children, reaped through it)."""
        self.conn.close()
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _status_without_parent(pid: int) -> int | None:
    import psutil

    try:
        return None if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else UNKNOWN_EXIT
    except psutil.NoSuchProcess:
        return UNKNOWN_EXIT


class Forked:
    """A rank process the zygote forked, behind what warm.Pool uses of subprocess.Popen (pid, poll, wait,
    send_signal, kill): its exit status comes from the zygote, its parent."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout or 0.0)
            self.returncode = self.zygote.wait(self.pid, min(left, 1.0))
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ---------------------------------------------------------------- the zygote process

def main(argv: list[str] | None = None) -> None:
    from scalelab.run import warm_rank

    args = sys.argv[1:] if argv is None else argv
    stamps = {"main": time.time()}
    warm_rank.import_for_jobs()  # imports only: no torch op, no thread (module docstring)
    stamps["imported"] = time.time()
    conn = Connection(int(args[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the launching process closes the block
    conn.send(stamps)
    codes: dict[int, int] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            break  # the block closed, or its process died
        if "wait" in request:
            conn.send(_wait(request["wait"], request["timeout"], codes))
            continue
        fd = recv_handle(conn)
        pid = os.fork()
        if pid == 0:
            conn.close()  # the child holds only its pool's connection
            _child(fd, request)
        os.close(fd)  # the pool sees the child's end, not a copy held here
        conn.send(pid)
    exit_without_teardown()  # children left are reaped by init


def _wait(pid: int, timeout: float, codes: dict[int, int]) -> int | None:
    deadline = time.monotonic() + timeout
    while pid not in codes:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return codes.get(pid, UNKNOWN_EXIT)
        if done:
            codes[pid] = os.waitstatus_to_exitcode(status)
        elif time.monotonic() >= deadline:
            return None
        else:
            time.sleep(0.01)
    return codes[pid]


def _child(fd: int, request: dict) -> None:
    """A forked rank process: the rank's environment and malloc settings, then serve its pool; never returns."""
    from scalelab.run import warm_rank

    code = 1
    try:
        stamps = {"main": time.time()}
        libc = ctypes.CDLL("libc.so.6")
        for key, option in MALLOPT.items():
            if key in request["env"]:
                libc.mallopt(option, int(request["env"][key]))
        warm_rank.apply_env(request["env"])
        stamps["imported"] = stamps["main"]  # the zygote's imports
        warm_rank.serve(fd, request["fork"], stamps)  # ends the process itself when its pool closes
    # what the interpreter of a `python -m scalelab.run.warm_rank` process does with an exception it did not catch
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else int(err.code is not None)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - said on stderr; the pool reads the end of this process
        traceback.print_exc()
    finally:
        exit_without_teardown(code)


if __name__ == "__main__":
    main()
