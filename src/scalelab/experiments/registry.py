"""The experiment registry: every module of `scalelab.experiments` that defines `EXPERIMENT` is one entry.

The study, the report and the CLI read this registry; no other list of experiment names exists.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from scalelab.errors import ConfigError
from scalelab.experiments.base import Experiment


@cache
def experiments() -> dict[str, Experiment]:
    """name -> Experiment, in study order."""
    import scalelab.experiments as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        entry = getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "EXPERIMENT", None)
        if isinstance(entry, Experiment):
            found.append(entry)
    names = [e.name for e in found]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two experiments share a name: {sorted(names)}")
    return {e.name: e for e in sorted(found, key=lambda e: (e.order, e.name))}


def names() -> tuple[str, ...]:
    return tuple(experiments())


def get(name: str, field: str = "experiment") -> Experiment:
    table = experiments()
    if name not in table:
        raise ConfigError(field, name, f"allowed: {', '.join(table)}")
    return table[name]
