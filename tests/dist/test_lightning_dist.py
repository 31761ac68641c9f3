"""The Lightning callback (scalelab.lightning) with a real Trainer on 2 CPU ranks (DDP, gloo).

Truths: an injected sleep in training_step (the forward stage), the batches Lightning gives each rank (steps and
samples), and the model's gradient bytes (one DDP bucket per step). Under `scalelab run`, and alone with
Lightning's own launcher (which does not set RANK: the callback takes the trainer's ranks). The forward stage's
machine share is bounded by a control: the same script without the sleep, run once for the module."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import CONTROL_RATIO, cli_env, run_cli
from scalelab.analysis import keys
from scalelab.store import Store
from scalelab.store.rundir import RunDir

pytest.importorskip("lightning", reason="PyTorch Lightning is not installed (pip install lightning)")
pytestmark = pytest.mark.timeout(300)

BATCHES, BATCH, EPOCHS = 6, 8, 2  # per rank and epoch: 6 batches of 8 samples
PARAM_BYTES = (16 * 32 + 32 + 32 * 4 + 4) * 4  # the two Linear layers, fp32

SCRIPT = f'''
import argparse, time
import torch
import lightning as L
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from scalelab.lightning import ScalelabCallback

p = argparse.ArgumentParser()
p.add_argument("--sleep-forward", type=float, default=0.0)
p.add_argument("--store", default=None)
a = p.parse_args()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, i):
        x, y = batch
        time.sleep(a.sleep_forward)
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


n = {BATCHES} * {BATCH} * 2
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs={EPOCHS}, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=1, callbacks=[ScalelabCallback(store=a.store, warmup_steps=1)])
trainer.fit(Net(), DataLoader(data, batch_size={BATCH}), DataLoader(data, batch_size={BATCH}))
'''


def only_run(store) -> dict:
    rows = Store(store).list_runs()
    assert len(rows) == 1, rows
    return Store(store).get(rows["run_id"].iloc[0])


@pytest.fixture(scope="module")
def control_forward_ms(tmp_path_factory) -> float:
    """The control: the script's forward stage without the sleep (Lightning's own launcher), a figure of the machine
    and its load (the tiny net's forward and Lightning's work around training_step) that no constant bounds."""
    folder = tmp_path_factory.mktemp("control")
    script = folder / "lit.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script), "--store", str(folder / "s")], capture_output=True, text=True,
                         timeout=280, cwd=folder, env=cli_env())
    assert res.returncode == 0, res.stderr[-3000:]
    return only_run(folder / "s")["summary"][keys.stage_ms("forward")]


def check_run(run: dict, sleep_s: float, control_ms: float) -> None:
    assert run["kind"] == "script" and run["status"] == "completed", run.get("reason")
    s = run["summary"]
    assert s[keys.RANKS_REPORTED] == 2
    steps = RunDir(run["dir"]).read_steps()
    for rank in (0, 1):  # one step per training batch Lightning gave the rank, validation outside them
        mine = [r for r in steps if r["rank"] == rank]
        assert len(mine) == BATCHES * EPOCHS and all(r["samples"] == BATCH for r in mine)
        for r in mine:
            assert r["forward(s)"] >= sleep_s
            events = [(op, nbytes) for op, _phase, _start, _s, nbytes in r["comm_events"]]
            # the one DDP bucket, and Lightning's own per-batch broadcast of its SIGTERM flag (one int64; the
            # training epoch loop's _broadcast_sigterm_tensor, Lightning >= 2.6): real traffic, metered too
            assert [e for e in events if e[0] == "allreduce"] == [("allreduce", PARAM_BYTES)]
            assert all(e == ("broadcast", 8) for e in events if e[0] != "allreduce") and len(events) <= 2
            assert r["comm_bytes_backward"] == sum(nbytes for _, nbytes in events)
    flags = 8 * (len(steps[0]["comm_events"]) - 1)
    assert s[keys.COMM_BYTES_BACKWARD_PER_STEP] == PARAM_BYTES + flags
    forward_ms = s[keys.stage_ms("forward")]
    print(f"\nforward {forward_ms:.1f} ms, control {control_ms:.1f} ms, injected {1e3 * sleep_s:.0f} ms")
    assert 1e3 * sleep_s <= forward_ms <= CONTROL_RATIO * control_ms + 1.3 * 1e3 * sleep_s, (forward_ms, control_ms)


def test_under_scalelab_run(tmp_path, control_forward_ms):
    script = tmp_path / "lit.py"
    script.write_text(SCRIPT)
    res = run_cli(["run", "--store", str(tmp_path / "store"), "--ranks", "2", "--", "python", str(script),
                   "--sleep-forward", "0.05"], timeout=280)
    assert res.returncode == 0, res.stderr[-3000:]
    check_run(only_run(tmp_path / "store"), 0.05, control_forward_ms)


def test_alone_with_lightnings_own_launcher(tmp_path, control_forward_ms):
    script = tmp_path / "lit.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script), "--sleep-forward", "0.05", "--store", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=280, cwd=tmp_path, env=cli_env())
    assert res.returncode == 0, res.stderr[-3000:]
    check_run(only_run(tmp_path / "s"), 0.05, control_forward_ms)
