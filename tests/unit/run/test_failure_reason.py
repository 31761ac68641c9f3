"""The root cause of a failed multi-rank run, from torchrun's per-rank failures with fixed timestamps."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest


pytestmark = pytest.mark.timeout(240)


def _failure(tmp_path: Path, rank: int, exitcode: int, message: str | None, timestamp: int):
    """A torchrun ProcessFailure as the agent builds it: from the rank's error file, or none for a signal."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / f"error.{rank}.json"
    if message is not None:
        error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {
            "py_callstack": f"Traceback ...\n{message}", "timestamp": str(timestamp)}}}))
    failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(error_file))
    failure.timestamp = timestamp
    return failure


def test_root_cause_skips_ranks_that_failed_because_of_their_peer(tmp_path):
    """Fixed failures, fixed timestamps: a rank whose collective broke because its peer aborted is reported
    first, yet the root cause is the rank that aborted; a rank the agent stopped with SIGTERM never is."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from scalelab.run.execute import failure_reason

    reset = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:33996: Connection reset by peer."
    failures = {0: _failure(tmp_path, 0, 1, reset, timestamp=100),
                1: _failure(tmp_path, 1, -signal.SIGABRT, None, timestamp=105),
                2: _failure(tmp_path, 2, -signal.SIGTERM, None, timestamp=90)}
    reason, _ = failure_reason(ChildFailedError("worker", failures))
    assert reason == "rank 1 killed by signal SIGABRT"

    # with no rank failing on its own, the earliest consequence is still named, with its message
    del failures[1]
    reason, trace = failure_reason(ChildFailedError("worker", failures))
    assert reason == f"rank 0 exited with code 1: {reset}"
    assert trace.startswith("Traceback")

    # among independent failures the earliest wins
    failures = {0: _failure(tmp_path, 0, 1, "ValueError: late", timestamp=200),
                1: _failure(tmp_path, 1, 3, "KeyError: early", timestamp=150)}
    assert failure_reason(ChildFailedError("worker", failures))[0] == "rank 1 exited with code 3: KeyError: early"


def test_a_rank_whose_loader_worker_the_agent_stopped_is_not_the_root_cause(tmp_path):
    """Seen in CI: rank 1 SIGKILLed; the agent's SIGTERM reached rank 0's loader worker first, and rank 0 exited
    1 with an error file written before the agent noticed rank 1. The root cause is still rank 1."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from scalelab.run.execute import failure_reason

    stopped = "RuntimeError: DataLoader worker (pid 20596) is killed by signal: Terminated."
    failures = {0: _failure(tmp_path, 0, 1, stopped, timestamp=100),
                1: _failure(tmp_path, 1, -signal.SIGKILL, None, timestamp=101)}
    assert failure_reason(ChildFailedError("worker", failures))[0] == "rank 1 killed by signal SIGKILL"
