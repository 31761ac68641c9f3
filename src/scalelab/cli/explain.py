"""`scalelab explain RUN`: why a run is not N times faster, from stored runs only (scalelab.lab.explain)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import say
from scalelab.cli.options import store_option
from scalelab.lab.explain import explain, lines
from scalelab.lab.pooled import cell_lines, study_cell
from scalelab.lab.stragglers import explain_lines
from scalelab.lab.terminal import terminal_width
from scalelab.store import open_store


def explain_cmd(run: str = typer.Argument(..., help="Run id or a unique prefix."),
                store: Optional[Path] = store_option()) -> None:
    """The lost-speedup breakdown of a stored run: ideal step -> measured step in parts, each with its 95 %
    interval, the largest cause and what to try; then the straggler, if one rank arrived last beyond noise, and
    the stage where it lost its time (a run without timed steps: from its collectives alone). A 1-rank run and a
    no-op-collectives variant get one line on what they are. Runs nothing: the 1-worker run and the no-sync and no-op
    variants are the stored runs of those configs (`scalelab scale` stores them all)."""

    opened = open_store(store)
    ex = explain(opened, run)
    # why not N x, then who the others waited for (not in a no-op-collectives variant: its collectives do nothing),
    # then, for a launch of a study cell, the cell's pooled figures the report shows
    waited = [] if (ex.run.get("config") or {}).get("noop_collectives") else explain_lines(ex.run)
    for line in lines(ex, terminal_width()) + waited + cell_lines(study_cell(opened.root, ex.run), ex.run["run_id"]):
        say(line)
