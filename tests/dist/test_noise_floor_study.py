"""A study measures its reference cell before the first experiment and after the last (two runs, not one reused),
puts the drift in the report's environment as its noise floor, and a rebuilt report is byte-identical."""
from __future__ import annotations

import hashlib

import pytest

from conftest import run_cli
from scalelab.store import Store

pytestmark = pytest.mark.timeout(300)

STUDY = """
name: floor
experiments: [batch_sweep]
base: {model: cnn, dataset: synthetic, samples: 128, eval_samples: 16, global_batch: 16, steps: 3, warmup_steps: 1}
options:
  batch_sweep: {batches: [16], launches: 1}
"""


def digest(folder) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_reference_cell_at_start_and_end_gives_the_noise_floor(tmp_path):
    spec = tmp_path / "floor.yaml"
    spec.write_text(STUDY)
    root, out = tmp_path / "store", tmp_path / "out"
    proc = run_cli(["study", "--config", str(spec), "--store", str(root), "--out", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = Store(root)
    reference = store.list_runs(study="floor/reference").sort_values("created")
    sweep = store.list_runs(study="floor/batch_sweep")
    assert list(reference["status"]) == ["completed", "completed"]  # start and end: two runs of one cell
    assert reference["created"].iloc[0] <= sweep["created"].min() and reference["created"].iloc[1] >= \
        sweep["created"].max()
    md = (out / "report" / "report.md").read_text()
    line = next(l for l in md.splitlines() if l.startswith("| noise floor"))
    assert "95 % interval" in line and "reference step" in line
    before, n_runs = digest(out / "report"), len(list((root / "runs").iterdir()))
    rebuilt = run_cli(["report", str(out)], timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert digest(out / "report") == before  # the same report, noise floor included, from stored runs alone
    assert len(list((root / "runs").iterdir())) == n_runs
