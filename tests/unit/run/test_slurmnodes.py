"""--launcher slurm without a Slurm: the allocation read from the environment, the refusals, the srun argv, the node
rank from SLURM_NODEID, the root cause of a failed step, and the launcher end to end against a fake srun and
scontrol on PATH (shell scripts that record their arguments)."""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from scalelab.config import TrainConfig, default_threads, namespace_nodes
from scalelab.errors import ConfigError
from scalelab.run import nodeagent
from scalelab.run.kinds import _one_machine
from scalelab.run.launch import LaunchSpec
from scalelab.run.nodes import NodeFailed
from scalelab.run.slurmnodes import (
    SlurmNodes,
    SlurmUnavailable,
    allocation,
    check_nodes,
    refuse_unlaunchable,
    root_cause,
    srun_argv,
    uses_slurm,
)
from scalelab.store.rundir import RunDir

ENV = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[0-2]"}


def three(nodelist: str) -> list[str]:
    assert nodelist == "n[0-2]"
    return ["n0", "n1", "n2"]


def cfg(nodes: int = 2, launcher: str = "slurm", **more) -> TrainConfig:
    return TrainConfig(model="mlp", local_nodes=nodes, nodes_launcher=launcher, global_batch=12, **more)


def test_the_allocation_is_read_from_slurms_variables():
    alloc = allocation(ENV, expand=three)
    assert (alloc.job_id, alloc.hosts) == ("7", ("n0", "n1", "n2"))


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_ID": "7"}, {"SLURM_JOB_NODELIST": "n0"}])
def test_outside_an_allocation_slurm_is_refused_in_one_line(env):
    with pytest.raises(SlurmUnavailable, match="not inside a Slurm allocation") as err:
        allocation(env, expand=three)
    assert "\n" not in str(err.value)


def test_more_nodes_than_the_allocation_has_are_refused_naming_both():
    alloc = allocation(ENV, expand=three)
    check_nodes(3, alloc)
    with pytest.raises(SlurmUnavailable, match=r"local_nodes 4: Slurm job 7 has 3 node\(s\) \(n0,n1,n2\); "
                                               r"allowed: 1..3"):
        check_nodes(4, alloc)


def test_a_studys_cells_are_checked_together_and_namespace_cells_not_at_all():
    refuse_unlaunchable([cfg(4, "namespaces"), cfg(2, "namespaces")], environ={}, expand=three)
    refuse_unlaunchable([cfg(1), cfg(3)], environ=ENV, expand=three)
    with pytest.raises(SlurmUnavailable, match="local_nodes 4"):
        refuse_unlaunchable([cfg(1), cfg(4), cfg(2)], environ=ENV, expand=three)
    with pytest.raises(SlurmUnavailable, match="not inside"):
        refuse_unlaunchable([cfg(1)], environ={}, expand=three)
    assert not uses_slurm(TrainConfig(model="mlp", nodes_launcher="slurm"))  # one node, no local_nodes: here


def test_slurm_nodes_take_no_link_shaping_and_are_not_this_machines_cores():
    with pytest.raises(ConfigError, match="link_gbps.*nodes_launcher namespaces"):
        cfg(2, link_gbps=0.5)
    assert namespace_nodes(cfg(3)) == 0 and namespace_nodes(cfg(3, "namespaces")) == 3
    assert default_threads(1, namespace_nodes(cfg(3))) == os.cpu_count()


def spec(tmp_path: Path, **more) -> LaunchSpec:
    return LaunchSpec(module="scalelab.run.worker", run_dir=tmp_path / "run-1", nproc_per_node=1,
                      env={"OMP_NUM_THREADS": "1"}, **more)


def test_the_step_is_one_node_agent_per_node_on_the_first_k_nodes(tmp_path):
    part = spec(tmp_path, nnodes=2, node_rank=-1, endpoint="10.0.0.1:29500")
    argv = srun_argv(part, ("n0", "n1"), step_name="scalelab-run-1", cpus_per_task="4")
    payload = json.loads(argv[-1])
    assert argv[:-1] == ["srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1", "--nodelist", "n0,n1",
                         "--cpus-per-task", "4", "--job-name=scalelab-run-1", "--export=ALL",
                         sys.executable, "-m", "scalelab.run.nodeagent"]
    assert (payload["node_rank"], payload["nnodes"], payload["endpoint"], payload["slurm"]) == (
        -1, 2, "10.0.0.1:29500", True)
    assert "--cpus-per-task" not in srun_argv(part, ("n0", "n1"), step_name="s")


def test_the_node_agent_reads_its_node_rank_from_slurm_nodeid(tmp_path, monkeypatch):
    assert nodeagent.slurm_node_rank({"SLURM_NODEID": "2"}) == 2
    with pytest.raises(RuntimeError, match="SLURM_NODEID None"):
        nodeagent.slurm_node_rank({})
    launched = []
    monkeypatch.setattr(nodeagent, "torchrun_launch", lambda s, fork: launched.append(s))
    monkeypatch.setattr("scalelab.run.worker.end_with_parent", lambda: None)
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    part = spec(tmp_path, nnodes=2, node_rank=-1, endpoint="10.0.0.1:29500")
    part.run_dir.mkdir()
    payload = json.loads(srun_argv(part, ("n0", "n1"), step_name="s")[-1])
    assert nodeagent.main([json.dumps(payload)]) == 0
    assert [s.node_rank for s in launched] == [1]
    record = RunDir(part.run_dir).read_slurm_node(1)
    assert (record["step"], record["node"], record["done"]) == ("3", "n1", True)


def test_node_0_keeps_the_store_until_the_others_are_done_or_one_failed(tmp_path):
    rundir = RunDir(tmp_path)
    start = time.monotonic()
    nodeagent.wait_for_nodes(rundir, 3, timeout_s=0.3)  # nobody done: until the timeout
    assert time.monotonic() - start >= 0.3
    rundir.write_slurm_node(1, {"done": True})
    rundir.write_slurm_node(2, {"done": True})
    start = time.monotonic()
    nodeagent.wait_for_nodes(rundir, 3, timeout_s=10)
    assert time.monotonic() - start < 1


def test_a_node_that_vanished_is_the_root_cause_before_its_peers_broken_connections(tmp_path):
    part = spec(tmp_path, nnodes=3, node_rank=-1)
    rundir = RunDir(part.run_dir)
    rundir.path.mkdir()
    for k in range(3):
        rundir.write_slurm_node(k, {"step": "0", "node": f"n{k}", "done": False})
    for k in (0, 1):
        rundir.write_node_failure(k, {"reason": "rank 0 exited with code 1: Connection reset by peer",
                                      "consequence": True, "time": time.time() - 5})
    hosts = ("n0", "n1", "n2")
    assert root_cause(part, rundir, hosts, 1) == ("node 2 (Slurm node n2, rank 2) lost: its node agent ended with "
                                                  "no record (its processes killed, or the node gone)")
    rundir.write_node_failure(1, {"reason": "rank 1 exited with code 1: ValueError: bad", "consequence": False,
                                  "time": time.time() - 4})
    assert root_cause(part, rundir, hosts, 1) == "node 1 (Slurm node n1, rank 1): rank 1 exited with code 1: " \
                                                 "ValueError: bad"


def test_a_step_slurm_refused_is_named_by_srun_s_error(tmp_path):
    part = spec(tmp_path, nnodes=2, node_rank=-1)
    RunDir(part.run_dir).path.mkdir()
    assert root_cause(part, RunDir(part.run_dir), ("n0", "n1"), 1, srun_error="srun: error: Unable to create "
                      "step") == "the job step across n0,n1 did not start: srun: error: Unable to create step"


def test_one_clock_only_when_every_slurm_node_ran_on_one_host(tmp_path):
    rundir = RunDir(tmp_path)
    rundir.write_provenance({"slurm": {"hosts": ["box", "box"]}})
    assert _one_machine({"local_nodes": 2, "nodes_launcher": "slurm"}, rundir)
    assert _one_machine({"local_nodes": 2}, rundir)  # namespaces: one machine by construction
    rundir.write_provenance({"slurm": {"hosts": ["a", "b"]}})
    assert not _one_machine({"local_nodes": 2, "nodes_launcher": "slurm"}, rundir)
    rundir.write_provenance({"slurm": {"hosts": ["a", None]}})
    assert not _one_machine({"local_nodes": 2, "nodes_launcher": "slurm"}, rundir)


FAKE_SCONTROL = """#!/bin/sh
# scontrol show node nK -> a NodeAddr of 10.9.0.K
case "$2" in node) echo "NodeName=$3 Arch=x86_64 NodeAddr=10.9.0.${3#n} NodeHostName=$3";; esac
"""

# a fake srun: records its argv, then plays each node agent's part (the records a real agent writes) or fails
FAKE_SRUN = """#!{python}
import json, os, sys
open(os.environ["FAKE_SRUN_LOG"], "w").write(json.dumps(sys.argv[1:]))
spec = json.loads(sys.argv[-1])
nodes = int(sys.argv[sys.argv.index("--nodes") + 1])
mode = os.environ["FAKE_SRUN_MODE"]
if mode == "refused":
    sys.stderr.write("srun: error: Unable to create step for job 7: More processors requested than permitted\\n")
    sys.exit(1)
for k in range(nodes):
    done = not (mode == "lost" and k == nodes - 1)
    with open(os.path.join(spec["run_dir"], f"slurm.node{{k}}.json"), "w") as f:
        json.dump({{"job": "7", "step": "4", "node": f"n{{k}}", "host": "box", "done": done}}, f)
sys.exit(0 if mode == "ok" else 137)
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN.format(python=sys.executable)),
                       ("scancel", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.json"))
    return tmp_path / "srun.json"


def launch(tmp_path, mode: str, monkeypatch, nodes: int = 2) -> RunDir:
    monkeypatch.setenv("FAKE_SRUN_MODE", mode)
    part = spec(tmp_path)
    rundir = RunDir(part.run_dir)
    rundir.path.mkdir(parents=True)
    rundir.write_provenance({"host": "box"})
    SlurmNodes(cfg(nodes), environ={**ENV, "SLURM_CPUS_ON_NODE": "2"})(part)
    return rundir


def test_the_launcher_runs_one_step_on_the_first_nodes_and_records_job_step_and_nodes(tmp_path, fake_slurm,
                                                                                     monkeypatch):
    monkeypatch.setattr("scalelab.run.slurmnodes.expand_nodelist", three)
    monkeypatch.setattr("scalelab.run.slurmnodes.allocation",
                        lambda environ: allocation(environ, expand=three))
    rundir = launch(tmp_path, "ok", monkeypatch)
    argv = json.loads(fake_slurm.read_text())
    assert argv[:8] == ["--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1", "--nodelist", "n0,n1"]
    assert json.loads(argv[-1])["endpoint"] == "10.9.0.0:29500"  # node 0's NodeAddr: the rendezvous host
    assert rundir.read_provenance()["slurm"] == {"job": "7", "step": "4", "nodes": ["n0", "n1"],
                                                 "hosts": ["box", "box"]}


def test_the_launcher_names_the_lost_node_and_the_refused_step(tmp_path, fake_slurm, monkeypatch):
    monkeypatch.setattr("scalelab.run.slurmnodes.allocation",
                        lambda environ: allocation(environ, expand=three))
    with pytest.raises(NodeFailed, match=r"node 2 \(Slurm node n2, rank 2\) lost"):
        launch(tmp_path / "a", "lost", monkeypatch, nodes=3)
    with pytest.raises(NodeFailed, match="did not start: srun: error: Unable to create step"):
        launch(tmp_path / "b", "refused", monkeypatch)
    with pytest.raises(SlurmUnavailable, match="local_nodes 4"):
        launch(tmp_path / "c", "ok", monkeypatch, nodes=4)


def test_of_two_nodes_gone_without_a_record_the_one_that_stopped_beating_first_is_named(tmp_path):
    # srun stopping a node can leave it without a record too: the node lost first is the one whose ranks went quiet
    part = spec(tmp_path, nnodes=3, node_rank=-1)
    rundir = RunDir(part.run_dir)
    rundir.path.mkdir()
    now = time.time()
    for k, beat in ((0, now - 1), (1, now), (2, now - 8)):
        rundir.write_slurm_node(k, {"step": "0", "node": f"n{k}", "done": False})
        rundir.write_heartbeat(k, {"rank": k, "step": 5})
        os.utime(rundir.heartbeat_file(k), (beat, beat))
    rundir.write_node_failure(1, {"reason": "rank 1 exited with code 1: Connection closed by peer",
                                  "consequence": True, "time": now})
    assert root_cause(part, rundir, ("n0", "n1", "n2"), 1).startswith("node 2 (Slurm node n2, rank 2) lost")


def test_sigterm_while_a_step_runs_is_an_interrupt_and_the_handler_is_restored():
    import signal

    from scalelab.run.slurmnodes import sigterm_interrupts

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with sigterm_interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here, at once
    assert signal.getsignal(signal.SIGTERM) is before
