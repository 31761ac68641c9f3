#!/usr/bin/env bash
# What gpu_checks.sh left open, in one bounded command (about 330 s on a GPU; logs to $OUT/gpu2.log):
#   run(command="bash benchmarks/gpu_checks_rest.sh", timeout_s=360)
# check 10 (the lost-speedup breakdown of 1 GPU vs 2 ranks), the CUDA max-batch test alone, and check 5 (max batch
# under an 8 GiB cap, then the found batch and the next by hand). Each step has its own timeout.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 SCALELAB_STORE=/tmp/gpu-store
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/gpu2.log") 2>&1
W=/tmp/gpu-work; mkdir -p $W; SL="python3 -m scalelab"
echo "=== 10 lost-speedup breakdown: 1 GPU vs 2 ranks, gloo on CUDA tensors ($(date +%T))"
# scalelab puts one rank per GPU on a node, so the 2 ranks are 2 namespace nodes of 1 rank each, both on GPU 0
# (needs root and iproute2 there: the log says so if not). Cells: 1 worker, 2 workers, its no-op and no-sync variants.
command -v ip >/dev/null || echo "no iproute2 here: namespace nodes cannot be made"
timeout 120 $SL scale --device cuda --backend gloo --model cnn --dataset synthetic --samples 8192 --local-nodes 2 \
  --ranks 1 --batches 128 --mode strong --launches 1 --steps 30 --study lost --out $W/lost 2>&1 | tail -6
timeout 30 python3 - "$W/lost" <<'PY'
import glob, subprocess, sys
import pandas as pd
found = glob.glob(f"{sys.argv[1]}/**/scale_strong_lost_speedup.csv", recursive=True)
if not found:
    sys.exit("no lost-speedup table was written")
t = pd.read_csv(found[0])
for (w, b), g in t.groupby(["workers", "global_batch"]):
    v = g.set_index("part")["value(ms)"]
    parts = v["ideal"] + sum(v[p] for p in ("data", "compute", "sync_work", "waiting", "wire", "interference",
                                            "hidden", "rest"))
    print(g[["part", "value(ms)", "ci_low(ms)", "ci_high(ms)", "measured", "share_of_gap"]].to_string(index=False))
    print(f"{w} workers, batch {b}: ideal + parts + rest = {parts:.3f} ms, measured {v['measured']:.3f} ms:",
          "ADD UP" if abs(parts - v["measured"]) < 1e-6 else "DO NOT ADD UP", "| every part measured:",
          bool(g["measured"].all()), f"| rest {100 * g.set_index('part').loc['rest', 'share_of_gap']:.0f} % of the gap")
runs = pd.read_csv(glob.glob(f"{sys.argv[1]}/**/scale_strong.csv", recursive=True)[0])
rid = runs[runs["workers"] == 2]["run_id"].iloc[0]
subprocess.run(["timeout", "20", sys.executable, "-m", "scalelab", "explain", rid], check=False)
PY
echo "=== 1 the CUDA max-batch test alone ($(date +%T))"
timeout 60 python3 -m pytest -q -m cuda -p no:cacheprovider -k max_batch_on_cuda tests 2>&1 | grep -v "^$" | tail -12
echo "=== 5 max batch under an 8 GiB cap ($(date +%T))"
timeout 100 $SL max-batch --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --variants base \
  --out $W/mb 2>&1 | grep "^trial\|max_batch\|^ *as configured" | cut -c1-160
best=$(python3 -c "import pandas as p,glob; print(int(p.read_csv(glob.glob('$W/mb/**/max_batch*.csv', recursive=True)[0])['max_batch'].iloc[0]))")
[ -n "$best" ] && for b in $best $((best + 1)); do
  timeout 20 $SL train --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --global-batch $b \
    --samples $((b * 2)) --steps 2 --warmup-steps 0 >/tmp/b$b.log 2>&1; echo "batch $b under 8 GiB: exit $? $(grep -io -m1 'out of memory' /tmp/b$b.log)"
done
echo "=== done ($(date +%T))"
