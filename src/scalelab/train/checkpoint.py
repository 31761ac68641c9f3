"""Checkpoints a killed run can be resumed from: written atomically every N steps, read back with weights_only.

Layout under the run directory::

    checkpoints/step-00000040/state.pt      rank 0: model, optimizer, grad scaler, step, epoch, evaluations
    checkpoints/step-00000040/rng.rank<r>.pt every rank: its torch RNG states
    checkpoints/latest.json                  {"step": 40, "dir": "step-00000040"}: moved last, atomically

Every file is written to a temporary name and renamed. latest.json moves only after every rank has written its
files (a barrier), so a kill at any moment leaves latest.json pointing at a complete checkpoint or at the one
before. The learning rate needs no state (a function of the step, train/lr.py), and the sampler's position is
the step: the permutation of an epoch is a function of (seed, epoch), so resuming skips the epoch's first
`step % steps_per_epoch` batches. Data-parallel replicas hold identical weights and optimizer state, so rank 0
writes them once.

Checkpoints are loaded with `torch.load(weights_only=True)`: a crafted file cannot run code.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.errors import ScalelabError
from scalelab.store import atomic_file
from scalelab.store.files import read_json, write_json_atomic
from scalelab.store.rundir import RunDir



@dataclass
class Checkpoint:
    step: int
    epoch: int
    state: dict  # model, optimizer, scaler (or None), evals
    rng: dict  # this rank's RNG states


def _save_atomic(obj, path: Path) -> None:
    with atomic_file(path, "wb") as f:
        torch.save(obj, f)


def _rng_state() -> dict:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return rng


def save(run_dir: Path, *, rank: int, step: int, epoch: int, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer, scaler, evals: list[dict]) -> None:
    """Write this rank's part of the checkpoint at `step`; rank 0 then publishes it and drops older ones."""
    root = RunDir(run_dir).checkpoints
    here = root / f"step-{step:08d}"
    here.mkdir(parents=True, exist_ok=True)
    _save_atomic(_rng_state(), here / f"rng.rank{rank}.pt")
    if rank == 0:
        _save_atomic({"step": step, "epoch": epoch, "model": model.state_dict(),
                      "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict() if scaler else None,
                      "evals": evals}, here / "state.pt")
    if dist.is_initialized():
        dist.barrier()  # every rank's files are on disk before latest.json names them
    if rank == 0:
        write_json_atomic(root / "latest.json", {"step": step, "dir": here.name})
        for old in root.glob("step-*"):
            if old.name != here.name:
                shutil.rmtree(old, ignore_errors=True)


def latest_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    path = RunDir(run_dir).checkpoints / "latest.json"
    return int(read_json(path)["step"]) if path.exists() else None


def load(run_dir: Path, rank: int, device: torch.device) -> Checkpoint:
    """The newest complete checkpoint, as this rank needs it."""
    path = RunDir(run_dir).checkpoints / "latest.json"
    if not path.exists():
        raise ScalelabError(f"{run_dir.name}: no checkpoint to resume from (the run needs --checkpoint-every)")
    here = RunDir(run_dir).checkpoints / read_json(path)["dir"]
    try:
        state = torch.load(here / "state.pt", map_location=device, weights_only=True)
        rng_file = here / f"rng.rank{rank}.pt"
        rng = torch.load(rng_file, weights_only=True) if rng_file.exists() else {}
    except Exception as err:  # noqa: BLE001 - unpickling refusals and corrupt files alike
        raise ScalelabError(f"{here}: checkpoint cannot be loaded ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''})") from None
    return Checkpoint(step=int(state["step"]), epoch=int(state["epoch"]), state=state, rng=rng)


def restore(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler) -> None:
    """Put the checkpoint's weights, optimizer and scaler state and this rank's RNG back."""
    model.load_state_dict(ckpt.state["model"])
    optimizer.load_state_dict(ckpt.state["optimizer"])
    if scaler is not None and ckpt.state.get("scaler"):
        scaler.load_state_dict(ckpt.state["scaler"])
    if "cpu" in ckpt.rng:
        torch.set_rng_state(ckpt.rng["cpu"])
    if "cuda" in ckpt.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(ckpt.rng["cuda"])
