"""`scalelab runs list | show | compare | tensorboard`: read the run store (and export a run's scalars)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd
import typer

from scalelab.cli.tables import print_fitted
from scalelab.cli.common import console
from scalelab.cli.options import store_option
from scalelab.errors import ScalelabError
from scalelab.lab.explain import explain, side_by_side
from scalelab.run.exports import write_scalars
from scalelab.store import open_store

app = typer.Typer(no_args_is_help=True, help="List, show and compare stored runs.")


# `runs list`'s columns in the order printed (and in --json), and the same most wanted first: where the terminal is
# too narrow, the last of those are dropped (and named)
LIST_COLUMNS = ("run_id", "created", "kind", "status", "model", "dataset", "ranks", "global_batch", "wrapper", "sync",
                "precision", "reason")
WANTED = ("run_id", "status", "kind", "ranks", "global_batch", "model", "created", "sync", "wrapper", "precision",
          "dataset", "reason")


def cell_text(col: str, value) -> str:
    """A catalog value as `runs list` prints it: nothing for a missing one, the creation time to the second (UTC)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    return str(value)[:19].replace("T", " ") if col == "created" else str(value)


@app.command("list")
def runs_list(
    status: Optional[str] = typer.Option(None, help="running, completed, failed or interrupted."),
    kind: Optional[str] = typer.Option(None, help="Kind of run (train, ...)."),
    model: Optional[str] = typer.Option(None, help="Only runs of this model."),
    limit: int = typer.Option(50, help="At most this many runs, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    wide: bool = typer.Option(False, "--wide", help="Every column, however wide the table gets."),
    store: Optional[Path] = store_option(),
) -> None:
    """List stored runs, newest first. Each run id is printed whole (every other command takes one); columns that
    do not fit the terminal are dropped, and named below the table (`--wide` shows them all)."""

    st = open_store(store)
    st.mark_stale()
    frame = st.list_runs(status=status, kind=kind, where={"model": model} if model else None, limit=limit)
    cols = [c for c in LIST_COLUMNS if c in frame]
    if as_json:
        print(frame[cols].to_json(orient="records"))
        return
    print_fitted(console, frame, order=LIST_COLUMNS, wanted=WANTED, wide=wide, keep=("run_id",),
                        text=cell_text)


@app.command("show")
def runs_show(run: str = typer.Argument(..., help="Run id or a unique prefix."),
              store: Optional[Path] = store_option()) -> None:
    """Show one run: status, config and summary."""

    print(json.dumps(open_store(store).get(run), indent=2, default=str))


@app.command("compare")
def runs_compare(
    runs: list[str] = typer.Argument(..., help="Run ids or unique prefixes."),
    metric: Optional[list[str]] = typer.Option(None, "--metric", "-m", help="Summary metrics to show (default: all)."),
    breakdown: bool = typer.Option(False, "--breakdown", help="Two runs' lost-speedup breakdowns side by side "
                                   "instead (see `scalelab explain`)."),
    store: Optional[Path] = store_option(),
) -> None:
    """Compare runs side by side: one row per run, one column per metric."""

    st = open_store(store)
    if breakdown:
        if len(runs) != 2:
            raise ScalelabError(f"runs: {len(runs)} given; --breakdown compares exactly 2")
        a, b = (explain(st, r) for r in runs)
        for ex in (a, b):
            if ex.table is None:
                raise ScalelabError(ex.notes[0])
        print(side_by_side(a.table, b.table, a.run["run_id"], b.run["run_id"]).to_string(index=False))
        return
    console.print(st.compare(runs, metric or None).T.to_string())


@app.command("tensorboard")
def runs_tensorboard(run: str = typer.Argument(..., help="Run id or a unique prefix."),
                     store: Optional[Path] = store_option()) -> None:
    """Write (or rewrite) a run's TensorBoard scalars into its directory; needs scalelab[tensorboard]."""

    out = write_scalars(Path(open_store(store).get(run)["dir"]), required=True)
    print(out if out is not None else "this run has no step records: nothing to export")
