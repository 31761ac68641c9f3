"""One mechanism for every extension point (experiments, sync strategies, models, datasets, hardware presets).

A registry holds one entry object per name. Entries come from the modules of a package, each of which defines
them at module level (`EXPERIMENT = Experiment(...)`, `ENTRY = SyncEntry(...)`, `ENTRIES = [...]`), found the
first time the registry is read, so adding one is one new module and the registry itself is never edited; or from
`register` (a test's own entry, or presets listed in one module).

    strategies = Registry("sync", SyncEntry, package="scalelab.sync", attribute="ENTRY", order=lambda e: e.order)
    strategies.names(); strategies.get("ddp"); strategies.register(entry); strategies.unregister("ring")
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from scalelab.errors import ConfigError

E = TypeVar("E")


class Registry(Generic[E]):
    """name -> entry of one extension point."""

    def __init__(self, kind: str, entry_type: type, *, package: str | None = None, attribute: str = "ENTRY",
                 order: Callable[[Any], Any] | None = None, hint: str | None = None,
                 entries: Iterable[E] = ()):
        self.kind, self.entry_type = kind, entry_type
        self.package, self.attribute = package, attribute
        self.order = order  # listing order (None: registration order)
        self.hint = hint  # what else a value may be, for errors (e.g. "module:function")
        self._entries: dict[str, E] = {}
        self._discovered = package is None
        for entry in entries:
            self._add(entry)

    def _add(self, entry: E) -> E:
        if not isinstance(entry, self.entry_type):
            raise TypeError(f"{self.kind} registry takes {self.entry_type.__name__}, not {type(entry).__name__}")
        name = entry.name
        if not name or ":" in name:
            raise ValueError(f"{self.kind} {name!r} is not a plain name")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def _discover(self) -> None:
        """Import every module of the package once and collect its module-level entries."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
            value = getattr(importlib.import_module(f"{self.package}.{info.name}"), self.attribute, None)
            for entry in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(entry, self.entry_type):
                    if entry.name in self._entries:
                        raise RuntimeError(f"two {self.kind} entries share the name {entry.name!r}")
                    self._add(entry)

    def register(self, entry: E) -> E:
        """Add an entry defined elsewhere (a test's own); its name must be new."""
        self._discover()
        return self._add(entry)

    def unregister(self, name: str) -> None:
        """Remove an entry added by `register` (tests clean up with it)."""
        self._entries.pop(name, None)

    def entries(self) -> tuple[E, ...]:
        self._discover()
        values = tuple(self._entries.values())
        return tuple(sorted(values, key=self.order)) if self.order else values

    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries())

    def __contains__(self, name: object) -> bool:
        self._discover()
        return name in self._entries

    def allowed(self) -> str:
        """"allowed: a, b, c [or <hint>]": the tail of every error about a bad name."""
        return f"allowed: {', '.join(self.names())}" + (f" or {self.hint}" if self.hint else "")

    def get(self, name: str, field: str | None = None) -> E:
        """The entry of `name`; a ConfigError naming `field` (default: the kind) and the allowed names otherwise."""
        self._discover()
        if not isinstance(name, str) or name not in self._entries:
            raise ConfigError(field or self.kind, name, self.allowed())
        return self._entries[name]

    def describe(self) -> str:
        """One line per entry for help: "name: description"."""
        return "; ".join(f"{e.name}: {e.description}" for e in self.entries())
