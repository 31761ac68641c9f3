"""Performance-model experiment (DESIGN F14): calibrate the model on this machine, predict, validate.

    cal = calibrate(base, store, "pred", batches=[8, 16, 32, 64])     # stored runs + a `bench comm` run
    table = predict_table(cal, PRESETS["10gbe"], [1, 2, 4, 8, 1024], mode="weak", batch=32, strategy="ddp")
    check = validate_measured(cal, store, "pred/validation", cells)   # predicted vs measured step time

Calibration measures what the model needs, as stored runs (resumable through `run_grid`):
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
    gradient, cold caches, ranks arriving apart): comm_scale = median over batches of (allreduce step −
    compute_scale × compute step) / Σ_p T(S_p) with the bench's α, β, at least 1 (the bench is the best case).
  The "measured" hardware is the bench's α, β times comm_scale, and its predictions (and the validation's, on
  this machine) multiply compute by compute_scale wherever collectives run; presets do not (`perfmodel.predict`).
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

from scalelab.analysis import perfmodel as pm
from scalelab.analysis.hardware import PRESETS, Hardware, fit_alpha_beta, hardware_from_dict, hardware_from_fit
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, StoreError
from scalelab.experiments.grid import Cell, cell_key, run_grid, study_runs, with_fields
from scalelab.store import Store, read_json, write_json_atomic

MEASURED = "measured"  # the hardware name that means this machine's fitted α and β
STAGES = ("forward", "backward", "optimizer", "other")


@dataclass(kw_only=True)
class Calibration:
    """What the performance model needs, measured on this machine."""

    model: str
    dataset: str
    ranks: int  # ranks of the compute runs (sync=noop when > 1) and of the bench (at least 2)
    threads: int | None  # torch threads per rank in the compute runs (None: the default, cores / ranks)
    backend: str  # of the bench: what α and β describe
    accumulate: int
    compute: dict[str, list[float]]  # stage -> [c0 (ms), c1 (ms per sample)], stages as in STAGES
    points: list[dict]  # the measured compute points the fit used
    alpha_s: float  # s per message (bench fit)
    beta_s_per_byte: float  # s per byte (bench fit)
    comm_scale: float = 1.0  # in-training collective time / the bench fit's (>= 1), see the module docstring
    compute_scale: float = 1.0  # compute with communication / without, on this machine (>= 1)
    insitu: list[dict] = field(default_factory=list)  # the allreduce runs both scales came from
    param_bytes: list[int]  # gradient bytes per trainable parameter, registration order
    parameters: int  # trainable parameter elements
    compute_runs: list[str] = field(default_factory=list)
    bench_run: str = ""
    key: str = ""  # identity of the measurement (cells + bench config)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    def compute_model(self) -> pm.ComputeModel:
        f, b, o, x = (pm.Linear(*self.compute[s]) for s in STAGES)
        return pm.ComputeModel(forward=f, backward=b, optimizer=o, overhead=x)

    def hardware(self, gpus_per_node: int = 1) -> Hardware:
        """This machine's links as training sees them: the bench's α, β times comm_scale."""
        k = self.comm_scale
        return hardware_from_fit(self.alpha_s * k, self.beta_s_per_byte * k, gpus_per_node=gpus_per_node,
                                 name=f"{MEASURED} ({self.backend} loopback, this machine)",
                                 source=f"α-β fit of `bench comm` run {self.bench_run} (mean per size) × in-training "
                                        f"scale {k:.2f}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        known = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(known - set(data) - {"created", "comm_scale", "compute_scale", "insitu"})
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


def calibration_path(store: Store, study: str) -> Path:
    return store.root / "studies" / study / "calibration.json"


def calibration_cells(base: TrainConfig, batches: Sequence[int]) -> list[Cell]:
    """One run without gradient sync per per-rank batch: same ranks, threads and data as `base`."""
    if base.nnodes != 1:
        raise ConfigError("nnodes", base.nnodes, "calibration runs on this machine: allowed 1")
    if len(set(batches)) < 2 or min(batches) < 1:
        raise ConfigError("batches", list(batches), "allowed: at least two different per-rank batches >= 1")
    bad = [b for b in batches if b % base.accumulate]
    if bad:
        raise ConfigError("batches", bad[0], f"allowed: per-rank batches divisible by accumulate {base.accumulate}")
    quiet = {"net_latency_ms": 0.0, "net_bandwidth_gbps": None, "ddp_hook": "none"}
    sync = {"sync": "noop" if base.ranks > 1 else "auto", "strategy": "auto"}
    return [Cell(f"compute, per-rank batch {b}", with_fields(base, global_batch=b * base.ranks, **quiet, **sync))
            for b in sorted(set(batches))]


def insitu_cells(base: TrainConfig, batches: Sequence[int]) -> list[Cell]:
    """Per per-rank batch, one run with per-parameter blocking allreduce and no emulation (none for one rank)."""
    if base.ranks < 2:
        return []
    return [Cell(f"in situ allreduce, per-rank batch {c.config.per_rank_batch}",
                 with_fields(c.config, sync="allreduce")) for c in calibration_cells(base, batches)]


def bench_means(run_dir: Path) -> tuple[list[float], list[float], int]:
    """(sizes in bytes, mean time per iteration in s, ranks) of a bench run's allreduce rows: per iteration the
    slowest rank's time, as in its results table, but averaged instead of the median."""
    from scalelab.measure.commbench import iteration_times

    data = read_json(run_dir / "timings.json")
    groups: dict[int, list[dict]] = {}
    for rec in data["records"]:
        if rec["op"] == "allreduce" and not rec.get("skipped"):
            groups.setdefault(rec["size(B)"], []).append(rec)
    sizes, means = [], []
    for size, recs in sorted(groups.items()):
        times = iteration_times([r["times(s)"] for r in sorted(recs, key=lambda r: r["rank"])])
        sizes.append(float(size))
        means.append(sum(times) / len(times))
    return sizes, means, int(data["ranks"])


def bench_config(base: TrainConfig, param_bytes: Sequence[int]):
    """The allreduce sweep: 1 KiB up to the whole gradient (at least 4 MiB, at most 64 MiB), ×4. The floor keeps
    the bandwidth term well above the latency for small models: with sizes up to 1 MiB on a loaded host, noise
    could push the fitted β to zero."""
    from scalelab.measure.commbench import CommBenchConfig

    top, end = min(64 * pm.MIB, max(4 * pm.MIB, sum(param_bytes))), 1024
    while end < top:
        end *= 4
    return CommBenchConfig(ops="allreduce", begin=1024, end=end, factor=4, warmup=5, iters=30,
                           ranks=max(2, base.ranks), backend="auto" if base.backend == "auto" else base.backend)


def gradient_sizes(base: TrainConfig) -> tuple[list[int], int]:
    """(bytes per trainable parameter in registration order, parameter elements) of the model, built once."""
    from scalelab.train.setup import build_inputs

    _, model = build_inputs(base)
    params = [p for p in model.parameters() if p.requires_grad]
    return [p.numel() * p.element_size() for p in params], sum(p.numel() for p in params)


def compute_points(runs: list[dict]) -> pd.DataFrame:
    """One row per compute run: per_rank_batch, accumulate, stage means in ms and the rest of the median step."""
    rows = []
    for run in runs:
        cfg, s = run["config"], run["summary"] or {}
        stages = {st: s.get(f"stage/{st}(ms)", 0.0) for st in STAGES[:3]}
        step = s["time/step_median(ms)"]
        rows.append({"run_id": run["run_id"], "per_rank_batch": cfg["global_batch"] / (cfg["ranks"] * cfg["nnodes"]),
                     "accumulate": cfg.get("accumulate", 1), **{f"{k}(ms)": v for k, v in stages.items()},
                     "other(ms)": max(0.0, step - sum(stages.values())), "step(ms)": step})
    return pd.DataFrame(rows).sort_values("per_rank_batch").reset_index(drop=True)


def insitu_scales(points: pd.DataFrame, insitu: list[dict], cal: "Calibration") -> tuple[float, float, list[dict]]:
    """(compute_scale, comm_scale, rows) from the in-situ allreduce runs and the compute runs at the same batches
    (definitions in the module docstring)."""
    by_batch = {row["per_rank_batch"]: row for row in points.to_dict("records")}
    bench = 1e3 * pm.sync_cost("allreduce", param_bytes=cal.param_bytes, n=cal.ranks, backward_s=0.0,
                               hardware=hardware_from_fit(cal.alpha_s, cal.beta_s_per_byte)).comm_s
    rows = []
    for run in insitu:
        b = run["config"]["global_batch"] / run["config"]["ranks"]
        summary, plain = run["summary"], by_batch.get(b)
        if plain is None:
            continue
        spans = sum(summary.get(f"stage/{st}(ms)", 0.0) for st in STAGES[:3])
        plain_spans = sum(plain[f"{st}(ms)"] for st in STAGES[:3])
        rows.append({"run_id": run["run_id"], "per_rank_batch": b, "step(ms)": summary["time/step_median(ms)"],
                     "compute_step(ms)": plain["step(ms)"], "bench_comm(ms)": bench,
                     "compute_ratio": spans / plain_spans if plain_spans > 0 else math.nan})
    if not rows:
        return 1.0, 1.0, rows
    ratios = pd.Series([r["compute_ratio"] for r in rows], dtype=float).dropna()
    compute = max(1.0, float(ratios.median())) if len(ratios) else 1.0
    for r in rows:
        r["comm_ratio"] = (r["step(ms)"] - compute * r["compute_step(ms)"]) / bench if bench > 0 else math.nan
    comm = pd.Series([r["comm_ratio"] for r in rows], dtype=float).dropna()
    return compute, (max(1.0, float(comm.median())) if len(comm) else 1.0), rows


def fit_of(model: pm.ComputeModel, stage: str) -> pm.Linear:
    return model.overhead if stage == "other" else getattr(model, stage)


def _find_bench(store: Store, key: str):
    """A completed bench run of this calibration (run ids bench-KEY-i), and the next free id."""
    runs = store.list_runs(kind="bench")
    ours = runs[runs["run_id"].str.startswith(f"bench-{key}-")]
    done = ours[ours["status"] == "completed"]
    return (done["run_id"].iloc[0] if len(done) else None), f"bench-{key}-{len(ours)}"


def calibrate(base: TrainConfig, store: Store, study: str, *, batches: Sequence[int],
              say: Callable[[str], None] = print, bench=None) -> Calibration:
    """Measure (or reuse) the compute fit, α and β, and the gradient sizes for `base` on this machine.
    `bench` (a CommBenchConfig) replaces the default sweep (`bench_config`)."""
    from scalelab.measure.commbench import run_commbench
    from scalelab.runner import RunFailed

    cells, insitu = calibration_cells(base, batches), insitu_cells(base, batches)
    param_bytes, parameters = gradient_sizes(base)
    bench = bench or bench_config(base, param_bytes)
    identity = [cell_key(c.config) for c in cells + insitu] + [json.dumps(bench.to_dict(), sort_keys=True)]
    key = hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:12]
    path = calibration_path(store, study)
    if path.exists():
        try:
            old = Calibration.load(path)
        except StoreError:
            old = None
        if old is not None and old.key == key:
            say(f"[{study}] calibration {path} reused")
            return old
    # each batch's compute run and its in-situ run back to back: load from other processes hits both alike
    paired = [c for i, cell in enumerate(cells) for c in [cell, *insitu[i:i + 1]]]
    results = run_grid(f"{study}/calibration", paired, store, say=say)
    failed = [r for r in results if r.status == "failed"]
    if failed:
        raise RunFailed(failed[0].run_id, f"calibration cell {failed[0].label}: {failed[0].reason}")
    by_key = {cell_key(TrainConfig.from_dict(r["config"])): r for r in study_runs(store, f"{study}/calibration")}
    points = compute_points([by_key[cell_key(c.config)] for c in cells])
    fit = pm.fit_compute_model(points)
    bench_run, next_id = _find_bench(store, key)
    if bench_run is None:
        outcome = run_commbench(dataclasses.replace(bench, run_id=next_id), store, say=say)
        if outcome.reason:
            raise RunFailed(outcome.run_id, outcome.reason)
        bench_run = outcome.run_id
    else:
        say(f"[{study}] bench {bench_run} reused")
    sizes, means, ranks = bench_means(store.run_dir(bench_run))
    alpha, beta = fit_alpha_beta(sizes, means, ranks, op="allreduce")
    cal = Calibration(
        model=base.model, dataset=base.dataset, ranks=bench.ranks, threads=base.threads,
        backend=bench.resolved_backend,
        accumulate=base.accumulate,
        compute={s: [fit_of(fit, s).c0, fit_of(fit, s).c1] for s in STAGES},
        points=json.loads(points.to_json(orient="records")), alpha_s=alpha, beta_s_per_byte=beta,
        param_bytes=param_bytes, parameters=parameters, compute_runs=list(points["run_id"]), bench_run=bench_run,
        key=key)
    cal.compute_scale, cal.comm_scale, cal.insitu = insitu_scales(
        points, [by_key[cell_key(c.config)] for c in insitu], cal)
    cal.save(path)
    say(f"[{study}] calibration: {base.ranks} rank(s) without sync at per-rank batches "
        f"{', '.join(str(int(b)) for b in points['per_rank_batch'])}; α = {alpha * 1e6:.1f} µs, "
        f"1/β = {1 / beta / 1e9 if beta else float('inf'):.3g} GB/s ({bench_run}); with communication: collectives "
        f"×{cal.comm_scale:.2f}, compute ×{cal.compute_scale:.2f}; wrote {path}")
    return cal


# ---------------------------------------------------------------- prediction

def resolve_hardware(names: Sequence[str], cal: Calibration, *, file: dict | None = None,
                     gpus_per_node: int | None = None) -> list[Hardware]:
    """Hardware presets by name (`PRESETS` plus "measured" = this machine's fit), then the one of `file`
    (`hardware_from_dict`); `gpus_per_node` overrides every preset's node size."""
    out = []
    for name in names:
        if name == MEASURED:
            out.append(cal.hardware(gpus_per_node or 1))
            continue
        if name not in PRESETS:
            raise ConfigError("hardware", name, f"allowed: {MEASURED}, {', '.join(PRESETS)}")
        out.append(PRESETS[name])
    if file is not None:
        out.append(hardware_from_dict(file))
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise ConfigError("gpus_per_node", gpus_per_node, "allowed: an integer >= 1")
        out = [dataclasses.replace(h, gpus_per_node=gpus_per_node) for h in out]
    if not out:
        raise ConfigError("hardware", list(names), f"give at least one of {MEASURED}, {', '.join(PRESETS)}")
    return out


def compute_scale(cal: Calibration, hw: Hardware) -> float:
    """cal.compute_scale for this machine's own hardware ("measured"), 1 for any other."""
    return cal.compute_scale if hw.name == cal.hardware().name else 1.0


def predict_table(cal: Calibration, hardware: Hardware | Sequence[Hardware], workers: Sequence[int], *,
                  mode: str = "weak", batch: float, strategy: str = "ddp", bucket_mb: float = 25.0,
                  compression: str = "none", accumulate: int = 1,
                  emulation: pm.Emulation | None = None) -> pd.DataFrame:
    """`perfmodel.predict` per hardware, stacked: pm.COLUMNS plus hardware, strategy, mode, compression.
    `batch` is the global batch in strong mode and the per-rank batch in weak mode."""
    if bucket_mb <= 0:
        raise ConfigError("bucket_mb", bucket_mb, "allowed: a number of MiB > 0")
    frames = []
    for hw in [hardware] if isinstance(hardware, Hardware) else hardware:
        batches = {"global_batch": batch} if mode == "strong" else {"per_rank_batch": batch}
        frame = pm.predict(cal.compute_model(), hw, workers, param_bytes=cal.param_bytes, mode=mode,
                           strategy=strategy, bucket_bytes=bucket_mb * pm.MIB, compression=compression,
                           accumulate=accumulate, emulation=emulation, compute_scale=compute_scale(cal, hw),
                           **batches)
        frames.append(frame.assign(hardware=hw.name, strategy=strategy, mode=mode, compression=compression))
    return pd.concat(frames, ignore_index=True)


def efficiency_threshold(table: pd.DataFrame, threshold: float = 0.5) -> dict[str, int | None]:
    """Per hardware: the smallest worker count whose predicted efficiency is below `threshold` (None: none)."""
    return {hw: pm.efficiency_threshold(group, threshold) for hw, group in table.groupby("hardware", sort=False)}


def options_for_efficiency(cal: Calibration, hardware: Hardware, workers: int, *, target: float = 0.5,
                           per_rank_batches: Sequence[float], strategies: Sequence[str] = pm.STRATEGIES[:-1],
                           bucket_mb: float = 25.0, compression: str = "none",
                           accumulate: int = 1) -> pd.DataFrame:
    """Which per-rank batch and strategy keep weak-scaling efficiency >= `target` at `workers` on `hardware`
    (`perfmodel.options_for_efficiency`: those meeting it first, smallest batch first)."""
    if not 0 < target <= 1:
        raise ConfigError("target_efficiency", target, "allowed: a number in (0, 1]")
    return pm.options_for_efficiency(cal.compute_model(), hardware, workers, target=target,
                                     per_rank_batches=per_rank_batches, strategies=strategies,
                                     param_bytes=cal.param_bytes, bucket_bytes=bucket_mb * pm.MIB,
                                     compression=compression, accumulate=accumulate,
                                     compute_scale=compute_scale(cal, hardware))


# ---------------------------------------------------------------- validation

VALIDATION_COLUMNS = ["run_id", "sync", "per_rank_batch", "accumulate", "bucket_mb", "ddp_hook", "net_latency_ms",
                      "net_bandwidth_gbps", "compute(ms)", "comm(ms)", "exposed_comm(ms)", "predicted", "measured",
                      "measured_comm(ms)", "error(%)", "measured_speedup", "measured_efficiency"]


def predict_run(cal: Calibration, config: dict) -> pd.Series | None:
    """The model's prediction for one stored run's config on this machine: the "measured" hardware (fitted α/β
    × comm_scale, compute × compute_scale where collectives run) plus the run's network emulation (each
    collective takes max(fitted time, L + S·8/(bw·1e9)), see `perfmodel.Emulation`). None for what the model
    does not cover (PowerSGD)."""
    if config.get("ddp_hook", "none") == "powersgd":
        return None
    n = config["ranks"] * config.get("nnodes", 1)
    sync = config.get("sync", "auto")
    strategy = "ddp" if sync == "auto" else sync
    compression = config.get("ddp_hook", "none")
    emulation = pm.Emulation.from_config(config.get("net_latency_ms", 0.0), config.get("net_bandwidth_gbps"))
    return pm.predict(cal.compute_model(), cal.hardware(), [n], param_bytes=cal.param_bytes, mode="weak",
                      per_rank_batch=config["global_batch"] / n, strategy=strategy if n > 1 else "noop",
                      bucket_bytes=config.get("bucket_mb", 25.0) * pm.MIB, compression=compression,
                      accumulate=config.get("accumulate", 1), emulation=emulation,
                      compute_scale=cal.compute_scale).iloc[0]


def validate_measured(cal: Calibration, store: Store, study: str, cells: Sequence[Cell] = (), *,
                      say: Callable[[str], None] = print) -> pd.DataFrame:
    """Predicted vs measured median step time for every completed run of `study` (running `cells` first,
    resumable) of the calibrated model and dataset. error(%) = 100·(predicted − measured)/measured;
    attrs["median_abs_error(%)"]. measured_efficiency = predicted one-worker step (compute only, same per-rank
    work) / measured step; measured_speedup = workers × that."""
    if cells:
        run_grid(study, cells, store, say=say)
    pred, meas = [], []
    for run in study_runs(store, study):
        cfg, summary = run["config"], run["summary"] or {}
        if (cfg["model"], cfg["dataset"]) != (cal.model, cal.dataset) or "time/step_median(ms)" not in summary:
            continue
        p = predict_run(cal, cfg)
        if p is None:
            say(f"[{study}] {run['run_id']}: ddp_hook {cfg['ddp_hook']} is not modelled, left out")
            continue
        n = cfg["ranks"] * cfg.get("nnodes", 1)
        one = cal.compute_model().step_ms(cfg["global_batch"] / n, cfg.get("accumulate", 1))
        step = summary["time/step_median(ms)"]
        pred.append({"run_id": run["run_id"], "predicted": p["step(ms)"], "compute(ms)": p["compute(ms)"],
                     "comm(ms)": p["comm(ms)"], "exposed_comm(ms)": p["exposed_comm(ms)"]})
        meas.append({"run_id": run["run_id"], "measured": step, "measured_comm(ms)": summary.get("comm/time(ms)"),
                     "sync": cfg.get("sync"), "per_rank_batch": cfg["global_batch"] / n, "workers": n,
                     "accumulate": cfg.get("accumulate", 1), "bucket_mb": cfg.get("bucket_mb"),
                     "ddp_hook": cfg.get("ddp_hook"), "net_latency_ms": cfg.get("net_latency_ms", 0.0),
                     "net_bandwidth_gbps": cfg.get("net_bandwidth_gbps"), "measured_efficiency": one / step,
                     "measured_speedup": n * one / step})
    if not pred:
        out = pd.DataFrame(columns=VALIDATION_COLUMNS + ["workers"])
        out.attrs["median_abs_error(%)"] = float("nan")
        return out
    pred_frame, meas_frame = pd.DataFrame(pred), pd.DataFrame(meas)
    check = pm.validate(pred_frame, meas_frame, ["run_id"], predicted_col="predicted", measured_col="measured")
    out = check.merge(pred_frame.drop(columns="predicted"), on="run_id").merge(
        meas_frame.drop(columns="measured"), on="run_id")
    out = out[VALIDATION_COLUMNS + ["workers"]].sort_values(
        ["net_latency_ms", "sync", "per_rank_batch"], kind="stable").reset_index(drop=True)
    out.attrs["median_abs_error(%)"] = pm.median_abs_error(out)
    return out


# ---------------------------------------------------------------- the experiment

def validation_cells(base: TrainConfig, batches: Sequence[int], strategy: str, bucket_mb: float,
                     compression: str) -> tuple[list[Cell], str | None]:
    """The measured points of `run_prediction`: `strategy` at base.ranks for each calibration batch, with the
    base's network emulation. ([], why) when nothing can be measured here."""
    if base.ranks < 2:
        return [], "validation needs ranks >= 2 (one rank does not communicate)"
    if compression != "none" and strategy != "ddp":
        return [], f"compression {compression} is measured only with strategy ddp (as a DDP comm hook)"
    hook = compression if strategy == "ddp" else "none"
    return [Cell(f"{strategy}, per-rank batch {b}", with_fields(base, global_batch=b * base.ranks, sync=strategy,
                                                               strategy="auto", bucket_mb=bucket_mb, ddp_hook=hook))
            for b in sorted(set(batches))], None


def recommendation(options: pd.DataFrame, workers: int, target: float) -> str:
    """One sentence from an `options_for_efficiency` table."""
    best = options.iloc[0]
    what = f"{best['strategy']} with per-rank batch {best['per_rank_batch']:g}"
    if best["meets_target"]:
        return f"{what} keeps efficiency at {best['efficiency']:.0%} (>= {target:.0%}) on {workers} workers"
    top = options.sort_values("efficiency", ascending=False).iloc[0]
    return (f"no candidate reaches {target:.0%} on {workers} workers; the best is {top['strategy']} with per-rank "
            f"batch {top['per_rank_batch']:g} at {top['efficiency']:.0%}")


def run_prediction(base: TrainConfig, store: Store, study: str, out_dir: Path, *, hardware: Sequence[str],
                   hardware_file: dict | None = None, gpus_per_node: int | None = None, workers: Sequence[int],
                   mode: str = "weak", batch: float, strategy: str = "ddp", bucket_mb: float = 25.0,
                   compression: str = "none", target: float = 0.5, calibration_batches: Sequence[int],
                   validate: bool = True, say: Callable[[str], None] = print):
    """Calibrate (or reuse), predict per hardware, find where efficiency falls below 50 % and what keeps it
    >= `target` at the largest worker count, validate on measured runs of this machine; write tables and plots."""
    from scalelab.experiments.basic import ExperimentResult
    from scalelab.experiments.grid import write_table
    from scalelab.report import figures

    if not 0 < target <= 1:
        raise ConfigError("target_efficiency", target, "allowed: a number in (0, 1]")
    cal = calibrate(base, store, study, batches=calibration_batches, say=say)
    hws = resolve_hardware(hardware, cal, file=hardware_file, gpus_per_node=gpus_per_node)
    table = predict_table(cal, hws, workers, mode=mode, batch=batch, strategy=strategy, bucket_mb=bucket_mb,
                          compression=compression, accumulate=base.accumulate)
    top = max(int(n) for n in workers)
    low = max(1.0, batch / top if mode == "strong" else batch)
    candidates = sorted({low * 2**k for k in range(8)})
    options = pd.concat([options_for_efficiency(cal, hw, top, target=target, per_rank_batches=candidates,
                                                bucket_mb=bucket_mb, compression=compression,
                                                accumulate=base.accumulate).assign(hardware=hw.name)
                         for hw in hws], ignore_index=True)
    cells, why = validation_cells(base, calibration_batches, strategy, bucket_mb, compression)
    validation = (validate_measured(cal, store, f"{study}/validation", cells, say=say) if validate and cells
                  else pd.DataFrame(columns=VALIDATION_COLUMNS))
    below = efficiency_threshold(table, 0.5)
    notes = {"calibration": f"{calibration_path(store, study)} (α = {cal.alpha_s * 1e6:.1f} µs, "
                            f"β⁻¹ = {1 / cal.beta_s_per_byte / 1e9 if cal.beta_s_per_byte else float('inf'):.3g} "
                            f"GB/s from the bench; in training collectives ×{cal.comm_scale:.2f}, compute "
                            f"×{cal.compute_scale:.2f}; {cal.parameters:,} parameters in {len(cal.param_bytes)} "
                            "tensors)",
             "efficiency < 50 % from": {hw: (f"{n} workers" if n else f"never up to {top} workers")
                                        for hw, n in below.items()},
             f"to keep >= {target:.0%} on {top} workers": {hw: recommendation(group, top, target)
                                                            for hw, group in options.groupby("hardware", sort=False)}}
    if len(validation):
        notes["validation"] = (f"median |error| {validation.attrs['median_abs_error(%)']:.1f} % over "
                               f"{len(validation)} measured runs")
    elif validate and why:
        notes["validation"] = f"skipped: {why}"
    result = ExperimentResult("predict", {"prediction": table, "options": options}, notes=notes)
    if len(validation):
        result.tables["validation"] = validation
    for name, frame in result.tables.items():
        paths = write_table(frame, out_dir, name)
        result.files += [paths["csv"], paths["json"]]
    on_curve = validation  # measured points drawn over the curves: same strategy and batch
    if len(validation):
        size = validation["per_rank_batch"] * (validation["workers"] if mode == "strong" else 1)
        on_curve = validation[(validation["sync"] == strategy) & (size == batch)]
    result.files.append(figures.predicted_scaling(table, on_curve, out_dir / "prediction.png", mode=mode))
    if len(validation):
        result.files.append(figures.predicted_vs_measured(validation, out_dir / "validation.png"))
    return result
