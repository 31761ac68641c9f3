"""Checkpoint and resume on 2 real gloo ranks: a rank SIGKILLed mid-run, the run resumed through the CLI,
every per-step loss equal to the uninterrupted run's (known truth: the same config and seed).
"""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from conftest import run_cli, start_cli, step_losses as _losses
from scalelab.store import RunDir, Store, read_json, read_jsonl
from scalelab.train import checkpoint


@pytest.mark.timeout(300)
def test_two_ranks_killed_then_resumed_reach_the_uninterrupted_loss(tmp_path, sleepy_model):
    root = tmp_path / "store"
    model = sleepy_model(0.02)
    common = ["--model", model, "--samples", "640", "--eval-samples", "64", "--global-batch", "16", "--ranks", "2",
              "--epochs", "1", "--lr", "0.05", "--seed", "7", "--store", str(root)]
    ref = run_cli(["train", *common], timeout=240)
    assert ref.returncode == 0, ref.stderr[-1500:]

    proc = start_cli(["train", *common, "--checkpoint-every", "8"])
    deadline = time.monotonic() + 120
    latest = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = [p for p in root.glob(f"runs/*/{RunDir('').checkpoints.name}/latest.json")]
        if found and read_json(found[0])["step"] >= 16:
            latest = found[0]
            break
        time.sleep(0.1)
    assert latest is not None, "no checkpoint at step 16 before the run ended"
    rank1 = [c for c in psutil.Process(proc.pid).children(recursive=True)
             if "scalelab.run.worker" in " ".join(c.cmdline()) and c.environ().get("RANK") == "1"]
    os.kill(rank1[0].pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 1 and "SIGKILL" in err
    run_id = latest.parent.parent.name
    killed_at = checkpoint.latest_step(latest.parent.parent)
    assert 16 <= killed_at < 40

    res = run_cli(["train", "--resume", run_id, "--store", str(root)], timeout=240)
    assert res.returncode == 0, res.stderr[-1500:]
    runs = Store(root).list_runs().set_index("run_id")
    assert runs.loc[run_id, "status"] == "completed"
    ref_id = next(r for r in runs.index if r != run_id)
    ref_losses, losses = _losses(Store(root).run_dir(ref_id)), _losses(Store(root).run_dir(run_id))
    assert sorted(losses) == list(range(1, 41))
    assert losses[40] == pytest.approx(ref_losses[40], rel=1e-5)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    # timing excludes the warm-up steps of each start: the first two, and the first two after the resume
    records = read_jsonl(Store(root).run_dir(run_id) / "steps.rank0.jsonl")
    assert [r["step"] for r in records if r["warmup"]] == [1, 2, killed_at + 1, killed_at + 2]
    # both ranks resumed: rank 1's records are whole too
    assert sorted(_losses(Store(root).run_dir(run_id), rank=1)) == list(range(1, 41))
