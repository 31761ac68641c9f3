"""One parameterised comparison: the same base config over the values of one axis (sync strategies, backends,
training engines), each value a cell beside its exposed-communication baseline.

The baseline is the same config with no-op collectives (the value's own work kept, only the collectives skipped;
sync.registry.baseline_fields): the difference of median step times is the exposed communication, measured by
ablation, not taken as a remainder. A value that cannot run here (a backend this machine lacks, Horovod not
installed, a config the value cannot honour) is a row with the reason, never dropped. Cells that two comparisons
share (DDP on gloo and its baseline are a cell of strategies, backends and engines alike) run once in a study.
This module registers no experiment: strategies.py, backends.py and engines.py each declare one axis of it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from scalelab.analysis.compare import comparison_table, trusted
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Context, Result
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked
from scalelab.lab.decision import Decision, rank
from scalelab.report import figures
from scalelab.sync import registry as syncs

DEFAULTS = {"model": "mlp", "ranks": 2, "steps": 20}
EXPOSED_NOTE = ("exposed comm = median step - median step at the fastest rank of the same config with no-op "
                "collectives (the strategy's own work kept), not clipped, with a conservative 95 % interval; comm = "
                "the union of each step's collective intervals; comm_critical = the part after every peer arrived "
                "(waiting_for_peers: before); hidden = waiting_for_peers + comm_critical - exposed and overlap = "
                "hidden / (waiting_for_peers + comm_critical), one interval; interference = exposed - "
                "(waiting_for_peers + comm_critical) when positive beyond noise; comm_wait = from the last gradient "
                "produced to the end of the sync, measured directly; quality flags an overlap above 1, or above 0 for a "
                "blocking strategy, beyond its interval")
LOOPBACK_NOTE = ("loopback bytes: the host's loopback counter (all ranks) sampled every sample_interval_s and "
                 "interpolated over the timed steps; with steps shorter than the sampling period, traffic of "
                 "neighbouring steps (e.g. warm-up) leaks in")
NO_BASELINE_NOTE = "exposed communication: not applicable (run without the baseline cells, option baseline off)"


@dataclass(frozen=True)
class Axis:
    """What a comparison varies: `name` is its table's first column and `table` the table's name; `values` every
    value in table order; `fields(value)` the config fields that select it; `skip(value, base)` why it cannot run
    here (None: it can); `label_of(config)` the value a stored config ran."""
    name: str
    table: str
    values: Sequence[str]
    fields: Callable[[str], dict]
    label_of: Callable[[dict], str]
    skip: Callable[[str, TrainConfig], str | None] = lambda value, base: None


def ordered(names: Sequence[str] | None, allowed: Sequence[str]) -> list[str]:
    """The names to run, in the canonical order (all when None)."""
    return list(allowed) if names is None else [n for n in allowed if n in names]


def baseline_cell(cell: Cell) -> Cell:
    """A cell's exposed-communication baseline: the same config with no-op collectives, as many launches."""
    return Cell(f"{cell.label}, no-op collectives", with_fields(cell.config, **syncs.baseline_fields(cell.config)),
                repeats=cell.repeats)


def run_comparison(ctx: Context, base: TrainConfig, axis: Axis, chosen: Sequence[str] | None, *, launches: int,
                   baseline: bool = True, notes: dict | None = None) -> Result:
    """Every chosen value of `axis` on `base` (with its baseline unless `baseline` is off), interleaved, checked
    (lab.checked), as one table; values that cannot run here are rows with their reason."""
    cells, skipped = [], {}
    for value in ordered(chosen, axis.values):
        reason = axis.skip(value, base)
        if reason is None:
            try:
                cell = Cell(value, with_fields(base, **axis.fields(value)), repeats=launches)
                pair = [cell, baseline_cell(cell)] if baseline else [cell]
            except ConfigError as err:  # the config cannot run with this value: say why, do not drop it
                reason = str(err)
        if reason is not None:
            ctx.say(f"[{axis.table.removeprefix('compare_')}] {value}: skipped: {reason}")
            skipped[value] = reason
            continue
        cells += pair
    step = 2 if baseline else 1

    def analyse(results):
        runs = ctx.cells.rows(results)
        pairs = [(runs[i], runs[i + 1] if baseline else None) for i in range(0, len(runs), step)]
        pairs += [({axis.name: value, "status": "skipped", "reason": why}, None) for value, why in skipped.items()]
        return comparison_table(pairs, axis=axis.name, label_of=axis.label_of, order=axis.values,
                                blocks=syncs.blocks)

    table = run_checked(ctx, cells, group="compare", analyse=analyse)
    notes = {"exposed": EXPOSED_NOTE if baseline else NO_BASELINE_NOTE, "loopback": LOOPBACK_NOTE, **(notes or {})}
    if skipped:
        notes["skipped"] = skipped
    return Result(axis.table, {axis.table: table}, notes=notes)


def comm_figures(name: str, label: str):
    """Step breakdown and bytes bars of a comparison table (rows that did not run keep their slot)."""
    def draw(result: Result, out) -> list:
        table = result.tables[name]
        if not (table["status"] == "completed").any():
            return []
        return [figures.comm_breakdown_bars(table, out / f"{name}.png", label=label, name=name),
                figures.comm_bytes_bars(table, out / f"{name}_bytes.png", label=label, name=name)]
    return draw


PLURAL = {"strategy": "strategies"}  # an axis -> its `scalelab compare` sub-command


def ranked(table, axis: str, what: str, default: str | None = None) -> tuple[list[str], Decision | None]:
    """The completed rows as one choice (scalelab.lab.decision.rank: a winner only beyond noise, by a material
    effect, over the whole family of rows): sentences and the decision; `default` is kept when none wins."""
    done = table[table["status"] == "completed"] if len(table) else table
    if len(done) < 2:
        return [], None
    return rank(done, axis, what, default=default, action=lambda label: f"the {label} {what}",
                command=f"scalelab compare {PLURAL.get(axis, axis + 's')}")


def decisions_of(name: str, axis: str, default: str | None = None) -> Callable[[Result], list[Decision]]:
    """An axis experiment's `decide`: the decision `ranked` makes over its table `name`."""
    def decide(result: Result) -> list[Decision]:
        decision = ranked(result.tables.get(name, pd.DataFrame()), axis, axis, default)[1]
        return [decision] if decision is not None else []
    return decide


def set_aside(row: dict, axis: str) -> str | None:
    """The sentence a completed row gets instead of its figures when a check flagged it (compare.trusted)."""
    return None if trusted(row.get("quality")) else f"{row[axis]}'s figures are not used: {row['quality']}."


def critical_comm(row) -> float:
    """Communication on the critical path (the wire time, after every peer had arrived) where it was measured (one
    host), else the time inside collectives."""
    value = row.get("comm_critical(ms)")
    return row["comm(ms)"] if value is None or pd.isna(value) else value


def overlap_whole(row) -> float:
    """The communication an overlap is a share of (analysis.breakdown.exposed_figures, docs/definitions.md):
    waiting for peers + wire where both were measured, else the time inside collectives."""
    split = [row.get(k) for k in ("waiting_for_peers(ms)", "comm_critical(ms)")]
    return sum(split) if all(isinstance(v, (int, float)) and v == v for v in split) else row["comm(ms)"]


def overlap_span(row) -> str:
    """The overlap's 95 % interval in words, as measured: never clipped, so it always contains its point (an
    overlap below 0 is interference: the step lost more than its communication on the critical path)."""
    low, high = row.get("overlap_ci_low"), row.get("overlap_ci_high")
    if low is None or pd.isna(low) or high is None or pd.isna(high):
        return "no interval"
    return f"interval {100 * low:.0f} to {100 * high:.0f} %"


def answer_columns(axis: str) -> list[str]:
    """The columns a comparison table's answer needs (the report shows these, the files every column)."""
    return [axis, "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)", "compute(ms)", "comm(ms)", "comm_critical(ms)",
            "waiting_for_peers(ms)", "exposed_comm(ms)", "overlap", "bytes_per_step", "quality"]


def comm_captions(table: str, what: str) -> dict[str, str]:
    """Captions of a comparison's table and plots."""
    return {table: f"One row per {what}: the median step with its interval, {figures.COMPUTE_LABEL}, "
                   "time inside collectives and the part of it on the critical path (after "
                   "every peer had arrived; before that: waiting for peers), exposed communication and overlap, "
                   "bytes moved per step; every column is in the files.",
            f"{table}.png": f"Per {what}: the median step split into {figures.COMPUTE_LABEL} and exposed "
                            "communication (bars: "
                            "the step's 95 % interval), and the time inside collectives (diamonds), which "
                            "overlap with compute can hide.",
            f"{table}_bytes.png": f"Per {what}: payload bytes per optimizer step by phase (the ranks' mean), and "
                                  "what the host's loopback interface carried."}
