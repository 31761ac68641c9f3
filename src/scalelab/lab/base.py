"""What an experiment is: one registered object per experiment (torchtitan's TrainSpec idea).

An experiment is one module of scalelab.experiments: its options, its cells, its table, its plots, its sentences
and its options in the built-in study, declared in its `EXPERIMENT`; the study, the report and the CLI read the
registry (`lab.registry`), so adding an experiment is that module plus its test (experiments/bucket_sweep.py is
the example). Two shapes:

    EXPERIMENT = Experiment(name="amp", command="amp", title=..., question=..., help=...,
                            cells=amp_cells,        # (base, opts) -> list[Cell], run as one group
                            analyse=amp_tables,     # (runs, base, opts) -> Result (tables, notes)
                            figures=amp_figures,    # (result, out_dir) -> list of PNG paths
                            interpret=amp_sentences,  # (result) -> (sentences, recommendation card)
                            decide=amp_decisions)  # (result) -> [lab.decision.Decision], the card's source

and, for experiments whose cells depend on earlier outcomes (the max-batch search, calibrate-then-predict),
`run=(ctx, base, opts) -> Result` that drives `ctx.cells` itself.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from scalelab.errors import ConfigError
from scalelab.store import write_json_atomic, write_text_atomic


@dataclass
class Result:
    """An experiment's answer: tables computed from stored runs, the files written, and notes for the report."""
    name: str
    tables: dict[str, pd.DataFrame]
    files: list[Path] = field(default_factory=list)
    notes: dict = field(default_factory=dict)  # shown in the report
    meta: dict = field(default_factory=dict)  # for the experiment's figures, not shown




@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of an experiment: its CLI flag (--NAME with '_' as '-'), study YAML key and parser."""
    name: str
    default: Any
    help: str
    parse: Callable[[Any, str], Any] | None = None  # (value from CLI text or YAML, option name) -> value
    flag: str | None = None  # CLI spelling when it is not --NAME (e.g. a boolean's "--pin-memory/--no-pin-memory")

    def value(self, raw: Any) -> Any:
        return self.parse(raw, self.name) if self.parse is not None and raw is not None else raw


@dataclass(frozen=True)
class Context:
    """What an experiment's run gets: the cell engine of its study and where its tables and plots go."""
    cells: Any  # lab.cells.Cells
    out_dir: Path
    say: Callable[[str], None]
    tables: bool = True  # write each table as CSV and JSON too (a study saves its results instead: lab.results)


@dataclass(frozen=True)
class StudyPlan:
    """What an experiment's options in the built-in study may depend on (`Experiment.study_options`)."""
    quick: bool  # the quick study (150 s) rather than the default one (10 minutes)
    gpus: int  # CUDA devices visible
    comm_model: dict  # the communication-side experiments' base fields (the MLP, its length)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    name: str  # the study's key, e.g. "batch_sweep"
    command: str | None  # the CLI command, e.g. "batch-sweep"; "compare strategies" is a sub-command of "compare"
    base: bool = True  # whether it starts from a training config (the CLI then takes every train flag)
    title: str  # the report section's title
    question: str  # the seeds' question it answers (shown under the title)
    help: str  # one line for `scalelab COMMAND --help`
    section: str  # the report section's id
    options: tuple[Option, ...] = ()
    defaults: dict = field(default_factory=dict)  # base config fields the CLI starts from (below YAML and flags)
    cells: Callable[..., list] | None = None  # (base, opts) -> cells of one group
    analyse: Callable[..., Result] | None = None  # (runs, base, opts) -> Result
    run: Callable[..., Result] | None = None  # (ctx, base, opts) -> Result, instead of cells + analyse
    figures: Callable[[Result, Path], list[Path]] | None = None
    interpret: Callable[[Result], tuple[list[str], str | None]] | None = None
    # the experiment's recommendations as decisions (scalelab.lab.decision), the ones its card is rendered from;
    # the report's invariant check reads them (None: it recommends nothing)
    decide: Callable[[Result], list] | None = None
    captions: dict[str, str] = field(default_factory=dict)  # table or figure stem -> caption
    columns: dict[str, list[str]] = field(default_factory=dict)  # table -> the ~10 columns that carry its answer
    order: int = 100  # place in the study and the report
    interleave: bool = False  # run the cells' repeats in rounds (A B C, A B C: cells compared with each other)
    # also over a user's script: `scalelab CMD ... -- python train.py ARGS` (base is then a run.script.ScriptConfig)
    takes_command: bool = False
    # its options in the built-in study, owned by the experiment (None from the call: not in that study); and
    # whether the quick study (150 s) runs it too
    study_options: Callable[[StudyPlan], dict | None] | None = None
    quick: bool = True
    version: int = 1  # of its table and sentences: raise it when they change, so saved results are re-derived

    def __post_init__(self) -> None:
        if (self.run is None) == (self.cells is None or self.analyse is None):
            raise ValueError(f"experiment {self.name}: give either run, or cells and analyse")

    def option_values(self, given: dict | None) -> dict:
        """Defaults, overridden by `given` (study YAML or CLI), each parsed; unknown keys are refused."""
        known = {o.name: o for o in self.options}
        given = {k: v for k, v in (given or {}).items() if k != "set"}
        for key in given:
            if key not in known:
                raise ConfigError(f"{self.name}.{key}", given[key],
                                  f"unknown option; allowed: {', '.join(known) or 'none'}")
        return {name: o.value(given.get(name, o.default)) for name, o in known.items()}

    def execute(self, ctx: Context, base, opts: dict) -> Result:
        """Run (or replay) the experiment: its cells through the engine, then its tables, then its figures."""
        if self.run is not None:
            result = self.run(ctx, base, opts)
        else:
            results = ctx.cells.run(self.cells(base, opts), group=self.name, interleave=self.interleave)
            # a cell launched several times is one row, its launches pooled (scalelab.analysis.repeats)
            rows = ctx.cells.rows(results)
            completed = [r for r in rows if r["status"] == "completed"]
            result = self.analyse(completed, base, opts)
            failed = {r.cell.label: r.reason or r.status for r in results
                      if r.status != "completed" and not r.cell.accepts(r.status, r.reason)}  # not an outcome
            if failed:  # the section says which cell failed, why, and how to measure it again (issue 60)
                result.notes[FAILED_CELLS] = {label: f"{why}; {REMEASURE}" for label, why in failed.items()}
        return self.write(result, ctx.out_dir, tables=ctx.tables)

    def write(self, result: Result, out_dir: Path, *, tables: bool = True) -> Result:
        """Every table as CSV and JSON (unless `tables` is off), then the experiment's figures, into `out_dir`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        for key, frame in result.tables.items() if tables else ():
            paths = write_table(frame, out_dir, key)
            result.files += [p for p in (paths["csv"], paths["json"]) if p not in result.files]
        if self.figures is not None and any(len(t) for t in result.tables.values()):
            result.files += [p for p in self.figures(result, out_dir) if p is not None]
        return result


FAILED_CELLS = "failed cells"  # a Result's note: cell label -> why it failed and how to re-measure it
REMEASURE = "running the same study again re-measures it (its finished cells are kept)"


def failed_cells(answered: list[tuple]) -> list[str]:
    """"experiment: cell" for every cell the study's experiments could not measure (their FAILED_CELLS note), and
    "experiment" for an experiment that failed as a whole (its "failed" note)."""
    out = []
    for experiment, result in answered:
        out += [f"{experiment.name}: {label}" for label in (result.notes.get(FAILED_CELLS) or {})]
        if "failed" in result.notes:
            out.append(experiment.name)
    return out


def write_table(frame: pd.DataFrame, out_dir: Path, name: str) -> dict[str, Path]:
    """A table as CSV and JSON (records), both written atomically."""
    import json


    csv_path, json_path = out_dir / f"{name}.csv", out_dir / f"{name}.json"
    write_text_atomic(csv_path, frame.to_csv(index=False))
    write_json_atomic(json_path, json.loads(frame.to_json(orient="records")))
    return {"csv": csv_path, "json": json_path}


# ---------------------------------------------------------------- option parsers shared by experiments

def int_list(value: Any, name: str) -> list[int]:
    """'32,64,128' or [32, 64, 128] -> [32, 64, 128] (integers >= 0, at least one)."""
    items = str(value).split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    try:
        values = [int(v) if not isinstance(v, bool) and float(v) == int(v) else None
                  for v in items if str(v).strip()] if items is not None else None
    except (TypeError, ValueError, OverflowError):
        values = None
    if not values or any(v is None or v < 0 for v in values):
        raise ConfigError(name, value, "allowed: comma-separated integers >= 0, e.g. 32,64,128")
    return values


def positive_ints(value, name: str) -> list[int]:
    """'2,8' or [2, 8] -> [2, 8], each an integer >= 1 (a depth, a width, a worker count)."""
    values = int_list(value, name)
    if min(values) < 1:
        raise ConfigError(name, value, "allowed: comma-separated integers >= 1, e.g. 2,8")
    return values


def name_list(value: Any, name: str, allowed: Sequence[str] | None = None) -> list[str]:
    """'a,b' or ["a", "b"] -> ["a", "b"], each in `allowed` when given (at least one)."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    names = [str(v).strip() for v in items if str(v).strip()] if items is not None else []
    if not names:
        raise ConfigError(name, value, f"give at least one{': ' + ', '.join(allowed) if allowed else ''}")
    for n in names:
        if allowed is not None and n not in allowed:
            raise ConfigError(name, n, f"allowed: {', '.join(allowed)}")
    return names


def bool_list(value: Any, name: str) -> list[bool]:
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, bool) for v in items):
        raise ConfigError(name, value, "allowed: true, false or a list of them")
    return list(items)


def number(lo: float, hi: float | None = None, *, integer: bool = False) -> Callable[[Any, str], Any]:
    """A parser for one number in [lo, hi]."""
    def parse(value: Any, name: str):
        try:
            ok = not isinstance(value, bool) and (float(value) == int(value) if integer else True)
            x = (int(value) if integer else float(value)) if ok else None
        except (TypeError, ValueError, OverflowError):
            x = None
        if x is None or x != x or x < lo or (hi is not None and x > hi):
            kind = "an integer" if integer else "a number"
            # a number given as text (a CLI flag) is reported as the number it is: "accumulate: 1 is not allowed"
            raise ConfigError(name, value if x is None or x != x else x,
                              f"allowed: {kind} >= {lo:g}" + (f" and <= {hi:g}" if hi is not None else ""))
        return x
    return parse


def choice(*allowed: str) -> Callable[[Any, str], str]:
    def parse(value: Any, name: str) -> str:
        if value not in allowed:
            raise ConfigError(name, value, f"allowed: {', '.join(allowed)}")
        return value
    return parse


def launches_option(default: int = 3) -> "Option":
    """How many times each compared cell is launched, interleaved in rounds (A B C, A B C, ...), so drift between
    launches hits every cell alike and its headline figures take their interval from all launches
    (scalelab.analysis.repeats)."""
    return Option(name="launches", default=default,
                  help="Launches per cell, interleaved in rounds; headline intervals come from all of them "
                       "(1: one launch, intervals from its steps only).",
                  parse=number(1, 40, integer=True))
