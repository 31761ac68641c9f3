"""Where ranks come from: local ranks and multi-node runs through torchrun's own machinery, Slurm scripts.

Ranks read their place (rank, world size, device) from the environment in `scalelab.distenv` only.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import importlib
import logging
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from scalelab.config import TrainConfig, default_threads, namespace_nodes
from scalelab.engines import registry as engines
from scalelab.errors import ScalelabError
from scalelab.store.rundir import RunDir

TRAIN_WORKER = "scalelab.run.worker"

LOOPBACK = "127.0.0.1"
# One node: collectives never leave the host. gloo's sockets, and NCCL's bootstrap sockets (its data goes over
# NVLink/PCIe/shared memory), on the loopback interface.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
LOCAL_HOSTS = (LOOPBACK, "localhost")


class LaunchFailed(Exception):
    """A launcher other than torchrun saw a rank fail: `reason` is the root cause in one line, `trace` the
    launcher's whole output (torchrun raises its own ChildFailedError)."""

    def __init__(self, reason: str, trace: str):
        self.reason, self.trace = reason, trace
        super().__init__(reason)


class PortInUse(ScalelabError):
    """Node 0 of a multi-node run cannot host the rendezvous store: its --rdzv-endpoint port is taken."""


def free_port(host: str = LOOPBACK) -> int:
    """A port that was free a moment ago on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class LaunchSpec:
    """What a launcher needs to start a run's ranks on this node; nothing in it is specific to torchrun."""

    module: str  # the worker module every rank runs (`python -m module --run-dir DIR ...args`)
    run_dir: Path
    nproc_per_node: int
    env: dict[str, str]  # set for the ranks (threads, loopback interfaces, allocator)
    nnodes: int = 1
    node_rank: int = 0
    endpoint: str | None = None  # the rendezvous host:port of a multi-node run; None: one node on loopback
    quiet: bool = False  # the ranks' stdout/stderr go to the run's logs/ and the agent says nothing
    args: tuple[str, ...] = ()  # more arguments for the worker module


# A launcher starts the ranks of a LaunchSpec and returns when they are done; raises when one failed.
Launcher = Callable[[LaunchSpec], None]


def torchrun_args(spec: LaunchSpec, *, port: int | None = None) -> list[str]:
    """The torchrun arguments that start `spec`'s ranks on this node.

    One node: a static rendezvous on 127.0.0.1 with a free port (or the spec's endpoint: a namespaced node's
    address). Several nodes: the same command on each node with the shared endpoint and this node's rank; node 0
    hosts the rendezvous store.
    """
    endpoint = spec.endpoint or f"{LOOPBACK}:{port or free_port()}"
    return [
        "--nnodes", str(spec.nnodes),
        "--nproc-per-node", str(spec.nproc_per_node),
        "--node-rank", str(spec.node_rank),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", endpoint,
        "--max-restarts", "0",
        "--monitor-interval", "0.2",
        # torchrun's files (each rank's error file; quiet: its stdout and stderr too, instead of the terminal) under
        # the run directory: without a log dir it makes a temporary folder a launch that it never removes
        "--log-dir", str(RunDir(spec.run_dir).logs),
        *(["--redirects", "3"] if spec.quiet else []),
        "--module", spec.module,
        "--run-dir", str(spec.run_dir),
        *spec.args,
    ]


# Worker modules whose whole rank is `main(argv)`: a node agent may fork their ranks (`torchrun_launch(fork=True)`)
FORKABLE = (TRAIN_WORKER, "scalelab.measure.commbench_worker")


def torchrun_launch(spec: LaunchSpec, *, fork: bool = False) -> None:
    """The default launcher: torchrun's elastic agent in this process, with the spec's environment.

    `fork`: the ranks are forked from this process after it imported the worker module, instead of started as
    fresh interpreters that import torch and scalelab again (about a second of each namespaced launch on 2 cores).
    Only for a process that never ran a torch op (OpenMP's thread pool is not fork-safe) and started with the
    spec's environment (variables a C library reads once at start, e.g. glibc's malloc settings, are then already
    the ranks'): a node agent (run/nodeagent.py). A module not in FORKABLE is started fresh whatever `fork` says.
    """
    with environ(spec.env), _agent_log_level(logging.CRITICAL if spec.quiet else None):
        run_torchrun(torchrun_args(spec), fork_module=spec.module if fork and spec.module in FORKABLE else None)


@contextlib.contextmanager
def _agent_log_level(level: int | None):
    """Silence torchrun's agent for quiet runs (their failures are expected and recorded in the run)."""
    logger = logging.getLogger("torch.distributed.elastic")
    old = logger.level
    if level is not None:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


def train_launch_spec(cfg: TrainConfig, run_dir: Path, *, quiet: bool = False, resume: bool = False) -> LaunchSpec:
    """A training run's ranks on this node, each running `scalelab.run.worker`."""
    env = {**worker_env(cfg), **engines.get(cfg.engine).env(cfg, run_dir)}  # Horovod's knobs and timeline
    return LaunchSpec(module=TRAIN_WORKER, run_dir=run_dir, nproc_per_node=cfg.ranks, env=env,
                      nnodes=cfg.nnodes, node_rank=cfg.node_rank,
                      endpoint=cfg.rdzv_endpoint if cfg.nnodes > 1 else None, quiet=quiet,
                      args=("--resume",) if resume else ())  # continue from the run's last checkpoint


def torchrun_argv(cfg: TrainConfig, run_dir: Path, *, port: int | None = None, quiet: bool = False,
                  resume: bool = False) -> list[str]:
    """The torchrun arguments of a training run on this node (`train_launch_spec` through `torchrun_args`)."""
    return torchrun_args(train_launch_spec(cfg, run_dir, quiet=quiet, resume=resume), port=port)


def worker_env(cfg: TrainConfig) -> dict[str, str]:
    """Environment for the ranks: threads per rank, and gloo kept on loopback for one-node runs."""
    env = {"OMP_NUM_THREADS": str(cfg.threads or default_threads(cfg.ranks, namespace_nodes(cfg)))}
    if cfg.nnodes == 1:
        env.update(LOOPBACK_ENV)
    if cfg.memory_limit:
        # Under a cap on address space: one malloc arena. A thread's arena reserves 64 MiB of address space up
        # front, and when mmap is refused at the cap glibc retries the allocation inside that reserve, so with a
        # second arena a rank could grow by up to 64 MiB past its cap unseen. A fixed mmap threshold sends freed
        # large blocks back to the OS instead of letting them linger in the heap.
        env.update({"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_THRESHOLD_": "131072"})
    return env


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set `values` in this process's environment for the block, then restore it: torchrun's agent runs here and
    hands its own environment to the ranks."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_torchrun(argv: list[str], *, fork_module: str | None = None) -> None:
    """Run the elastic agent in this process; raises ChildFailedError when a rank fails. `fork_module`: its ranks
    are forked from this process and run that module's `main(argv)` (`torchrun_launch`).

    One node (static rendezvous on 127.0.0.1): this process hosts the rendezvous store itself, on loopback only
    (`loopback_store`); the endpoint's port is a wish, another free one is taken when it is in use. Several
    nodes: node 0 hosts torchrun's store on the shared endpoint; a port already in use there is PortInUse.
    """
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    from torch.distributed.run import get_args_parser
    from torch.distributed.run import run as run_fresh

    args = get_args_parser().parse_args(argv)
    run = run_fresh if fork_module is None else functools.partial(_run_forked, fork_module)
    if args.rdzv_backend != "static" or not args.rdzv_endpoint:
        run(args)
        return
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=-1)
    if str(args.nnodes) == "1" and host in LOCAL_HOSTS:
        with loopback_store(port) as bound:
            args.rdzv_endpoint = f"{LOOPBACK}:{bound}"
            run(args)
        return
    try:
        run(args)
    except torch.distributed.DistNetworkError as err:
        if int(args.node_rank) == 0 and "EADDRINUSE" in str(err):
            raise PortInUse(f"rdzv_endpoint {host}:{port} is already in use on this host (node 0 hosts the "
                            f"rendezvous store there): stop what holds port {port} or choose another port") from err
        raise


def _run_forked(module: str, args) -> None:
    """torchrun's `run(args)` with ranks forked from this process, each calling `module.main(script args)`."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args

    main = importlib.import_module(module).main  # imported here, once: every forked rank has it already
    args.start_method = "fork"
    config, _, _ = config_from_args(args)
    elastic_launch(config=config, entrypoint=main)(list(args.training_script_args))


def loopback_store(port: int) -> contextlib.AbstractContextManager[int]:
    """Host a one-node run's rendezvous store on 127.0.0.1 only, for the duration of the block; yields its port.

    Why: torchrun's static rendezvous creates its TCPStore server itself, and that server (libuv backend) binds
    the wildcard address ("::", every interface, IPv4 and IPv6) whatever host the endpoint names, so a one-node
    run would accept connections from the network on an unauthenticated key-value store. TCPStore has no
    "bind host" option, but it can serve on a socket handed to it (`master_listen_fd`), and with
    `multi_tenant=True` every TCPStore of this process on that port reuses the same server. So the server is
    created here, on a socket bound to 127.0.0.1, before torchrun runs; the static rendezvous (multi_tenant=True)
    then reuses it instead of binding its own. The socket is bound from the start, so no other process can take
    the port between choosing it and torchrun listening on it (no free_port() race).
    """
    return bound_store(LOOPBACK, port, any_port=True)


@contextlib.contextmanager
def bound_store(host: str, port: int, *, any_port: bool = False) -> Iterator[int]:
    """Host the rendezvous store of this process on `host` only (see `loopback_store`), for the block; yields its
    port. `any_port`: take another free port when `port` is in use (one node, where nobody else needs to know it).
    """
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # as TCPStore's own sockets: the port can be bound again right after the run, despite TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE or not any_port:
                raise
            sock.bind((host, 0))  # the wished port was taken meanwhile: any free one will do on one node
        bound = sock.getsockname()[1]
        store = TCPStore(host, bound, None, True, datetime.timedelta(seconds=60), wait_for_workers=False,
                         multi_tenant=True, master_listen_fd=sock.fileno(), use_libuv=True)
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now and closes it when it stops
    try:
        yield bound
    finally:
        del store  # the server stops once torchrun's handle on it is gone as well


def slurm_script(cfg_path: str, *, nodes: int, gpus_per_node: int, time: str = "01:00:00",
                 partition: str | None = None, account: str | None = None, job_name: str = "scalelab",
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None) -> str:
    """An sbatch script that runs `scalelab train` under torchrun on every node, node 0 hosting the rendezvous.

    `env`: exported for every node (e.g. GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME: the interface the nodes share).
    """
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
        *(f"export {key}={shlex.quote(value)}" for key, value in (env or {}).items()),
        "# node 0's address is the rendezvous endpoint: its NodeAddr, the address Slurm itself reaches it on (the",
        "# hostname unless slurm.conf gives an address). The rendezvous store has no authentication: keep the port",
        "# inside the cluster's private network.",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head_addr=$(scontrol show node "$head" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        "port=${SCALELAB_PORT:-29500}",
        # one step per node; the command is quoted once as a whole, so paths with spaces or quotes survive
        "srun --kill-on-bad-exit=1 bash -c " + shlex.quote(" ".join([
            shlex.quote(sys.executable), "-m", "scalelab", "train", "--config", shlex.quote(cfg_path),
            "--nnodes", str(nodes), "--ranks", str(max(1, gpus_per_node)),
            '--node-rank "$SLURM_NODEID"', '--rdzv-endpoint "$0:$1"', "--run-id scalelab-$SLURM_JOB_ID",
            *[shlex.quote(a) for a in (extra_args or [])],
        ])) + ' "${head_addr:-$head}" "$port"',
    ]
    return "\n".join(line for line in lines if line) + "\n"
