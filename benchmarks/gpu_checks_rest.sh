#!/usr/bin/env bash
# The checks gpu_checks.sh ran out of time for in its first sitting: the CUDA tests, max batch, NCCL on one GPU.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 SCALELAB_STORE=/tmp/gpu-store
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/gpu2.log") 2>&1
W=/tmp/gpu-work; mkdir -p $W; SL="python3 -m scalelab"
echo "=== 7b NCCL, 2 processes on one GPU ($(date +%T))"
cat > $W/nccl2.py <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", 0)); t = torch.ones(2**20, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize(); print("rank", dist.get_rank(), "allreduce ok", t[0].item())
dist.destroy_process_group()
PY
timeout 20 torchrun --nproc-per-node 2 $W/nccl2.py 2>&1 | grep -i "error\|ok\|duplicate" | grep -v "error_file\|errors.html" | head -4
echo "=== 5 max batch ($(date +%T))"
timeout 110 $SL max-batch --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --variants base \
  --out $W/mb 2>&1 | grep "^trial\|max_batch\|^ *as configured" | cut -c1-160
best=$(python3 -c "import pandas as p,glob; print(int(p.read_csv(glob.glob('$W/mb/**/max_batch*.csv', recursive=True)[0])['max_batch'].iloc[0]))")
[ -n "$best" ] && for b in $best $((best + 1)); do
  timeout 25 $SL train --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --global-batch $b \
    --samples $((b * 2)) --steps 2 --warmup-steps 0 >/tmp/b$b.log 2>&1; echo "batch $b under 8 GiB: exit $? $(grep -io -m1 'out of memory' /tmp/b$b.log)"
done
echo "=== 1 pytest -m cuda ($(date +%T))"
timeout 190 python3 -m pytest -q -m cuda -p no:cacheprovider -rA --durations=0 tests 2>&1 | grep -v "^$" | tail -45
echo "=== done ($(date +%T))"
