"""The whole study end to end on a tiny spec: every section present, and the rebuilt report byte-identical."""
from __future__ import annotations

import hashlib

import pytest

from conftest import hungry_model, run_cli

pytestmark = pytest.mark.timeout(600)

def tiny_study_yaml(tmp_path) -> str:
    model = hungry_model(tmp_path)
    return f"""
name: tiny
base: {{model: cnn, dataset: synthetic, samples: 64, eval_samples: 16, global_batch: 16, steps: 3, warmup_steps: 1}}
options:
  profile: {{set: {{ranks: 1}}}}
  batch_sweep: {{batches: [16, 32], launches: 1}}
  max_batch: {{memory_limit: {int(4.5 * 8 * 2**20)}, variants: [base], set: {{model: "{model}"}}}}
  model_grid: {{widths: [1024]}}  # one width still holds both outcomes: depth 2 fits under the cap, depth 8 does not
  scale: {{workers: [1, 2], batches: [16], mode: [strong], launches: 1, set: {{model: mlp}}}}
  bucket_sweep: {{launches: 1}}  # one launch a cell, as batch_sweep: this test checks the sections, not intervals
  strategies: {{strategies: [allreduce, ddp, noop], set: {{model: mlp, ranks: 2, bucket_mb: 25.0}}}}
  backends: {{set: {{model: mlp, ranks: 2, bucket_mb: 25.0}}}}
  comm: {{begin: 4K, end: 16K, iters: 2, warmup: 1, ops: allreduce, ranks: 2}}
  loader: {{workers: [0, 1], set: {{dataset: synthetic_jpeg}}}}
  amp: {{set: {{steps: 4}}}}
  checkpointing: {{segments: [0, 1]}}
  lr_scaling: {{batches: [16, 64], rules: [none, linear], workers: [1], target: 0.2,
               set: {{dataset: mnist1d, samples: 256, eval_samples: 64, epochs: 1, steps: null, lr: 0.03}}}}
  predict: {{workers: [1, 2, 64], hardware: [measured, ib_hdr], calibration_batches: [8, 16], validate: false,
            set: {{model: mlp, ranks: 2}}}}
"""


def digest(folder) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_tiny_study_has_every_section_and_rebuilds_identically(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(tiny_study_yaml(tmp_path))
    store, out = tmp_path / "store", tmp_path / "out"
    proc = run_cli(["study", "--config", str(spec), "--store", str(store), "--out", str(out)], timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = (out / "report" / "report.md").read_text()
    for title in ("Where a step's time goes", "Batch size", "The largest batch that fits", "How it scales",
                  "Gradient synchronisation strategies", "Communication backends", "Communication microbenchmark",
                  "Data loading", "Mixed precision", "Activation checkpointing", "Large-batch learning-rate rules",
                  "What larger clusters would do", "System metrics"):
        assert f"## {title}" in md, title
    assert "No data for this section" not in md and "failed:" not in md
    html = (out / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 12
    before = digest(out / "report")
    n_runs = len(list((store / "runs").iterdir()))
    rebuilt = run_cli(["report", str(out)], timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert digest(out / "report") == before  # the same report from the stored runs alone
    assert len(list((store / "runs").iterdir())) == n_runs  # and nothing was run
    assert audited(out) == []  # no sentence relies on a row a physics check fails (analysis.checks)


def audited(out) -> list[str]:
    """The study's contradictions (lab.study.audit) over its saved results, every decision worded beyond what it can
    carry (analysis.checks.decision_faults) among them."""
    from scalelab.lab import registry, results
    from scalelab.lab.study import audit, held_to_host_peak

    folder = results.results_dir(out)
    answered = [(registry.get(p.stem), results.load(registry.get(p.stem), folder))
                for p in sorted(folder.glob("*.json")) if p.stem in registry.names()]
    assert len(answered) >= 12
    return audit(held_to_host_peak(answered))  # the decisions' faults included


def test_a_budget_too_small_leaves_out_all_but_the_core_and_says_so(tmp_path):
    """A 1-second budget cannot hold the plan after the reference cell: the core experiment (profile) runs, the
    others are left out, the output and the report's environment say which and why."""
    store, out = tmp_path / "store", tmp_path / "out"
    proc = run_cli(["study", "--quick", "--only", "profile,threads,batch_sweep", "--budget", "1s", "--store",
                    str(store), "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("threads", "batch_sweep"):
        assert f"== budget: {name}: left out (the rest of the study with {name} as planned:" in proc.stdout
    assert "profile: left out" not in proc.stdout
    md = (out / "report" / "report.md").read_text()
    assert "time budget" in md and "threads: left out" in md and "batch_sweep: left out" in md
    assert "## Where a step's time goes" in md
