"""Checkpoint and resume in one process: a run crashed mid-way and resumed ends where an uninterrupted run of the
same seed ends; runs that cannot be resumed, crafted and partial checkpoints.

Known truth: the same config and seed run without interruption. Weights, optimizer state, RNG and the sampler's
position all come back from the checkpoint, so the resumed run's per-step losses equal the uninterrupted run's.
"""
from __future__ import annotations

import os
import pickle

import pytest
import torch

from conftest import faulty_model, step_losses as _losses
from scalelab.config import TrainConfig
from scalelab.errors import ScalelabError
from scalelab.run.execute import RunFailed, execute, resume_run
from scalelab.store import RunDir, read_json, read_jsonl
from scalelab.train import checkpoint

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
