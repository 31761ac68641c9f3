"""What a namespaced launch costs: `scalelab train --local-nodes N` as a whole command, and its launch alone (the
run's `phases.json`: launch to ranks_done, which holds the cluster's set-up and teardown, the node agents, the
ranks' start and their training), for one or more source trees run interleaved, round by round.

Prints per tree the median (min-max) of both in seconds and, against the first tree, the ratio of each round's
pair (the machine's drift cancels within a pair). Needs root (network namespaces).

    python benchmarks/node_launch.py --src /tmp/base/src --src src --rounds 6      # before / after a change
    python benchmarks/node_launch.py --nodes 3 --link-gbps 1                        # this checkout only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(src: str | None, nodes: int, link: float | None, steps: int) -> tuple[float, float]:
    """(whole command s, launch s) of one `scalelab train` over `nodes` namespaced nodes in a fresh store."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory(prefix="scalelab-node-launch-") as tmp:
        argv = [sys.executable, "-m", "scalelab", "train", "--model", "mlp", "--dataset", "synthetic", "--samples",
                "128", "--global-batch", str(8 * nodes), "--steps", str(steps), "--ranks", "1", "--local-nodes",
                str(nodes), "--store", tmp, *(["--link-gbps", f"{link:g}"] if link else [])]
        began = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        wall = time.monotonic() - began
        if proc.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
        phases = json.loads(next(Path(tmp, "runs").glob("*/phases.json")).read_text())
        return wall, phases["ranks_done"] - phases["launch"]


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", action="append", default=None, help="a source tree (repeat: interleaved); default: this")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--link-gbps", type=float, default=None)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    srcs = args.src or [None]
    one_run(srcs[0], args.nodes, args.link_gbps, args.steps)  # warm-up: page cache, pyc files
    got: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(srcs))}
    for r in range(args.rounds):
        for i, src in enumerate(srcs):
            got[i].append(one_run(src, args.nodes, args.link_gbps, args.steps))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{got[i][-1][0]:.2f} s" for i in got), flush=True)
    print(f"\n{args.nodes} nodes x 1 rank, {args.steps} steps, link {args.link_gbps or 'unshaped'}; "
          f"n = {args.rounds} per tree, median (min-max)")
    for i, src in enumerate(srcs):
        walls, launches = zip(*got[i])
        line = f"{src or 'this checkout'}: command {spread(list(walls))} s, launch {spread(list(launches))} s"
        if i:
            ratio = [a[0] / b[0] for a, b in zip(got[i], got[0])]
            line += f"; command / first tree's, pair by pair: {spread(ratio)}"
        print(line)


if __name__ == "__main__":
    main()
