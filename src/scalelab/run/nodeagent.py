"""One node of a multi-node run: `python -m scalelab.run.nodeagent SPEC_JSON`, started by run/nodes.py inside
the node's network namespace, or by srun on each node of a Slurm job step (run/slurmnodes.py: its node rank from
SLURM_NODEID). Runs torchrun's agent for this node's ranks (or, for the Horovod engine, Horovod's
per-node launch: run/hvdnode.py); on failure writes the root cause as
seen from this node to the run directory (`failure.node<k>.json`) and exits 1.

Node 0 hosts the rendezvous store, bound to its private address only (`bound_store`: torchrun's own server would
bind the wildcard), and keeps it up after its ranks are done until its stdin closes: the launcher closes it once
every other node has ended, so no node finds the store gone in torchrun's exit barrier. Under Slurm there is no
such pipe: each node records where it runs and, at its end, that it is done (`slurm.node<k>.json`), and node 0
waits for the others' records.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from scalelab.distenv import exit_without_teardown
from scalelab.errors import ScalelabError
from scalelab.run.launch import LaunchSpec, bound_store, torchrun_launch
from scalelab.store.rundir import RunDir


DONE_WAIT_S = 60.0  # under Slurm, how long node 0 keeps the store up for the other nodes' exit barrier at most


def slurm_node_rank(environ=os.environ) -> int:
    """This node's rank within its job step: Slurm's SLURM_NODEID (srun's one task per node)."""
    value = environ.get("SLURM_NODEID")
    if value is None or not value.isdigit():
        raise RuntimeError(f"SLURM_NODEID {value!r}: a node agent of --launcher slurm runs as a task of srun")
    return int(value)


def wait_for_nodes(rundir: RunDir, nodes: int, timeout_s: float = DONE_WAIT_S, poll_s: float = 0.1) -> None:
    """Under Slurm (no pipe from the launcher): until every other node recorded that it is done, or one failed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(rundir.node_failure_file(k).exists() for k in range(1, nodes)):
            return
        if all(_done(rundir, k) for k in range(1, nodes)):
            return
        time.sleep(poll_s)


def _done(rundir: RunDir, k: int) -> bool:
    if not rundir.slurm_node_file(k).exists():
        return False
    try:
        return bool(rundir.read_slurm_node(k).get("done"))
    except (OSError, ValueError, ScalelabError):  # being replaced: not done as far as this look can tell
        return False


def record_slurm_node(rundir: RunDir, k: int, done: bool, environ=os.environ) -> None:
    rundir.write_slurm_node(k, {"job": environ.get("SLURM_JOB_ID"), "step": environ.get("SLURM_STEP_ID"),
                                "node": environ.get("SLURMD_NODENAME"), "host": socket.gethostname(),
                                "pid": os.getpid(), "done": done})


def main(argv: list[str] | None = None) -> int:
    data = json.loads((argv if argv is not None else sys.argv[1:])[0])
    launcher = data.pop("launcher", "torchrun")
    slurm = data.pop("slurm", False)
    if data["node_rank"] < 0:  # one srun for all nodes: the rank is this task's node in the step
        data["node_rank"] = slurm_node_rank()
    spec = LaunchSpec(**{**data, "run_dir": Path(data["run_dir"]), "args": tuple(data["args"])})
    rundir = RunDir(spec.run_dir)
    from scalelab.run.worker import end_with_parent

    end_with_parent()  # scalelab SIGKILLed: stop this node's ranks instead of training on as orphans
    try:
        if slurm:
            record_slurm_node(rundir, spec.node_rank, done=False)
        if launcher != "torchrun":  # Horovod's: node 0's services are the launcher's own (run/hvdnode.py)
            from scalelab.run.kinds import LAUNCHERS

            LAUNCHERS[launcher](spec)
        elif spec.node_rank == 0:
            host, port = spec.endpoint.rsplit(":", 1)
            with bound_store(host, int(port)):
                torchrun_launch(spec, fork=True)
                if slurm:
                    wait_for_nodes(rundir, spec.nnodes)
                else:
                    sys.stdin.read()  # until the launcher closes it (or dies): the other nodes are done with it
        else:
            torchrun_launch(spec, fork=True)
        if slurm:
            record_slurm_node(rundir, spec.node_rank, done=True)
    except BaseException as err:  # noqa: BLE001 - every failure of this node is recorded for the launcher
        from scalelab.run.execute import failure_reason, is_consequence

        reason, _ = failure_reason(err)
        rundir.write_node_failure(spec.node_rank, {
            "reason": reason, "consequence": is_consequence(reason), "time": time.time()})
        return 1
    return 0


if __name__ == "__main__":
    # the node's outcome is recorded by now (its ranks' files, failure.node<k>.json); the teardown skipped is time
    # every launch waits for, node 0's agent's after the other nodes' (it keeps the store up until they have ended)
    exit_without_teardown(main())
