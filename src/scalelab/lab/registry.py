"""The experiment registry: every module of `scalelab.experiments` that defines `EXPERIMENT` is one entry.

The study, the report and the CLI read this registry; no other list of experiment names exists.
"""
from __future__ import annotations

from scalelab.lab.base import Experiment
from scalelab.registry import Registry

EXPERIMENTS: Registry[Experiment] = Registry("experiment", Experiment, package="scalelab.experiments",
                                             attribute="EXPERIMENT", order=lambda e: (e.order, e.name))


def experiments() -> dict[str, Experiment]:
    """name -> Experiment, in study order."""
    return {e.name: e for e in EXPERIMENTS.entries()}


def names() -> tuple[str, ...]:
    return EXPERIMENTS.names()


def get(name: str, field: str = "experiment") -> Experiment:
    return EXPERIMENTS.get(name, field)
