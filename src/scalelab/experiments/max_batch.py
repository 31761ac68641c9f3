"""The largest batch that fits, found safely (seed 000 Q1, seed 004): on a CPU, and for several ranks, every trial
runs in processes of its own (torchrun, also for one rank), so an out-of-memory error, a failed allocation under
the memory cap or the kernel's OOM kill ends only that trial, never the search, and leaks nothing into the next
trial. One rank on CUDA tries its batches in this process (`trials_here`): there an out-of-memory error is an
exception the caching allocator recovers from, the run's memory fraction is undone and its cache emptied after each
trial (run.kinds), and a process per trial cost about 13 s of a resnet18 search's each (CUDA context, cuDNN).

Search: a trial that fits reports its memory by kind (scalelab.train.memory) and how much memory training added on
top of set-up. Activations grow in proportion to the batch, the rest does not: after the first fitting trial the
largest batch whose activations (bytes per sample of a rank's batch, the larger of saved and backward peak) plus
the fixed part (parameters + gradients + optimizer state) fit under the limit is predicted, and the next trial aims
at a quarter of it, at most 16x the first fit (the prediction omits the step's temporaries and any memory a model
frees within the step; on CPU the cap counts from a baseline that already holds the parameters). After two fitting trials the limit is predicted from the line through their added
memory and checked directly (b* must fit, b* + 1 must not). Where a prediction misses, the next guess is
clamped inside the bracket [largest fit, smallest failure] and bisection takes over; without measurements the
batch doubles.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.interpret import fmt
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, StoreError
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, name_list, number
from scalelab.lab.cells import Cell, Cells, with_fields
from scalelab.run.execute import RunFailed
from scalelab.sizes import parse_bytes

# cuBLAS and cuDNN word a failed allocation their own way (seen on an H100 at the edge of its memory).
OOM_MARKS = ("out of memory", "not enough memory", "memoryerror", "cannot allocate memory", "signal sigkill",
             "std::bad_alloc", "outofmemoryerror", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")
# Native code that reports a failed allocation in words of its own: oneDNN under an address-space cap, cuDNN's
# workspace on a full GPU (CUDNN_STATUS_INTERNAL_ERROR, seen on an H100 at batch 17522 of resnet18, between fits
# and OOMs). Read as memory only once a smaller batch fitted: before that the config itself may be broken.
NATIVE_ALLOCATION_MARKS = ("could not create a primitive", "cudnn_status_internal_error")


GUESS_SHARE = 4  # the first guess aims at 1/GUESS_SHARE of the batch the activations predict
GUESS_JUMP = 16  # and goes at most this many times past the first fit


@dataclass(frozen=True)
class Trial:
    batch: int
    fits: bool
    added_bytes: float | None = None  # memory training added on top of set-up (fitting trials)
    run_id: str | None = None
    reason: str | None = None
    activation_bytes: float | None = None  # per rank: max(saved, backward peak) of its first micro-step
    fixed_bytes: float | None = None  # per rank: parameters + gradients + optimizer state
    memory: bool = True  # a trial that did not fit: its failure was an allocation (else another failure: `reason`)


@dataclass
class SearchResult:
    max_batch: int  # 0 when even the smallest batch does not fit
    trials: list[Trial] = field(default_factory=list)
    stopped: Trial | None = None  # the trial that failed for a reason other than memory, which ended the search

    @property
    def n_trials(self) -> int:
        return len(self.trials)


def next_guess(trials: list[Trial], limit_bytes: float | None, step: int) -> int | None:
    """The next batch to try, or None when the bracket is closed (largest fit + step == smallest failure)."""
    fits = sorted((t for t in trials if t.fits), key=lambda t: t.batch)
    fails = sorted((t.batch for t in trials if not t.fits))
    lo = fits[-1].batch if fits else 0
    hi = fails[0] if fails else None
    if hi is not None and hi - lo <= step:
        return None
    guess = None
    measured = [t for t in fits if t.added_bytes is not None]
    # Predict only right after a fit: after a failed guess, bisection halves the bracket, so a curved memory
    # profile costs O(log) trials instead of creeping down from a too-high prediction.
    if limit_bytes and len(fits) == 1 and hi is None and trials[-1].fits:  # the first fit: from its activations
        predicted = activation_guess(trials[-1], limit_bytes, step)
        if predicted is not None:
            # Aim at a quarter: activations omit the step's temporaries (gradients flowing back, workspaces; on
            # CPU the added memory grew 1.1x (mlp) and 2.8x (cnn) as fast as the activations), so the full
            # prediction overshoots; a fit well inside the limit gives the line below a second point far from
            # the first, instead of extrapolating from two small batches. At most GUESS_JUMP x the first fit: a
            # model's memory need not be in what it saves (buffers it frees in forward), and each halving back
            # from an overshoot costs a failing trial.
            guess = min(predicted // (GUESS_SHARE * step) * step, lo * GUESS_JUMP)
            guess = max(guess, lo + step)
    if guess is None and limit_bytes and len({t.batch for t in measured}) >= 2 and trials[-1].fits:
        slope, intercept = np.polyfit([t.batch for t in measured], [t.added_bytes for t in measured], 1)
        if slope > 0:
            predicted = math.floor((limit_bytes - intercept) / slope / step) * step
            # Consecutive fits above a prediction mean it runs low (memory grows faster than the line): step
            # further each time (1, 2, 4, ... steps past the largest fit), so closing in stays logarithmic.
            streak = 0
            for t in reversed(trials):
                if not t.fits:
                    break
                streak += 1
            gallop = lo + step * 2 ** max(0, streak - 3)  # the first fits (start, 2x start) are not a streak
            guess = max(predicted, gallop, lo + step)
            if hi is not None:  # inside a bracket, trust the line only halfway: curved profiles overshoot
                mid = lo + (hi - lo) // 2
                guess = (min(guess, hi - step) + mid) // (2 * step) * step
    if guess is None:
        guess = lo * 2 if hi is None else lo + max(step, (hi - lo) // (2 * step) * step)
    if hi is not None:
        guess = min(max(guess, lo + step), hi - step)
    return max(guess, step)


def activation_guess(trial: Trial, limit_bytes: float, step: int) -> int | None:
    """The largest multiple of `step` whose activations, scaled from `trial`'s in proportion to the batch, plus its
    fixed part fit in `limit_bytes`; None without those measurements."""
    if not trial.activation_bytes or trial.fixed_bytes is None:
        return None
    per_sample = trial.activation_bytes / (trial.batch / step)  # bytes per sample of one rank's batch
    return math.floor((limit_bytes - trial.fixed_bytes) / per_sample) * step


def search(trial: Callable[[int], Trial], *, start: int = 1, step: int = 1, limit_bytes: float | None = None,
           max_trials: int = 40, say: Callable[[str], None] = print) -> SearchResult:
    """Find the largest multiple of `step` for which `trial(batch).fits`. Only an allocation failure
    (`Trial.memory`) means "does not fit"; a trial that failed otherwise (a timeout, a hang the watchdog ended, an
    error of the model) ends the search (`stopped`), and the largest fit so far is a lower bound."""
    if start < step or start % step:
        raise ConfigError("start", start, f"allowed: a positive multiple of the rank count ({step})")
    result = SearchResult(0)
    batch: int | None = start
    while batch is not None and result.n_trials < max_trials:
        t = trial(batch)
        result.trials.append(t)
        if not t.fits and not t.memory:  # not an answer about memory: no bracket can close on it
            say(f"trial {result.n_trials}: batch {batch} failed for a reason other than memory ({t.reason}); "
                "the search stops here")
            result.stopped = t
            break
        say(f"trial {result.n_trials}: batch {batch} {'fits' if t.fits else 'does not fit'}"
            + (f" ({t.reason})" if t.reason and not t.fits else ""))
        if not t.fits and batch == start:
            break
        batch = next_guess(result.trials, limit_bytes, step)
    fits = [t.batch for t in result.trials if t.fits]
    result.max_batch = max(fits) if fits else 0
    return result


def is_oom(reason: str | None) -> bool:
    text = (reason or "").lower()
    return any(mark in text for mark in OOM_MARKS)


def does_not_fit(cfg: TrainConfig, lenient: bool):
    """Which failure reasons of a trial mean "does not fit" (an outcome), rather than an error.

    Under an address-space cap some native code crashes on a failed allocation instead of raising: a rank killed
    by a signal then counts as not fitting, like the kernel's OOM kill. `lenient`: count any failure as "does not
    fit"; the search sets it once a smaller batch has fitted under a memory cap: the config is known to work, and
    native code (oneDNN, say) reports a failed allocation in its own words ("could not create a primitive")."""
    capped = cfg.memory_limit is not None
    return lambda reason: is_oom(reason) or lenient or (capped and "killed by signal" in reason)


def allocation_failure(cfg: TrainConfig, after_fit: bool) -> Callable[[str | None], bool]:
    """Which failure reasons of a max-batch trial are a failed allocation: an out-of-memory error in any of its
    wordings (OOM_MARKS, the kernel's OOM kill included); under an address-space cap a rank killed by a signal
    (native code may crash on a failed allocation instead of raising); once a smaller batch fitted, native code's
    own words for it (NATIVE_ALLOCATION_MARKS). Anything else (a timeout, a watchdog kill, an error of the model) is
    not memory."""
    capped = cfg.memory_limit is not None

    def judge(reason: str | None) -> bool:
        text = (reason or "").lower()
        return (is_oom(text) or (capped and "killed by signal" in text)
                or (after_fit and any(mark in text for mark in NATIVE_ALLOCATION_MARKS)))
    return judge


def trials_here(cfg: TrainConfig) -> bool:
    """Whether a trial of `cfg` may run in this process: one plain rank on CUDA (a CPU cap is RLIMIT_AS, which a
    process cannot raise again; several ranks need their own processes anyway)."""
    return (cfg.resolved_device == "cuda" and not cfg.distributed and not cfg.local_nodes and cfg.nnodes == 1
            and cfg.engine == "ddp")


def run_trial(cells: Cells, cfg: TrainConfig, group: str, *, after_fit: bool = False,
              here: bool = False) -> Trial:
    """One trial through the cell engine (a stored outcome is reused), in processes of its own (torchrun) unless
    `here`. Once a smaller batch fitted, every failure is a stored outcome (the report rebuilds from it), an
    allocation failure or not (`Trial.memory`); before that, a failure that is not memory is an error."""
    memory = allocation_failure(cfg, after_fit)
    [res] = cells.run([Cell(f"batch {cfg.global_batch}", cfg, isolate=not here,
                            outcome_failure=lambda reason: memory(reason) or after_fit)], group=group)
    if res.status == "missing":
        raise StoreError(f"max batch: trial at batch {cfg.global_batch} is not in the store ({cells.study}/{group})")
    if res.status == "completed":
        summary = cells.runs([res])[0]["summary"]
        return Trial(cfg.global_batch, True, summary.get(keys.MEMORY_TRAIN_ADDED_BYTES), res.run_id,
                     **memory_by_kind(summary))
    if res.cell.accepts("failed", res.reason):
        return Trial(cfg.global_batch, False, None, res.run_id, res.reason, memory=memory(res.reason))
    if cfg.memory_limit is not None:  # nothing fitted yet: may be the cap, may be a real error; say both
        raise RunFailed(res.run_id, f"batch {cfg.global_batch} failed under the memory cap of "
                        f"{cfg.memory_limit / 2**20:.0f} MiB before any batch fitted ({res.reason}); if "
                        "that is memory, raise --memory-limit")
    raise RunFailed(res.run_id, res.reason or "failed")


def memory_by_kind(summary: dict) -> dict:
    """A fitting trial's activation and fixed bytes per rank, from its summary (None where a stored run from before
    memory by kind lacks them)."""
    activations = [summary.get(k) for k in (keys.MEMORY_ACTIVATIONS_BYTES, keys.MEMORY_ACTIVATIONS_PEAK_BYTES)]
    activations = [v for v in activations if v is not None]
    fixed = [summary.get(k) for k in (keys.MEMORY_PARAMETERS_BYTES, keys.MEMORY_GRADIENTS_BYTES,
                                      keys.MEMORY_OPTIMIZER_BYTES)]
    return {"activation_bytes": max(activations) if activations else None,
            "fixed_bytes": sum(fixed) if None not in fixed else None}


def max_batch(base: TrainConfig, cells: Cells, group: str, *, memory_limit: int | None = None,
              say: Callable[[str], None] = print, trial_steps: int = 2, here: bool | None = None) -> SearchResult:
    """The largest global batch of `base` that trains `trial_steps` steps under the memory limit. `here`: trials
    in this process (None: where `trials_here` allows; False: a process per trial, as a check of the first)."""
    step = base.world_size
    cap = memory_limit if memory_limit is not None else base.memory_limit
    fitted: list[int] = []
    here = trials_here(base) if here is None else here and trials_here(base)

    def trial(batch: int) -> Trial:
        cfg = with_fields(base, global_batch=batch, steps=trial_steps, warmup_steps=0, eval_every=10**9,
                          memory_limit=cap, samples=max(batch, base.samples or batch))
        t = run_trial(cells, cfg, group, after_fit=any(b < batch for b in fitted), here=here)
        if t.fits:
            fitted.append(batch)
        return t

    return search(trial, start=step, step=step, limit_bytes=cap, say=say)


VARIANTS = ("base", "amp", "checkpointing")

# What set the limit a search ran under: only a real device's memory or a limit the user chose answers "what is the
# largest batch"; the built-in study's cap only demonstrates the search (max_batch_result).
DEVICE, USER, DEMONSTRATION = "device", "user", "demonstration"


def limit_of(base: TrainConfig, opts: dict, device_name: str | None = None) -> tuple[int | None, str, str]:
    """(cap in bytes or None, kind, words) of the limit a search of `base` runs under. The cap is --memory-limit
    (or the study's `memory_limit`), else the config's `memory_limit`; it is the study's demonstration cap when it
    equals `demonstration_cap` (set only by the built-in study); without a cap on CUDA the device's memory is the
    limit. On CUDA a demonstration cap is dropped: the GPU's own memory is the real limit."""
    cuda = base.resolved_device == "cuda"
    demo = opts.get("demonstration_cap")
    cap = opts["memory_limit"] if opts["memory_limit"] is not None else base.memory_limit
    if cap is not None and demo is not None and cap == demo:
        if cuda:
            cap = None
        else:
            return cap, DEMONSTRATION, (f"the study's demonstration cap of {cap / 2**20:.0f} MiB of address space "
                                        "(RLIMIT_AS, virtual memory)")
    if cap is not None:
        where = "--memory-limit" if opts["memory_limit"] is not None else "the config's memory_limit field"
        return cap, USER, f"the limit you set, {cap / 2**20:.0f} MiB ({where})"
    if cuda:
        return None, DEVICE, f"the CUDA memory of {device_name or 'the GPU'}"
    raise ConfigError("memory_limit", None, "required on CPU (the search would otherwise fill the machine), "
                                            "e.g. --memory-limit 2GiB")


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    """The max batch of the base config, with mixed precision, and with activation checkpointing, side by side."""
    segments = opts["segments"]
    cap, kind, words = limit_of(base, opts, _device_name() if base.resolved_device == "cuda" else None)
    amp = "fp16" if base.resolved_device == "cuda" else "bf16"
    chosen = {"as configured": base, amp: with_fields(base, precision=amp),
              f"checkpointing ({segments} segments)": with_fields(base, checkpoint_segments=segments)}
    chosen = {label: cfg for (label, cfg), v in zip(chosen.items(), VARIANTS) if v in opts["variants"]}
    rows = []
    for label, cfg in chosen.items():
        ctx.say(f"[max batch] {label}")
        res = max_batch(with_fields(cfg, memory_limit=cap), ctx.cells, f"max_batch/{label.split(' ')[0]}",
                        memory_limit=cap, say=ctx.say)
        stop = res.stopped
        rows.append({"variant": label, "max_batch": res.max_batch, "trials": res.n_trials,
                     "memory_limit(bytes)": cap, "limit": kind,
                     "tried": " ".join(f"{t.batch}{'+' if t.fits else '-' if t.memory else '!'}" for t in res.trials),
                     "stopped_at": stop.batch if stop else None, "failure": stop.reason if stop else None})
    notes = {"limit": words}
    if base.resolved_device == "cpu":
        notes["limit on a CPU"] = CPU_LIMIT_NOTE
    return Result("max_batch", {"max_batch": pd.DataFrame(rows)}, notes=notes)


CPU_LIMIT_NOTE = ("on a CPU the limit is a cap on the address space a rank may add after its set-up (RLIMIT_AS): "
                  "virtual memory, which also counts what the allocator and libraries reserve without touching, so "
                  "the batch that fits compares settings on this machine (as configured, mixed precision, "
                  "checkpointing); it is not the batch that fits in physical RAM")


def max_batch_result(result) -> tuple[list[str], str | None]:
    """The largest batch per variant; a batch is recommended only under a real limit (the device's memory, or a
    limit the user set), and the recommendation names it. Under the built-in study's demonstration cap: a sentence
    saying why nothing is recommended."""
    t = result.tables["max_batch"]
    if not len(t):
        return [], None
    words = result.notes.get("limit", "the limit")
    base = t.iloc[0]
    out = [f"As configured, the largest batch under {words} is {int(base.max_batch)} "
           f"(found in {int(base.trials)} trials)."]
    for row in t.iloc[1:].itertuples():
        gain = row.max_batch / base.max_batch if base.max_batch else float("nan")
        out.append(f"With {row.variant}: {int(row.max_batch)} ({fmt(gain)}x).")
    stopped = t[t["stopped_at"].notna()] if "stopped_at" in t else t.iloc[:0]
    for row in stopped.to_dict("records"):
        out.append(f"The search ({row['variant']}) stopped at batch {int(row['stopped_at'])}, which failed "
                   f"for a reason other than memory ({row['failure']}); {int(row['max_batch'])} is a lower bound, "
                   "not the largest batch that fits.")
    kind = base.get("limit", USER)  # a table from before this column: a limit someone set
    if kind == DEMONSTRATION:
        out.append("No batch is recommended: the study's cap is a demonstration, an arbitrary amount of virtual "
                   "memory chosen so the search ends fast on a CPU, so these batches show how the search works and "
                   "how the variants compare here, not what fits in this machine's RAM or on a GPU; give "
                   "--memory-limit (or run on CUDA) for a recommendation.")
        return out, None
    best = t.loc[t["max_batch"].idxmax()]
    if best["variant"] in set(stopped["variant"]):
        return out + [f"No batch is recommended: {best['variant']}'s search ended on a failure that is not memory."], None
    return out, f"For the largest batch under {words}, use {best.variant}: {int(best.max_batch)} samples fit."


DEMO_CAP_QUICK, DEMO_CAP = 96 * 2**20, 128 * 2**20  # the built-in study's CPU caps: small, so the search ends fast


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study (the quick study leaves it out). On CUDA the GPU's memory is the limit; a
    CPU cap would mislead the search's prediction. On a CPU the cap is a demonstration (`demonstration_cap`): the
    search runs, nothing is recommended."""
    q = plan.quick
    cap = None if plan.gpus else DEMO_CAP_QUICK if q else DEMO_CAP
    return {"memory_limit": cap, "demonstration_cap": cap, "segments": 2,
            # one search (~1.5 min): what checkpointing and AMP do to memory is in their own experiments;
            # their searches are left to `max-batch --variants` (the default study's 10-minute budget)
            "variants": ["base"],
            "set": {"model": "resnet18"}}


EXPERIMENT = Experiment(
    name="max_batch", command="max-batch", section="maxbatch", order=30,
    title="The largest batch that fits",
    question="What is the largest batch that fits, and how much do mixed precision and activation checkpointing "
             "raise it? (seed 000 Q1, seed 004)",
    help="The largest batch that fits (each trial its own process; one rank on CUDA in this one), plain, with AMP "
         "and with checkpointing.",
    options=(Option(name="memory_limit", default=None, help="CPU memory a trial may add, e.g. 4GiB (default: "
                                                            "none on CPU; the GPU on CUDA).", parse=parse_bytes),
             Option(name="segments", default=2, help="Checkpoint segments for the checkpointing variant.",
                    parse=number(1, integer=True)),
             Option(name="variants", default=list(VARIANTS), help="base, amp, checkpointing (comma-separated).",
                    parse=lambda v, n: name_list(v, n, VARIANTS)),
             Option(name="demonstration_cap", default=None, help="Set by the built-in study: when memory_limit "
                                                                 "equals it, the cap is the study's demonstration "
                                                                 "and no batch is recommended.", parse=parse_bytes)),
    run=_run,
    interpret=max_batch_result,
    captions={"max_batch": "Largest global batch that trains under the memory limit (`limit`: the device's memory, "
                           "one the user set, or the study's demonstration cap); trials in their own processes (one rank on CUDA: in the "
                           "study's, its cache emptied between trials)."},
    study_options=study_options,
    quick=False,
    version=2,
)
