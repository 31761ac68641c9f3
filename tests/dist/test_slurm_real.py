"""`scalelab slurm` on a real Slurm (Debian's slurm-wlm and munge, tests/dist/slurm_cluster.py): the script it
writes is submitted with sbatch to a 2-node cluster of namespace nodes, one slurmd each, runs `scalelab train`
under torchrun on both nodes and completes; its run `scalelab-<job id>` is stored with both ranks.

Skipped, with the reason, where the Slurm packages or network namespaces are missing.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import TINY_MLP, cli_env, run_cli
from scalelab.engines import registry
from scalelab.run import netns
from scalelab.store import Store, read_jsonl
from slurm_cluster import leftovers, slurm_cluster, unavailable

JOB_TIMEOUT_S = 150.0
HOROVOD_MISSING = registry.get("horovod").unavailable()

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture
def slurm(tmp_path):
    """A 2-node Slurm cluster for the test; every daemon, namespace and job process is gone afterwards."""
    with slurm_cluster(tmp_path / "slurm", nodes=2) as cluster:
        yield cluster
    assert all(d.poll() is not None for d in cluster.daemons)
    assert not leftovers(cluster)


def _job_state(slurm, job_id: str) -> str | None:
    """The job's state while slurmctld knows it (it forgets a finished job after MinJobAge, 300 s by default)."""
    out = slurm.run("scontrol", "show", "job", job_id).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), None)


@pytest.mark.parametrize("engine", ["ddp", "horovod"])
def test_the_script_scalelab_slurm_writes_runs_under_sbatch_and_stores_its_run(tmp_path, slurm, engine):
    # horovod: each node starts its own ranks (run/hvdnode.py), no horovodrun and no ssh between the nodes
    if engine == "horovod" and HOROVOD_MISSING:
        pytest.skip(HOROVOD_MISSING)
    model = tmp_path / "tiny_mlp.py"
    model.write_text(TINY_MLP)
    config = tmp_path / "run.yaml"
    config.write_text(f"model: {model}:make\nsamples: 256\nglobal_batch: 16\nsteps: 6\n")
    store = tmp_path / "store"
    script = tmp_path / "job.sbatch"
    res = run_cli(["slurm", "--config", str(config), "--engine", engine, "--nodes", "2", "--gpus-per-node", "0",
                   "--time", "00:05:00",
                   # the nodes share eth0, the namespace's interface; the store is on the one filesystem
                   "--env", f"GLOO_SOCKET_IFNAME={netns.IFACE}", "--env", f"SCALELAB_STORE={store}",
                   "--output", str(script)])
    assert res.returncode == 0, res.stderr
    out = tmp_path / "job.out"
    # sbatch hands its environment to the job: PYTHONPATH finds this checkout's scalelab on the nodes
    sub = slurm.run("sbatch", "--parsable", f"--output={out}", str(script), env=cli_env())
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (state := _job_state(slurm, job_id)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, f"job {job_id} still {state} after {JOB_TIMEOUT_S:g} s"
        time.sleep(1)
    log = out.read_text() if out.exists() else "(no job output)"
    assert state == "COMPLETED", f"job {job_id}: {state}\n{log[-3000:]}\n{slurm.logs()}"
    run = Store(store).get(f"scalelab-{job_id}")
    assert run["status"] == "completed"
    assert (run["config"]["nnodes"], run["config"]["engine"], run["summary"]["ranks/reported"]) == (2, engine, 2)
    for rank in (0, 1):  # one rank on each Slurm node
        assert len(read_jsonl(Path(run["dir"]) / f"steps.rank{rank}.jsonl")) == 6
