"""Checkpoint and resume: a run killed mid-way and resumed ends where an uninterrupted run of the same seed ends.

Known truth: the same config and seed run without interruption. Weights, optimizer state, RNG and the sampler's
position all come back from the checkpoint, so the resumed run's per-step losses equal the uninterrupted run's.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from conftest import cli_env, faulty_model, run_cli
from scalelab.config import TrainConfig
from scalelab.errors import ScalelabError
from scalelab.run.execute import RunFailed, execute, resume_run
from scalelab.store import RunDir, Store, read_json, read_jsonl
from scalelab.train import checkpoint

def _losses(run_dir, rank=0):
    return {r["step"]: r["loss"] for r in read_jsonl(run_dir / f"steps.rank{rank}.jsonl")}


def _flaky(tmp_path, armed: bool) -> str:
    """A model that raises in its 10th training forward while the file `armed` exists (removing it): once."""
    flag = tmp_path / ("armed" if armed else "never")
    if armed:
        flag.write_text("")
    fault = f"if os.path.exists({str(flag)!r}): os.remove({str(flag)!r}); raise RuntimeError('injected crash')"
    return faulty_model(tmp_path, f"flaky_{armed}", call=10, fault=fault)


def test_resumed_run_matches_an_uninterrupted_one_step_by_step(tmp_path, store):
    common = dict(samples=96, eval_samples=32, global_batch=8, epochs=2, lr=0.1, seed=3, warmup_steps=0)
    whole = execute(TrainConfig(model=_flaky(tmp_path, False), **common), store, say=lambda s: None)
    assert not (RunDir(whole.run_dir).checkpoints).exists()

    cfg = TrainConfig(model=_flaky(tmp_path, True), checkpoint_every=4, **common)
    with pytest.raises(RunFailed) as err:
        execute(cfg, store, say=lambda s: None)
    run_id = err.value.run_id
    run_dir = store.run_dir(run_id)
    assert checkpoint.latest_step(run_dir) == 8  # the crash came in step 10
    assert sorted(p.name for p in (RunDir(run_dir).checkpoints).iterdir()) == ["latest.json", "step-00000008"]

    resumed = resume_run(run_id, store, say=lambda s: None)
    assert resumed.run_id == run_id and store.get(run_id)["status"] == "completed"
    history = read_json(run_dir / "status.json")["history"]
    assert [h["status"] for h in history] == ["failed"] and "injected crash" in history[0]["reason"]

    expected, got = _losses(whole.run_dir), _losses(run_dir)
    assert sorted(got) == list(range(1, 25))  # every step once: 12 per epoch, the crash's steps redone
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert resumed.summary["eval/acc"] == pytest.approx(whole.summary["eval/acc"])
    records = read_jsonl(run_dir / "steps.rank0.jsonl")
    assert all("checkpoint(s)" in r for r in records if r["step"] in (4, 8, 12, 16, 20))


def test_resume_refuses_runs_it_cannot_continue(tmp_path, store):
    done = execute(TrainConfig(model="mlp", samples=32, eval_samples=16, global_batch=16, epochs=1), store,
                   say=lambda s: None)
    with pytest.raises(ScalelabError, match="only a failed or interrupted training run can be resumed"):
        resume_run(done.run_id, store)
    with pytest.raises(RunFailed) as err:
        execute(TrainConfig(model=_flaky(tmp_path, True), samples=96, global_batch=8, epochs=1), store,
                say=lambda s: None)
    with pytest.raises(ScalelabError, match="no checkpoint to resume from"):
        resume_run(err.value.run_id, store)


def test_cli_resume_errors_are_one_line(tmp_path, store):
    done = execute(TrainConfig(model="mlp", samples=32, eval_samples=16, global_batch=16, epochs=1), store,
                   say=lambda s: None)
    for args, expected in [
        (["--resume", done.run_id], "only a failed or interrupted training run can be resumed"),
        (["--resume", "no-such-run"], "not found"),
        (["--resume", done.run_id, "--lr", "0.1"], "a resumed run keeps its stored config; drop --lr"),
    ]:
        res = run_cli(["train", *args, "--store", str(store.root)])
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], res.stderr
    assert list(store.list_runs()["status"]) == ["completed"]


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the crafted file is not torch.save's
def test_a_crafted_checkpoint_is_refused_without_running_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    (RunDir(run_dir).checkpoints / "step-00000004").mkdir(parents=True)
    with open(RunDir(run_dir).checkpoints / "step-00000004" / "state.pt", "wb") as f:
        pickle.dump({"step": 4, "model": _Boom()}, f)
    (RunDir(run_dir).checkpoints / "latest.json").write_text('{"step": 4, "dir": "step-00000004"}')
    with pytest.raises(ScalelabError, match="checkpoint cannot be loaded"):
        checkpoint.load(run_dir, 0, torch.device("cpu"))
    assert not (tmp_path / "pwned").exists()


def test_latest_only_names_a_complete_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint.save(tmp_path, rank=0, step=4, epoch=0, model=model, optimizer=opt, scaler=None, evals=[])
    # a kill while step 8 was being written: its files exist in part, latest.json still names step 4
    (RunDir(tmp_path).checkpoints / "step-00000008").mkdir()
    (RunDir(tmp_path).checkpoints / "step-00000008" / ".state.pt.tmp123").write_bytes(b"\x80\x04trunc")
    ckpt = checkpoint.load(tmp_path, 0, torch.device("cpu"))
    assert ckpt.step == 4 and torch.equal(ckpt.state["model"]["weight"], model.weight.detach())


@pytest.mark.timeout(300)
def test_two_ranks_killed_then_resumed_reach_the_uninterrupted_loss(tmp_path, sleepy_model):
    root = tmp_path / "store"
    model = sleepy_model(0.02)
    common = ["--model", model, "--samples", "640", "--eval-samples", "64", "--global-batch", "16", "--ranks", "2",
              "--epochs", "1", "--lr", "0.05", "--seed", "7", "--store", str(root)]
    ref = run_cli(["train", *common], timeout=240)
    assert ref.returncode == 0, ref.stderr[-1500:]

    proc = subprocess.Popen([sys.executable, "-m", "scalelab", "train", *common, "--checkpoint-every", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
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
