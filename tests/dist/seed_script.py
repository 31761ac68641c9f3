"""The seed-like user script of the probe tests (its own argparse, its own loop, DDP) and what it leaves.

The probe version adds the lines marked `# PROBE` (5 added, 1 changed: the loop over `run.data(loader)`); the
plain version is the same script without them."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from scalelab.store.rundir import RunDir

SEED = '''"""A seed's train.py: its own argparse, its own loop, DDP."""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from scalelab import probe  # PROBE
from scalelab.zoo.data import build_data
from scalelab.zoo.models import build_model

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--batch", type=int, default=16, help="samples per rank")
p.add_argument("--sleep-forward", type=float, default=0.0)
p.add_argument("--sleep-backward", type=float, default=0.0)
p.add_argument("--hook", choices=["none", "before", "after"], default="none")
p.add_argument("--raise-at", type=int, default=0)
a = p.parse_args()

dist.init_process_group("gloo")
bundle = build_data("synthetic", samples=1024, eval_samples=64)
torch.manual_seed(0)
model = DDP(build_model("mlp", bundle.spec, depth=2, width=64))
calls = []


def my_hook(state, bucket):
    calls.append(bucket.buffer().numel())
    return default_hooks.allreduce_hook(state, bucket)


if a.hook == "before":
    model.register_comm_hook(None, my_hook)
run = probe.open()  # PROBE
if a.hook == "after":
    model.register_comm_hook(None, my_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loader = DataLoader(bundle.train, batch_size=a.batch, sampler=DistributedSampler(bundle.train, shuffle=False))
for i, (x, y) in enumerate(run.data(loader)):  # PROBE
    if i == a.steps:
        break
    if i + 1 == a.raise_at:
        raise ValueError(f"injected failure at step {i + 1}")
    with run.stage("forward"):  # PROBE
        time.sleep(a.sleep_forward)
        loss = F.cross_entropy(model(x), y)
    with run.stage("backward"):  # PROBE
        loss.backward()
        time.sleep(a.sleep_backward)
    with run.stage("optimizer"):  # PROBE
        opt.step()
        opt.zero_grad()
if a.hook != "none" and not calls:
    raise RuntimeError("the user's comm hook never ran")
dist.destroy_process_group()
'''


def seed_script(folder: Path, *, probe: bool) -> Path:
    """The seed script with the probe lines, or without them (stages become plain blocks)."""
    lines = []
    for line in SEED.splitlines():
        if not probe and "# PROBE" in line:
            if "run.stage(" in line:
                line = line[:line.index("with")] + "if True:"
            elif "run.data(loader)" in line:
                line = line.replace("run.data(loader)", "loader").replace("  # PROBE", "")
            else:
                continue
        lines.append(line)
    path = folder / ("train_probe.py" if probe else "train_plain.py")
    path.write_text("\n".join(lines) + "\n")
    return path


def collectives(run_dir: Path) -> Counter:
    """(op, bytes) of every collective of every rank, in steps and out."""
    rundir = RunDir(run_dir)
    events = [e for r in rundir.read_steps() for e in r.get("comm_events", [])]
    events += [e for res in rundir.read_results() for e in res["comm_outside"].get("comm_events", [])]
    return Counter((op, nbytes) for op, _phase, _start, _s, nbytes in events)
