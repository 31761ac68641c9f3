"""The sync registry: names, variants, options, and that config validation, compare and the performance model read
it.
"""
from __future__ import annotations

import pytest

from scalelab.analysis.synccost import SyncCost
from scalelab.lab import registry as experiments
from scalelab.experiments.strategies import strategy_fields
from scalelab.perf import perfmodel
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.sync import registry
from scalelab.sync.noop import NoopSync
from scalelab.sync.registry import SyncEntry


def test_every_strategy_module_registers_itself_in_listing_order():
    assert registry.names() == ("gather_scatter", "allreduce", "bucketed", "ddp", "noop")
    assert registry.variants() == ("gather_scatter", "allreduce", "bucketed", "ddp", "ddp+fp16", "ddp+bf16",
                                   "ddp+powersgd", "ddp+accumulate", "noop")
    assert registry.get("ddp").options == ("bucket_mb", "ddp_hook", "powersgd_rank")
    assert registry.get("bucketed").options == ("bucket_mb",)
    assert all(e.description and "\n" not in e.description for e in registry.entries())
    with pytest.raises(ValueError, match="allowed: gather_scatter"):
        registry.get("ring")


@pytest.mark.parametrize("config, variant", [
    ({"sync": "auto"}, "ddp"), ({"sync": "ddp", "ddp_hook": "bf16"}, "ddp+bf16"),
    ({"sync": "ddp", "accumulate": 4}, "ddp+accumulate"), ({"sync": "ddp", "ddp_hook": "fp16", "accumulate": 4},
                                                           "ddp+fp16"),
    ({"sync": "bucketed", "accumulate": 4}, "bucketed"),
])
def test_variant_of_a_config(config, variant):
    assert registry.variant_of(config) == variant


@pytest.fixture
def ring():
    """A strategy registered by the test (no new module): everything that lists syncs must see it."""
    entry = registry.register(SyncEntry(name="ring", factory=lambda cfg, model, ctx, meter: NoopSync(model, meter),
                                        description="a test strategy", cost=lambda q: SyncCost(1.0, 0.5, 1),
                                        order=35))
    yield entry
    registry.unregister("ring")


def test_a_registered_strategy_is_accepted_by_the_config_and_listed_by_compare_and_perfmodel(ring):
    assert TrainConfig(sync="ring", ranks=2).resolved_sync == "ring"
    assert registry.variants().index("ring") == registry.variants().index("bucketed") + 1  # registry order
    assert experiments.get("strategies").option_values({"strategies": "ring,noop"})["strategies"] == ["ring", "noop"]
    assert strategy_fields("ring", 2)["sync"] == "ring"  # the compare experiment can run it
    assert "ring" in perfmodel.STRATEGIES
    assert perfmodel.sync_cost("ring", param_bytes=[4.0], n=2, hardware=None, backward_s=1.0) == SyncCost(1.0, 0.5, 1)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(ring)


def test_config_refuses_an_unregistered_sync_naming_the_registry():
    with pytest.raises(ConfigError, match="allowed: auto, gather_scatter, allreduce, bucketed, ddp, noop"):
        TrainConfig(sync="ring", ranks=2)
