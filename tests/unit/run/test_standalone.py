"""A probe opened by a script run with plain `python` records its own run in the store and finishes it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import cli_env
from scalelab.analysis import keys
from scalelab.store import Store

pytestmark = pytest.mark.timeout(180)

SCRIPT = """
import torch
from scalelab import probe
run = probe.open()
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    with run.step(samples=4):
        with run.stage("forward"):
            loss = model(torch.randn(4, 8)).pow(2).mean()
        if step == FAIL_AT:
            raise KeyError("boom")
        with run.stage("backward"):
            loss.backward()
        with run.stage("optimizer"):
            opt.step()
            opt.zero_grad()
"""


@pytest.mark.parametrize("fail_at", [-1, 3])
def test_a_plain_python_script_records_its_run(tmp_path, fail_at):
    (tmp_path / "train.py").write_text(SCRIPT.replace("FAIL_AT", str(fail_at)))
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=150,
                          env=cli_env({"SCALELAB_STORE": str(tmp_path / "store")}))
    store = Store(tmp_path / "store")
    run = store.get(store.list_runs()["run_id"].iloc[0])
    assert run["kind"] == "script" and run["model"] == "script:train.py"
    if fail_at < 0:
        assert done.returncode == 0, done.stderr[-2000:]
        assert run["status"] == "completed" and run["summary"][keys.STEPS_TOTAL] == 5
    else:
        assert done.returncode == 1
        assert run["status"] == "failed" and run["reason"] == "rank 0 raised KeyError: 'boom'"
