#!/usr/bin/env bash
# GPU-CHECKS.md on the device machine, in named checks, each under its own timeout, ending with one summary table
# (check, pass/fail, figure, card; also $OUT/summary.tsv). Logs: $OUT/gpu.log and $OUT/<check>.log.
#
#   run(command="bash benchmarks/gpu_checks.sh", timeout_s=560)                    # the core group, <= 9 min
#   run(command="CHECKS='perf' BASE=.base bash benchmarks/gpu_checks.sh", carry=[".base"], timeout_s=560)
#
# CHECKS names checks or groups (space-separated); the groups, each sized to fit 9 minutes of a 15-minute lease:
#   core = tests train study latency nccl2          (GPU-CHECKS 1, 2, 6, 9, 7b; about 5 min)
#   perf = profile overhead probe                   (2, issue 42's before/after; about 6 min)
#   more = maxbatch amp lost                        (5, 4, 10; about 5 min)
# Seen on an H200 (2026-11-27): tests 121 s, study 90 s, profile 68 s with BASE, overhead about 19 s a pair
# (5 pairs x 2 models: 190 s a tree). With BASE, run profile and overhead in calls of their own.
# BASE: a folder holding another tree's src/ (e.g. `git archive` of the commit before a change, put in an ignored
# folder and carried): profile and overhead then measure it too, in the same sitting, for a before/after.
# PAIRS: interleaved launch pairs per model in overhead (default 5, the acceptance's n).
set -u
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 SCALELAB_STORE=/tmp/gpu-store
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/gpu.log") 2>&1
W=/tmp/gpu-work; mkdir -p $W; SL="python3 -m scalelab"; PAIRS=${PAIRS:-5}; BASE=${BASE:-}
CHECKS=${CHECKS:-core}
CHECKS=${CHECKS//core/tests train study latency nccl2}; CHECKS=${CHECKS//perf/profile overhead probe}
CHECKS=${CHECKS//more/maxbatch amp lost}
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); CARD=${CARD:-no GPU}
python3 -c 'import scipy, click, typer, rich, pandas, matplotlib, jinja2, psutil, yaml, pynvml' || echo "MISSING PACKAGES"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
echo "card: $CARD; checks: $CHECKS; pairs: $PAIRS; base: ${BASE:-none}"
: >"$OUT/summary.tsv"

# check NAME SECONDS FUNCTION: run the function under its own timeout, its output in $OUT/NAME.log; then the
# function NAME_verdict (below) reads that log and prints "pass|FAIL<TAB>figure".
check() {
  local name=$1 limit=$2; shift 2
  echo; echo "=== $name (limit ${limit}s, $(date +%T))"
  local began=$SECONDS
  timeout -k 10 "$limit" bash -c "$1" >"$OUT/$name.log" 2>&1; local rc=$?  # the check's whole process group
  grep -v "^epoch \|USDT\|^W[0-9]" "$OUT/$name.log" | tail -40
  local took=$((SECONDS - began)) verdict
  if [ $rc -eq 124 ]; then verdict=$'FAIL\ttimed out after '"${limit}"' s'
  else verdict=$("${name}_verdict" "$rc" "$took" 2>&1 | tail -1); fi
  printf '%s\t%s\t%s\t%ss\n' "$name" "$verdict" "$CARD" "$took" >>"$OUT/summary.tsv"
}
log() { cat "$OUT/$1.log"; }

# 1: every CUDA test (none skipped for want of a GPU; those needing 2 GPUs skip)
tests() { python3 -m pytest -q -m cuda -p no:cacheprovider -rs tests; }
tests_verdict() { local s; s=$(log tests | grep -E "[0-9]+ (passed|failed)" | tail -1)
  [[ $1 -eq 0 ]] && echo -e "pass\t$s" || echo -e "FAIL\t$s $(log tests | grep -o '^FAILED [^ ]*' | tr '\n' ' ')"; }

# 2: one rank on CUDA with the CUDA loader defaults
train() { $SL train --device cuda --model resnet18 --dataset synthetic --global-batch 256 --steps 60 --samples 15360; }
train_verdict() { [[ $1 -eq 0 ]] && echo -e "pass\t$(log train | grep -m1 -io 'throughput[^|]*' | head -c 80)" ||
  echo -e "FAIL\texit $1"; }

# 2 (issue 42): scalelab / bare, interleaved pairs, at the resolved loader settings; BASE measured the same way
overhead() {
  if [ -n "$BASE" ]; then
    echo "--- base tree ($BASE)"
    PYTHONPATH=$PWD/$BASE/src python3 benchmarks/overhead.py --device cuda --models resnet18,bncnn --pairs "$PAIRS" \
      --loader 2,pinned
    echo "--- this tree"
  fi
  python3 benchmarks/overhead.py --device cuda --models resnet18,bncnn --pairs "$PAIRS" --loaders resolved
}
overhead_verdict() { local figs ok=pass
  figs=$(log overhead | grep "scalelab / bare over" | sed -E 's/.*\] *//; s/^([a-z0-9]+) .*median ([0-9.]+).*range ([0-9.-]+).*/\1 \2 (\3)/' |
    tr '\n' ';')
  for m in $(log overhead | grep "scalelab / bare over" | tail -2 | grep -o "median [0-9.]*" | cut -d' ' -f2); do
    python3 -c "import sys; sys.exit(0 if $m >= 0.97 else 1)" || ok=FAIL; done
  [[ $1 -eq 0 ]] || ok=FAIL; echo -e "$ok\tscalelab/bare median (range), base first if BASE: $figs"; }

# 3 (issue 42 item 3): where the measured loop loses time, both sides under torch.profiler
profile() {
  if [ -n "$BASE" ]; then echo "--- base tree ($BASE)"
    PYTHONPATH=$PWD/$BASE/src python3 benchmarks/overhead_profile.py --device cuda --models resnet18,bncnn \
      --loader 2,pinned --trace "$W/trace-base"; echo "--- this tree"; fi
  python3 benchmarks/overhead_profile.py --device cuda --models resnet18,bncnn --loaders resolved --cprofile \
    --trace "$W/trace"
}
profile_verdict() { [[ $1 -eq 0 ]] && echo -e "pass\t$(log profile | grep -E '^(bare|scalelab) ' |
  sed -E 's/ +/ /g; s/kernels.*//' | tr '\n' ';' | head -c 300)" || echo -e "FAIL\texit $1"; }

# 5 (issue 42 item 5): the probe and `scalelab run` of a plain script, against the script run bare
probe() { python3 benchmarks/probe_cost.py --device cuda --models resnet18 --global-batch 256 --samples 15360 \
  --steps 40 --warmup 8 --repeats 3 --comparisons probe,found; }
probe_verdict() { [[ $1 -eq 0 ]] && echo -e "pass\t$(log probe | grep -E '/ bare' | sed -E 's/ +/ /g' | tr '\n' ';')" ||
  echo -e "FAIL\texit $1"; }

# 6: the one-GPU study, all five experiments, with its report, in <= 5 minutes
study() { $SL study --config examples/study-1gpu.yaml --out $W/study; }
study_verdict() { local rep; rep=$(find $W/study -name "report.html" | head -1)
  tar czf "$OUT/study.tgz" -C $W study 2>/dev/null
  [[ $1 -eq 0 && -n "$rep" && $2 -le 300 ]] && echo -e "pass\t$2 s, report written" ||
    echo -e "FAIL\texit $1, $2 s, report: ${rep:-none}"; }

# 9: emulated latency on NCCL is refused in one line
latency() { $SL train --device cuda --model cnn --sync allreduce --net-latency-ms 1 --steps 4; }
latency_verdict() { [[ $1 -ne 0 ]] && log latency | grep -qi "nccl" && echo -e "pass\trefused: $(log latency | tail -1 | head -c 100)" ||
  echo -e "FAIL\texit $1: $(log latency | tail -1 | head -c 100)"; }

# 7b: NCCL with 2 processes on one GPU
nccl2() {
  cat > $W/nccl2.py <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", 0)); t = torch.ones(2**20, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize(); print("rank", dist.get_rank(), "allreduce ok", t[0].item())
dist.destroy_process_group()
PY
  torchrun --nproc-per-node 2 $W/nccl2.py
}
nccl2_verdict() { local n; n=$(log nccl2 | grep -c "allreduce ok 2.0")
  [[ $n -eq 2 ]] && echo -e "pass\tboth ranks summed to 2.0" || echo -e "FAIL\t$n of 2 ranks ok (NCCL may refuse 2 ranks on one GPU)"; }

# 5: max batch under an 8 GiB cap (trials in this process), then the found batch and the next by hand
maxbatch() {
  $SL max-batch --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --variants base --out $W/mb
  best=$(python3 -c "import pandas as p,glob; print(int(p.read_csv(glob.glob('$W/mb/**/max_batch*.csv', recursive=True)[0])['max_batch'].iloc[0]))")
  for b in $best $((best + 1)); do
    $SL train --device cuda --model resnet18 --dataset synthetic --memory-limit 8GiB --global-batch $b \
      --samples $((b * 2)) --steps 2 --warmup-steps 0 >$W/b$b.log 2>&1
    echo "by hand: batch $b under 8 GiB: exit $? $(grep -io -m1 'out of memory' $W/b$b.log)"
  done
}
maxbatch_verdict() { local best next trials
  best=$(log maxbatch | grep "by hand" | head -1); next=$(log maxbatch | grep "by hand" | tail -1)
  trials=$(log maxbatch | grep -c "^trial")
  [[ $best == *"exit 0"* && $next == *"out of memory"* ]] && echo -e "pass\t${best#by hand: } / next OOM, $trials trials, $2 s" ||
    echo -e "FAIL\t$best | $next"; }

# 4: precision on CUDA
amp() { $SL amp --device cuda --model resnet18 --dataset synthetic --global-batch 256 --steps 120 --samples 30720 \
  --eval-every 40 --launches 1 --out $W/amp; }
amp_verdict() { [[ $1 -eq 0 ]] && ! log amp | grep -qi "nan\b" && echo -e "pass\t$(log amp | grep -m1 -i 'faster\|slower\|within' | head -c 120)" ||
  echo -e "FAIL\texit $1"; }

# 10: the lost-speedup breakdown of 1 GPU vs 2 ranks (two namespace nodes of one rank on the one GPU, gloo)
lost() {
  $SL scale --device cuda --backend gloo --model cnn --dataset synthetic --samples 8192 --local-nodes 2 --ranks 1 \
    --batches 128 --mode strong --launches 1 --steps 30 --study lost --out $W/lost
  python3 - "$W/lost" <<'PY'
import glob, sys
import pandas as pd
t = pd.read_csv(glob.glob(f"{sys.argv[1]}/**/scale_strong_lost_speedup.csv", recursive=True)[0])
for (w, b), g in t.groupby(["workers", "global_batch"]):
    v = g.set_index("part")["value(ms)"]
    parts = v["ideal"] + sum(v[p] for p in ("data", "compute", "sync_work", "waiting", "wire", "interference",
                                            "hidden", "rest"))
    print(f"lost: {w} workers, batch {b}: parts {parts:.3f} ms, measured {v['measured']:.3f} ms:",
          "ADD UP" if abs(parts - v["measured"]) < 1e-6 else "DO NOT ADD UP")
PY
}
lost_verdict() { log lost | grep -q "ADD UP" && ! log lost | grep -q "DO NOT" && echo -e "pass\t$(log lost | grep '^lost' | tail -1)" ||
  echo -e "FAIL\t$(log lost | tail -1 | head -c 120)"; }

export SL W BASE PAIRS OUT CARD
export -f tests train overhead profile probe study latency nccl2 maxbatch amp lost
for c in $CHECKS; do
  case $c in
    tests) check tests 180 tests ;;        train) check train 45 train ;;
    overhead) check overhead $([ -n "$BASE" ] && echo 420 || echo 220) overhead ;;
    profile) check profile $([ -n "$BASE" ] && echo 110 || echo 60) profile ;;
    probe) check probe 120 probe ;;        study) check study 320 study ;;
    latency) check latency 25 latency ;;   nccl2) check nccl2 30 nccl2 ;;
    maxbatch) check maxbatch 120 maxbatch ;; amp) check amp 60 amp ;; lost) check lost 150 lost ;;
    *) echo "unknown check: $c (allowed: tests train overhead profile probe study latency nccl2 maxbatch amp lost)" ;;
  esac
done
echo; echo "=== summary ($(date +%T))"
{ printf 'check\tresult\tfigure\tcard\ttime\n'; cat "$OUT/summary.tsv"; } | sed 's/\t/ | /g'  # no `column` there
