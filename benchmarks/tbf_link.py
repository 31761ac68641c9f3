"""Does a kernel-shaped link carry its rate, and how early does a collective after an idle spell finish?

Two namespace nodes (`--local-nodes 2`), one gloo rank each, each node's link shaped by tbf as scalelab shapes it
(`analysis.bandwidth.tbf_burst_bytes`), or with another bucket (`--buckets`, KiB; both ends of the veth are
re-shaped with `tc qdisc replace`). Per rate, bucket, collective and size, `--iters` timed calls:
- back to back (a barrier between calls): the median time / the wire time (payload at the rate, less TCP/IP
  headers). Near 1: the link carries its rate; above: the shaping itself costs throughput.
- after `--gap-ms` of idle link (sleep, barrier, call): how much earlier than back to back. tbf's bucket is full
  after an idle spell and its bytes pass early; a real link of that rate has no such burst, and the performance
  model leaves it out.
allreduce sends both ways at once (timed as the slower rank); scatter sends one way (timed on the receiver).
Prints one row per point with the interquartile range of its calls; run it alone.

    python benchmarks/tbf_link.py [--rates 0.2,0.5,1] [--buckets scalelab,64] [--sizes 256K,800K,2M]
        [--iters 25] [--gap-ms 20]
Needs root (network namespaces); about 30 s per rate and bucket.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PORT = 29611


def worker(rank: int, master: str, out: Path, sizes: list[int], iters: int, gap_s: float) -> None:
    """One rank: per op, size and gap, `iters` timed calls (the first 5 of 5 + iters untimed), written to `out`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{PORT}", rank=rank, world_size=2)
    records = []
    for op in ("allreduce", "scatter"):
        for size in sizes:
            for gap in (0.0, gap_s):
                t = torch.ones(size // 4)
                times = []
                for _ in range(5 + iters):
                    if gap:
                        time.sleep(gap)
                    dist.barrier()
                    start = time.perf_counter()
                    if op == "allreduce":
                        dist.all_reduce(t)
                    else:
                        dist.scatter(t, [t, t] if rank == 0 else None, src=0)
                    times.append(time.perf_counter() - start)
                records.append({"op": op, "size": size, "gap": gap, "times": times[5:]})
    out.write_text(json.dumps(records))
    dist.destroy_process_group()


def reshape(cluster, gbps: float, burst: int) -> None:
    """Both ends of every node's veth to tbf at `gbps` with a bucket of `burst` bytes."""
    from scalelab.run import netns

    args = netns.tbf_args(gbps, burst)
    for node in cluster.nodes:
        for ns, dev in ((node.netns, netns.IFACE), (cluster.switch, f"n{node.index}")):
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *args], check=True,
                           capture_output=True)


def measure(gbps: float, burst: int, args) -> list[dict]:
    """Both ranks' records over a fresh 2-node cluster at `gbps` with a bucket of `burst` bytes."""
    from scalelab.run.netns import local_cluster

    with local_cluster(2, link_gbps=gbps) as cluster, tempfile.TemporaryDirectory() as tmp:
        reshape(cluster, gbps, burst)
        outs = [Path(tmp) / f"rank{n.index}.json" for n in cluster.nodes]
        procs = [subprocess.Popen(["ip", "netns", "exec", n.netns, sys.executable, __file__, "--worker", str(n.index),
                                   cluster.nodes[0].address, str(out), "--sizes", args.sizes,
                                   "--iters", str(args.iters), "--gap-ms", str(args.gap_ms)],
                                  stderr=subprocess.DEVNULL)
                 for n, out in zip(cluster.nodes, outs)]
        try:
            for p in procs:
                if p.wait(timeout=600):
                    raise SystemExit(f"tbf_link: a rank failed at {gbps:g} Gbit/s (exit {p.returncode})")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        return [json.loads(out.read_text()) for out in outs]


def timed(ranks: list[list[dict]], op: str, size: int, gap: float) -> list[float]:
    """Per call: allreduce's slower rank; scatter's receiver (rank 1), whose call ends when the bytes are in."""
    per_rank = [next(r["times"] for r in recs if (r["op"], r["size"], r["gap"]) == (op, size, gap)) for recs in ranks]
    return [max(ts) for ts in zip(*per_rank)] if op == "allreduce" else per_rank[1]


def quartiles(times: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(times, n=4)
    return 1e3 * q1, 1e3 * q2, 1e3 * q3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="0.2,0.5,1", help="Gbit/s")
    ap.add_argument("--buckets", default="scalelab", help="KiB, or scalelab (tbf_burst_bytes)")
    ap.add_argument("--sizes", default="256K,800K,2M")
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--worker", nargs=3, metavar=("RANK", "MASTER", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    from scalelab.analysis.bandwidth import tbf_burst_bytes
    from scalelab.perf.links import wire_beta
    from scalelab.measure.commbench import format_size, parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        rank, master, out = args.worker
        worker(int(rank), master, Path(out), sizes, args.iters, args.gap_ms / 1e3)
        return 0
    from scalelab.run.netns import check_usable

    check_usable(1.0)
    print(f"{'Gbit/s':>6} {'bucket':>9} {'op':>9} {'size':>6} {'wire(ms)':>8}  {'back-to-back(ms) [IQR]':>24} "
          f"{'/wire':>5}  {'after idle(ms) [IQR]':>22} {'early(ms)':>9}")
    for gbps in (float(r) for r in args.rates.split(",")):
        for bucket in args.buckets.split(","):
            burst = tbf_burst_bytes(gbps) if bucket == "scalelab" else int(float(bucket) * 1024)
            ranks = measure(gbps, burst, args)
            for op in ("allreduce", "scatter"):
                for size in sizes:
                    wire = 1e3 * size * wire_beta(gbps)
                    lo, busy, hi = quartiles(timed(ranks, op, size, 0.0))
                    ilo, idle, ihi = quartiles(timed(ranks, op, size, args.gap_ms / 1e3))
                    print(f"{gbps:6g} {format_size(burst):>9} {op:>9} {format_size(size):>6} {wire:8.2f}  "
                          f"{busy:8.2f} [{lo:6.2f}-{hi:6.2f}] {busy / wire:5.2f}  {idle:6.2f} [{ilo:6.2f}-{ihi:6.2f}] "
                          f"{busy - idle:+9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
