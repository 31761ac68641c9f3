"""Batch size: epoch time with and without data loading, throughput and peak memory per global batch (seed 000 Q1)."""
from __future__ import annotations

from scalelab.analysis import interpret, tables
from scalelab.lab.base import Experiment, Option, Result, int_list
from scalelab.lab.cells import Cell, with_fields
from scalelab.report import figures

EXPERIMENT = Experiment(
    name="batch_sweep", command="batch-sweep", section="batch", order=20,
    title="Batch size: epoch time, throughput, memory",
    question="How do epoch time (with and without data loading) and throughput change with the batch size? "
             "(seed 000 Q1)",
    help="Epoch time with and without data loading, throughput and peak memory per batch size.",
    options=(Option(name="batches", default=[32, 64, 128, 256], help="Global batch sizes.", parse=int_list),),
    cells=lambda base, opts: [Cell(f"batch {b}", with_fields(base, global_batch=b)) for b in opts["batches"]],
    analyse=lambda runs, base, opts: Result("batch_sweep", {"batch_sweep": tables.batch_sweep_table(runs)}),
    figures=lambda result, out: [figures.time_vs_batch(result.tables["batch_sweep"], out / "batch_sweep.png")],
    interpret=lambda result: interpret.batch_sweep(result.tables["batch_sweep"]),
    captions={"batch_sweep": "Per global batch: epoch time with and without data loading (s), throughput "
                             "(samples/s), peak memory (GiB), step time min/median/max over timed steps (ms).",
              "batch_sweep.png": "Epoch time and step time (median, bars min..max) vs global batch."},
)
