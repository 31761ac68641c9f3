"""Slurm job steps against namespace nodes in the same sitting (issue 59's acceptance): each multi-node cell run by
`--launcher slurm` and by `--local-nodes` (namespace nodes of this machine, the link shaped to the same rate), the
same threads per rank, interleaved round by round, each cell's median step decided between the two launchers by
the study's rule (lab/decision.py `decide`: the ratio's interval from the pooled launch noise, equivalent within
±10 %, better or worse beyond noise, else undecided).

Inside an allocation whose nodes are namespace nodes of this machine (the test cluster):
    python benchmarks/slurm_vs_local.py --nodes 2,3 --launches 3 --store DIR
Or let it make that cluster (tests/dist/slurm_cluster.py: 3 nodes, links shaped to --link-gbps), submit itself with
sbatch and print the job's output (needs root and Debian's slurm-wlm and munge):
    python benchmarks/slurm_vs_local.py --cluster --nodes 2,3 --launches 3
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from scalelab.analysis.compare import trusted

ROOT = Path(__file__).resolve().parents[1]


def compare(nodes: list[int], launches: int, link_gbps: float, steps: int, store_dir: Path) -> None:
    from scalelab.analysis.scaling import scaling_table
    from scalelab.config import TrainConfig
    from scalelab.lab.cells import Cell, Cells, with_fields
    from scalelab.lab.decision import UNDECIDED, decide, model_for, pooled, step_side
    from scalelab.lab.progress import PlainProgress
    from scalelab.store import Store

    # an MLP of 7.4 MB of gradients, one rank and one thread a node, a blocking allreduce (the dist test's cells)
    base = TrainConfig(model="mlp", model_options="depth=2,width=512", dataset="synthetic", samples=2048,
                       ranks=1, threads=1, sync="allreduce", steps=steps, warmup_steps=1, global_batch=48)
    cells = []
    for k in nodes:
        cells.append(Cell(f"slurm, {k} nodes", with_fields(base, local_nodes=k, nnodes=k, nodes_launcher="slurm"),
                          repeats=launches))
        cells.append(Cell(f"local, {k} nodes", with_fields(base, local_nodes=k, nnodes=k, link_gbps=link_gbps),
                          repeats=launches))
    engine = Cells(Store(store_dir), "slurm_vs_local", progress=PlainProgress(print))
    started = time.monotonic()
    results = engine.run(cells, group="compare", interleave=True)
    rows = {res.label: scaling_table(engine.rows([res]), "strong").iloc[0] for res in results}
    sides = {label: step_side(row, label) for label, row in rows.items()}
    print(f"{len(cells)} cells x {launches} launches in {time.monotonic() - started:.0f} s; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with pooled(model_for(list(sides.values()))):  # one noise model over every cell of the sitting
        for k in nodes:
            a, b = sides[f"slurm, {k} nodes"], sides[f"local, {k} nodes"]
            d = decide(a, b, question=f"launcher at {k} nodes", family=len(nodes))
            print(f"{k} nodes: slurm {a.value:.1f} ms ({a.interval[0]:.1f}-{a.interval[1]:.1f}, launch medians "
                  f"{', '.join(f'{v:.1f}' for v in a.launch_values or ())}, {a.quality}) vs local {b.value:.1f} ms "
                  f"({b.interval[0]:.1f}-{b.interval[1]:.1f}, launch medians "
                  f"{', '.join(f'{v:.1f}' for v in b.launch_values or ())}, {b.quality}): {verdict(d)}")
            if d.verdict == UNDECIDED and not (trusted(a.quality) and trusted(b.quality)):
                # a flagged side (a busy host) is never decided; what the launches say with the flag set aside,
                # for a machine shared with other work: not the rule's verdict
                aside = decide(replace(a, quality="ok"), replace(b, quality="ok"), question=d.question,
                               family=len(nodes))
                print(f"  with the flag set aside (not the rule's verdict): {verdict(aside)}")


def verdict(d) -> str:
    low, high = d.interval if d.interval else (float("nan"), float("nan"))
    more = f"; about {d.more} launches each would decide it" if d.more else ""
    return (f"{d.verdict}; slurm's speed against local ×{d.against.value / d.chosen.value:.3f}, "
            f"{100 * d.confidence:.1f} % interval {low:.3f}-{high:.3f}; {d.why}{more}")


def submit_on_test_cluster(args: argparse.Namespace) -> None:
    """Make the 3-node namespace Slurm cluster, run this script in an sbatch job on it, print the job's output."""
    sys.path.insert(0, str(ROOT / "tests" / "dist"))
    from slurm_cluster import slurm_cluster  # noqa: E402 - the test harness

    from scalelab.run import netns

    with tempfile.TemporaryDirectory(prefix="scalelab-slurm-vs-local-") as tmp, \
            slurm_cluster(Path(tmp) / "slurm", nodes=max(args.nodes), link_gbps=args.link_gbps) as slurm:
        out, script = Path(tmp) / "job.out", Path(tmp) / "job.sbatch"
        argv = [sys.executable, str(Path(__file__).resolve()), "--nodes", ",".join(map(str, args.nodes)),
                "--launches", str(args.launches), "--link-gbps", f"{args.link_gbps:g}", "--steps", str(args.steps),
                "--store", str(Path(tmp) / "store")]
        script.write_text("\n".join([
            "#!/bin/bash", f"#SBATCH --nodes={max(args.nodes)}", "#SBATCH --ntasks-per-node=1",
            "#SBATCH --time=00:20:00", "set -euo pipefail", f"export GLOO_SOCKET_IFNAME={netns.IFACE}",
            " ".join(map(shlex.quote, argv))]) + "\n")
        print(script.read_text())
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        job = slurm.run("sbatch", "--parsable", f"--output={out}", str(script), env=env).stdout.strip()
        while True:
            state = next((w.split("=", 1)[1] for w in slurm.run("scontrol", "show", "job", job).stdout.split()
                          if w.startswith("JobState=")), None)
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                break
            time.sleep(2)
        text = out.read_text() if out.exists() else ""
        print(f"job {job}: {state}")
        print("\n".join(line for line in text.splitlines() if not line.startswith("[")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--link-gbps", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--cluster", action="store_true", help="make the namespace Slurm cluster and submit with sbatch")
    args = ap.parse_args()
    if args.cluster:
        submit_on_test_cluster(args)
        return
    if "SLURM_JOB_ID" not in os.environ:
        sys.exit("slurm_vs_local: not inside a Slurm allocation; run it in one, or with --cluster")
    compare(args.nodes, args.launches, args.link_gbps, args.steps, args.store or Path(tempfile.mkdtemp()))


if __name__ == "__main__":
    main()
