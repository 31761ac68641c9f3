"""Gradient-sync strategies, backends and training engines side by side (pure): one row per sync variant, backend
or engine.

Definitions (docs/definitions.md):
- step = the run's median timed step (min and max beside it); compute = the median step of its baseline at its
  fastest rank (scalelab.analysis.breakdown.exposed_figures says why): the same config with no-op collectives (the strategy's own work kept: DDP's buckets, hooks and division; the bucketed
  copies; rank 0's averaging), so only the collectives are missing;
- comm = time inside collectives: the union of each step's collective intervals (summary comm/time(ms)); comm_sum
  = their plain sum (overlapped intervals more than once); comm_wait = from the last gradient produced to the end
  of the sync, the directly measured blocking wait, which means the same for every strategy; comm_critical = the
  time inside collectives of the rank that sets the step once every peer had arrived, and waiting_for_peers the
  most a rank stood inside them for a peer still computing (scalelab.analysis.peers: one host only);
- exposed comm = step - compute, never clipped, with a conservative 95 % interval from the two medians' intervals;
  hidden = waiting_for_peers + comm_critical - exposed (ms that ran under compute) and overlap = hidden /
  (waiting_for_peers + comm_critical), one quantity in two units with one interval (comm where waiting and wire
  were not measured; empty when 0), never clipped;
  interference = exposed - comm_critical when the exposed interval lies above it (the collectives slowed the
  compute around them), else 0. `quality` is "ok", or says why not: an exposed interval entirely below 0, an
  overlap interval above 1 by more than OVERLAP_SLACK, a blocking strategy whose overlap interval lies above 0 by
  more than OVERLAP_SLACK (it hides nothing by construction), time inside collectives above the mean step beyond
  both intervals, or collectives faster than the kernel-shaped links of a local-nodes run allow
  (scalelab.analysis.bandwidth), is "implausible";
- bytes are payload bytes per step as the CommMeter counts them (scalelab.sync.meter), averaged over ranks;
  loopback bytes are what the host's loopback interface carried per step (all ranks, from the system sampler).

Inputs are stored runs as dicts {run_id, config, summary, status, reason}; a backend that could not run is a dict
{backend, status: "skipped", reason}. The sync variant of a run and the variants' order are given by the caller
(they come from scalelab.sync.registry, a layer above this one).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.bandwidth import busbw_ceiling
from scalelab.analysis.breakdown import OVERLAP_SLACK, baseline_step_ms, exposed_figures
from scalelab.analysis.intervals import difference_interval
from scalelab.analysis.repeats import LAUNCH_MEDIANS, LAUNCHES, WITHIN_DOF, WITHIN_VAR

BACKENDS = ("gloo", "nccl", "mpi")
# TCP's headers and tbf's token accounting leave the measured busbw a little under a shaped link's rate (seen
# 0.117 GB/s on 1 Gbit/s); a run is judged faster than its links only beyond this much above the ceiling.
LINK_SLACK = 0.05
EXPOSED_COLUMNS = ["exposed_comm(ms)", "exposed_ci_low(ms)", "exposed_ci_high(ms)", "overlap", "overlap_ci_low",
                   "overlap_ci_high", "hidden(ms)", "hidden_ci_low(ms)", "hidden_ci_high(ms)", "interference(ms)",
                   "quality"]

# table column -> summary key (scalelab.analysis.summary)
SUMMARY_COLUMNS = {
    "step(ms)": keys.STEP_MEDIAN_MS, "step_ci_low(ms)": keys.STEP_MEDIAN_CI_LOW_MS,
    "step_ci_high(ms)": keys.STEP_MEDIAN_CI_HIGH_MS, "step_min(ms)": keys.STEP_MIN_MS, "step_max(ms)": keys.STEP_MAX_MS,
    "step_launch_min(ms)": keys.STEP_LAUNCH_MEDIAN_MIN_MS, "step_launch_max(ms)": keys.STEP_LAUNCH_MEDIAN_MAX_MS,
    "comm(ms)": keys.COMM_TIME_MS, "comm_sum(ms)": keys.COMM_SUM_MS, "comm_wait(ms)": keys.COMM_WAIT_MS,
    "comm_blocking(ms)": keys.COMM_BLOCKING_MS, "comm_critical(ms)": keys.COMM_CRITICAL_MS,
    "comm_critical_ci_high(ms)": keys.ci_keys(keys.COMM_CRITICAL_MS)[1],
    "waiting_for_peers(ms)": keys.COMM_PEERS_WAIT_MS,
    "collectives_per_step": keys.COMM_COLLECTIVES_PER_STEP, "bytes_per_step": keys.COMM_BYTES_PER_STEP,
    "bytes_forward_per_step": keys.COMM_BYTES_FORWARD_PER_STEP,
    "bytes_backward_per_step": keys.COMM_BYTES_BACKWARD_PER_STEP,
    "bytes_optimizer_per_step": keys.COMM_BYTES_OPTIMIZER_PER_STEP,
    "algbw(GB/s)": keys.COMM_ALGBW, "busbw(GB/s)": keys.COMM_BUSBW,
    "loopback_bytes_per_step": keys.COMM_LOOPBACK_BYTES_PER_STEP, "train_loss": keys.TRAIN_LOSS,
    "timed_steps": keys.STEPS_TIMED, "launches": LAUNCHES,
    # the noise model's inputs (scalelab.analysis.noise): each launch's median step, the within-launch spread
    LAUNCH_MEDIANS: LAUNCH_MEDIANS, WITHIN_VAR: WITHIN_VAR, WITHIN_DOF: WITHIN_DOF,
}
# the columns of a comparison table after its first one (the compared value: `comparison_table`)
COMPARISON_COLUMNS = ["status", "reason", "sync_config", "ddp_hook", "accumulate", "micro_batch_per_rank",
                      "global_batch", "launches", "timed_steps", "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)",
                      "step_min(ms)", "step_max(ms)", "step_launch_min(ms)", "step_launch_max(ms)", LAUNCH_MEDIANS, WITHIN_VAR, WITHIN_DOF, "compute(ms)", "comm(ms)", "comm_sum(ms)", "comm_wait(ms)",
                      "comm_blocking(ms)", "comm_critical(ms)", "comm_critical_ci_high(ms)",
                      "waiting_for_peers(ms)", "blocks", *EXPOSED_COLUMNS, "collectives_per_step", "bytes_per_step",
                      "bytes_forward_per_step", "bytes_backward_per_step", "bytes_optimizer_per_step",
                      "algbw(GB/s)", "busbw(GB/s)", "loopback_bytes_per_step", "loopback/payload", "train_loss",
                      "run_id", "baseline_run_id"]


def exposed_comm(step_ms: float | None, baseline_step_ms: float | None) -> float | None:
    """Step time with real sync minus step time of the same config with no-op collectives; not clipped (a negative
    value is reported and flagged, not hidden)."""
    if _missing(step_ms) or _missing(baseline_step_ms):
        return None
    return step_ms - baseline_step_ms


def overlap(exposed_ms: float | None, comm_ms: float | None) -> float | None:
    """1 - exposed / time inside collectives; None without communication; not clipped."""
    if _missing(exposed_ms) or _missing(comm_ms) or comm_ms <= 0:
        return None
    return 1.0 - exposed_ms / comm_ms


def exposed_with_interval(summary: dict, baseline: dict, comm_ms: float | None, *,
                          comm_high_ms: float | None = None, blocks: bool = False) -> dict:
    """Exposed comm, overlap and the part hidden under compute of a run against its no-op baseline's summary, as
    scalelab.analysis.breakdown.exposed_figures defines them (one definition in every view: the baseline at its
    fastest rank; overlap = hidden / (waiting + wire), its interval the hidden part's, divided), with conservative
    95 % intervals, interference and a quality flag. Where waiting and wire were not measured (ranks across hosts),
    overlap is judged against `comm_ms` (critical communication, else time inside collectives; `comm_high_ms`
    its interval's upper end) and its interval comes from exposed alone. `blocks`: the strategy syncs after
    backward and waits for it."""
    fig = exposed_figures(summary, baseline)
    exposed = fig["exposed"]
    out = dict.fromkeys(EXPOSED_COLUMNS)
    if not exposed.known():
        return out
    split = fig["comm"].known() and fig["comm"].value > 0
    if split:
        comm_ms, comm_high_ms = fig["comm"].value, fig["comm"].high
    out["exposed_comm(ms)"], out["overlap"] = exposed.value, overlap(exposed.value, comm_ms)
    base_key = keys.STEP_FASTEST_MEDIAN_MS if not _missing(baseline.get(keys.STEP_FASTEST_MEDIAN_MS)) \
        else keys.STEP_MEDIAN_MS
    if not any(_missing(v) for v in (*(summary.get(k) for k in keys.ci_keys(keys.STEP_MEDIAN_MS)),
                                     *(baseline.get(k) for k in keys.ci_keys(base_key)))):
        out["exposed_ci_low(ms)"], out["exposed_ci_high(ms)"] = exposed.low, exposed.high
        if split:
            hidden = fig["hidden"]
            out["hidden(ms)"], out["hidden_ci_low(ms)"], out["hidden_ci_high(ms)"] = hidden
            out["overlap_ci_low"], out["overlap_ci_high"] = hidden.low / comm_ms, hidden.high / comm_ms
        else:
            out["overlap_ci_low"], out["overlap_ci_high"] = overlap(exposed.high, comm_ms), overlap(exposed.low, comm_ms)
    elif split:
        out["hidden(ms)"] = fig["hidden"].value
    out["interference(ms)"] = interference(out, comm_ms, comm_high_ms)
    out["quality"] = ("implausible: time inside collectives longer than the step beyond noise"
                      if comm_exceeds_step(summary) else plausibility(out, blocks=blocks))
    return out


def interference(row: dict, comm_ms: float | None, comm_high_ms: float | None = None) -> float | None:
    """Exposed - communication when the step lost more than its collectives took, beyond both intervals (the
    exposed interval's low end above the communication's high end): the collectives slowed the compute around them
    (their threads take cores on a CPU, their kernels take SMs on a GPU). 0 when not beyond noise; None unknown."""
    exposed = row.get("exposed_comm(ms)")
    if _missing(exposed) or _missing(comm_ms):
        return None
    low = row.get("exposed_ci_low(ms)")
    low = exposed if _missing(low) else low
    high = comm_ms if _missing(comm_high_ms) else comm_high_ms
    return exposed - comm_ms if low > high else 0.0


def comm_exceeds_step(summary: dict) -> bool:
    """Time inside collectives (the union per step, a mean) above the mean step beyond both intervals: a rank
    cannot spend longer in a step's collectives than in the step, so a clock or the meter is wrong."""
    comm_low = summary.get(keys.ci_keys(keys.COMM_TIME_MS)[0])
    epoch_high = summary.get(keys.ci_keys(keys.EPOCH_S)[1])
    per_epoch = summary.get(keys.STEPS_PER_EPOCH)
    if _missing(comm_low) or _missing(epoch_high) or not per_epoch:
        return False
    return comm_low > 1e3 * epoch_high / per_epoch


def faster_than_link(run: dict) -> str | None:
    """Words when a run over kernel-shaped links (local_nodes with link_gbps) moved its collectives faster than the
    links allow (scalelab.analysis.bandwidth.busbw_ceiling) beyond the busbw interval and LINK_SLACK: the meter's
    clock does not see the wire (timing a launch, not a completion); else None."""
    c, s = run.get("config") or {}, run.get("summary") or {}
    gbps, nodes = c.get("link_gbps"), c.get("local_nodes") or 0
    busbw, algbw, payload = s.get(keys.COMM_BUSBW), s.get(keys.COMM_ALGBW), s.get(keys.COMM_BYTES_PER_STEP)
    if not gbps or nodes < 2 or any(_missing(v) or not v for v in (busbw, algbw, payload)):
        return None
    ceiling = busbw_ceiling(gbps, world=c.get("ranks", 1) * nodes, nodes=nodes,
                            bus_bytes_per_step=payload * busbw / algbw,
                            collectives_per_step=s.get(keys.COMM_COLLECTIVES_PER_STEP) or 1)
    low = s.get(keys.ci_keys(keys.COMM_BUSBW)[0])
    low = busbw if _missing(low) else low
    if ceiling is None or low <= ceiling * (1 + LINK_SLACK):
        return None
    return (f"implausible: collectives faster than the {gbps:g} Gbit/s links beyond noise "
            f"(busbw {busbw:.3g} GB/s, the links allow {ceiling:.3g})")


def plausibility(row: dict, *, blocks: bool = False) -> str:
    """"ok", or why the exposed communication cannot be taken at face value (intervals missing: judged on the
    point values). Exposed above communication (overlap below 0) is not an error: it is interference."""
    low = row.get("exposed_ci_low(ms)")
    high = row.get("exposed_ci_high(ms)")
    low, high = (row["exposed_comm(ms)"],) * 2 if low is None else (low, high)
    if high < 0:
        return "implausible: the sync is faster than its no-op baseline beyond noise"
    o_low, o_high = row.get("overlap_ci_low"), row.get("overlap_ci_high")
    if o_low is None and row.get("overlap") is not None:
        o_low = o_high = row["overlap"]
    if o_low is not None and o_low > 1 + OVERLAP_SLACK:
        return "implausible: overlap above 100 % beyond its interval"
    if blocks and o_low is not None and o_low > OVERLAP_SLACK:
        return (f"implausible: a blocking sync hides nothing, yet its overlap interval "
                f"({100 * o_low:.0f}–{100 * o_high:.0f} %) excludes 0")
    return "ok"


def run_metrics(run: dict) -> dict:
    """The comparison's metric columns of one stored run (None where the summary lacks a key)."""
    summary = run.get("summary") or {}
    out = {col: summary.get(key) for col, key in SUMMARY_COLUMNS.items()}
    payload, loop = out["bytes_per_step"], out["loopback_bytes_per_step"]
    out["loopback/payload"] = loop / payload if not _missing(loop) and not _missing(payload) and payload > 0 else None
    return out


def run_quality(summary: dict) -> str:
    """What a run's own summary says about how far it can be trusted: its noise reason when the machine was busy
    outside it, "precision not reached" for an auto-length run that stopped short, else "ok"."""
    if summary.get(keys.QUALITY_NOISY):
        return summary.get(keys.QUALITY_NOISE_REASON) or "noisy"
    return summary.get(keys.QUALITY) or "ok"


def trusted(quality) -> bool:
    """Whether a row's figures may make a ranking or a recommendation: not implausible, not noisy, not two
    measurements that disagree (ok, re-measured, precision not reached: its interval says how sure it is)."""
    return not isinstance(quality, str) or not (quality.startswith(("implausible", "noisy"))
                                                or "disagree" in quality or "persisted" in quality)


def worst_quality(*reasons: str | None) -> str | None:
    """The first reason that is not "ok" (an implausible figure before a noisy run), else "ok" (None if none)."""
    given = [r for r in reasons if isinstance(r, str)]
    return next((r for r in given if r != "ok"), "ok" if given else None)


def with_baseline(row: dict, run: dict, baseline: dict | None) -> dict:
    """Add compute (the baseline run's median step), exposed comm, overlap, their intervals and the quality flag
    (the exposed part's, else the run's or its baseline's own) to a row of run_metrics."""
    base = (baseline or {}).get("summary", {}) or {}
    row["compute(ms)"] = baseline_step_ms(base, real=run.get("summary") or {})
    row["baseline_run_id"] = (baseline or {}).get("run_id")
    critical = row.get("comm_critical(ms)")
    comm, comm_high = (row.get("comm(ms)"), None) if _missing(critical) else \
        (critical, row.get("comm_critical_ci_high(ms)"))
    row.update(exposed_with_interval(run.get("summary") or {}, base, comm, comm_high_ms=comm_high,
                                     blocks=bool(row.get("blocks"))))
    if run.get("summary"):
        own = run_quality(run["summary"])
        base_q = run_quality(base) if base else "ok"
        row["quality"] = worst_quality(faster_than_link(run), row.get("quality"), own,
                                       None if base_q == "ok" else f"baseline {base_q}")
    return row


def completed(run: dict | None) -> dict | None:
    return run if run is not None and run.get("status", "completed") == "completed" else None


def comparison_table(pairs: list[tuple[dict, dict | None]], *, axis: str, label_of: Callable[[dict], str],
                     order: Sequence[str], blocks: Callable[[dict], bool] | None = None) -> pd.DataFrame:
    """One row per compared value, in `order`: (a run, its baseline run or None: exposed communication not
    measured), or a value that cannot run here (a dict without "config": {axis: value, status, reason}) paired with
    None. Column `axis` is the value (`label_of(config)`: a sync variant, a backend, an engine, a bucket size);
    sync_config is the config's own sync; `blocks(config)`: whether its sync waits after backward (it can hide
    nothing: `plausibility`)."""
    rows = []
    for run, baseline in pairs:
        if "config" not in run:  # a value that cannot run here
            rows.append({axis: run[axis], "status": run["status"], "reason": run["reason"]})
            continue
        c = run["config"]
        k = c.get("accumulate", 1)
        row = {axis: label_of(c), "status": run.get("status", "completed"), "reason": run.get("reason"),
               "sync_config": c.get("sync"), "ddp_hook": c.get("ddp_hook", "none"), "accumulate": k,
               "micro_batch_per_rank": c["global_batch"] // (c["ranks"] * c.get("nnodes", 1)) / k,
               "global_batch": c["global_batch"], "run_id": run["run_id"],
               "blocks": bool(blocks(c)) if blocks else None, **run_metrics(run)}
        rows.append(with_baseline(row, run, completed(baseline)))
    frame = pd.DataFrame(rows, columns=[axis, *COMPARISON_COLUMNS])
    rank = {v: i for i, v in enumerate(order)}
    frame = frame.sort_values(axis, key=lambda v: v.map(rank), kind="stable")
    return frame.reset_index(drop=True)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
