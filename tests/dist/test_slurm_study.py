"""A study with node counts under Slurm (issue 59), on the namespace Slurm cluster of tests/dist/slurm_cluster.py
(3 nodes, links shaped by the kernel to 0.5 Gbit/s), submitted with sbatch: `scale` over 1, 2 and 3 nodes and
`predict` calibrated over 2 of the allocation's nodes (its compute, in-situ and bench runs job steps there). The
report has the per-node table; the calibration's runs are Slurm cells of the job across n0 and n1 (one rank alone:
n0); the validation's run across all three nodes is held out in node count and its error is reported.

Skipped, with the reason, where the Slurm packages or network namespaces are missing.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
import pytest

from scalelab.lab.results import frame_of
from scalelab.perf.calibration import Calibration
from scalelab.store import RunDir, Store, read_json
from slurm_cluster import unavailable
from test_slurm_nodes import ours_running, slurm3, steps_of, submit, wait_job  # noqa: F401 - slurm3: a fixture

pytestmark = [pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

JOB_TIMEOUT_S = 840.0
# one rank and one thread a node, an MLP of 7.4 MB of gradients; scale launches each cell once; predict calibrates
# on 2 nodes (per-rank batches 8 and 32) and validates at 8, 32 and its own 24 there, and at 24 across 3 nodes
STUDY = """
name: slurmstudy
experiments: [scale, predict]
reference: false
base: {model: mlp, model_options: "depth=2,width=512", dataset: synthetic, samples: 2048, eval_samples: 64,
       global_batch: 48, steps: 6, warmup_steps: 1, ranks: 1, threads: 1, nodes_launcher: slurm}
options:
  scale: {nodes: [1, 2, 3], batches: [48], mode: strong, launches: 1}
  predict: {workers: [1, 2, 4, 8, 64], hardware: [measured, 10gbe], calibration_batches: [8, 32],
            set: {local_nodes: 2}}
"""


def slurm_of(store: Path, run_id: str) -> dict:
    return RunDir(Store(store).run_dir(run_id)).read_provenance().get("slurm", {})


@pytest.mark.timeout(900)
def test_a_study_under_slurm_reports_per_node_and_predicts_from_the_smaller_node_counts(tmp_path, slurm3):
    spec, store, out = tmp_path / "study.yaml", tmp_path / "store", tmp_path / "out"
    spec.write_text(STUDY)
    started = time.monotonic()
    job_id, log = submit(slurm3, tmp_path, ["study", "--config", str(spec), "--store", str(store), "--out", str(out)],
                         minutes=14)
    state = wait_job(slurm3, job_id, JOB_TIMEOUT_S)
    text = log.read_text() if log.exists() else "(no job output)"
    assert state == "COMPLETED", f"job {job_id}: {state}\n{text[-4000:]}\n{slurm3.logs()}"
    print(f"study job {job_id}: {time.monotonic() - started:.0f} s")
    md = (out / "report" / "report.md").read_text()
    # the per-node table of the scaling over nodes (seed 003's tables 1-3)
    nodes = pd.read_csv(next((out / "report" / "tables").glob("*scale_strong_nodes*.csv")))
    assert sorted(set(nodes["nodes"])) == [1, 2, 3] and sorted(set(nodes["node"])) == [0, 1, 2]
    assert "Per node" in md, md[:3000]
    # the calibration: every run a cell of this job, across the allocation's first 2 nodes (one rank alone: n0)
    (path,) = store.glob("studies/**/calibration.json")
    cal = Calibration.load(path)
    assert (cal.nodes, cal.nodes_launcher) == (2, "slurm")
    across = [*cal.compute_runs, cal.bench_run, *(r["run_id"] for r in cal.insitu)]
    alone = [p["run_id"] for p in cal.lone_points]
    for run_id in across + alone:
        where = slurm_of(store, run_id)
        assert where.get("job") == job_id and where.get("step") is not None, (run_id, where)
        assert where["nodes"] == (["n0"] if run_id in alone else ["n0", "n1"]), (run_id, where)
    print(f"calibration runs (Slurm job {job_id}): compute {cal.compute_runs}, bench {cal.bench_run}, in situ "
          f"{[r['run_id'] for r in cal.insitu]}, alone {alone}")
    # the validation: the run across all 3 nodes held out in node count, its error reported
    val = frame_of(read_json(out / "results" / "predict.json")["tables"]["validation"])
    held = val[val["workers"] == 3]
    assert len(held) == 1 and held["sample"].iloc[0].startswith("held out: nodes"), val.to_string()
    assert slurm_of(store, held["run_id"].iloc[0])["nodes"] == ["n0", "n1", "n2"]
    error = float(held["error(%)"].iloc[0])
    assert math.isfinite(error)
    assert f"across 3 workers (a node count no calibration run used): error {error:+.1f} %" in md.replace("\\|", "|")
    row = held.iloc[0]
    print(f"held out at 3 nodes: run {row['run_id']}, predicted {row['predicted']:.1f} ms (95 %: "
          f"{row['predicted_ci_low']:.1f}-{row['predicted_ci_high']:.1f}), measured {row['measured']:.1f} ms, "
          f"error {error:+.1f} %")
    print(val[["run_id", "workers", "per_rank_batch", "sample", "predicted", "measured", "error(%)"]].to_string())
    assert not steps_of(slurm3, job_id) and not ours_running(store)
