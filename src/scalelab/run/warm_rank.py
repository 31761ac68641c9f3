"""The rank process of a warm pool (scalelab.run.warm): `python -m scalelab.run.warm_rank FD LOCAL_RANK [--fork]`,
or (most pools) a child of the block's zygote, which did those imports once (scalelab.run.warm_zygote, `serve`).

It imports what its jobs need, says it is ready on FD (its end of a socket pair with the pool), then runs one job
per message until the pool closes the connection. Two modes:

- warm (default): the job runs in this process (`scalelab.run.worker` or the comm bench's worker, as torchrun would
  run it); torch's one-time allocations are made before the first job, so that the first job's memory figures equal
  a later one's. A failed job ends the process: its state may be broken, and its peers may be stuck.
- fork (`--fork`, a fork server): the job runs in a child forked from this process, which has imported torch and
  scalelab but never run a torch op (no intra-op thread pool, no allocator cache, no OpenMP state: forking is safe,
  and the child starts where a fresh process would, with its imports done). Its one other thread is numpy's
  OpenBLAS pool, started at import, which OpenBLAS itself shuts down before a fork (its pthread_atfork handler), as
  for the DataLoader's forked workers. For cells that need a fresh process:
  a memory cap (RLIMIT_AS cannot be raised again in the process it capped), an isolated cell (a max-batch trial's
  out-of-memory, a thread count torch fixes at its first parallel op). The child is told its peers' pids before it
  starts (they exist only once every rank forked); the server reports the child's end and serves the next job.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection

from scalelab.distenv import exit_without_teardown
from scalelab.measure.machine import RANK_PIDS_ENV as PIDS_ENV  # the job's ranks, for local_rank_pids


class WarmRank:
    """One warm rank: says it is ready, then runs jobs until the pool closes the connection."""

    def __init__(self, fd: int, stamps: dict[str, float]):
        self.conn = Connection(fd)
        self.stamps = stamps  # unix times of this process's start (main, imported, warmed), sent as it is ready

    def serve(self) -> None:
        self.conn.send(self.stamps)
        while True:
            # Ctrl-C reaches every process of the terminal: between jobs the launching process handles it (it
            # closes the pool); during a job the worker gets it as torchrun's ranks do
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                job = self.conn.recv()
            except (EOFError, OSError):
                return  # the pool closed
            answer = self.run(job)
            try:
                self.conn.send(answer)
            except OSError:
                return  # the pool closed while the job ran (the launching process was interrupted)

    def run(self, job: dict) -> dict:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        answer = run_job(job)
        if not answer["ok"]:
            self.conn.send(answer)
            raise SystemExit(1)  # its state may be broken: the pool starts new ranks
        _leftover_process_group()
        _release_memory()
        return answer


class ForkServer(WarmRank):
    """One rank of a fork pool: each job in a fresh child (module docstring)."""

    child: int | None = None

    def serve(self) -> None:
        # SIGTERM (the pool stopping a rank whose peer failed) is for the child at work; idle, it ends this process
        signal.signal(signal.SIGTERM, self._forward)
        super().serve()

    def _forward(self, signum, _frame) -> None:
        if self.child is None:
            raise SystemExit(128 + signum)
        os.kill(self.child, signum)

    def run(self, job: dict) -> dict:
        result_r, result_w = os.pipe()
        go_r, go_w = os.pipe()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no SIGTERM between the fork and `child`
        pid = os.fork()
        if pid == 0:  # the child: the rank for this job
            self.conn.close()  # the pool sees this server's end, not a copy held by a child
            os.close(result_r)
            os.close(go_w)
            _child(job, go_r, result_w)
        self.child = pid
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(result_w)
        os.close(go_r)
        try:
            self.conn.send({"pid": pid})
            pids = self.conn.recv()  # every rank's child, for the noise sampler's own-process set
        except (EOFError, OSError):  # the pool closed before the job started: the child goes with it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise SystemExit(1) from None
        os.write(go_w, pids.encode())
        os.close(go_w)
        with os.fdopen(result_r, "rb") as result:
            data = result.read()
        _, status = os.waitpid(pid, 0)
        self.child = None
        code = os.waitstatus_to_exitcode(status)
        if data:
            return pickle.loads(data)
        if code == 0:
            return {"ok": True}
        return {"ok": False, "reason": died(int(job["env"].get("RANK", "0")), code), "trace": ""}


def _child(job: dict, go_r: int, result_w: int) -> None:
    """The forked rank: waits for its peers' pids, runs the job with its own output and limits, never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        with os.fdopen(go_r, "rb") as go:
            pids = go.read().decode()
        job["env"][PIDS_ENV] = pids
        if job.get("log"):  # an isolated cell: its output goes to its run's logs, as torchrun's --redirects
            fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        answer = run_job(job)
        if not answer["ok"]:
            os.write(result_w, pickle.dumps(answer))
        code = 0 if answer["ok"] else 1
    finally:
        exit_without_teardown(code)  # not the server's atexit handlers, nor its buffered output twice


def run_job(job: dict) -> dict:
    """The job's worker entry point with the job's whole environment; {"ok": True} or why it failed."""
    import importlib

    apply_env(job["env"])
    try:
        importlib.import_module(job["module"]).main(job["argv"])
    except BaseException as err:  # noqa: BLE001 - reported to the pool
        return {"ok": False, "reason": reason(int(os.environ["RANK"]), err),
                "trace": "".join(traceback.format_exception(err))}
    return {"ok": True}


def apply_env(env: dict[str, str]) -> None:
    """The job's whole environment, as torchrun would give it: nothing of the previous job's."""
    for key in set(os.environ) - set(env):
        del os.environ[key]
    os.environ.update(env)


def reason(rank: int, err: BaseException) -> str:
    """The one-line reason torchrun gives for a rank that raised (run.execute.failure_reason)."""
    if isinstance(err, SystemExit):
        return f"rank {rank} exited with code {err.code}"
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return f"rank {rank} exited with code 1: {text[-1] if text else type(err).__name__}"


def died(rank: int, code: int) -> str:
    if code < 0:
        return f"rank {rank} killed by signal {signal.Signals(-code).name}"
    return f"rank {rank} exited with code {code}"


def _leftover_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _release_memory() -> None:
    """Hand what the job freed back to the OS, so that the next job's resident set (and its peak, which the worker
    reads from the kernel's mark) starts where a fresh process's would, not at the last job's high-water mark."""
    import ctypes
    import gc

    gc.collect()  # cheap: the imports are frozen, and the next job's worker freezes what this one left (freeze_alive)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap pages mapped otherwise
    except (OSError, AttributeError):  # not glibc: the next job's peak may include this job's freed heap
        pass


def import_for_jobs() -> None:
    """What every job needs, imported before the first: what a warm rank saves each later cell. No torch op runs
    here and no thread starts (numpy's OpenBLAS pool aside, which shuts itself down before a fork), so a process
    that did only this may fork (a fork server, the zygote: scalelab.run.warm_zygote)."""
    import scalelab.measure.commbench_worker  # noqa: F401
    import scalelab.run.worker  # noqa: F401

    # Building an optimizer imports torch._dynamo (sympy and some 800 modules: ~0.9 s on a 2-core machine), which
    # each job of a fresh process would pay before its first step. A Python import that runs no torch op.
    import torch._dynamo  # noqa: F401
    from scalelab.measure.memory import freeze_alive

    freeze_alive()  # the imports' objects out of every later full collection's scan


def serve(fd: int, fork: bool, stamps: dict[str, float]) -> None:
    """Serve the pool on FD until it closes the connection, this process's imports done (`import_for_jobs`, here or
    in the zygote this process was forked from); never returns."""
    if fork:
        stamps["warmed"] = time.time()
        server: WarmRank = ForkServer(fd, stamps)
    else:
        from scalelab.config import TrainConfig
        from scalelab.measure.memory import freeze_alive
        from scalelab.run.worker import warm_up_runtime

        # torch's one-time allocations before the first job, so that the first job's memory figures (what training
        # added to its baseline) equal a later job's: the first job of a pool is no different from the others
        warm_up_runtime(TrainConfig())
        freeze_alive()  # and torch's one-time state with them
        stamps["warmed"] = time.time()
        server = WarmRank(fd, stamps)
    server.serve()
    exit_without_teardown()  # the pool closed: every job's files written, its answer sent


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    stamps = {"main": time.time()}
    import_for_jobs()
    stamps["imported"] = time.time()
    serve(int(args[0]), "--fork" in args, stamps)


if __name__ == "__main__":
    main()
