"""One training run from the parent's side: validate, record, launch the ranks, summarise, mark the outcome.

Every run that got a directory ends marked: completed, failed (with the root-cause rank, exit code and
traceback) or interrupted. Nothing here reads rank or device from the environment; launch.py does.
"""
from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalelab.analysis.summary import loopback_bytes_per_step, summarize
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, ScalelabError, StoreError
from scalelab.launch import DistContext, environ, run_torchrun, torchrun_argv, worker_env
from scalelab.provenance import collect_provenance
from scalelab.report.tensorboard import write_scalars
from scalelab.report.trace import write_trace
from scalelab.store import Store, read_json, read_jsonl
from scalelab.watchdog import Watchdog


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


def check_inputs(cfg: TrainConfig) -> None:
    """Build the data and the model once here, so a bad dataset or model fails before any run is recorded."""
    from scalelab.train.setup import build_inputs

    try:
        bundle, _ = build_inputs(cfg)
    except (MemoryError, RuntimeError) as err:  # torch reports a failed allocation as RuntimeError
        if not isinstance(err, MemoryError) and "allocate" not in str(err):
            raise
        raise ConfigError("samples", cfg.samples, "the dataset does not fit in this machine's memory; "
                          "allowed: fewer samples") from None
    n = len(bundle.train)
    if cfg.drop_last and n < cfg.global_batch:  # no full batch: an epoch of zero steps
        raise ConfigError("global_batch", cfg.global_batch, f"more than the {n} training samples of "
                          f"{cfg.dataset} with drop_last; allowed: at most {n}, or keep the last batch")


def collect_summary(run_dir: Path) -> dict:
    """Summarise a run from its stored per-rank files alone."""
    results = [read_json(p) for p in sorted(run_dir.glob("result.rank*.json"))]
    if not results:
        raise StoreError(f"run {run_dir.name}: no rank wrote a result file")
    records = [r for p in sorted(run_dir.glob("steps.rank*.jsonl")) for r in read_jsonl(p)]
    main = min(results, key=lambda r: r["rank"])
    summary = summarize(records, steps_per_epoch=main["steps_per_epoch"], evals=main["evals"],
                        memory=[r["memory"] for r in results])
    summary["ranks/reported"] = len(results)
    system0 = run_dir / "system.rank0.jsonl"
    if "comm/bytes_per_step" in summary and system0.exists():
        # beside the metered bytes: what the host's loopback carried (gloo on one node runs over it)
        loopback = loopback_bytes_per_step(read_jsonl(system0), records)
        if loopback is not None:
            summary["comm/loopback_bytes_per_step"] = loopback
    return summary


# Messages of a collective that failed because another rank died or aborted first (gloo, NCCL).
_PEER_FAILURE = re.compile(r"connection (reset|closed) by peer|broken pipe|remote process exited|"
                           r"communicator was aborted|connection refused", re.IGNORECASE)


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

    if isinstance(err, ChildFailedError):
        # After the first failure torchrun stops the other ranks with SIGTERM; a rank that dies of a signal leaves
        # no error file, so its timestamp is only when the agent noticed it, and a rank the agent stopped can look
        # "first". The root cause is the earliest failure the agent did not cause itself.
        # Likewise a rank whose collective broke because its peer went away (gloo's "connection reset by peer",
        # NCCL's "remote process exited") is a consequence, and it can be reported before the rank that caused it.
        def stopped_by_agent(f) -> bool:
            return f.exitcode in (-signal.SIGTERM, 128 + signal.SIGTERM)

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


def _uses_torchrun(cfg: TrainConfig, isolate: bool) -> bool:
    # One rank without a process group runs in this process, unless it must be isolated (a memory cap, or a
    # max-batch trial whose out-of-memory must not touch the caller): then torchrun starts it as one rank.
    return cfg.distributed or bool(cfg.memory_limit) or isolate


def _interrupt_main_thread(_beats) -> None:
    # An in-process rank hangs in this very process: a real SIGINT to the main thread wakes a blocking sleep or
    # wait; marking_failures then sees the watchdog's verdict and marks the run failed, not interrupted.
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _launch(cfg: TrainConfig, run_dir: Path, isolate: bool, resume: bool = False) -> None:
    if not _uses_torchrun(cfg, isolate):
        from scalelab.worker import run_rank

        import torch

        device = torch.device("cuda", 0) if cfg.resolved_device == "cuda" else torch.device("cpu")
        run_rank(cfg, run_dir, DistContext(0, 1, 0, 1, device), resume=resume)
        return
    with environ(worker_env(cfg)), _agent_log_level(logging.CRITICAL if isolate else None):
        run_torchrun(torchrun_argv(cfg, run_dir, quiet=isolate, resume=resume))


@contextlib.contextmanager
def _agent_log_level(level: int | None):
    """Silence torchrun's agent for isolated runs (their failures are expected and recorded in the run)."""
    logger = logging.getLogger("torch.distributed.elastic")
    old = logger.level
    if level is not None:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


def _open_run(cfg: TrainConfig, store: Store, argv: list[str] | None, study: str | None) -> str:
    provenance = collect_provenance(argv, seed=cfg.seed)
    try:
        return store.create_run(cfg.to_dict(), provenance, kind="train", study=study, run_id=cfg.run_id)
    except StoreError:
        # A later node of a multi-node run on a shared filesystem joins the directory node 0 made.
        if cfg.node_rank > 0 and cfg.run_id and store.run_dir(cfg.run_id).is_dir():
            return cfg.run_id
        raise


def execute(cfg: TrainConfig, store: Store, *, argv: list[str] | None = None, study: str | None = None,
            say: Callable[[str], None] = print, isolate: bool = False) -> RunOutcome:
    """Run one training job to completion and return its summary; raises RunFailed or KeyboardInterrupt."""
    check_inputs(cfg)
    # Store what actually runs: "auto" resolved to this machine's device, backend and strategy.
    cfg = cfg.resolved()
    run_id = _open_run(cfg, store, argv, study)
    say(f"run {run_id}: {cfg.model} on {cfg.dataset}, {cfg.world_size} rank(s), global batch {cfg.global_batch}, "
        f"{cfg.resolved_wrapper}/{cfg.resolved_backend if cfg.distributed else '-'}, {cfg.precision}")
    return _run(cfg, store, run_id, isolate=isolate)


def resume_run(run_id: str, store: Store, *, say: Callable[[str], None] = print) -> RunOutcome:
    """Continue a failed or interrupted run from its last checkpoint, in its own directory and catalog row."""
    from scalelab.train import checkpoint

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
    for stale in [*run_dir.glob("result.rank*.json"), *run_dir.glob("heartbeat.rank*.json"), run_dir / "error.txt"]:
        stale.unlink(missing_ok=True)  # from the attempt that stopped (old heartbeats must not fool the watchdog)
    store.reopen_run(rid)
    say(f"run {rid}: resuming from the checkpoint at step {step}")
    return _run(cfg, store, rid, isolate=False, resume=True)


def _run(cfg: TrainConfig, store: Store, run_id: str, *, isolate: bool, resume: bool = False) -> RunOutcome:
    run_dir = store.run_dir(run_id)
    local_ranks = list(range(cfg.node_rank * cfg.ranks, (cfg.node_rank + 1) * cfg.ranks))
    dog = Watchdog(run_dir, local_ranks, cfg.hang_timeout_s, abort=None if _uses_torchrun(cfg, isolate) else
                   _interrupt_main_thread)
    with marking_failures(store, run_id, on_failure=_try_trace, verdict=lambda: dog.verdict), dog:
        _launch(cfg, run_dir, isolate, resume)
        summary = collect_summary(run_dir)
    write_trace(run_dir)
    write_scalars(run_dir)
    store.finish_run(run_id, "completed", summary=summary)
    return RunOutcome(run_id, run_dir, summary)


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
        (run_dir / "error.txt").write_text(trace)
        if on_failure:
            on_failure(run_dir)
        store.finish_run(run_id, "failed", reason=reason)
        raise RunFailed(run_id, reason) from err


def _try_trace(run_dir: Path) -> None:
    """The trace of whatever a failed run recorded; a failure to write it must not hide the run's own."""
    try:
        write_trace(run_dir)
    except Exception:  # noqa: BLE001 - best effort on an already failed run
        pass


def _is_interrupt(err: BaseException) -> bool:
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return isinstance(err, SignalException) and err.sigval in (signal.SIGINT, signal.SIGTERM)
