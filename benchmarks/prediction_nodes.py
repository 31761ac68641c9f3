"""Does the performance model predict a cluster it was not calibrated on? Namespace nodes, kernel-shaped links.

Nodes are network namespaces on this machine (`--local-nodes`), one rank each, joined by a bridge; each node's link
is shaped by the kernel (tbf). For each node count k:
- calibration (in-sample): compute without sync at k nodes, in-situ per-parameter allreduce, overlapped buckets
  and gather/scatter (its own in-training scale) at k nodes over the calibration link (1 Gbit/s), a `bench comm`
  allreduce sweep over that link, and one on loopback (what moving bytes costs the hosts themselves;
  scalelab.perf.links);
- measured points: every sync strategy over the calibration link (in-sample) and over the held-out links
  (0.5 and 0.2 Gbit/s, unshaped), each launched --repeats times in interleaved rounds; a point is the median of
  its launches' median steps, with the launches' interval.
With more nodes than cores (3 and 4 nodes on 2 cores) the CPU is oversubscribed: compute is calibrated at that
node count, so those points are held out for communication only.
Prints every point, then the in-sample and held-out median and max |error|, and how many predictions fall outside
the measured interval (beyond_ci(%): the distance past its nearer end, in % of the measured step).
Goal on a quiet machine: held-out median |error| <= 10 %, max <= 25 %.

    python benchmarks/prediction_nodes.py [--nodes 2,3,4] [--links 0.5,0.2,unshaped] [--calibration-gbps 1]
        [--strategies gather_scatter,allreduce,bucketed,ddp] [--repeats 3] [--model-options depth=1,width=64]
        [--steps 30] [--store DIR] [--out DIR]
Needs root (network namespaces); takes ~40 minutes with the defaults on 2 cores.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def gbps(text: str) -> float | None:
    return None if text == "unshaped" else float(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,3,4")
    ap.add_argument("--links", default="0.5,0.2,unshaped", help="held-out links (Gbit/s, or unshaped)")
    ap.add_argument("--calibration-gbps", type=float, default=1.0)
    ap.add_argument("--strategies", default="gather_scatter,allreduce,bucketed,ddp")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--model-options", default="depth=1,width=64", help="the MLP: 0.8 MB of gradients")
    ap.add_argument("--batches", default="16,32", help="per-rank batches of the compute calibration")
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch of the measured points")
    ap.add_argument("--steps", type=int, default=30,
                    help="steps per launch (2 untimed): the median of 28 rather than 8 steps")
    ap.add_argument("--store", type=Path, default=None, help="run store (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=None, help="table and figure (default: STORE/out)")
    args = ap.parse_args()

    import pandas as pd

    from scalelab.analysis import keys
    from scalelab.config import TrainConfig
    from scalelab.lab.base import write_table
    from scalelab.perf.calibration import calibrate
    from scalelab.lab.cells import Cell, Cells, with_fields
    from scalelab.perf.links import network_label
    from scalelab.perf.prediction import validate_measured
    from scalelab.perf import perfmodel as pm
    from scalelab.report import figures
    from scalelab.store import Store

    store = Store(args.store or Path(tempfile.mkdtemp(prefix="scalelab-bench-nodes-")))
    cal_link = args.calibration_gbps
    links = [cal_link] + [gbps(x) for x in args.links.split(",")]
    strategies = args.strategies.split(",")
    rows = []
    for k in (int(x) for x in args.nodes.split(",")):
        base = TrainConfig(model=args.model, model_options=args.model_options, dataset="synthetic", samples=4096,
                           eval_samples=64, ranks=1, local_nodes=k, link_gbps=cal_link, global_batch=k * args.batch,
                           steps=args.steps, warmup_steps=2, eval_every=10_000, bucket_mb=0.25, hang_timeout_s=120)
        cells = Cells(store, f"bench-nodes-{k}")
        cal = calibrate(base, cells, batches=[int(b) for b in args.batches.split(",")], say=print,
                        strategies=strategies)
        grid = [Cell(f"{k} nodes, {s}, {network_label(with_fields(base, sync=s, link_gbps=g).to_dict())}",
                     with_fields(base, sync=s, link_gbps=g), repeats=args.repeats)
                for g in links for s in strategies]
        results = cells.run(grid, group="points", interleave=True)
        for res in results:
            launches = cells.runs([res], all_repeats=True)
            pooled = cells.pooled(launches)
            if pooled is None:
                print(f"{res.cell.label}: no launch completed ({res.reason})")
                continue
            run = {**launches[-1], "summary": pooled, "status": "completed"}
            check = validate_measured(cal, [run], say=print)
            if check.empty:
                continue
            lo, hi = (pooled.get(c) for c in keys.ci_keys(keys.STEP_MEDIAN_MS))
            link = res.cell.config.link_gbps
            rows.append({**check.iloc[0].to_dict(), "nodes": k, "link": "unshaped" if link is None else f"{link:g}",
                         "held_out": link != cal_link, "launches": len(launches), "ci_low": lo, "ci_high": hi})
    table = pd.DataFrame(rows)
    # how far a prediction lies outside the launches' interval, in % of the measured step (0: inside): a miss
    # within the measurement's own spread says less about the model than one beyond it
    pred = table["predicted"]
    beyond = (pred - table["ci_high"]).clip(lower=0) + (table["ci_low"] - pred).clip(lower=0)
    table["beyond_ci(%)"] = 100 * beyond / table["measured"]
    pd.set_option("display.width", 220)
    cols = ["nodes", "link", "sync", "held_out", "launches", "compute(ms)", "comm(ms)", "exposed_comm(ms)",
            "predicted", "measured", "ci_low", "ci_high", "error(%)", "beyond_ci(%)"]
    print("\nevery point (ms; measured = median over launches of each launch's median step, its 95 % interval):")
    print(table[cols].to_string(index=False, float_format="{:,.1f}".format))
    for name, part in (("in-sample", table[~table["held_out"]]), ("held-out", table[table["held_out"]])):
        err = part["error(%)"].abs()
        outside = part["beyond_ci(%)"] > 0
        print(f"{name}: {len(part)} points, median |error| {err.median():.1f} %, max {err.max():.1f} %; "
              f"{int(outside.sum())} predicted outside the measured interval, by at most "
              f"{part['beyond_ci(%)'].max():.1f} %")
        for nodes, g in part.groupby("nodes"):
            print(f"  {nodes} nodes: median {g['error(%)'].abs().median():.1f} %, max {g['error(%)'].abs().max():.1f} %")
    held = table[table["held_out"]]["error(%)"].abs()
    met = held.median() <= 10 and held.max() <= 25
    print(f"goal (held-out median <= 10 %, max <= 25 %): {'met' if met else 'NOT met'}; "
          f"held-out = links {args.links} (calibrated at {cal_link:g} Gbit/s); points at 3+ nodes on 2 cores are "
          "held out for communication only (compute calibrated at that node count)")
    out = args.out or store.root / "out"
    write_table(table, out, "prediction_nodes")
    print(f"figure: {figures.predicted_vs_measured(table, out / 'prediction_nodes.png')}")
    print(f"overall median |error| {pm.median_abs_error(table):.1f} % over {len(table)} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
