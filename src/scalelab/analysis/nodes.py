"""Per-node figures of one run (pure): seed 003's tables 1-3 — time per epoch, CPU user / system and network
MB/s of each node.

- A node's ranks are ranks node x ranks_per_node ... (node + 1) x ranks_per_node - 1 (torchrun's numbering).
- time per epoch (s) = the mean timed step of the node's slowest rank (training time, evaluation excluded)
  x steps per epoch: what the node itself waited, as the seed measured it on each node.
- CPU user / system (%) = the node's run processes' user and system CPU seconds (its ranks and their loader
  workers, read from /proc by the node's first rank: scalelab.measure.machine) over the timed window, as a share
  of one core (100 % = one core busy all the time).
- network sent / received (MB/s) = the node's interfaces other than loopback (its network namespace's counters,
  or the host's for a node that is a whole machine) over the timed window, 1 MB = 10^6 bytes.
- The timed window is rank 0's (scalelab.analysis.noise.timed_window); counters are interpolated at its ends.
  A figure whose samples do not cover the window is None.
"""
from __future__ import annotations

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.noise import timed_window, window_deltas
from scalelab.analysis.summary import per_step, steps_frame

CPU = ("cpu_run_user(s)", "cpu_run_system(s)")
NET = ("net_sent(bytes)", "net_recv(bytes)", "lo_sent(bytes)", "lo_recv(bytes)")
COLUMNS = ("epoch(s)", "cpu_user(%)", "cpu_system(%)", "net_sent(MB/s)", "net_recv(MB/s)")


def node_rows(records: list[dict], samples: list[dict], *, ranks_per_node: int, nodes: int,
              steps_per_epoch: int) -> list[dict]:
    """One row per node: {node, ranks, epoch(s), cpu_user(%), cpu_system(%), net_sent(MB/s), net_recv(MB/s)}."""
    window = timed_window(records)
    rows = []
    for node in range(nodes):
        ranks = range(node * ranks_per_node, (node + 1) * ranks_per_node)
        mine = [r for r in records if r.get("rank") in ranks]
        steps = per_step(steps_frame(mine)) if mine else None
        row = dict.fromkeys(COLUMNS)
        row.update(node=node, ranks=len(ranks))
        if steps is not None and len(steps):
            row["epoch(s)"] = float(steps["train(s)"].mean()) * steps_per_epoch
        own = [s for s in samples if s.get("rank") in ranks]
        if window is not None:
            seconds = window[1] - window[0]
            cpu = window_deltas(own, CPU, *window)
            if cpu is not None:
                row["cpu_user(%)"] = 100.0 * cpu["cpu_run_user(s)"] / seconds
                row["cpu_system(%)"] = 100.0 * cpu["cpu_run_system(s)"] / seconds
            net = window_deltas(own, NET, *window)
            if net is not None:
                row["net_sent(MB/s)"] = (net["net_sent(bytes)"] - net["lo_sent(bytes)"]) / seconds / 1e6
                row["net_recv(MB/s)"] = (net["net_recv(bytes)"] - net["lo_recv(bytes)"]) / seconds / 1e6
        rows.append(row)
    return rows


def node_table(runs: list[dict]) -> pd.DataFrame:
    """Per-node figures of stored runs (as the cell engine gives them, every launch of a cell: `runs(...,
    all_repeats=True)`): one row per (nodes, workers, global batch, node), each figure the median over the
    completed launches of that cell, `launches` how many."""
    rows = []
    for run in runs:
        summary = run.get("summary") or {}
        if run["status"] != "completed" or keys.STEPS_PER_EPOCH not in summary:
            continue
        c, files = run["config"], run["files"]
        nodes = c.get("nnodes", 1)
        for row in node_rows(files.read_steps(), files.read_system(), ranks_per_node=c["ranks"], nodes=nodes,
                             steps_per_epoch=summary[keys.STEPS_PER_EPOCH]):
            rows.append({"nodes": nodes, "workers": c["ranks"] * nodes, "global_batch": c["global_batch"], **row})
    if not rows:
        return pd.DataFrame(columns=["nodes", "workers", "global_batch", "node", "ranks", *COLUMNS, "launches"])
    frame = pd.DataFrame(rows)
    by = ["nodes", "workers", "global_batch", "node", "ranks"]
    out = frame.groupby(by, sort=True)[list(COLUMNS)].median()
    out["launches"] = frame.groupby(by, sort=True).size()
    return out.reset_index()
