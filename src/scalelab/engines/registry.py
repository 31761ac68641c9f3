"""The registry of training engines: one `EngineEntry` per engine (`ddp`, `horovod`), found in this package.

An engine is what differs between torchrun + DDP and horovodrun + Horovod for the same loop: which launcher starts
the ranks (run/launch.py names them), what each rank sets up to talk to the others, how gradients are averaged
(a GradSync, scalelab.sync.base) and which config fields it reads. Model, data, sampler, stage timing and the run's
records are the same for every engine. Everything that needs engine names reads them here: the config's `engine`
validation, the CLI's help, the `compare engines` experiment.

    from scalelab.engines import registry
    registry.names()                        # ("ddp", "horovod")
    engine = registry.get(cfg.engine)
    engine.unavailable()                    # None, or why it cannot run here ("horovod is not installed ...")
    engine.connect(cfg, ctx); ...; engine.disconnect()   # in every rank
    sync = engine.build_sync(cfg, model, ctx, meter)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalelab.registry import Registry


def _available() -> str | None:
    return None


@dataclass(frozen=True, kw_only=True)
class EngineEntry:
    """One engine and what the rest of scalelab needs to know about it.

    name         the config's `engine` value.
    description  one line, used for CLI help.
    launcher     the launcher that starts its ranks, by name (run/launch.py: "torchrun", "horovodrun").
    connect      (cfg, ctx) -> None: in a rank, join the others (process group, hvd.init()).
    disconnect   () -> None: in a rank, always at the end (also after a failure).
    build_sync   (cfg, model, ctx, meter) -> GradSync; with cfg.noop_collectives the baseline of exposed
                 communication (the same loop without the engine's collectives).
    check        (cfg) -> None: raise ConfigError for fields the engine cannot honour.
    env          (cfg, run_dir) -> environment for its ranks (beside threads and loopback interfaces).
    options      config fields only this engine reads.
    unavailable  () -> None, or one line saying why the engine cannot run on this machine and how to fix it.
    order        position in every listing (lower first).
    """

    name: str
    description: str
    launcher: str
    connect: Callable[..., None] = field(compare=False)
    disconnect: Callable[[], None] = field(compare=False)
    build_sync: Callable[..., Any] = field(compare=False)
    check: Callable[[Any], None] = field(default=lambda cfg: None, compare=False)
    env: Callable[..., dict[str, str]] = field(default=lambda cfg, run_dir: {}, compare=False)
    options: tuple[str, ...] = ()
    unavailable: Callable[[], str | None] = field(default=_available, compare=False)
    order: int = 50


ENGINES: Registry[EngineEntry] = Registry("engine", EngineEntry, package="scalelab.engines", attribute="ENGINE",
                                          order=lambda e: (e.order, e.name))


def names() -> tuple[str, ...]:
    return ENGINES.names()


def entries() -> tuple[EngineEntry, ...]:
    return ENGINES.entries()


def get(name: str, field: str | None = None) -> EngineEntry:
    """The entry of `name`; ConfigError naming `field` and the allowed engines otherwise."""
    return ENGINES.get(name, field)


def describe() -> str:
    return ENGINES.describe()
