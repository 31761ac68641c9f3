"""Real runs end to end on several processes: 2 gloo ranks through torchrun, two agents as two nodes, a rank
that raises."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli, start_cli
from scalelab.config import TrainConfig
from scalelab.run.execute import RunFailed, execute
from scalelab.store import read_jsonl

pytestmark = pytest.mark.timeout(240)


def test_two_gloo_ranks_end_to_end_through_the_cli(tmp_path):
    root = tmp_path / "store"
    proc = run_cli(["train", "--model", "mlp", "--dataset", "synthetic", "--samples", "200", "--eval-samples", "40",
                    "--global-batch", "32", "--ranks", "2", "--epochs", "2", "--store", str(root)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    from scalelab.store import Store

    runs = Store(root).list_runs()
    assert list(runs["status"]) == ["completed"]
    run_dir = root / "runs" / runs["run_id"][0]
    per_rank = [read_jsonl(run_dir / f"steps.rank{r}.jsonl") for r in (0, 1)]
    # 200 samples, global batch 32: 6 full steps + 1 of 8 samples split 4/4, for 2 epochs
    assert [len(s) for s in per_rank] == [14, 14]
    assert sum(r["samples"] for s in per_rank for r in s if r["epoch"] == 0) == 200
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ranks/reported"] == 2 and summary["steps/timed"] == 12
    assert 0 <= summary["eval/acc"] <= 1 and summary["throughput(samples/s)"] > 0
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["wrapper"], config["backend"], config["device"]) == ("ddp", "gloo", "cpu")
    assert "throughput" in proc.stdout
    # torchrun's own files are the run's (its rank error files), not a folder left in /tmp at every launch
    assert sorted(p.name for p in (run_dir / "logs").glob("*/attempt_0/*")) == ["0", "1"]


def test_two_agents_as_two_nodes_on_loopback(tmp_path):
    from scalelab.run.launch import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in (0, 1):
        procs.append(start_cli(["train", "--model", "mlp", "--samples", "128", "--eval-samples", "32", "--global-batch",
                                "16", "--steps", "4", "--nnodes", "2", "--node-rank", str(node), "--ranks", "1",
                                "--rdzv-endpoint", endpoint, "--run-id", "twonode", "--store",
                                str(tmp_path / f"node{node}")]))
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    assert (tmp_path / "node0/runs/twonode/steps.rank0.jsonl").exists()
    assert (tmp_path / "node1/runs/twonode/steps.rank1.jsonl").exists()


FAILING_MODEL = """
import os
from torch import nn

class Boom(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, spec.num_classes)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 3:
            raise RuntimeError("injected failure on rank 1")
        return self.fc(x.flatten(1))

def make(spec):
    return Boom(spec)
"""


def test_a_rank_that_raises_fails_the_run_with_its_rank_and_message(store, tmp_path):
    path = tmp_path / "boom.py"
    path.write_text(FAILING_MODEL)
    cfg = TrainConfig(model=f"{path}:make", samples=64, eval_samples=16, global_batch=8, steps=6, ranks=2)
    with pytest.raises(RunFailed) as info:
        execute(cfg, store, say=lambda s: None)
    assert "rank 1" in info.value.reason and "injected failure on rank 1" in info.value.reason
    row = store.get(info.value.run_id)
    assert row["status"] == "failed" and "rank 1" in row["reason"]
    assert "injected failure" in (store.run_dir(info.value.run_id) / "error.txt").read_text()
    kept = read_jsonl(store.run_dir(info.value.run_id) / "steps.rank0.jsonl")
    assert len(kept) >= 1  # records up to the failure are kept
