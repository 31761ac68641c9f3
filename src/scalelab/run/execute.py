"""Every run, whatever its kind, goes through the same steps here: record → launch → summarise → export → finish.

The kind (run/kinds.py: train, bench) supplies its config checks, how its ranks start, how its files are
summarised and what it exports; the launcher (run/launch.py: torchrun by default) is one replaceable step that
takes the run's LaunchSpec. Every run that got a directory ends marked: completed, failed (with the root-cause
rank, exit code and traceback) or interrupted. Nothing here reads rank or device from the environment.
"""
from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.config import TrainConfig
from scalelab.engines import registry as engines
from scalelab.errors import ScalelabError, StoreError
from scalelab.measure.commbench import CommBenchConfig, read_results
from scalelab.provenance import collect_provenance
from scalelab.run import netns
from scalelab.run.kinds import BENCH, TRAIN, RunKind, check_inputs
from scalelab.run.launch import Launcher, LaunchFailed, torchrun_launch
from scalelab.run.nodes import LocalNodes
from scalelab.run.slurmnodes import SlurmNodes, refuse_unlaunchable, uses_slurm
from scalelab.run.watchdog import Watchdog
from scalelab.store import RunDir, Store
from scalelab.train import checkpoint


class RunFailed(Exception):
    """A run started and failed; the message is the root cause in one line."""

    def __init__(self, run_id: str, reason: str):
        self.run_id, self.reason = run_id, reason
        super().__init__(f"run {run_id} failed: {reason}")


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    run_dir: Path
    summary: dict


@dataclass(frozen=True)
class Finished:
    """A run taken through every step: its summary and the status it was marked with."""

    run_id: str
    run_dir: Path
    summary: dict
    status: str
    reason: str | None


@dataclass(frozen=True)
class BenchOutcome:
    run_id: str
    run_dir: Path
    table: pd.DataFrame
    summary: dict
    status: str  # "completed", or "failed" when the correctness check found wrong elements
    reason: str | None


def _interrupt_main_thread(_beats) -> None:
    # An in-process rank hangs in this very process: a real SIGINT to the main thread wakes a blocking sleep or
    # wait; marking_failures then sees the watchdog's verdict and marks the run failed, not interrupted.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def record_run(kind: RunKind, cfg: Any, store: Store, argv: list[str] | None, study: str | None) -> str:
    """Create the run's directory and catalog row; returns its run_id."""
    provenance = collect_provenance(argv, seed=kind.seed(cfg))
    try:
        # node 0 owns a multi-node run: it adopts the directory another node made first on a shared filesystem
        return store.create_run(cfg.to_dict(), provenance, kind=kind.name, study=study, run_id=cfg.run_id,
                                adopt=kind.owns_shared(cfg))
    except StoreError:
        # A later node of a multi-node run on a shared filesystem joins the directory node 0 made.
        if kind.joins(cfg) and store.run_dir(cfg.run_id).is_dir():
            return cfg.run_id
        raise


def run_recorded(kind: RunKind, cfg: Any, store: Store, run_id: str, *, launcher: Launcher = torchrun_launch,
                 isolate: bool = False, resume: bool = False, phases: dict[str, float] | None = None) -> Finished:
    """Launch a recorded run's ranks, summarise and export what they stored, and mark the run finished.

    `phases`: unix times of the steps before (start, prepared, recorded); the launch, summary, export and catalog
    are added and the whole is stored with the run (phases.json): where a cell's time outside training goes."""
    phases = dict(phases or {})
    run_dir = store.run_dir(run_id)
    spec = kind.launch_spec(cfg, run_dir, isolate=isolate, resume=resume)
    abort, explain = None if spec is not None else _interrupt_main_thread, None
    if uses_slurm(cfg) and launcher is torchrun_launch:
        # the same ranks, as one job step across the Slurm allocation's first local_nodes nodes
        # (a bench has no engine: torchrun starts its ranks)
        launcher = SlurmNodes(cfg, launcher=engines.get(cfg.engine).launcher if hasattr(cfg, "engine")
                              else "torchrun")
        abort, explain = launcher.abort, launcher.unreachable
    elif cfg.local_nodes and launcher is torchrun_launch:
        # the same ranks, across namespaced nodes of this machine: each node's agent runs the kind's launcher
        launcher = LocalNodes(cfg, node_launcher=kind.launcher(cfg, launcher))
        # a hang stops the node agents too (one stuck in the rendezvous started no rank) and names the node
        # that cannot be reached
        abort, explain = launcher.abort, launcher.unreachable
    else:
        launcher = kind.launcher(cfg, launcher)
    ranks, timeout_s = kind.watched(cfg)
    dog = Watchdog(run_dir, ranks, timeout_s, abort=abort, explain=explain)
    with marking_failures(store, run_id, on_failure=kind.on_failure, verdict=lambda: dog.verdict), dog:
        phases["launch"] = time.time()
        if spec is None:
            kind.run_here(cfg, run_dir, resume=resume)
        else:
            launcher(spec)
        phases["ranks_done"] = time.time()
        verdict = kind.summarise(cfg, run_dir)
        phases["summarised"] = time.time()
        kind.export(cfg, run_dir)
        phases["exported"] = time.time()
    store.finish_run(run_id, verdict.status, reason=verdict.reason, summary=verdict.summary)
    phases["finished"] = time.time()
    RunDir(run_dir).write_phases(phases)
    return Finished(run_id, run_dir, verdict.summary, verdict.status, verdict.reason)


def check_nodes_usable(cfg: Any) -> None:
    """Refused before anything is recorded: namespace nodes without privilege, `ip` or netem for a delay; Slurm
    nodes outside an allocation or beyond its node count."""
    if uses_slurm(cfg):
        refuse_unlaunchable([cfg])
    elif cfg.local_nodes:
        netns.check_usable(cfg.link_gbps, cfg.link_delay_ms)


def execute_run(kind: RunKind, cfg: Any, store: Store, *, argv: list[str] | None = None, study: str | None = None,
                say: Callable[[str], None] = print, launcher: Launcher = torchrun_launch,
                isolate: bool = False) -> Finished:
    """Every step of one run of `kind`: prepare the config, record, launch, summarise, export, finish."""
    phases = {"start": time.time()}
    cfg = kind.prepare(cfg)
    check_nodes_usable(cfg)
    phases["prepared"] = time.time()
    run_id = record_run(kind, cfg, store, argv, study)
    phases["recorded"] = time.time()
    say(kind.describe(run_id, cfg))
    return run_recorded(kind, cfg, store, run_id, launcher=launcher, isolate=isolate, phases=phases)


def execute(cfg: TrainConfig, store: Store, *, argv: list[str] | None = None, study: str | None = None,
            say: Callable[[str], None] = print, isolate: bool = False,
            launcher: Launcher = torchrun_launch) -> RunOutcome:
    """Run one training job to completion and return its summary; raises RunFailed or KeyboardInterrupt."""
    done = execute_run(TRAIN, cfg, store, argv=argv, study=study, say=say, launcher=launcher, isolate=isolate)
    return RunOutcome(done.run_id, done.run_dir, done.summary)


def run_commbench(cfg: CommBenchConfig, store: Store, *, argv: list[str] | None = None, study: str | None = None,
                  say: Callable[[str], None] = print, launcher: Launcher = torchrun_launch) -> BenchOutcome:
    """Record, launch and finish one communication benchmark run; raises RunFailed when a rank fails."""
    done = execute_run(BENCH, cfg, store, argv=argv, study=study, say=say, launcher=launcher)
    return BenchOutcome(done.run_id, done.run_dir, read_results(done.run_dir), done.summary, done.status,
                        done.reason)


# Messages of a collective that failed because another rank died or aborted first (gloo, NCCL).
_PEER_FAILURE = re.compile(r"connection (reset|closed) by peer|broken pipe|remote process exited|"
                           r"communicator was aborted|connection refused", re.IGNORECASE)
# Messages of a rank that failed because the agent's SIGTERM reached it or its loader workers first.
_STOPPED = re.compile(r"killed by signal: Terminated|got signal: 15\b", re.IGNORECASE)


def is_consequence(reason: str) -> bool:
    """Whether a one-line failure reason is the consequence of another failure (a peer gone, a stop signal)."""
    return bool(_PEER_FAILURE.search(reason) or _STOPPED.search(reason) or "SIGTERM" in reason)


def _message(failure) -> tuple[str, str]:
    """(message, traceback) of a torchrun ProcessFailure: from its error file's record, or its plain message."""
    message = failure.message
    if isinstance(message, dict):
        text = message.get("message", "")
        return text, message.get("extraInfo", {}).get("py_callstack", text)
    return str(message), str(message)


def failure_reason(err: BaseException) -> tuple[str, str]:
    """(one-line reason, full traceback text) for a failed launch or an in-process exception."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(err, LaunchFailed):  # horovodrun: its launcher found the root cause already
        return err.reason, err.trace
    if isinstance(err, ChildFailedError):
        # After the first failure torchrun stops the other ranks with SIGTERM; a rank that dies of a signal leaves
        # no error file, so its timestamp is only when the agent noticed it, and a rank the agent stopped can look
        # "first". The root cause is the earliest failure the agent did not cause itself.
        # Likewise a rank whose collective broke because its peer went away (gloo's "connection reset by peer",
        # NCCL's "remote process exited") is a consequence, and it can be reported before the rank that caused it.
        # A rank whose loader worker got that SIGTERM first raises "DataLoader worker ... killed by signal:
        # Terminated" and exits 1 with an error file: stopped by the agent too.
        def stopped_by_agent(f) -> bool:
            return f.exitcode in (-signal.SIGTERM, 128 + signal.SIGTERM) or bool(_STOPPED.search(_message(f)[0]))

        def key(kv):
            rank, f = kv
            return stopped_by_agent(f), bool(_PEER_FAILURE.search(_message(f)[0])), f.timestamp, rank

        rank, failure = min(err.failures.items(), key=key)
        if failure.exitcode < 0:
            return f"rank {rank} killed by signal {failure.signal_name()}", str(err)
        text, trace = _message(failure)
        first = text.strip().splitlines()[-1] if text.strip() else "no error message"
        return f"rank {rank} exited with code {failure.exitcode}: {first}", trace
    text = f"{type(err).__name__}: {err}".strip().splitlines()
    return f"rank 0 raised {text[0] if text else type(err).__name__}", "".join(traceback.format_exception(err))


def resume_run(run_id: str, store: Store, *, say: Callable[[str], None] = print,
               launcher: Launcher = torchrun_launch) -> RunOutcome:
    """Continue a failed or interrupted run from its last checkpoint, in its own directory and catalog row."""

    store.mark_stale()  # a run whose process died with the machine is "interrupted", not "running"
    info = store.get(run_id)
    rid, run_dir = info["run_id"], Path(info["dir"])
    if info["kind"] != "train" or info["status"] not in ("failed", "interrupted"):
        raise ScalelabError(f"run {rid}: is a {info['kind']} run with status {info['status']}; "
                            "only a failed or interrupted training run can be resumed")
    step = checkpoint.latest_step(run_dir)
    if step is None:
        raise ScalelabError(f"run {rid}: has no checkpoint to resume from (it ran without --checkpoint-every); "
                            "start it again instead")
    cfg = TrainConfig.from_dict(info["config"])
    check_inputs(cfg)
    check_nodes_usable(cfg)
    RunDir(run_dir).clear_attempt()  # from the attempt that stopped (old heartbeats must not fool the watchdog)
    store.reopen_run(rid)
    say(f"run {rid}: resuming from the checkpoint at step {step}")
    done = run_recorded(TRAIN, cfg, store, rid, launcher=launcher, resume=True)
    return RunOutcome(done.run_id, done.run_dir, done.summary)


@contextlib.contextmanager
def marking_failures(store: Store, run_id: str, *, on_failure: Callable[[Path], None] | None = None,
                     verdict: Callable[[], str | None] = lambda: None):
    """Leave the run marked whatever escapes the block: interrupted (re-raised as KeyboardInterrupt) or failed
    with its root cause and traceback in error.txt (raised as RunFailed). `verdict` is the hang watchdog's: when
    it ended the run, it is the root cause, whatever the killed ranks reported."""
    run_dir = store.run_dir(run_id)
    try:
        yield
    except BaseException as err:  # noqa: BLE001 - every failure must leave the run marked
        hung = verdict()
        if not hung and isinstance(err, KeyboardInterrupt):
            store.finish_run(run_id, "interrupted", reason="interrupted by the user (SIGINT)")
            raise
        if not hung and _is_interrupt(err):
            store.finish_run(run_id, "interrupted", reason=f"interrupted by {err}")
            raise KeyboardInterrupt from err
        if hung or isinstance(err, ScalelabError):
            reason, trace = hung or str(err), "".join(traceback.format_exception(err))
        else:
            reason, trace = failure_reason(err)
        RunDir(run_dir).write_error(trace)
        if on_failure:
            on_failure(run_dir)
        store.finish_run(run_id, "failed", reason=reason)
        raise RunFailed(run_id, reason) from err


def _is_interrupt(err: BaseException) -> bool:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(err, SignalException) and err.sigval in (signal.SIGINT, signal.SIGTERM)
