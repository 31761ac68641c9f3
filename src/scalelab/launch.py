"""Where ranks come from: local ranks and multi-node runs through torchrun's own machinery, Slurm scripts.

This module is the one place that reads rank, world size and device from the environment (`dist_context`).
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelab.config import TrainConfig, default_threads

LOOPBACK = "127.0.0.1"


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
    """Read the rank layout torchrun put in the environment (single process when it is absent)."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = torch.device("cuda", local_rank) if device_kind == "cuda" else torch.device("cpu")
    return DistContext(rank, world, local_rank, local_world, device)


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_argv(cfg: TrainConfig, run_dir: Path, *, port: int | None = None, quiet: bool = False) -> list[str]:
    """The torchrun arguments that start this run's ranks on this node, each running `scalelab.worker`.

    One node: a static rendezvous on 127.0.0.1 with a free port. Several nodes: the same command on each node with
    the shared endpoint and this node's rank; node 0 hosts the rendezvous store.
    """
    if cfg.nnodes == 1:
        endpoint = f"{LOOPBACK}:{port or free_port()}"
    else:
        endpoint = cfg.rdzv_endpoint
    return [
        "--nnodes", str(cfg.nnodes),
        "--nproc-per-node", str(cfg.ranks),
        "--node-rank", str(cfg.node_rank),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", endpoint,
        "--max-restarts", "0",
        "--monitor-interval", "0.2",
        # quiet: the ranks' stdout/stderr go to files under the run directory instead of the terminal
        *(["--redirects", "3", "--log-dir", str(run_dir / "logs")] if quiet else []),
        "--module", "scalelab.worker",
        "--run-dir", str(run_dir),
    ]


def worker_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment for the ranks: threads per rank, and gloo kept on loopback for one-node runs."""
    env = {"OMP_NUM_THREADS": str(cfg.threads or default_threads(cfg.ranks))}
    if cfg.nnodes == 1:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # one node: collectives never leave the host
    if cfg.memory_limit:
        # Under a cap on address space: few malloc arenas (each reserves address space), and a fixed mmap
        # threshold so freed large blocks go back to the OS instead of lingering in the heap.
        env.update({"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"})
    return env


def run_torchrun(argv: list[str]) -> None:
    """Run the elastic agent in this process; raises ChildFailedError when a rank fails."""
    from torch.distributed.run import get_args_parser, run

    run(get_args_parser().parse_args(argv))


def slurm_script(cfg_path: str, *, nodes: int, gpus_per_node: int, time: str = "01:00:00",
                 partition: str | None = None, account: str | None = None, job_name: str = "scalelab",
                 extra_args: list[str] | None = None) -> str:
    """An sbatch script that runs `scalelab train` under torchrun on every node, node 0 hosting the rendezvous."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}" if gpus_per_node else "",
        f"#SBATCH --time={time}",
        f"#SBATCH --partition={partition}" if partition else "",
        f"#SBATCH --account={account}" if account else "",
        "set -euo pipefail",
        "# node 0's hostname is the rendezvous endpoint; the rendezvous store has no authentication:",
        "# keep the port inside the cluster's private network.",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "port=${SCALELAB_PORT:-29500}",
        "srun --kill-on-bad-exit=1 bash -c '" + " ".join([
            shlex.quote(sys.executable), "-m", "scalelab", "train", "--config", shlex.quote(cfg_path),
            "--nnodes", str(nodes), "--ranks", str(max(1, gpus_per_node)),
            '--node-rank "$SLURM_NODEID"', '--rdzv-endpoint "$0:$1"', "--run-id scalelab-$SLURM_JOB_ID",
            *[shlex.quote(a) for a in (extra_args or [])],
        ]) + "' \"$head\" \"$port\"",
    ]
    return "\n".join(line for line in lines if line) + "\n"
