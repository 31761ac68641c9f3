"""Where a step's time goes: the stage breakdown of one run, as a table and a pie chart (seed 001 2b, 003 task 1)."""
from __future__ import annotations

from scalelab.analysis import interpret, tables
from scalelab.lab.base import Experiment, Result
from scalelab.lab.cells import Cell
from scalelab.report import figures

EXPERIMENT = Experiment(
    name="profile", command="profile", section="profile", order=10,
    title="Where a step's time goes",
    question="Which stage dominates a training step: data, copy, forward, backward, communication, optimizer? "
             "(seed 001 part 2b, seed 003 task 1)",
    help="Where a step's time goes: stage table and pie chart.",
    cells=lambda base, opts: [Cell("profile", base)],
    analyse=lambda runs, base, opts: Result("profile", {"profile": tables.stage_profile_table(runs)}),
    figures=lambda result, out: [figures.stage_pie(result.tables["profile"], out / "profile.png")],
    interpret=lambda result: interpret.profile(result.tables["profile"]),
    captions={"profile": "Mean time per step of each stage (ms) and its share (%).",
              "profile.png": "Share of a step per stage (mean over timed steps)."},
)
