"""Scenarios with known answers (issue 28): each is a real 2-rank run whose truth was injected, and the figures that
must attribute it. tests/dist/test_sense_dist.py asserts them; benchmarks/sense.py prints them.

- straggler: rank 1's forward sleeps STRAGGLER_S more each step; the other rank stands in the allreduce meanwhile.
  Truth: waiting for peers ~ STRAGGLER_S; communication on the critical path stays that of the bytes.
- data wait: every sample takes DATA_SLEEP_S to load (no loader workers): the data stage ~ per-rank batch x that,
  and it is not communication.
- link: two namespaced nodes joined by links shaped to LINK_GBPS by the kernel (tbf): no collective beats them.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from scalelab.config import TrainConfig

STRAGGLER_S = 0.040
DATA_SLEEP_S = 0.002
PER_RANK_BATCH = 8
LINK_GBPS = 0.2

STRAGGLER_MODEL = """
import time
import torch
import torch.distributed as dist
from torch import nn


class Straggler(nn.Module):
    '''Rank 1's forward sleeps {delay} s longer than every other rank's: a straggler of known size.'''

    def __init__(self, spec):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(spec.shape).prod()), 256), nn.ReLU(),
                                nn.Linear(256, spec.num_classes))

    def forward(self, x):
        if self.training and dist.is_initialized() and dist.get_rank() == 1:
            time.sleep({delay})
        return self.fc(x)


def make(spec):
    return Straggler(spec)
"""

SLOW_DATA = """
import time
import torch
from torch.utils.data import Dataset


class Slow(Dataset):
    '''Every sample takes {sleep} s to load: a data wait of known size.'''

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 1, 32, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        time.sleep({sleep})
        return self.x[i], self.y[i]


def make():
    return Slow(256, 0), Slow(16, 1), 4
"""


def _write(folder: Path, name: str, source: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:make"


def straggler(folder: Path) -> TrainConfig:
    return TrainConfig(model=_write(folder, "straggler", STRAGGLER_MODEL.format(delay=STRAGGLER_S)),
                       dataset="synthetic", samples=256, eval_samples=16, global_batch=2 * PER_RANK_BATCH,
                       steps=14, warmup_steps=2, ranks=2, sync="allreduce", sample_interval_s=0.5)


def data_wait(folder: Path) -> TrainConfig:
    return TrainConfig(model="mlp", dataset=_write(folder, "slow_data", SLOW_DATA.format(sleep=DATA_SLEEP_S)),
                       global_batch=2 * PER_RANK_BATCH, steps=12, warmup_steps=2, ranks=2, num_workers=0,
                       sample_interval_s=0.5)


def shaped_link(folder: Path) -> TrainConfig:
    return TrainConfig(model="mlp", dataset="synthetic", samples=128, eval_samples=16, global_batch=16, steps=6,
                       warmup_steps=1, ranks=1, local_nodes=2, link_gbps=LINK_GBPS, sync="allreduce",
                       sample_interval_s=0.5)
