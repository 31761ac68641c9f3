"""`noop`: no synchronisation at all, the ablation baseline (ranks train apart; step time with real sync minus
this is the exposed communication of the compare experiment)."""
from __future__ import annotations

from scalelab.analysis.synccost import CostQuery, SyncCost
from scalelab.sync.base import PlainSync
from scalelab.sync.registry import SyncEntry


class NoopSync(PlainSync):
    """No collective, nothing to do after backward."""


def cost(q: CostQuery) -> SyncCost:
    """0: nothing is communicated."""
    return SyncCost(0.0, 0.0, 0)


ENTRY = SyncEntry(name="noop", factory=lambda cfg, model, ctx, meter: NoopSync(model, meter),
                  description="no gradient sync at all (the ablation baseline; ranks train apart)",
                  cost=cost, order=90)
