"""Metric keys of a run's summary, as named constants. The unit is part of the key (torchtitan's habit); stored
summaries use these exact strings, so they never change."""
from __future__ import annotations

# The named stages of a step, in order (`other` is the part of a step outside all of them).
STAGES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval")

STEPS_TIMED = "steps/timed"
STEPS_TOTAL = "steps/total"
STEPS_HOST_CLOCK = "steps/clock_host"  # a probed run: steps timed by the host clock (before CUDA was initialised)
STEPS_CUDA_EVENTS = "steps/clock_cuda_events"  # a probed run: steps timed by CUDA events
STEPS_DETAILED = "steps/detailed"  # steps kept in full (records, trace) of a long probed run; the rest: sketches
STEPS_BOUNDARY = "steps/boundary"  # a script's run: what bounded its steps (probe, ddp_forward, optimizer_step, none)
SAMPLES_PER_STEP = "steps/samples_per_step"  # a script's run: samples of a step over all ranks (median, timed steps)
# a script's run: the data wait every rank had in a step (its least over ranks; mean over timed steps): a wait of
# one rank alone is the others' waiting for peers, not data wait of the run
DATA_WAIT_ALL_RANKS_MS = "time/data_wait_all_ranks(ms)"
STEP_P95_MS = "time/step_p95(ms)"  # a long probed run: from the merged quantile sketch of its steps
STEPS_PER_EPOCH = "steps/per_epoch"

STEP_MEDIAN_MS = "time/step_median(ms)"
STEP_MIN_MS = "time/step_min(ms)"
STEP_MAX_MS = "time/step_max(ms)"
# distribution-free 95 % interval of the median timed step (order statistics; `median_interval`)
STEP_MEDIAN_CI_LOW_MS = "time/step_median_ci_low(ms)"
STEP_MEDIAN_CI_HIGH_MS = "time/step_median_ci_high(ms)"
# the median over timed steps of the fastest rank's time of each step, with its interval (the same as the step for
# one rank): in a synchronised run the fastest rank waits inside the collectives for the others, so the lost-speedup
# breakdown (scalelab.analysis.breakdown) takes its variants without a sync at their fastest rank
STEP_FASTEST_MEDIAN_MS = "time/step_fastest_median(ms)"
# how precisely the median step is known: the wider side of its interval, in % of the median (every run); runs of
# auto length (`steps: auto`) also store their target (%) and whether they reached it (scalelab.analysis.precision)
PRECISION_HALF_WIDTH_PCT = "precision/half_width(%)"
PRECISION_TARGET_PCT = "precision/target(%)"
PRECISION_REACHED = "precision/reached"
QUALITY = "quality"  # absent when nothing is wrong; else why the run's figures are doubtful ("precision not reached")
EVAL_MS = "time/eval(ms)"  # one evaluation, outside the steps
EVALS = "evals/count"
EPOCH_S = "time/epoch(s)"
EPOCH_NO_DATA_S = "time/epoch_no_data(s)"
SKEW = "time/skew(slowest/median)"
EPOCH_ITERATION_S = "time/epoch_iteration(s)"  # loader runs: one epoch of the training loader alone
THROUGHPUT = "throughput(samples/s)"
THROUGHPUT_NO_DATA = "throughput_no_data(samples/s)"
# NVML's utilisation of the run's GPUs over the timed steps: the share of time a kernel ran, not of the chip used
GPU_UTIL = "gpu/util(%)"
GPU_UTIL_SAMPLES = "gpu/util_samples"

TRAIN_LOSS = "train/loss"
TRAIN_ACC = "train/acc"
EVAL_LOSS = "eval/loss"
EVAL_ACC = "eval/acc"

MEMORY_TRAIN_ADDED_BYTES = "memory/train_added(bytes)"
MEMORY_PEAK_RSS_GIB = "memory/peak_rss(GiB)"
MEMORY_CUDA_MAX_ALLOCATED_GIB = "memory/cuda_max_allocated(GiB)"
# memory by kind, per rank (max over ranks), measured on one warm-up step (scalelab.measure.activations)
MEMORY_PARAMETERS_BYTES = "memory/parameters(bytes)"
MEMORY_GRADIENTS_BYTES = "memory/gradients(bytes)"
MEMORY_OPTIMIZER_BYTES = "memory/optimizer_state(bytes)"
MEMORY_ACTIVATIONS_BYTES = "memory/activations_saved(bytes)"  # distinct storages saved for backward in forward
MEMORY_ACTIVATIONS_PEAK_BYTES = "memory/activations_backward_peak(bytes)"  # incl. what checkpointing recomputes

COMM_TIME_MS = "comm/time(ms)"  # union of the step's collective intervals, per rank
COMM_SUM_MS = "comm/sum(ms)"  # sum of the collective intervals (overlapped stretches more than once)
COMM_BLOCKING_MS = "comm/blocking(ms)"  # the loop's "comm" span (DDP waits inside backward: 0 there)
COMM_WAIT_MS = "comm/wait(ms)"  # last gradient produced -> end of the sync: the blocking wait, every strategy
COMM_CRITICAL_MS = "comm/critical(ms)"  # inside collectives once every peer had arrived (analysis/peers.py)
COMM_PEERS_WAIT_MS = "comm/waiting_for_peers(ms)"  # inside collectives before the last peer arrived, per step
# the part of the backward stage spent inside gradient collectives (DDP waits for its buckets inside backward):
# per rank and step, the union of its backward collectives' intervals less the loop's "comm" span, within
# [0, backward]; the profile splits backward into this and the rest, so that the stages still sum to the step
COMM_IN_BACKWARD_MS = "comm/in_backward(ms)"
BACKWARD_OUTSIDE_COMM_MS = "time/backward_outside_comm(ms)"  # the rest of backward, on the same steps
COMM_ALGBW = "comm/algbw(GB/s)"
COMM_BUSBW = "comm/busbw(GB/s)"
COMM_COLLECTIVES_PER_STEP = "comm/collectives_per_step"
COMM_BYTES_PER_STEP = "comm/bytes_per_step"
COMM_BYTES_FORWARD_PER_STEP = "comm/bytes_forward_per_step"
COMM_BYTES_BACKWARD_PER_STEP = "comm/bytes_backward_per_step"
COMM_BYTES_OPTIMIZER_PER_STEP = "comm/bytes_optimizer_per_step"
COMM_LOOPBACK_BYTES_PER_STEP = "comm/loopback_bytes_per_step"
# a user's script (scalelab run): every collective of the run, inside marked steps and out, per rank
COMM_BYTES_TOTAL = "comm/bytes_total"
COMM_COLLECTIVES_TOTAL = "comm/collectives_total"
COMM_TIME_TOTAL_MS = "comm/time_total(ms)"  # summed per-step unions (collectives outside steps: their union)
SCRIPT_WALL_S = "script/wall(s)"  # a script's rank from the probe's opening to its closing, the slowest rank

# what the rest of the machine did over the timed window (scalelab.analysis.noise); the busiest host counts
NOISE_OUTSIDE_CPU_CORES = "noise/outside_cpu(cores)"  # CPU taken by processes outside the run, in cores
NOISE_STEAL_PCT = "noise/steal(%)"  # CPU time the hypervisor gave to others
NOISE_LOAD = "noise/load"  # 1-minute load average
NOISE_RESOLUTION_CORES = "noise/resolution(cores)"  # what 10 ms ticks can tell apart over the timed window
QUALITY_NOISY = "quality/noisy"  # bool: outside CPU or steal above its threshold
QUALITY_NOISE_REASON = "quality/noise_reason"  # "ok" or "noisy: <what crossed its threshold>"

RANKS_REPORTED = "ranks/reported"
THREADS_USED = "threads/used"  # torch.get_num_threads() of the lowest rank, as it trained

STAGE_PREFIX = "stage/"

# Figures that carry a 95 % interval besides the median step (scalelab.analysis.summary): means over the timed
# steps (mean_interval), and rates of a fixed count over such a mean (throughput: samples; algbw / busbw: bytes),
# whose interval is the count over the mean's interval. Their keys: `ci_keys`.
MEAN_FIGURES = (EPOCH_S, COMM_TIME_MS, COMM_CRITICAL_MS, COMM_PEERS_WAIT_MS)
RATE_FIGURES = {THROUGHPUT: EPOCH_S, COMM_ALGBW: COMM_TIME_MS, COMM_BUSBW: COMM_TIME_MS}  # rate -> its mean


def ci_keys(key: str) -> tuple[str, str]:
    """The summary keys of a figure's 95 % interval: "time/epoch(s)" -> ("time/epoch_ci_low(s)",
    "time/epoch_ci_high(s)"); the step's are STEP_MEDIAN_CI_LOW_MS / _HIGH_MS."""
    if key == STEP_MEDIAN_MS:
        return STEP_MEDIAN_CI_LOW_MS, STEP_MEDIAN_CI_HIGH_MS
    name, paren, unit = key.partition("(")
    return f"{name}_ci_low{paren}{unit}", f"{name}_ci_high{paren}{unit}"


def interval_figures(summary: dict) -> list[str]:
    """The keys of a summary that carry an interval (stage means included)."""
    return [k for k in summary if ci_keys(k)[0] in summary]


def stage_ms(stage: str) -> str:
    """The mean time of a step's stage: "stage/<stage>(ms)"."""
    return f"{STAGE_PREFIX}{stage}(ms)"


def memory_gib(name: str) -> str:
    """A memory peak in GiB: "memory/<name>(GiB)"."""
    return f"memory/{name}(GiB)"


# Small samples (scalelab.analysis.repeats, scalelab.analysis.interpret.ranking): a cell pooled from several
# launches keeps the lowest and highest of its launches' own median steps, so a finding between two cells can
# require that their launches do not interleave. Absent in single-launch and older summaries.
STEP_LAUNCH_MEDIAN_MIN_MS = "time/step_launch_median_min(ms)"
STEP_LAUNCH_MEDIAN_MAX_MS = "time/step_launch_median_max(ms)"
