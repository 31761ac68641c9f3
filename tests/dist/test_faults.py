"""Faults injected into real 2-rank runs: a rank SIGKILLed mid-epoch, a rank that hangs.

Each test starts `scalelab train` as its own process, injects the fault, and checks what a user relies on: the
command ends non-zero in bounded time, no process of the run survives, the catalog names the rank and the cause,
and the records flushed before the fault are kept.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from conftest import faulty_model, kill_rank, start_cli, wait_for_steps
from scalelab.store import Store, read_jsonl

pytestmark = pytest.mark.timeout(240)


def _start(args: list[str], root: Path):
    return start_cli(["train", *args, "--store", str(root)])


def _run_processes(proc: subprocess.Popen) -> list[psutil.Process]:
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


def _rank_pid(proc: subprocess.Popen, rank: int) -> int | None:
    """The pid of the given rank: a worker process (not a loader worker) whose RANK is `rank`."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "scalelab.run.worker" in " ".join(child.cmdline()) and child.environ().get("RANK") == str(rank) \
                    and "scalelab.run.worker" not in " ".join(child.parent().cmdline()):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def test_sigkill_of_one_rank_mid_epoch_fails_the_run_cleanly(tmp_path, sleepy_model):
    root = tmp_path / "store"
    # two loader workers per rank: they must go too
    proc = _start(["--model", sleepy_model(0.05), "--samples", "4096", "--global-batch", "8", "--ranks", "2",
                   "--epochs", "3", "--num-workers", "2"], root)
    run_dir = wait_for_steps(proc, root, rank=0)
    family = _run_processes(proc)
    assert len(family) >= 1 + 2 + 2 * 2, [p.cmdline() for p in family]  # agent, 2 ranks, their loader workers
    victim = _rank_pid(proc, 1)
    assert victim is not None
    err, elapsed = kill_rank(proc, victim, timeout=90)
    assert proc.returncode != 0
    assert elapsed < 60, f"took {elapsed:.1f} s to end after the kill"
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"

    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["failed"]
    reason = runs["reason"][0]
    assert "rank 1" in reason and "SIGKILL" in reason, reason
    assert "rank 1" in err and "SIGKILL" in err, err[-800:]
    assert read_jsonl(run_dir / "steps.rank0.jsonl"), "records flushed before the kill were lost"


def test_ranks_end_when_scalelab_itself_is_killed(tmp_path, sleepy_model):
    """kill -9 of scalelab takes torchrun's agent with it (it runs in-process): the ranks must not train on as
    orphans. Each rank watches its parent and ends itself, flushing its records."""
    root = tmp_path / "store"
    proc = _start(["--model", sleepy_model(0.05), "--samples", "4096", "--global-batch", "8", "--ranks", "2",
                   "--epochs", "3"], root)
    run_dir = wait_for_steps(proc, root, rank=1)
    ranks = [p for p in _run_processes(proc)[1:] if "scalelab.run.worker" in " ".join(p.cmdline())]
    assert len(ranks) == 2
    proc.kill()
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(ranks, timeout=20)
    assert not alive, f"orphaned ranks: {[p.pid for p in alive]}"
    assert read_jsonl(run_dir / "steps.rank1.jsonl")
    # the catalog still says running; the next command that looks finds its process gone
    assert Store(root).mark_stale() == 1
    assert list(Store(root).list_runs()["status"]) == ["interrupted"]


def test_a_rank_issuing_a_collective_the_others_skip_fails_the_run_naming_it(tmp_path):
    """Rank 1 all-reduces a tensor rank 0 never all-reduces (as if rank 0 had skipped that collective): gloo sees
    the mismatch against rank 0's gradient all-reduce and aborts rank 1; the run fails naming it, without a hang."""
    root = tmp_path / "store"
    model = faulty_model(tmp_path, "extra", call=5, rank=1,
                         fault="import torch.distributed as dist; dist.all_reduce(torch.zeros(3))")
    proc = _start(["--model", model, "--samples", "512", "--global-batch", "8", "--ranks", "2", "--steps", "50",
                   "--sync", "allreduce", "--hang-timeout", "60"], root)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    reason = Store(root).list_runs()["reason"][0]
    assert reason.startswith("rank 1 "), reason
