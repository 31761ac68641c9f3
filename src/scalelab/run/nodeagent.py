"""One node of a --local-nodes run: `python -m scalelab.run.nodeagent SPEC_JSON`, started by run/nodes.py inside
the node's network namespace. Runs torchrun's agent for this node's ranks (or, for the Horovod engine, Horovod's
per-node launch: run/hvdnode.py); on failure writes the root cause as
seen from this node to the run directory (`failure.node<k>.json`) and exits 1.

Node 0 hosts the rendezvous store, bound to its private address only (`bound_store`: torchrun's own server would
bind the wildcard), and keeps it up after its ranks are done until its stdin closes: the launcher closes it once
every other node has ended, so no node finds the store gone in torchrun's exit barrier.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from scalelab.distenv import exit_without_teardown
from scalelab.run.launch import LaunchSpec, bound_store, torchrun_launch
from scalelab.store.rundir import RunDir


def main(argv: list[str] | None = None) -> int:
    data = json.loads((argv if argv is not None else sys.argv[1:])[0])
    launcher = data.pop("launcher", "torchrun")
    spec = LaunchSpec(**{**data, "run_dir": Path(data["run_dir"]), "args": tuple(data["args"])})
    from scalelab.run.worker import end_with_parent

    end_with_parent()  # scalelab SIGKILLed: stop this node's ranks instead of training on as orphans
    try:
        if launcher != "torchrun":  # Horovod's: node 0's services are the launcher's own (run/hvdnode.py)
            from scalelab.run.kinds import LAUNCHERS

            LAUNCHERS[launcher](spec)
        elif spec.node_rank == 0:
            host, port = spec.endpoint.rsplit(":", 1)
            with bound_store(host, int(port)):
                torchrun_launch(spec, fork=True)
                sys.stdin.read()  # until the launcher closes it (or dies): the other nodes are done with the store
        else:
            torchrun_launch(spec, fork=True)
    except BaseException as err:  # noqa: BLE001 - every failure of this node is recorded for the launcher
        from scalelab.run.execute import failure_reason, is_consequence

        reason, _ = failure_reason(err)
        RunDir(spec.run_dir).write_node_failure(spec.node_rank, {
            "reason": reason, "consequence": is_consequence(reason), "time": time.time()})
        return 1
    return 0


if __name__ == "__main__":
    # the node's outcome is recorded by now (its ranks' files, failure.node<k>.json); the teardown skipped is time
    # every launch waits for, node 0's agent's after the other nodes' (it keeps the store up until they have ended)
    exit_without_teardown(main())
