"""`scalelab runs list | show | compare | tensorboard`: read the run store (and export a run's scalars)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scalelab.cli.common import console
from scalelab.cli.options import store_option
from scalelab.errors import ScalelabError
from scalelab.lab.explain import explain, side_by_side
from scalelab.run.exports import write_scalars
from scalelab.store import open_store

app = typer.Typer(no_args_is_help=True, help="List, show and compare stored runs.")


@app.command("list")
def runs_list(
    status: Optional[str] = typer.Option(None, help="running, completed, failed or interrupted."),
    kind: Optional[str] = typer.Option(None, help="Kind of run (train, ...)."),
    model: Optional[str] = typer.Option(None, help="Only runs of this model."),
    limit: int = typer.Option(50, help="At most this many runs, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = store_option(),
) -> None:
    """List stored runs, newest first."""

    st = open_store(store)
    st.mark_stale()
    frame = st.list_runs(status=status, kind=kind, where={"model": model} if model else None, limit=limit)
    cols = [c for c in ("run_id", "created", "kind", "status", "model", "dataset", "ranks", "global_batch",
                        "wrapper", "sync", "precision", "reason") if c in frame]
    if as_json:
        print(frame[cols].to_json(orient="records"))
        return
    table = Table(show_header=True)
    for c in cols:
        table.add_column(c)
    for row in frame[cols].itertuples(index=False):
        table.add_row(*["" if v is None else str(v) for v in row])
    console.print(table)


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
