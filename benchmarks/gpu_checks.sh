#!/usr/bin/env bash
# GPU-CHECKS.md in one bounded command on the device machine (logs to $OUT/gpu.log):
#   run(command="bash benchmarks/gpu_checks.sh", timeout_s=580)
# Each check has its own timeout, so that one hang costs its slice, not the lease.
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 SCALELAB_STORE=/tmp/gpu-store
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/gpu.log") 2>&1
S=/tmp/gpu-store; W=/tmp/gpu-work; mkdir -p $W
sec() { echo; echo "=== $* ($(date +%T))"; }
SL="python3 -m scalelab"
python3 -c 'import scipy, click, typer, rich, pandas, matplotlib, jinja2, psutil, yaml' || echo "MISSING PACKAGES"
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'

sec 1 pytest -m cuda
[ -z "${SKIP_TESTS:-}" ] && timeout 140 python3 -m pytest -q -m cuda -p no:cacheprovider -rs tests 2>&1 | tail -15

sec 2 train resnet18 on one GPU with the CUDA loader defaults, then scalelab vs a bare loop at the same loader settings
timeout 40 $SL train --device cuda --model resnet18 --dataset synthetic --global-batch 256 --steps 60 --samples 15360 2>&1 | tail -25
# two loader settings (resolved: 2 workers + pinned; and 0 workers), 2 pairs each: 8 launches (the acceptance's
# >= 5 pairs per model need a lease of their own)
[ -z "${SKIP_TESTS:-}" ] && timeout 100 python3 benchmarks/overhead.py --device cuda --models resnet18 --pairs 2 2>&1 | grep -v "^epoch"

sec 4 precision
timeout 45 $SL amp --device cuda --model resnet18 --dataset synthetic --global-batch 256 --steps 120 --samples 30720 \
  --eval-every 40 --launches 1 --out $W/amp 2>&1 | tail -25

sec 5 max batch under an 8 GiB cap, then the found batch and the next by hand
timeout 80 $SL max-batch --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --variants base \
  --out $W/mb 2>&1 | tail -12
best=$(python3 -c "import pandas as p,glob; print(int(p.read_csv(glob.glob('$W/mb/**/max_batch*.csv', recursive=True)[0])['max_batch'].iloc[0]))")
[ -n "$best" ] && for b in $best $((best + 1)); do
  timeout 25 $SL train --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --global-batch $b \
    --samples $((b * 2)) --steps 2 --warmup-steps 0 >/tmp/b$b.log 2>&1; echo "batch $b under 8 GiB: exit $? $(grep -i -m1 'memory' /tmp/b$b.log)"
done

sec 6 one-GPU study
timeout 90 $SL study --config examples/study-1gpu.yaml --only profile,batch_sweep,checkpointing --out $W/study 2>&1 | tail -15; ls $W/study | head

sec 8 probe on a script that initialises CUDA late: in check 1 '(test_a_probed_script_that_initialises_cuda_late)'
sec 9 emulated latency on NCCL, memory limit on CUDA '(check 1: test_a_memory_limit_on_cuda_caps_the_caching_allocator)'
timeout 15 $SL train --device cuda --model cnn --sync allreduce --net-latency-ms 1 --steps 4 2>&1 | tail -2; echo "exit $?"
sec 7b NCCL, 2 processes on one GPU
cat > $W/nccl2.py <<'PY'
import os, torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", 0)); t = torch.ones(2**20, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize(); print("rank", dist.get_rank(), "allreduce ok", t[0].item())
dist.destroy_process_group()
PY
timeout 20 torchrun --nproc-per-node 2 $W/nccl2.py 2>&1 | grep -v "^W\|^\*" | tail -4
tar czf "$OUT/study.tgz" -C $W study 2>/dev/null; echo "=== done ($(date +%T))"
