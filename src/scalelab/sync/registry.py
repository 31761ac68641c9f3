"""The registry of gradient-sync strategies: one `SyncEntry` per strategy, and `build_sync` that builds one.

Every module of the scalelab.sync package that defines a module-level `ENTRY` (a SyncEntry) is a strategy; the
registry finds them (pkgutil) the first time it is asked, so adding a strategy is one new module here plus its
test. Everything else that needs sync names reads them from here: the config's `sync` validation, the compare
order (`variants`), the performance model (`cost`), the CLI's choices and help. This module imports no strategy
module and no user of the registry at import time.

    from scalelab.sync import registry
    registry.names()                  # ("gather_scatter", "allreduce", "bucketed", "ddp", "noop")
    registry.variants()               # (..., "ddp", "ddp+fp16", "ddp+bf16", "ddp+powersgd", "ddp+accumulate", "noop")
    registry.get("ddp").options       # ("bucket_mb", "ddp_hook", "powersgd_rank")
    sync = registry.build_sync(cfg, model, ctx, meter)
    registry.baseline_fields(cfg)     # {"noop_collectives": True}: the baseline of exposed communication
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scalelab.registry import Registry

# variant fields whose value is the experiment's own accumulation (the compare runs pick it)
ACCUMULATE = "accumulate"


@dataclass(frozen=True, kw_only=True)
class SyncEntry:
    """One gradient-sync strategy and what the rest of scalelab needs to know about it.

    name         the config's `sync` value.
    factory      (cfg, model, ctx, meter) -> GradSync; with cfg.noop_collectives the strategy's no-op variant
                 (all of its work but the collectives, nothing metered).
    description  one line, used for CLI help.
    options      config fields the strategy reads (besides sync, accumulate and noop_collectives).
    variants     name -> config fields that select it (compare's rows), in order; {"accumulate": ACCUMULATE}
                 means "the experiment's accumulation" (> 1). Default: the strategy's name alone.
    cost         CostQuery -> SyncCost (scalelab.analysis.synccost): the performance model's communication of one
                 optimizer step; None when the model has no formula for the strategy.
    order        position in every listing (lower first); ties by name.
    broadcasts_initial_state  the strategy starts every rank from rank 0's model itself (DDP does).
    blocks       the strategy syncs only after backward and waits for it: it can hide nothing, so a measured
                 overlap above 0 beyond noise is a measurement error (scalelab.analysis.compare.plausibility).
    """

    name: str
    factory: Callable[..., Any] = field(compare=False)
    description: str
    options: tuple[str, ...] = ()
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    cost: Callable[..., Any] | None = field(default=None, compare=False)
    order: int = 50
    broadcasts_initial_state: bool = False
    blocks: bool = False

    def __post_init__(self) -> None:
        variants = dict(self.variants) or {self.name: {}}
        object.__setattr__(self, "variants", MappingProxyType({k: MappingProxyType(dict(v))
                                                              for k, v in variants.items()}))


STRATEGIES: Registry[SyncEntry] = Registry("sync", SyncEntry, package="scalelab.sync", attribute="ENTRY",
                                           order=lambda e: (e.order, e.name))


def register(entry: SyncEntry) -> SyncEntry:
    """Add `entry` (a strategy defined outside this package, e.g. in a test); its name and variants must be new."""
    if set(entry.variants) & set(variants()):
        raise ValueError(f"sync {entry.name!r} is already registered")
    return STRATEGIES.register(entry)


def unregister(name: str) -> None:
    """Remove a strategy added by `register` (tests clean up with it)."""
    STRATEGIES.unregister(name)


def entries() -> tuple[SyncEntry, ...]:
    """Every registered strategy, in listing order."""
    return STRATEGIES.entries()


def names() -> tuple[str, ...]:
    """The `sync` values a config may name (besides "auto", which is ddp)."""
    return STRATEGIES.names()


def get(name: str) -> SyncEntry:
    """The entry of `name`; ConfigError naming the allowed values otherwise."""
    return STRATEGIES.get(name)


def variants() -> tuple[str, ...]:
    """Every strategy's variants (compare's rows), in listing order."""
    return tuple(v for e in entries() for v in e.variants)


def variant_fields(variant: str) -> tuple[str, dict[str, Any]]:
    """(sync name, config fields) of a variant; ValueError naming the allowed variants otherwise."""
    for e in entries():
        if variant in e.variants:
            return e.name, dict(e.variants[variant])
    raise ValueError(f"variant {variant!r}; allowed: {', '.join(variants())}")


def variant_of(config: Mapping[str, Any]) -> str:
    """The variant a stored config describes: of its strategy's variants whose fields it holds (ACCUMULATE: an
    accumulation > 1; a field absent from the config takes its default), the one with the most fields, the first
    in order on a tie; the strategy's name when none fits."""
    sync = config.get("sync", "auto")
    entry = get("ddp" if sync == "auto" else sync)
    defaults = {"accumulate": 1, "ddp_hook": "none"}

    def holds(key: str, want: Any) -> bool:
        value = config.get(key, defaults.get(key))
        return value is not None and value > 1 if want == ACCUMULATE else value == want

    fitting = [(len(f), i, v) for i, (v, f) in enumerate(entry.variants.items()) if all(holds(k, w) for k, w in f.items())]
    return min(fitting, key=lambda t: (-t[0], t[1]))[2] if fitting else entry.name


def blocks(config: Mapping[str, Any]) -> bool:
    """Whether the strategy of a stored config blocks after backward (SyncEntry.blocks)."""
    sync = config.get("sync", "auto")
    return get("ddp" if sync == "auto" else sync).blocks


def baseline_fields(config) -> dict[str, Any]:
    """Config fields of the exposed-communication baseline of `config` (a TrainConfig or a stored config dict):
    the same strategy with no-op collectives; `noop` (no sync at all) is its own baseline."""
    sync = config.get("sync", "auto") if isinstance(config, Mapping) else config.sync
    return {} if sync == "noop" else {"noop_collectives": True}


def describe() -> str:
    """One line per strategy for CLI help: "name: description"."""
    return "; ".join(f"{e.name}: {e.description}" for e in entries())


def build_sync(cfg, model, ctx, meter):
    """The strategy `cfg.sync` names (auto = ddp) around `model`, recording into `meter`."""
    entry = get("ddp" if cfg.sync == "auto" else cfg.sync)
    if not entry.broadcasts_initial_state:
        from scalelab.sync.base import broadcast_initial_state

        broadcast_initial_state(model)
    return entry.factory(cfg, model, ctx, meter)
