"""Shared fixtures: a store in tmp, tiny configs, and teardown of any process group a test left behind."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def store(tmp_path):
    from scalelab.store import Store

    return Store(tmp_path / "store")


SLEEPY_MODEL = """
import time
import torch
from torch import nn


class Sleepy(nn.Module):
    '''A tiny model whose forward sleeps a known time: the known truth for the forward stage.'''

    def __init__(self, spec, delay_s={delay}):
        super().__init__()
        self.delay_s = delay_s
        self.fc = nn.Linear(int(torch.tensor(spec.shape).prod()), spec.num_classes)

    def forward(self, x):
        time.sleep(self.delay_s)
        return self.fc(x.flatten(1))


def make(spec):
    return Sleepy(spec)
"""


@pytest.fixture
def sleepy_model(tmp_path):
    """Path ref 'file.py:make' of a model whose forward sleeps 50 ms."""
    def write(delay_s: float = 0.05) -> str:
        path = tmp_path / f"sleepy_{int(delay_s * 1e6)}.py"
        path.write_text(textwrap.dedent(SLEEPY_MODEL.format(delay=delay_s)))
        return f"{path}:make"
    return write


def cli_env(extra: dict | None = None) -> dict:
    """Environment for running `python -m scalelab` in a subprocess from a source checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def run_cli(args: list[str], *, timeout: float = 180, cwd: Path | None = None, env: dict | None = None):
    import subprocess

    return subprocess.run([sys.executable, "-m", "scalelab", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=cli_env(env))
