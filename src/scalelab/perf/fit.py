"""From measured runs to the calibration's fitted figures (docs/model.md; the runs are made by `calibrate.py`).

Calibration measures what the model needs, as stored runs (resumable through the cell engine):
- compute: one run per per-rank batch with no gradient sync (base.ranks ranks with sync=noop, so every rank
  shares the machine as in the measured runs; one plain rank when base.ranks is 1). forward, backward and
  optimizer are fitted on their stage means; the rest of the step (data, h2d, other, and the wait for the
  slowest rank) is fitted on median step − forward − backward − optimizer, so compute(b) reproduces the median
  step time of a run without communication.
- communication: a `bench comm` allreduce sweep on base.ranks ranks (at least 2) of this machine's backend;
  α and β from `fit_alpha_beta` on the mean iteration time per size (timings.json): a step's communication is a
  sum of many collectives, so its median follows the sum of their means, not of their medians (gloo's small
  messages are bimodal here: a few hundred µs, or a scheduler tick).
- in situ (base.ranks > 1): one run per per-rank batch with per-parameter allreduce (sync=allreduce), right after
  the compute run of that batch. On a CPU host the collectives share the cores and caches with compute, so
  - compute is slower in runs that communicate: compute_scale = median over batches of the in-situ run's
    forward + backward + optimizer spans / the compute run's (means over ranks and steps; at least 1);
  - collectives inside training cost more than the bench's (the sync layer's own copies and scaling of every
    gradient, cold caches, ranks arriving apart): comm_scale = median over batches of the scale k at which
    Σ_p T(S_p) equals (allreduce step − compute_scale × compute step), at least 1 (the bench is the best case).
    k multiplies what the hosts do (α, the hosts' β); over a shaped link the wire keeps its rate
    (`links.link_costs`), so on loopback k is the plain ratio to the bench's Σ_p T(S_p).
  - comm_scale is fitted on allreduce and holds for the strategies that run allreduce (allreduce, bucketed, ddp).
    A strategy with other collectives (`OWN_SCALE`: gather_scatter) costs differently inside training: gloo's
    gather and scatter each post one message where its allreduce runs a ring of dependent steps, and on 2 shared
    cores the ratio of the two moved between calibrations (allreduce ×1.1 to ×2.6 the bench, gather/scatter about
    ×1 in the same sessions). When the caller predicts such a strategy (`calibrate(strategies=...)`), one run of
    it per batch gives its own scale (sync_scales), found the same way; it has no floor of 1, since the bench
    it scales timed another collective.
  The "measured" hardware is the bench's α, β with comm_scale, and its predictions (and the validation's, on
  this machine) multiply compute by compute_scale wherever collectives run; presets do not (`perfmodel.predict`).
- overlap (base.ranks > 1): one run per per-rank batch with overlapped buckets (sync=bucketed, about a quarter
  of the gradient per bucket, or one per parameter when that gives a single bucket), right after the allreduce
  run. On 2 shared cores gloo's threads compete with backward, so less is hidden than a separate engine would
  hide: overlap = the median over batches of the Hardware.overlap at which the model's exposed communication
  equals the measured one (`fit_overlap`).
- the model's gradient sizes: one entry per trainable parameter (numel · element size), in registration order.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from scalelab.analysis import keys
from scalelab.measure.commbench import iteration_times
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import OWN_SCALE, STAGES, Calibration
from scalelab.perf.hardware import fit_alpha_beta
from scalelab.store import RunDir

def bench_times(files: RunDir) -> BenchTimes:
    """A bench run's allreduce rows (`files`: the run's RunDir): per size the timed iterations (each the slowest
    rank's time, as in its results table) and their mean, from the back-to-back loop where it was timed."""

    data = files.read_timings()
    groups: dict[int, list[dict]] = {}
    for rec in data["records"]:
        if rec["op"] == "allreduce" and not rec.get("skipped"):
            groups.setdefault(rec["size(B)"], []).append(rec)
    out = BenchTimes([], [], [], int(data["ranks"]))
    for size, recs in sorted(groups.items()):
        times = iteration_times([r["times(s)"] for r in sorted(recs, key=lambda r: r["rank"])])
        out.sizes.append(float(size))
        out.iterations.append(times)
        out.means.append(max(r["loop(s)"] for r in recs) / len(times) if "loop(s)" in recs[0]
                         else sum(times) / len(times))
    return out


def bench_means(files: RunDir) -> tuple[list[float], list[float], int]:
    """(sizes in bytes, mean time per iteration in s, ranks) of a bench run's allreduce rows: per iteration the
    slowest rank's time, as in its results table, but averaged instead of the median."""
    times = bench_times(files)
    return times.sizes, times.means, times.ranks



def world(config: dict) -> int:
    """Ranks over all nodes of a stored run's config."""
    return int(config.get("ranks", 1)) * int(config.get("nnodes", 1))


def compute_points(runs: list[dict]) -> pd.DataFrame:
    """One row per compute run: per_rank_batch, accumulate, stage means in ms and the rest of the median step."""
    rows = []
    for run in runs:
        cfg, s = run["config"], run["summary"] or {}
        stages = {st: s.get(keys.stage_ms(st), 0.0) for st in STAGES[:3]}
        step = s[keys.STEP_MEDIAN_MS]
        rows.append({"run_id": run["run_id"], "per_rank_batch": cfg["global_batch"] / world(cfg),
                     "accumulate": cfg.get("accumulate", 1), **{f"{k}(ms)": v for k, v in stages.items()},
                     "other(ms)": max(0.0, step - sum(stages.values())), "step(ms)": step})
    return pd.DataFrame(rows).sort_values("per_rank_batch").reset_index(drop=True)


def insitu_rows(points: pd.DataFrame, runs: list[dict], cal: "Calibration", strategy: str) -> list[dict]:
    """One row per in-situ run of `strategy` with a compute run at its batch: its median step, that compute run's
    step, the model's communication at scale 1 and the ratio of compute spans (with / without communication)."""
    by_batch = {row["per_rank_batch"]: row for row in points.to_dict("records")}
    bench = strategy_comm_ms(cal, strategy)(1.0)
    rows = []
    for run in runs:
        b = run["config"]["global_batch"] / world(run["config"])
        summary, plain = run["summary"], by_batch.get(b)
        if plain is None:
            continue
        spans = sum(summary.get(keys.stage_ms(st), 0.0) for st in STAGES[:3])
        plain_spans = sum(plain[f"{st}(ms)"] for st in STAGES[:3])
        rows.append({"run_id": run["run_id"], "sync": strategy, "per_rank_batch": b,
                     "step(ms)": summary[keys.STEP_MEDIAN_MS],
                     "compute_step(ms)": plain["step(ms)"], "bench_comm(ms)": bench,
                     "compute_ratio": spans / plain_spans if plain_spans > 0 else math.nan})
    return rows


def strategy_comm_ms(cal: "Calibration", strategy: str) -> Callable[[float], float]:
    """The model's communication of one step of `strategy` (ms) as a function of the hosts' in-training scale."""
    def comm_ms(scale: float) -> float:
        return 1e3 * pm.sync_cost(strategy, param_bytes=cal.param_bytes, n=cal.ranks, backward_s=0.0,
                                  hardware=cal.hardware(scale=scale)).comm_s
    return comm_ms


def fitted_scales(rows: list[dict], cal: "Calibration", strategy: str, compute_scale: float) -> pd.Series:
    """Per row, the scale at which the model's communication equals step − compute_scale × compute step
    (stored in the row as comm_ratio); the finite ones."""
    comm_ms = strategy_comm_ms(cal, strategy)
    for r in rows:
        r["comm_ratio"] = scale_to_match(comm_ms, r["step(ms)"] - compute_scale * r["compute_step(ms)"])
    return pd.Series([r["comm_ratio"] for r in rows], dtype=float).dropna()


def insitu_scales(points: pd.DataFrame, insitu: list[dict], cal: "Calibration") -> tuple[float, float, list[dict]]:
    """(compute_scale, comm_scale, rows) from the in-situ allreduce runs and the compute runs at the same batches
    (definitions in the module docstring)."""
    rows = insitu_rows(points, insitu, cal, "allreduce")
    if not rows:
        return 1.0, 1.0, rows
    ratios = pd.Series([r["compute_ratio"] for r in rows], dtype=float).dropna()
    compute = max(1.0, float(ratios.median())) if len(ratios) else 1.0
    comm = fitted_scales(rows, cal, "allreduce", compute)
    return compute, (max(1.0, float(comm.median())) if len(comm) else 1.0), rows


def own_scale(points: pd.DataFrame, runs: list[dict], cal: "Calibration",
              strategy: str) -> tuple[float | None, list[dict]]:
    """(scale, rows): `strategy`'s own in-training scale (OWN_SCALE) from its in-situ runs, with the calibration's
    compute_scale, without the floor of 1; None when no run gives one (the strategy then keeps comm_scale)."""
    rows = insitu_rows(points, runs, cal, strategy)
    scales = fitted_scales(rows, cal, strategy, cal.compute_scale)
    return (float(scales.median()) if len(scales) else None), rows


def scale_to_match(model_ms: Callable[[float], float], measured_ms: float) -> float:
    """The scale k at which `model_ms(k)` (non-decreasing in k) equals `measured_ms`: the ratio measured / model
    when the whole cost scales (loopback), less where a shaped wire's fixed rate is part of it; 0 when the
    unscaled part alone is already longer; NaN without a model cost."""
    from scipy.optimize import brentq  # here: ranks import this package, and scipy costs them start-up time

    if not math.isfinite(measured_ms) or model_ms(1.0) <= 0:
        return math.nan
    if model_ms(0.0) >= measured_ms:
        return 0.0
    hi = 1.0
    while model_ms(hi) < measured_ms:
        if hi >= 1e6:
            return hi
        hi *= 2
    return float(brentq(lambda k: model_ms(k) - measured_ms, 0.0, hi, xtol=1e-9))


def fit_overlap(points: pd.DataFrame, runs: list[dict], cal: "Calibration") -> tuple[float, list[dict]]:
    """(overlap, rows) from the in-situ bucketed runs: per batch, the overlap in [0, 1] at which the model's
    exposed communication equals the measured one (step − compute_scale × the compute run's step; exposed
    falls as overlap rises, so a root search finds it; clipped at the ends), then the median over batches.
    1 when no run has hideable communication (a single bucket, or backward too short to matter)."""
    from scipy.optimize import brentq  # here, as in scale_to_match

    by_batch = {row["per_rank_batch"]: row for row in points.to_dict("records")}
    model, hw = cal.compute_model(), cal.hardware()
    rows = []
    for run in runs:
        cfg, summary = run["config"], run["summary"]
        b = cfg["global_batch"] / world(cfg)
        if b not in by_batch:
            continue
        measured = summary[keys.STEP_MEDIAN_MS] - cal.compute_scale * by_batch[b]["step(ms)"]
        backward_s = cal.compute_scale * model.backward(b) / 1e3

        def exposed(overlap: float) -> float:
            return 1e3 * pm.sync_cost("bucketed", param_bytes=cal.param_bytes, n=cal.ranks,
                                      hardware=dataclasses.replace(hw, overlap=overlap), backward_s=backward_s,
                                      bucket_bytes=cfg["bucket_mb"] * pm.MIB).exposed_s

        none, full = exposed(0.0), exposed(1.0)
        if none - full < 1e-3:  # under a µs of hideable time: this run says nothing about overlap
            continue
        overlap = (0.0 if measured >= none else 1.0 if measured <= full
                   else float(brentq(lambda o: exposed(o) - measured, 0.0, 1.0, xtol=1e-9)))
        rows.append({"run_id": run["run_id"], "sync": "bucketed", "per_rank_batch": b, "measured_exposed(ms)": measured,
                     "exposed_no_overlap(ms)": none, "exposed_full_overlap(ms)": full, "overlap": overlap})
    values = pd.Series([r["overlap"] for r in rows], dtype=float)
    return (float(values.median()) if len(values) else 1.0), rows


def fit_of(model: pm.ComputeModel, stage: str) -> pm.Linear:
    return model.overhead if stage == "other" else getattr(model, stage)


@dataclass
class BenchTimes:
    """A bench's allreduce sweep as the fit reads it: per size the mean time per iteration and the timed
    iterations (each the slowest rank's seconds) that `uncertainty` resamples."""

    sizes: list[float]
    means: list[float]
    iterations: list[list[float]]
    ranks: int

    def fit(self) -> tuple[float, float]:
        return fit_alpha_beta(self.sizes, self.means, self.ranks, op="allreduce")


@dataclass
class Measured:
    """What a calibration is fitted on: per cell its launches (stored runs; `cell_run` pools them), per sync of the
    in-situ runs its cells' launches, and the benches' timings. `uncertainty.resample` draws another from it."""

    compute: list[list[dict]]
    insitu: dict[str, list[list[dict]]]
    bench: BenchTimes
    host_bench: BenchTimes | None = None  # loopback, when the bench ran over a shaped link
    veth_bench: BenchTimes | None = None  # an unshaped namespace link, when the bench ran over a shaped one
    # in-situ cells over a link the calibration's training did not cross: not fitted on, predicted (`modelerror`)
    cross: list[list[dict]] = field(default_factory=list)
    # one rank alone at the same per-rank batches (calibrate.lone_cells): the baseline of one rank per node
    lone: list[list[dict]] = field(default_factory=list)


def cell_run(launches: list[dict]) -> dict:
    """One cell's launches as one run: the last launch with their pooled summary (`analysis.repeats.pool`)."""
    if len(launches) == 1:
        return launches[0]
    from scalelab.analysis.repeats import pool
    from scalelab.analysis.summary import timed_step_ms

    steps = [timed_step_ms(r["files"].read_steps()) for r in launches]
    return {**launches[-1], "summary": pool([r["summary"] for r in launches], steps)}


def fit(template: Calibration, measured: Measured) -> Calibration:
    """The calibration's fitted figures from `measured` (compute model, α and β, in-situ scales, overlap), on a
    copy of `template` (which gives the model, the gradient sizes, the link and the identity)."""
    points = compute_points([cell_run(c) for c in measured.compute])
    model = pm.fit_compute_model(points)
    alpha, beta = measured.bench.fit()
    host = measured.host_bench.fit() if measured.host_bench else (None, None)
    veth = measured.veth_bench.fit() if measured.veth_bench else (None, None)
    cal = dataclasses.replace(
        template, compute={s: [fit_of(model, s).c0, fit_of(model, s).c1] for s in STAGES},
        points=json.loads(points.to_json(orient="records")), alpha_s=alpha, beta_s_per_byte=beta,
        compute_runs=list(points["run_id"]), host_alpha_s=host[0], host_beta_s_per_byte=host[1],
        veth_alpha_s=veth[0], veth_beta_s_per_byte=veth[1], sync_scales={}, insitu=[], replicates=[], residuals=[],
        lone={}, lone_points=[])
    runs = {sync: [cell_run(c) for c in measured.insitu.get(sync, [])] for sync in ("allreduce", "bucketed", *OWN_SCALE)}
    cal.compute_scale, cal.comm_scale, cal.insitu = insitu_scales(points, runs["allreduce"], cal)
    for sync in OWN_SCALE:
        scale, rows = own_scale(points, runs[sync], cal, sync)
        if scale is not None:
            cal.sync_scales[sync] = scale
        cal.insitu += rows
    cal.overlap, overlap_rows = fit_overlap(points, runs["bucketed"], cal)
    cal.insitu += overlap_rows
    if measured.lone:
        cal.lone, cal.lone_points = lone_fit([cell_run(c) for c in measured.lone])
    return cal


def lone_fit(runs: list[dict]) -> tuple[dict[str, list[float]], list[dict]]:
    """(stage -> [c0, c1], the points) of the compute of one rank alone, from its runs without sync."""
    points = compute_points(runs)
    model = pm.fit_compute_model(points)
    return {s: [fit_of(model, s).c0, fit_of(model, s).c1] for s in STAGES}, json.loads(points.to_json(orient="records"))
