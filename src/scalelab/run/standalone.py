"""A probe opened by a script that `scalelab run` did not start (`python train.py`, or the user's own torchrun):
the run is recorded in the store by the script's own ranks, and finished when the process exits.

Rank 0 records the run (kind "script", the command as the process got it); every rank of one torchrun job derives
the same run id from what torchrun gave them all (the rendezvous address and port, the job's run id, the agent's
pid), so the other ranks find the directory rank 0 made. At exit each rank closes its probe (result file); rank 0
waits for every rank's result, summarises, exports and finishes the run as run/execute.py does. A rank that dies
of an uncaught exception marks the run failed with its traceback (error.txt). There is no hang watchdog: nothing
outside the ranks watches them.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import sys
import time
import traceback
from pathlib import Path

import psutil
import torch

from scalelab.distenv import DistContext, dist_context
from scalelab.errors import StoreError
from scalelab.run.execute import record_run
from scalelab.run.probe import Probe, set_current
from scalelab.run.script import SCRIPT, ScriptConfig
from scalelab.store import Store, open_store
from scalelab.store.rundir import RunDir

WAIT_FOR_RANKS_S = 120.0  # how long rank 0 waits, at exit, for the other ranks' results (and they for its run)


def shared_run_id(env: dict[str, str]) -> str:
    """One id for every rank of one torchrun job, from what torchrun put in each rank's environment."""
    parts = [env.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")]
    key = "/".join([*parts, str(os.getppid())])
    return f"script-{time.strftime('%Y%m%d', time.gmtime())}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


def same_command_pids() -> set[int]:
    """This process and its siblings running the same command line: the ranks of this job on this host."""
    me = psutil.Process()
    pids, parent = {me.pid}, me.parent()
    if parent is None:
        return pids
    mine = me.cmdline()
    for sibling in parent.children():
        try:
            if sibling.cmdline() == mine:
                pids.add(sibling.pid)
        except psutil.Error:
            continue
    return pids


def open_standalone(*, store: str | None = None, warmup_steps: int = 2, sample_interval_s: float = 0.5,
                    ctx: DistContext | None = None, run_id: str | None = None) -> Probe:
    """A new run recorded by this job's ranks. `ctx` and `run_id` are for launchers that are not torchrun (the
    Lightning callback passes the trainer's ranks and an id its rank 0 broadcast); by default both come from
    torchrun's environment."""
    ctx = ctx or dist_context("cuda" if torch.cuda.is_available() else "cpu")
    st = open_store(store)
    if ctx.world > 1 and run_id is None:
        run_id = shared_run_id(dict(os.environ))
    cfg = ScriptConfig(command=("python", *sys.argv), ranks=ctx.local_world,
                       nnodes=max(1, ctx.world // max(1, ctx.local_world)), warmup_steps=warmup_steps,
                       sample_interval_s=sample_interval_s, hang_timeout_s=0.0, run_id=run_id)
    if ctx.rank == 0:
        run_id = record_run(SCRIPT, cfg, st, sys.argv, None)
    else:
        run_id = cfg.run_id
        wait_for(lambda: RunDir(st.run_dir(run_id)).config_file.exists(), f"run {run_id} made by rank 0")
    probe = Probe(st.run_dir(run_id), ctx, warmup_steps=warmup_steps, sample_interval_s=sample_interval_s,
                  heartbeat_s=None, rank_pids=same_command_pids).start()
    probe.instrumented = True
    set_current(probe)
    finish = Finisher(probe, st, run_id, cfg, ctx)
    atexit.register(finish.at_exit)
    previous = sys.excepthook

    def on_uncaught(kind, err, tb):
        finish.failed(err)
        previous(kind, err, tb)

    sys.excepthook = on_uncaught
    return probe


def wait_for(ready, what: str, timeout_s: float = WAIT_FOR_RANKS_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise StoreError(f"{what}: not there after {timeout_s:g} s")
        time.sleep(0.05)


class Finisher:
    """Ends a standalone run once: completed at a normal exit (rank 0), failed on an uncaught exception."""

    def __init__(self, probe: Probe, store: Store, run_id: str, cfg: ScriptConfig, ctx: DistContext):
        self.probe, self.store, self.run_id, self.cfg, self.ctx = probe, store, run_id, cfg, ctx
        self.done = False

    def failed(self, err: BaseException) -> None:
        if self.done:
            return
        self.done = True
        self.probe.close(failed=True)
        set_current(None)
        rundir = RunDir(self.store.run_dir(self.run_id))
        rundir.write_error("".join(traceback.format_exception(err)))
        first = (traceback.format_exception_only(err)[-1].strip() or type(err).__name__)
        self.store.finish_run(self.run_id, "failed", reason=f"rank {self.ctx.rank} raised {first}")

    def at_exit(self) -> None:
        if self.done:
            return
        self.done = True
        self.probe.close()
        set_current(None)
        if self.ctx.rank != 0:
            return
        run_dir: Path = self.store.run_dir(self.run_id)
        rundir = RunDir(run_dir)
        try:
            wait_for(lambda: len(rundir.result_files()) >= self.ctx.world, f"run {self.run_id}: every rank's result")
            verdict = SCRIPT.summarise(self.cfg, run_dir)
            SCRIPT.export(self.cfg, run_dir)
        except Exception as err:  # noqa: BLE001 - the run must end marked
            rundir.write_error("".join(traceback.format_exception(err)))
            self.store.finish_run(self.run_id, "failed", reason=str(err))
            return
        if self.store.get(self.run_id)["status"] == "running":  # another rank may have failed it
            self.store.finish_run(self.run_id, verdict.status, reason=verdict.reason, summary=verdict.summary)
