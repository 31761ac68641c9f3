"""The hang watchdog on a real 2-rank run with a rank that sleeps: the run fails within the timeout, naming
that rank."""
from __future__ import annotations

import time

import psutil
import pytest

from conftest import faulty_model, start_cli
from scalelab.store import Store


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ranks", [2, 1])
def test_a_sleeping_rank_fails_the_run_within_the_timeout_naming_it(tmp_path, ranks):
    stuck_rank = ranks - 1
    # the stuck rank sleeps for an hour in the forward of its 5th training step: a hang
    model = faulty_model(tmp_path, "stuck", call=5, fault="time.sleep(3600)", rank=stuck_rank)
    root = tmp_path / "store"
    timeout = 8
    proc = start_cli(["train", "--model", model, "--samples", "512", "--global-batch", "8", "--ranks", str(ranks),
                      "--steps", "50", "--hang-timeout", str(timeout), "--store", str(root)])
    started = time.monotonic()
    family = [psutil.Process(proc.pid)]
    while proc.poll() is None and time.monotonic() - started < 30 and len(family) < 1 + (ranks if ranks > 1 else 0):
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        time.sleep(0.2)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 1, err[-1500:]
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["failed"]
    reason = runs["reason"][0]
    assert reason.startswith(f"rank {stuck_rank} hung: no progress for"), reason
    assert f"hang timeout {timeout} s" in reason and f"rank {stuck_rank} at step 4 (forward)" in reason
    assert f"rank {stuck_rank} hung" in err
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive
    # the run's records and the error trace are kept
    run_dir = Store(root).run_dir(runs["run_id"][0])
    assert (run_dir / "error.txt").exists() and (run_dir / "steps.rank0.jsonl").exists()
