"""Ctrl-C during a run: the run is marked interrupted with the reason, and no rank is left behind."""
from __future__ import annotations

import signal
import time

import psutil
import pytest

from conftest import start_cli
from scalelab.store import Store

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("ranks,sig", [(2, signal.SIGINT), (2, signal.SIGTERM), (1, signal.SIGINT)])
def test_signal_marks_the_run_interrupted_and_leaves_no_process(tmp_path, sleepy_model, ranks, sig):
    root = tmp_path / "store"
    # Ctrl-C on 2 ranks reaches a fresh interpreter, as a user's does; the others a call the CLI server forked
    proc = start_cli(["train", "--model", sleepy_model(0.05), "--samples", "4096", "--global-batch", "8", "--ranks",
                      str(ranks), "--epochs", "5", "--store", str(root)], fresh=(ranks, sig) == (2, signal.SIGINT))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until steps are being recorded
        if list(root.glob("runs/*/steps.rank0.jsonl")):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("run never started: " + proc.communicate()[1][-1500:])
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"left behind: {alive}"
    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["interrupted"], err[-1500:]
    assert runs["reason"][0]
