"""Calibration of the performance model on this machine: the compute fit, α and β, the in-situ scales, the
gradient sizes (docs/model.md; used by `scalelab.perf.prediction`).

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
The calibration is a JSON file in the study folder (STORE/studies/STUDY/calibration.json); it is reused while
the measurement it describes (same cells, same bench) is unchanged.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.hardware import Hardware
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, StoreError
from scalelab.lab.cells import Cell, Cells, with_fields
from scalelab.measure.commbench import CommBenchConfig, iteration_times
from scalelab.perf import perfmodel as pm
from scalelab.perf.hardware import fit_alpha_beta
from scalelab.perf.links import NodeLink, link_text, wire_beta
from scalelab.run.execute import RunFailed
from scalelab.store import RunDir, Store, read_json, write_json_atomic
from scalelab.train.setup import build_inputs

MEASURED = "measured"  # the hardware name that means this machine's fitted α and β
STAGES = ("forward", "backward", "optimizer", "other")


@dataclass(kw_only=True)
class Calibration:
    """What the performance model needs, measured on this machine."""

    model: str
    dataset: str
    ranks: int  # ranks of the compute runs (sync=noop when > 1) and of the bench (at least 2), over all nodes
    threads: int | None  # torch threads per rank in the compute runs (None: the default, cores / ranks)
    backend: str  # of the bench: what α and β describe
    accumulate: int
    compute: dict[str, list[float]]  # stage -> [c0 (ms), c1 (ms per sample)], stages as in STAGES
    points: list[dict]  # the measured compute points the fit used
    alpha_s: float  # s per message (bench fit)
    beta_s_per_byte: float  # s per byte (bench fit)
    comm_scale: float = 1.0  # in-training collective time / the bench fit's (>= 1), see the module docstring
    compute_scale: float = 1.0  # compute with communication / without, on this machine (>= 1)
    overlap: float = 1.0  # share of the hideable communication backward hides here (Hardware.overlap)
    sync_scales: dict[str, float] = field(default_factory=dict)  # strategy -> its own in-training scale (OWN_SCALE)
    insitu: list[dict] = field(default_factory=list)  # the in-situ runs the scales and the overlap came from
    param_bytes: list[int]  # gradient bytes per trainable parameter, registration order
    parameters: int  # trainable parameter elements
    compute_runs: list[str] = field(default_factory=list)
    bench_run: str = ""
    key: str = ""  # identity of the measurement (cells + bench config)
    nodes: int = 1  # nodes the compute runs and the bench spanned (local_nodes; 1: ranks on this host's loopback)
    link_gbps: float | None = None  # each node's shaped link in the bench (kernel tbf); None: unshaped
    # α, β of a loopback bench on this machine when the bench ran over a shaped link: what moving bytes costs the
    # hosts themselves, the floor under every link (`hardware` for another link)
    host_alpha_s: float | None = None
    host_beta_s_per_byte: float | None = None
    # α, β of a bench over the same nodes with the link unshaped (the veth path and bridge): what an unshaped
    # namespace link costs the hosts, where the loopback bench misses that path
    veth_alpha_s: float | None = None
    veth_beta_s_per_byte: float | None = None
    repeats: int = 1  # launches per calibration cell
    batches: list[float] = field(default_factory=list)  # per-rank batches of the runs the calibration measured
    compute_nodes: int | None = None  # compute measured again at this node count (`calibrate_compute`)
    # the fitted figures refitted on resampled calibration data (`uncertainty`): the prediction intervals
    replicates: list[dict] = field(default_factory=list)
    device: str = ""  # what compute ran on: "<n>-core CPU" or the CUDA device's name ("": a file of an older version)
    host: str | None = None  # the host of runs measured elsewhere (`predict --from`); None: calibrated here
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    def compute_model(self) -> pm.ComputeModel:
        f, b, o, x = (pm.Linear(*self.compute[s]) for s in STAGES)
        return pm.ComputeModel(forward=f, backward=b, optimizer=o, overhead=x)

    def scale_for(self, strategy: str | None) -> float:
        """The in-training scale of `strategy`'s collectives: its own where calibrated (sync_scales), else
        comm_scale (fitted on allreduce)."""
        return self.sync_scales.get(strategy or "", self.comm_scale)

    def hardware(self, gpus_per_node: int = 1, *, link: NodeLink | None = None,
                 scale: float | None = None, strategy: str | None = None) -> Hardware:
        """The calibrated machine's links as training sees them: the bench's α, β with the in-training scale
        (`scale`, default `scale_for(strategy)`) on the hosts' part (`links.link_costs`: a shaped wire's rate is
        not scaled). With `link` other than the calibrated one (`calibrated_link`), the same hosts joined by that
        link (`link_hardware`)."""
        k = self.scale_for(strategy) if scale is None else scale
        if link is not None and link != self.calibrated_link:
            return link_hardware(self, link, gpus_per_node, scale=k)
        alpha_intra, beta_intra, alpha, beta = link_costs(self, self.calibrated_link, k)
        where = (" loopback, this machine" if self.host is None else f", host {self.host}") + (
            f", {self.nodes} nodes over {link_text(self.link_gbps)}" if self.nodes > 1 else "")
        return Hardware(name=f"{MEASURED} ({self.backend}{where})", alpha_intra=alpha_intra, beta_intra=beta_intra,
                        alpha_inter=alpha, beta_inter=beta, gpus_per_node=gpus_per_node, overlap=self.overlap,
                        source=f"α-β fit of `bench comm` run {self.bench_run} (mean per size), in-training scale "
                               f"{k:.2f} on the hosts' part; overlap {self.overlap:.2f} fitted in situ")

    @property
    def calibrated_link(self) -> NodeLink:
        return NodeLink(self.nodes > 1, self.link_gbps)

    def replicas(self) -> list["Calibration"]:
        """The calibration refitted on each resample of its data (`replicates`, `perf/uncertainty.py`): what the
        prediction intervals are drawn from; [] for a calibration without them."""
        return [dataclasses.replace(self, **rep, replicates=[]) for rep in self.replicates]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        known = {f.name for f in dataclasses.fields(cls)}
        optional = {"created", "comm_scale", "compute_scale", "overlap", "insitu", "device", "host", "nodes",
                    "link_gbps", "host_alpha_s", "host_beta_s_per_byte", "sync_scales", "veth_alpha_s",
                    "veth_beta_s_per_byte", "repeats", "compute_nodes", "replicates", "batches"}
        missing = sorted(known - set(data) - optional)
        if missing:
            raise StoreError(f"calibration: field {missing[0]!r} missing; calibrate again (delete the file)")
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, path: Path) -> "Calibration":
        return cls.from_dict(read_json(path))


def device_name(config: dict, files: RunDir) -> str:
    """What a stored run computed on, from its config and provenance: the first CUDA device's name, "CUDA device"
    when the provenance names none, else "<n>-core CPU" ("CPU" when the core count is unknown)."""
    provenance = read_json(files.provenance_file) if files.provenance_file.exists() else {}
    gpus = provenance.get("cuda_devices") or []
    if config.get("device") == "cuda" or (config.get("device") == "auto" and gpus):
        return str(gpus[0]) if gpus else "CUDA device"
    cores = provenance.get("cpu_count")
    return f"{cores}-core CPU" if isinstance(cores, int) else "CPU"


def calibration_path(store: Store, study: str) -> Path:
    return store.root / "studies" / study / "calibration.json"


def calibration_cells(base: TrainConfig, batches: Sequence[int]) -> list[Cell]:
    """One run without gradient sync per per-rank batch: same ranks, nodes, threads and data as `base`."""
    if base.nnodes != 1 and not base.local_nodes:
        raise ConfigError("nnodes", base.nnodes, "calibration runs on this machine: allowed 1, or local_nodes")
    if len(set(batches)) < 2 or min(batches) < 1:
        raise ConfigError("batches", list(batches), "allowed: at least two different per-rank batches >= 1")
    bad = [b for b in batches if b % base.accumulate]
    if bad:
        raise ConfigError("batches", bad[0], f"allowed: per-rank batches divisible by accumulate {base.accumulate}")
    quiet = {"net_latency_ms": 0.0, "net_bandwidth_gbps": None, "ddp_hook": "none"}
    sync = {"sync": "noop" if base.world_size > 1 else "auto", "wrapper": "auto"}
    return [Cell(f"compute, per-rank batch {b}", with_fields(base, global_batch=b * base.world_size, **quiet, **sync))
            for b in sorted(set(batches))]


# strategies whose collectives are not allreduce: comm_scale does not carry over to them (module docstring)
OWN_SCALE = ("gather_scatter",)


def insitu_cells(base: TrainConfig, batches: Sequence[int], param_bytes: Sequence[int],
                 strategies: Sequence[str] = ()) -> list[Cell]:
    """Per per-rank batch, one run with per-parameter blocking allreduce and one with overlapped buckets (about a
    quarter of the gradient each, so there is overlap to measure; one per parameter when the last-ready tensor
    alone fills a quarter), and one of each strategy of `strategies` in OWN_SCALE; no emulation; none for one
    rank."""
    if base.world_size < 2:
        return []
    cap = sum(param_bytes) / 4
    if len(pm.bucket_sizes(param_bytes, cap)) < 2:
        cap = min(param_bytes)
    bucket_mb = max(1, cap) / pm.MIB
    own = [s for s in OWN_SCALE if s in strategies]
    return [cell for c in calibration_cells(base, batches) for cell in (
        Cell(f"in situ allreduce, per-rank batch {c.config.per_rank_batch}", with_fields(c.config, sync="allreduce")),
        Cell(f"in situ bucketed, per-rank batch {c.config.per_rank_batch}",
             with_fields(c.config, sync="bucketed", bucket_mb=bucket_mb)),
        *(Cell(f"in situ {s}, per-rank batch {c.config.per_rank_batch}", with_fields(c.config, sync=s))
          for s in own))]


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


def bench_config(base: TrainConfig, param_bytes: Sequence[int]):
    """The allreduce sweep: 1 KiB up to the whole gradient (at least 4 MiB, at most 64 MiB), ×4. The floor keeps
    the bandwidth term well above the latency for small models: with sizes up to 1 MiB on a loaded host, noise
    could push the fitted β to zero."""

    top, end = min(64 * pm.MIB, max(4 * pm.MIB, sum(param_bytes))), 1024
    while end < top:
        end *= 4
    nodes = {"local_nodes": base.local_nodes, "link_gbps": base.link_gbps, "link_delay_ms": base.link_delay_ms,
             "ranks": base.ranks} if base.local_nodes > 1 else {"ranks": max(2, base.ranks)}
    return CommBenchConfig(ops="allreduce", begin=1024, end=end, factor=4, warmup=5, iters=30,
                           backend="auto" if base.backend == "auto" else base.backend, **nodes)


def gradient_sizes(base: TrainConfig) -> tuple[list[int], int]:
    """(bytes per trainable parameter in registration order, parameter elements) of the model, built once."""

    _, model = build_inputs(base)
    params = [p for p in model.parameters() if p.requires_grad]
    return [p.numel() * p.element_size() for p in params], sum(p.numel() for p in params)


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
        veth_alpha_s=veth[0], veth_beta_s_per_byte=veth[1], sync_scales={}, insitu=[], replicates=[])
    runs = {sync: [cell_run(c) for c in measured.insitu.get(sync, [])] for sync in ("allreduce", "bucketed", *OWN_SCALE)}
    cal.compute_scale, cal.comm_scale, cal.insitu = insitu_scales(points, runs["allreduce"], cal)
    for sync in OWN_SCALE:
        scale, rows = own_scale(points, runs[sync], cal, sync)
        if scale is not None:
            cal.sync_scales[sync] = scale
        cal.insitu += rows
    cal.overlap, overlap_rows = fit_overlap(points, runs["bucketed"], cal)
    cal.insitu += overlap_rows
    return cal


def calibrate(base: TrainConfig, cells: Cells, *, batches: Sequence[int], say: Callable[[str], None] = print,
              bench=None, strategies: Sequence[str] = (), repeats: int = 1) -> Calibration:
    """Measure (or reuse) the compute fit, α and β, and the gradient sizes for `base` on this machine.
    `bench` (a CommBenchConfig) replaces the default sweep (`bench_config`). `strategies`: the sync strategies
    the caller will predict; those in OWN_SCALE get in-situ runs of their own (module docstring). `repeats`:
    launches per training cell (interleaved by batch). The calibration carries `uncertainty.REPLICATES` refits
    on resampled launches, steps and bench iterations: the prediction intervals."""
    from scalelab.perf import uncertainty

    param_bytes, parameters = gradient_sizes(base)
    compute, insitu = calibration_cells(base, batches), insitu_cells(base, batches, param_bytes, strategies)
    if repeats > 1:
        compute, insitu = ([dataclasses.replace(c, repeats=repeats) for c in group] for group in (compute, insitu))
    bench = bench or bench_config(base, param_bytes)
    bench = dataclasses.replace(bench, backend=bench.resolved_backend)  # what runs here: the cell's identity
    study = cells.study
    # over a shaped link, a loopback bench (the hosts' own cost per byte, under any link) and one over the same
    # nodes unshaped (the veth path's own cost: perf/links.py)
    host_bench = (dataclasses.replace(bench, local_nodes=0, link_gbps=None, link_delay_ms=None, ranks=2)
                  if bench.link_gbps is not None else None)
    veth_bench = dataclasses.replace(bench, link_gbps=None) if bench.link_gbps is not None else None
    benches = [Cell("bench allreduce", bench, kind="bench")] + (
        [Cell("bench allreduce, loopback (the hosts)", host_bench, kind="bench"),
         Cell("bench allreduce, unshaped namespace link", veth_bench, kind="bench")] if host_bench else [])
    identity = ([c.key for c in compute + insitu] + [json.dumps(b.config.to_dict(), sort_keys=True) for b in benches]
                + ([repeats] if repeats > 1 else []))
    key = hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:12]
    path = calibration_path(cells.store, study)
    if path.exists():
        try:
            old = Calibration.load(path)
        except StoreError:
            old = None
        if old is not None and old.key == key and old.replicates:
            say(f"[{study}] calibration {path} reused")
            return old
    # each batch's compute run and its in-situ runs back to back: load from other processes hits them alike
    paired = [c for cell in compute for c in [cell, *(i for i in insitu
                                                      if i.config.per_rank_batch == cell.config.per_rank_batch)]]
    results = cells.run([*paired, *benches], group="calibration", interleave=repeats > 1)
    failed = [r for r in results if r.status != "completed"]
    if failed:
        raise RunFailed(failed[0].run_id or "-", f"calibration cell {failed[0].label}: {failed[0].reason}")
    launches = {res.cell.key: cells.runs([res], all_repeats=True) for res in results}
    bench_runs = [launches[c.key][-1] for c in benches]
    times = [bench_times(r["files"]) for r in bench_runs]
    measured = Measured(compute=[launches[c.key] for c in compute],
                        insitu={sync: [launches[c.key] for c in insitu if c.config.sync == sync]
                                for sync in ("allreduce", "bucketed", *OWN_SCALE)},
                        bench=times[0], host_bench=times[1] if host_bench else None,
                        veth_bench=times[2] if host_bench else None)
    first = launches[compute[0].key][-1]
    template = Calibration(
        model=base.model, dataset=base.dataset, ranks=bench.world, threads=base.threads,
        backend=bench.resolved_backend, accumulate=base.accumulate, compute={}, points=[], alpha_s=0.0,
        beta_s_per_byte=0.0, param_bytes=param_bytes, parameters=parameters, bench_run=bench_runs[0]["run_id"],
        nodes=max(1, bench.local_nodes), link_gbps=bench.link_gbps, key=key, repeats=repeats,
        batches=sorted({float(c.config.per_rank_batch) for c in compute}), device=device_name(first["config"], first["files"]))
    cal = fit(template, measured)
    cal.replicates = uncertainty.replicates(template, measured)
    cal.save(path)
    where = f" on {bench.local_nodes} nodes over {link_text(bench.link_gbps)}" if bench.local_nodes > 1 else ""
    say(f"[{study}] calibration: {base.world_size} rank(s){where} without sync at per-rank batches "
        f"{', '.join(str(int(p['per_rank_batch'])) for p in cal.points)}"
        f"{f' ({repeats} launches each)' if repeats > 1 else ''}; α = {cal.alpha_s * 1e6:.1f} µs, 1/β = "
        f"{1 / cal.beta_s_per_byte / 1e9 if cal.beta_s_per_byte else float('inf'):.3g} GB/s ({cal.bench_run}); "
        f"with communication: collectives ×{cal.comm_scale:.2f}{own_scales_text(cal)}, compute "
        f"×{cal.compute_scale:.2f}, overlap {cal.overlap:.2f}; {len(cal.replicates)} bootstrap refits; wrote {path}")
    return cal


def calibrate_compute(cal: Calibration, base: TrainConfig, cells: Cells, *, batches: Sequence[int],
                      repeats: int = 1) -> Calibration:
    """`cal` with its compute measured again on `base` (runs without sync, `calibration_cells`), e.g. at the
    node count to be predicted: on a host whose nodes share cores, compute at that count is in-sample while
    everything that involves the network stays as calibrated (`compute_nodes` says so). The replicates' compute is
    refitted on resampled launches and steps of these runs."""
    from scalelab.perf import uncertainty

    group = calibration_cells(base, batches)
    group = [dataclasses.replace(c, repeats=repeats) for c in group] if repeats > 1 else group
    results = cells.run(group, group=f"compute at {max(1, base.local_nodes)} nodes", interleave=repeats > 1)
    failed = [r for r in results if r.status != "completed"]
    if failed:
        raise RunFailed(failed[0].run_id or "-", f"compute cell {failed[0].label}: {failed[0].reason}")
    launches = [cells.runs([res], all_repeats=True) for res in results]
    points = compute_points([cell_run(c) for c in launches])
    model = pm.fit_compute_model(points)
    computes = uncertainty.compute_replicates(launches, len(cal.replicates))
    return dataclasses.replace(
        cal, compute={s: [fit_of(model, s).c0, fit_of(model, s).c1] for s in STAGES},
        points=json.loads(points.to_json(orient="records")), compute_runs=list(points["run_id"]),
        compute_nodes=max(1, base.local_nodes),
        replicates=[{**rep, "compute": c} for rep, c in zip(cal.replicates, computes)])


def own_scales_text(cal: Calibration) -> str:
    """", gather_scatter ×0.93" for each strategy with its own in-training scale ("" when none)."""
    return "".join(f", {sync} ×{k:.2f}" for sync, k in cal.sync_scales.items())


# ---------------------------------------------------------------- the calibrated hosts over a link (perf/links.py)

def link_costs(cal: Calibration, link: NodeLink, scale: float) -> tuple[float, float, float, float]:
    """(α, β of the hosts; α, β across nodes) of the calibrated hosts joined by `link` (the module docstring), with
    the in-training `scale` on what the hosts do (α, the hosts' β), not on a shaped wire's rate."""
    if link.namespaced and link.gbps is None and cal.veth_alpha_s is not None and cal.veth_beta_s_per_byte:
        # an unshaped namespace link: the bench over that very path (veth and bridge), not loopback's
        host = (cal.veth_alpha_s, cal.veth_beta_s_per_byte)
        return scale * host[0], scale * host[1], scale * host[0], scale * host[1]
    if cal.link_gbps is None:
        host = (cal.alpha_s, cal.beta_s_per_byte)
    elif cal.host_alpha_s is not None and cal.host_beta_s_per_byte is not None:
        host = (cal.host_alpha_s, cal.host_beta_s_per_byte)
    elif link == cal.calibrated_link:  # a calibration file from before loopback benches: its own fit
        host = (cal.alpha_s, cal.beta_s_per_byte)
    else:
        raise ConfigError("link_gbps", link.gbps, f"the calibration ran over {link_text(cal.link_gbps)} without a "
                                                  "loopback bench, so another link cannot be predicted; calibrate "
                                                  "again")
    # the latency of the path the calibration ran over when the target is the same kind of path (namespace nodes:
    # shaping adds no latency), else the host's
    alpha = cal.alpha_s if link.namespaced and cal.nodes > 1 else host[0]
    beta = scale * host[1]
    if link.gbps is not None:
        fitted = cal.beta_s_per_byte * cal.link_gbps / link.gbps if cal.link_gbps is not None else 0.0
        beta = max(beta, fitted, wire_beta(link.gbps))
    return scale * host[0], scale * host[1], scale * alpha, beta


def link_hardware(cal: Calibration, link: NodeLink, gpus_per_node: int = 1, *,
                  scale: float | None = None) -> Hardware:
    """The calibrated hosts joined by `link` (module docstring), with the in-training `scale` (default the
    calibration's comm_scale)."""
    k = cal.comm_scale if scale is None else scale
    alpha_intra, beta_intra, alpha, beta = link_costs(cal, link, k)
    target = link_text(link.gbps) if link.namespaced else "this host's loopback"
    return Hardware(name=f"measured ({cal.backend}, hosts over {target})", alpha_intra=alpha_intra,
                    beta_intra=beta_intra, alpha_inter=alpha, beta_inter=beta, gpus_per_node=gpus_per_node,
                    overlap=cal.overlap,
                    source=f"calibrated over {link_text(cal.link_gbps) if cal.nodes > 1 else 'loopback'} "
                           f"(bench {cal.bench_run}): per byte the slower of the hosts and the wire, "
                           f"in-training scale {k:.2f} on the hosts' part")
