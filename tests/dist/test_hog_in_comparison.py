"""A CPU hog started during one cell of a real comparison (2-rank gloo runs of `compare strategies`): that cell's
run is flagged noisy, the cell is measured once more without the hog, and the final table is consistent: the row
says it was re-measured, its figures come from the new launch, and no row is left noisy unremarked."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from scalelab.analysis import keys
from scalelab.config import TrainConfig
from scalelab.lab import registry
from scalelab.lab.base import Context
from scalelab.lab.cells import Cells
from scalelab.lab.progress import PlainProgress

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="noise detection reads Linux /proc")]


class HogDuring(PlainProgress):
    """Progress that starts a busy process when the cell `label` starts for the first time and ends it when
    that cell is done."""

    def __init__(self, label: str):
        super().__init__(lambda line: None)
        self.label, self.hog, self.started = label, None, 0

    def cell_started(self, label: str) -> None:
        super().cell_started(label)
        if label == self.label and not self.started:
            self.started += 1
            self.hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])

    def cell_done(self, label: str, outcome: str, **kw) -> None:
        super().cell_done(label, outcome, **kw)
        self.stop()

    def stop(self) -> None:
        if self.hog is not None:
            os.kill(self.hog.pid, signal.SIGKILL)
            self.hog.wait()
            self.hog = None


def test_a_hog_during_one_cell_is_flagged_then_re_measured(store, tmp_path):
    base = TrainConfig(model="mlp", dataset="synthetic", samples=512, eval_samples=16, global_batch=32, steps=20,
                       warmup_steps=2, ranks=2, sample_interval_s=0.1)
    progress = HogDuring("ddp")
    said = []
    ctx = Context(Cells(store, "hog", progress=progress), tmp_path, said.append)
    experiment = registry.get("strategies")
    try:
        result = experiment.execute(ctx, base, experiment.option_values({"strategies": "allreduce,ddp",
                                                                         "launches": 1}))
    finally:
        progress.stop()
    assert progress.started == 1
    hogged = [store.get(r) for r in store.list_runs(study="hog/compare")["run_id"]]
    first_ddp = [r for r in hogged if r["config"]["sync"] == "ddp" and not r["config"].get("noop_collectives")]
    assert len(first_ddp) == 1 and first_ddp[0]["summary"][keys.QUALITY_NOISY] is True  # the hog was seen

    table = result.tables["compare_strategies"].set_index("sync")
    ddp = table.loc["ddp"]
    assert ddp["quality"] == "re-measured" or ddp["quality"].startswith(("re-measured: the two", "noisy"))
    assert ddp["run_id"] != first_ddp[0]["run_id"]  # its figures come from the new launch
    again = store.get(ddp["run_id"])
    assert again["study"] == "hog/compare/again"
    # consistent: every row is ok, re-measured, or flagged in words; a noisy run is never shown as ok
    for sync, row in table.iterrows():
        run = store.get(row["run_id"])
        if run["summary"].get(keys.QUALITY_NOISY):
            assert row["quality"] != "ok", sync
    assert any("measuring" in line and "once more" in line for line in said)
