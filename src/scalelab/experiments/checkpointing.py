"""Activation checkpointing with 0..k segments: peak memory vs step time (seed 001 part 1b)."""
from __future__ import annotations

from scalelab.analysis import interpret, tables
from scalelab.experiments.base import Experiment, Option, Result, int_list
from scalelab.experiments.cells import Cell, with_fields
from scalelab.report import figures

EXPERIMENT = Experiment(
    name="checkpointing", command="checkpointing", section="checkpointing", order=100,
    title="Activation checkpointing",
    question="How much memory does checkpointing save and what does it cost in time? (seed 001 part 1b)",
    help="Activation checkpointing: peak memory vs step time per number of segments.",
    options=(Option(name="segments", default=[0, 1, 2, 4], help="Checkpoint segments to try (0 = off).",
                    parse=int_list),),
    cells=lambda base, opts: [Cell(f"{k} segments", with_fields(base, checkpoint_segments=k))
                              for k in opts["segments"]],
    analyse=lambda runs, base, opts: Result("checkpointing", {"checkpointing": tables.checkpointing_table(runs)}),
    figures=lambda result, out: [figures.memory_vs_segments(result.tables["checkpointing"],
                                                            out / "checkpointing.png")],
    interpret=lambda result: interpret.checkpointing(result.tables["checkpointing"]),
    captions={"checkpointing": "Per number of checkpoint segments: peak memory and step time.",
              "checkpointing.png": "Peak memory and step time vs checkpoint segments."},
)
