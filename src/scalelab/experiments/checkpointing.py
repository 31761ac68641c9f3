"""Activation checkpointing with 0..k segments: saved activations, their backward peak and the process's peak
memory vs step time (seed 001 part 1b).

Every one of k segments is checkpointed (scalelab.zoo.models.run_blocks), so 1 segment keeps only the blocks'
input. The activations are measured exactly on each run's first step (scalelab.measure.activations); on CPU the
process's peak RSS includes its baseline (libraries, data, allocator caches) and hides them."""
from __future__ import annotations

from scalelab.analysis import interpret, tables
from scalelab.lab.base import Experiment, Option, Result, int_list, launches_option
from scalelab.lab.cells import Cell, with_fields
from scalelab.report import figures

EXPERIMENT = Experiment(
    name="checkpointing", command="checkpointing", section="checkpointing", order=100,
    title="Activation checkpointing",
    question="How much memory does checkpointing save and what does it cost in time? (seed 001 part 1b)",
    help="Activation checkpointing: saved activations, backward peak and peak memory vs step time per number of "
         "segments (every segment checkpointed).",
    options=(Option(name="segments", default=[0, 1, 2, 4], help="Checkpoint segments to try (0 = off).",
                    parse=int_list), launches_option()),
    cells=lambda base, opts: [Cell(f"{k} segments", with_fields(base, checkpoint_segments=k), repeats=opts["launches"])
                              for k in opts["segments"]],
    interleave=True,
    analyse=lambda runs, base, opts: Result("checkpointing", {"checkpointing": tables.checkpointing_table(runs)}),
    figures=lambda result, out: [figures.memory_vs_segments(result.tables["checkpointing"],
                                                            out / "checkpointing.png")],
    interpret=lambda result: interpret.checkpointing(result.tables["checkpointing"]),
    captions={"checkpointing": "Per number of checkpoint segments: bytes saved for backward in forward, their peak "
                               "during backward (recomputation included), measured exactly on one step per rank; "
                               "the process's peak memory; step time. On CPU the process's peak RSS includes its "
                               "baseline and hides the activations; the saved bytes show the effect.",
              "checkpointing.png": "Left: saved activations and their backward peak (left axis), the process's "
                                   "peak memory (right axis, its own scale); right: step time; vs checkpoint "
                                   "segments."},
)
