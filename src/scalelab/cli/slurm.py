"""`scalelab slurm`: an sbatch script that runs `scalelab train` under torchrun on every node."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import console
from scalelab.config import load_yaml


def slurm(
    config: Path = typer.Option(..., "--config", "-c", help="YAML run config every node reads."),
    nodes: int = typer.Option(2, min=1, help="Nodes."),
    gpus_per_node: int = typer.Option(1, min=0, help="GPUs (ranks) per node."),
    time: str = typer.Option("01:00:00", help="Slurm time limit."),
    partition: Optional[str] = typer.Option(None, help="Slurm partition."),
    account: Optional[str] = typer.Option(None, help="Slurm account."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (default stdout)."),
) -> None:
    """Write an sbatch script that runs `scalelab train` under torchrun on every node."""
    from scalelab.run.launch import slurm_script

    load_yaml(config)  # fail now, not on the cluster, if the file is missing or not YAML
    script = slurm_script(str(config.resolve()), nodes=nodes, gpus_per_node=gpus_per_node, time=time,
                          partition=partition, account=account)
    if output:
        output.write_text(script)
        console.print(f"wrote {output}")
    else:
        print(script, end="")
