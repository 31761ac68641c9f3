"""`scalelab setup horovod`: build (or reuse the kept wheel of) Horovod for this torch and install it.

    scalelab setup horovod [--rebuild]
"""
from __future__ import annotations

import typer

from scalelab.cli.common import console
from scalelab.install.horovod import setup_horovod

app = typer.Typer(no_args_is_help=True, help="Install optional engines for this machine (horovod).")


@app.command("horovod")
def horovod(rebuild: bool = typer.Option(False, "--rebuild", help="Build again even when a kept wheel exists.")) -> None:
    """Build Horovod 0.28.1 (gloo, CPU) against the installed torch, keep the wheel, install it without touching
    torch, check hvd.gloo_built(). A failure is one line naming the step and its log file (exit code 2)."""

    setup_horovod(rebuild=rebuild, say=console.print)
