"""Scenarios with known answers (issue 28): each is a real 2-rank run whose truth was injected, and the figures that
must attribute it. tests/dist/test_sense_dist.py asserts them; benchmarks/sense.py prints them.

- straggler: rank 1's forward sleeps STRAGGLER_S more each step; the other rank stands in the allreduce meanwhile.
  Truth: waiting for peers ~ STRAGGLER_S; communication on the critical path stays that of the bytes.
- data wait: every sample takes DATA_SLEEP_S to load (no loader workers): the data stage ~ per-rank batch x that,
  and it is not communication.
- link: two namespaced nodes joined by links shaped to LINK_GBPS by the kernel (tbf): no collective beats them.
- learning: the MNIST-1D CNN beside a model blind to its input (one learnable score per class), SEEDS seeds each.
  Truth: the blind model can at best always guess one class, which is chance by definition; the CNN learns.

A figure that is the machine's own work (communication on the critical path, the ordinary imbalance of 2 ranks on
shared cores) scales with the machine's speed, so no constant bounds it: each scenario's control is the same config
without its injected cause (`straggler(folder, delay_s=0)`, `data_wait(folder, sleep_s=0)`), measured in the same
session, and the tests bound such a figure by the control's (issue 38). `Runs` executes each config once, so the
tests that read a run (test_sense_dist, test_breakdown_dist) share it.
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


class Runs:
    """The stored runs ({config, summary}) of the configs asked for, each executed once into one store under
    `folder`: tests/conftest.py's `scenario_runs` keeps one a session, so a run two tests read (the straggler and its
    control) is launched once."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._done: dict[str, dict] = {}

    def __call__(self, cfg: TrainConfig) -> dict:
        from scalelab.run.execute import execute
        from scalelab.store import Store

        key = repr(cfg)  # a dataclass of plain fields: equal configs, equal keys
        if key not in self._done:
            store = Store(self.folder / "store")
            done = execute(cfg, store, say=lambda _: None)
            self._done[key] = {"config": store.get(done.run_id)["config"], "summary": done.summary}
        return self._done[key]


def _write(folder: Path, name: str, source: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return f"{path}:make"


def straggler(folder: Path, delay_s: float = STRAGGLER_S) -> TrainConfig:
    """`delay_s`: rank 1's extra sleep per step (0: the control, the same config without the straggler)."""
    model = _write(folder, f"straggler_{round(1e3 * delay_s)}ms", STRAGGLER_MODEL.format(delay=delay_s))
    return TrainConfig(model=model, dataset="synthetic", samples=256, eval_samples=16, global_batch=2 * PER_RANK_BATCH,
                       steps=14, warmup_steps=2, ranks=2, sync="allreduce", sample_interval_s=0.5)


def data_wait(folder: Path, sleep_s: float = DATA_SLEEP_S) -> TrainConfig:
    """`sleep_s`: each sample's load time (0: the control, the same config without the data wait)."""
    dataset = _write(folder, f"slow_data_{round(1e3 * sleep_s)}ms", SLOW_DATA.format(sleep=sleep_s))
    return TrainConfig(model="mlp", dataset=dataset, global_batch=2 * PER_RANK_BATCH, steps=12, warmup_steps=2,
                       ranks=2, num_workers=0, sample_interval_s=0.5)


def shaped_link(folder: Path) -> TrainConfig:
    return TrainConfig(model="mlp", dataset="synthetic", samples=128, eval_samples=16, global_batch=16, steps=6,
                       warmup_steps=1, ranks=1, local_nodes=2, link_gbps=LINK_GBPS, sync="allreduce",
                       sample_interval_s=0.5)


SEEDS = 2
LEARN_STEPS = 300

BLIND_MODEL = """
import torch
from torch import nn


class Blind(nn.Module):
    '''One learnable score per class, whatever the input: the best it can learn is to always guess one class.'''

    def __init__(self, spec):
        super().__init__()
        self.score = nn.Parameter(torch.zeros(spec.num_classes))

    def forward(self, x):
        return self.score.expand(x.shape[0], -1)


def make(spec):
    return Blind(spec)
"""


def learner(folder: Path, seed: int, *, blind: bool) -> TrainConfig:
    """The amp study's MNIST-1D set-up (1 rank, batch 32, lr 0.03), shorter; `blind`: the input-blind model."""
    model = _write(folder, "blind", BLIND_MODEL) if blind else "cnn"
    return TrainConfig(model=model, dataset="mnist1d", global_batch=32, lr=0.03, steps=LEARN_STEPS,
                       warmup_steps=1, ranks=1, seed=seed, eval_every=0)
