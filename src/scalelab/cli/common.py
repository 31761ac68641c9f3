"""What the command modules share: consoles, progress lines, an experiment's context and its printed result."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from scalelab.lab.base import Context
from scalelab.lab.cells import Cells
from scalelab.lab.progress import PlainProgress
from scalelab.lab.terminal import terminal_width, wrapped
from scalelab.store import open_store

console = Console()
err_console = Console(stderr=True)


def say(line: str) -> None:
    """Progress lines are plain text: '[study 1/3]' must not be read as rich markup; broken to the terminal's width
    where one is known (lab.terminal: COLUMNS or a terminal), else whole, for logs."""
    for part in wrapped(line, terminal_width()):
        console.print(part, markup=False, highlight=False, soft_wrap=True)


def run_failed(err: Exception) -> typer.Exit:
    """Print a failed run as one line (however long); the caller raises the returned exit code 1."""
    err_console.print(f"error: {err}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def store_and_out(store: Path | None, study: str, out: Path | None):
    """The run store and an experiment's output folder (default STORE/studies/STUDY)."""

    st = open_store(store)
    return st, out or st.root / "studies" / study


def experiment_context(store, study: str, out_dir: Path, write=say):
    """A one-experiment context: the study's cell engine with progress lines, tables and plots into `out_dir`."""

    progress = PlainProgress(write)
    return Context(Cells(store, study, progress=progress), out_dir, progress.say)


def show_result(result, *, wide: bool = False, columns: dict | None = None, captions: dict | None = None) -> None:
    """Each table with the columns that fit the terminal (cli.tables: the report's answer columns first, the rest
    named below it; `wide`: every column), then notes and files, wrapped to the terminal."""
    from scalelab.cli.tables import render

    for name, frame in result.tables.items():
        if name.endswith("_curves"):
            continue
        console.rule(name)
        frame = frame.drop(columns=["run_id"], errors="ignore")
        for line in render(frame, None if wide else console.width, (columns or {}).get(name),
                           [(captions or {}).get(name, "")]):
            print(line)
    for key, value in result.notes.items():
        console.print(f"{key}: {value}", markup=False, highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in result.files), markup=False, highlight=False)
