"""Auto length on 2 gloo ranks: the ranks agree on the slowest rank's step times and stop at the same step."""
from __future__ import annotations

import pytest

from scalelab.config import TrainConfig
from scalelab.run.execute import execute
from scalelab.store import read_jsonl
from scalelab.store.rundir import RunDir
from scalelab.train.length import AGREE_EVERY

pytestmark = pytest.mark.timeout(180)

UNEVEN_MODEL = """
import os, random, time
import torch
from torch import nn

class Uneven(nn.Module):
    '''Rank 0 sleeps a steady 10 ms (precise after 5 steps on its own); rank 1 sleeps 5 or 60 ms at random.'''
    def __init__(self, spec):
        super().__init__()
        self.rank, self.rng = int(os.environ.get("RANK", "0")), random.Random(1)
        self.fc = nn.Linear(3 * 32 * 32, spec.num_classes)

    def forward(self, x):
        time.sleep(0.01 if self.rank == 0 else self.rng.choice((0.005, 0.06)))
        return self.fc(x.flatten(1))

def make(spec):
    return Uneven(spec)
"""


def test_two_ranks_stop_at_the_same_step_decided_on_the_slowest_rank(store, tmp_path):
    path = tmp_path / "uneven.py"
    path.write_text(UNEVEN_MODEL)
    cfg = TrainConfig(model=f"{path}:make", samples=960, eval_samples=16, global_batch=16, ranks=2, steps="auto",
                      time_budget_s=1.0, warmup_steps=1, threads=1, sample_interval_s=0.5)
    out = execute(cfg, store, say=lambda s: None)
    per_rank = [read_jsonl(out.run_dir / f"steps.rank{r}.jsonl") for r in (0, 1)]
    assert [r["step"] for r in per_rank[0]] == [r["step"] for r in per_rank[1]]  # the same steps, the same last
    timed = len(per_rank[0]) - cfg.warmup_steps
    assert timed < 60 - cfg.warmup_steps  # stopped before the epoch's end
    assert timed % AGREE_EVERY == 0 and timed >= 8  # decided at agreements only
    slowest = [max(a["wall(s)"], b["wall(s)"]) for a, b in zip(per_rank[0], per_rank[1]) if not a["warmup"]]
    assert sum(slowest) >= 1.0 and sum(slowest[:-AGREE_EVERY]) < 1.0  # stopped at the first agreement past budget
    results = RunDir(out.run_dir).read_results()
    # rank 0 alone (a steady 10 ms) would have stopped for precision: the slowest rank decided for both
    assert [r["length"]["stopped_by"] for r in results] == ["budget", "budget"]
    assert out.summary["precision/reached"] is False and out.summary["quality"] == "precision not reached"
    assert out.summary["steps/timed"] == timed
