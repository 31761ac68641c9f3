"""A rank's place in the job: the one place that reads rank, world size and device from the environment.

torchrun (and any launcher after it) puts RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE in each rank's
environment, horovodrun HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK and HOROVOD_LOCAL_SIZE; `dist_context` reads
them, everything else receives the `DistContext`. How a rank process (or any process of a launch) that is done
ends: `exit_without_teardown`, the base layer's so that every entry point (run/, measure/) shares it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DistContext:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_context(device_kind: str) -> DistContext:
    """Read the rank layout torchrun or horovodrun put in the environment (single process when it is absent)."""
    def read(torchrun: str, horovodrun: str, default: int) -> int:
        return int(os.environ.get(torchrun, os.environ.get(horovodrun, default)))

    rank = read("RANK", "HOROVOD_RANK", 0)
    world = read("WORLD_SIZE", "HOROVOD_SIZE", 1)
    local_rank = read("LOCAL_RANK", "HOROVOD_LOCAL_RANK", 0)
    local_world = read("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE", 1)
    device = torch.device("cuda", local_rank) if device_kind == "cuda" else torch.device("cpu")
    return DistContext(rank, world, local_rank, local_world, device)


def exit_without_teardown(code: int = 0) -> None:
    """End this process now, its buffered output flushed, without the interpreter's teardown: for a process whose
    work is recorded (a rank's files written, a job's answer sent). Tearing down torch, torch._dynamo and sympy
    took 0.5-0.8 s a process on 2 cores, which a launch or a study's close waits for, and a namespaced rank was once
    seen to abort there after writing its result ("terminate called without an active exception"), failing a
    finished run. No atexit handler runs, and nothing buffered is written twice by a forked child."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
