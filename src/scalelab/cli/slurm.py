"""`scalelab slurm`: an sbatch script that runs `scalelab train` on every node (under torchrun; with `--engine
horovod`, Horovod's per-node launch, run/hvdnode.py: no horovodrun, no ssh between the nodes)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import console
from scalelab.config import load_yaml
from scalelab.engines import registry
from scalelab.errors import ConfigError
from scalelab.run.launch import slurm_script

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def slurm(
    config: Path = typer.Option(..., "--config", "-c", help="YAML run config every node reads."),
    nodes: int = typer.Option(2, min=1, help="Nodes."),
    gpus_per_node: int = typer.Option(1, min=0, help="GPUs (ranks) per node."),
    time: str = typer.Option("01:00:00", help="Slurm time limit."),
    partition: Optional[str] = typer.Option(None, help="Slurm partition."),
    account: Optional[str] = typer.Option(None, help="Slurm account."),
    engine: Optional[str] = typer.Option(None, help="Training engine (ddp, horovod); default: the config's."),
    env: list[str] = typer.Option([], "--env", help="NAME=VALUE exported on every node (repeatable), e.g. "
                                  "NCCL_SOCKET_IFNAME=ib0: the interface the nodes share."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (default stdout)."),
) -> None:
    """Write an sbatch script that runs `scalelab train` on every node (torchrun, or Horovod's per-node launch)."""

    data = load_yaml(config)  # fail now, not on the cluster, if the file is missing or not YAML
    exported = parse_env(env)
    engine = engine or (data or {}).get("engine", "ddp")
    registry.get(engine, "engine")  # a name that is not an engine is refused here
    if engine == "horovod" and "GLOO_SOCKET_IFNAME" not in exported:
        raise ConfigError("--env", "", "--engine horovod needs the interface the nodes share for gloo's sockets, "
                                       "e.g. --env GLOO_SOCKET_IFNAME=eth0")
    script = slurm_script(str(config.resolve()), nodes=nodes, gpus_per_node=gpus_per_node, time=time,
                          partition=partition, account=account, env=exported,
                          extra_args=["--engine", engine] if engine != "ddp" else None)
    if output:
        output.write_text(script)
        console.print(f"wrote {output}")
    else:
        print(script, end="")


def parse_env(items: list[str]) -> dict[str, str]:
    """`NAME=VALUE` items as a dict; a bad one is a ConfigError naming it."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise ConfigError("--env", item, "allowed: NAME=VALUE with NAME a shell variable name, "
                                             "e.g. --env GLOO_SOCKET_IFNAME=eth0")
        out[name] = value
    return out
