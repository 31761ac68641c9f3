"""The performance model calibrated on runs measured elsewhere (`scalelab predict --from DIR`, docs/model.md): stored
runs copied from another machine (one GPU box, say) give the compute fit, and α and β when a `bench comm` run is
among them; the model then predicts that machine's compute on presets or a hardware file. Nothing is launched:
every number comes from the stored files, and the model is built here on the CPU only to size its gradients.

    runs = stored_runs(Path("copied-store"))                  # a run dir, a store, a study dir, a folder of runs
    cal = calibrate_from(runs, source=Path("copied-store"), model=None, dataset=None, links=None)
    result = predict_from(cal, runs, hardware=hws, ...)        # prediction_result, validated on the stored runs

What the runs must hold (else one line naming DIR and the run it lacks, exit 2 from the CLI):
- compute: completed `train` runs without communication — one rank, sync noop, or --noop-collectives, no network
  emulation — of one model and dataset at two or more per-rank batches, from one host, device, world size,
  precision, accumulate and threads (the group with the most batches when there are several). Their summaries
  need the median step and the forward, backward and optimizer stages (`fit.compute_points`).
- links, only for `--hardware measured` (the other machine's own links): the newest completed `bench comm` run of
  the same host with allreduce timings (`fit.bench_means`).
- the gradient sizes: the model is built from the run's config (a dataset read from a path needs that path here).
The in-situ scales and the overlap stay 1: fitting them takes runs of several syncs at the same batches and ranks,
and on a device whose collectives have their own engine they are 1 anyway.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.hardware import Hardware
from scalelab.perf.hardware import fit_alpha_beta
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, ScalelabError, StoreError
from scalelab.perf.calibrate import gradient_sizes
from scalelab.perf.calibration import MEASURED, STAGES, Calibration, device_name
from scalelab.perf.fit import bench_means, compute_points, fit_of, world
from scalelab.lab.base import Result
from scalelab.perf.prediction import prediction_result
from scalelab.perf.validation import VALIDATION_COLUMNS, validate_measured
from scalelab.perf import perfmodel as pm
from scalelab.store import RunDir, Store

SOURCES = "a run directory, a store, a study directory of a store, or a folder of run directories"
NO_SYNC = "1 rank, --sync noop or --noop-collectives"
# the config fields that decide the model and its gradient sizes (the rest would be validated for this machine)
MODEL_FIELDS = ("model", "model_options", "dataset", "data_path", "samples", "eval_samples", "augment", "seed")


# ---------------------------------------------------------------- reading the runs

def run_dirs(source: Path) -> list[RunDir]:
    """The run directories `source` names (see SOURCES); a study directory's runs come from its store's catalog."""
    source = Path(source)
    if not source.is_dir():
        raise ConfigError("from", str(source), f"not a directory; allowed: {SOURCES}")
    if RunDir(source).config_file.exists():
        return [RunDir(source)]
    if (source / "runs").is_dir():
        return _children(source / "runs")
    root = source.parent.parent
    if source.parent.name == "studies" and (root / "catalog.sqlite").is_file():
        store, name = Store(root), source.name
        listed = store.list_runs()  # a study's experiments file their runs as STUDY/EXPERIMENT
        ours = listed[(listed["study"] == name) | listed["study"].fillna("").str.startswith(f"{name}/")]
        return [RunDir(store.run_dir(r)) for r in sorted(ours["run_id"])]
    return _children(source)


def _children(folder: Path) -> list[RunDir]:
    return [RunDir(p) for p in sorted(folder.iterdir()) if p.is_dir() and RunDir(p).config_file.exists()]


def stored_runs(source: Path) -> list[dict]:
    """Every run under `source` as {run_id, config, status, kind, host, created, files}; a missing or corrupt
    config or status is a StoreError naming the file. Summaries are read when a run is used (`with_summary`)."""
    dirs = run_dirs(source)
    if not dirs:
        raise ConfigError("from", str(source), f"holds no stored run (a folder with config.json); allowed: {SOURCES}")
    runs = []
    for files in dirs:
        status = files.read_status()
        provenance = files.read_provenance() if files.provenance_file.exists() else {}
        runs.append({"run_id": files.run_id, "config": files.read_config(), "status": status.get("status"),
                     "kind": status.get("kind", "train"), "created": status.get("created", ""),
                     "host": provenance.get("host") or status.get("host") or "unknown", "files": files})
    return runs


def with_summary(run: dict, need: Sequence[str] = ()) -> dict:
    """The run with its summary, which must hold the keys `need` (else a StoreError naming summary.json)."""
    files = run["files"]
    summary = files.read_summary()
    if summary is None:
        raise StoreError(f"{files.summary_file}: file not found (run {run['run_id']} is marked completed)")
    lacking = [k for k in need if not isinstance(summary.get(k), (int, float))]
    if lacking:
        raise StoreError(f"{files.summary_file}: no number for {lacking[0]!r}; the compute fit needs "
                         f"{', '.join(need)}")
    return {**run, "summary": summary}


def without_communication(config: dict) -> bool:
    """A train run whose step has no real collective: one rank, sync noop, or --noop-collectives, not emulated."""
    emulated = config.get("net_latency_ms", 0.0) or config.get("net_bandwidth_gbps") is not None
    return not emulated and (world(config) == 1 or config.get("sync") == "noop"
                             or bool(config.get("noop_collectives")))


def per_rank_batch(config: dict) -> float:
    return config["global_batch"] / world(config)


# ---------------------------------------------------------------- choosing the runs

def compute_group(runs: list[dict], *, source: Path, model: str | None, dataset: str | None) -> list[dict]:
    """The compute runs the fit uses (see the module docstring), each with its `device` and summary added. Of
    several models, the one whose runs can be fitted (two or more batches) is chosen; two such models are
    ambiguous."""
    done = [r for r in runs if r["status"] == "completed" and r["kind"] == "train"
            and without_communication(r["config"])]
    chosen = [r for r in done if model in (None, r["config"].get("model"))
              and dataset in (None, r["config"].get("dataset"))]
    if not chosen:
        which = " of " + " on ".join(x for x in (model, dataset) if x) if model or dataset else ""
        have = sorted({_name(r) for r in done})
        held = f"; it holds them for {', '.join(have)}" if have else ""
        raise ConfigError("from", str(source), f"holds no completed run without gradient sync ({NO_SYNC}){which} "
                                               f"to fit compute{held}")
    groups: dict[tuple, list[dict]] = {}
    for run in chosen:
        cfg = run["config"]
        run = {**run, "device": device_name(cfg, run["files"])}
        key = (_name(run), run["host"], run["device"], world(cfg), cfg.get("accumulate", 1), cfg.get("precision"),
               cfg.get("threads"))
        groups.setdefault(key, []).append(run)
    fitted = {k: g for k, g in groups.items() if len({per_rank_batch(r["config"]) for r in g}) >= 2}
    names = sorted({k[0] for k in fitted})
    if len(names) > 1:
        raise ConfigError("from", str(source), f"holds runs without sync of several models ({', '.join(names)}); "
                                               "choose one with --model and --dataset")
    if not fitted:
        single = ", ".join(sorted({f"{_name(r)} at per-rank batch {per_rank_batch(r['config']):g}" for r in chosen}))
        raise ConfigError("from", str(source), f"holds runs without sync at one per-rank batch per model only "
                                               f"({single}); the compute fit needs two or more ({NO_SYNC})")
    best = max(fitted.values(), key=lambda g: (len({per_rank_batch(r["config"]) for r in g}), len(g)))
    need = [keys.STEP_MEDIAN_MS, *(keys.stage_ms(s) for s in STAGES[:3])]
    return [with_summary(r, need) for r in best]


def _name(run: dict) -> str:
    return f"{run['config'].get('model')} on {run['config'].get('dataset')}"


def bench_run(runs: list[dict], host: str) -> dict | None:
    """The newest completed `bench comm` run of `host` with allreduce timings (None: none)."""
    benches = [r for r in runs if r["status"] == "completed" and r["kind"] == "bench" and r["host"] == host
               and "allreduce" in (r["config"].get("ops") or []) and r["files"].timings_file.exists()]
    return max(benches, key=lambda r: (r["created"], r["run_id"])) if benches else None


def model_config(config: dict) -> TrainConfig:
    """A one-rank CPU config that builds the run's model and data (MODEL_FIELDS; the rest is this machine's)."""
    return TrainConfig.from_dict({k: config[k] for k in MODEL_FIELDS if config.get(k) is not None})


# ---------------------------------------------------------------- calibration

def calibrate_from(runs: list[dict], *, source: Path, model: str | None = None, dataset: str | None = None,
                   links: bool | None = None) -> Calibration:
    """The calibration the stored `runs` (from `stored_runs(source)`) give. links: True needs a bench run of the
    compute's host (α and β for --hardware measured), None uses one when there is one, False ignores it."""
    compute = compute_group(runs, source=source, model=model, dataset=dataset)
    first, host, device = compute[0]["config"], compute[0]["host"], compute[0]["device"]
    bench = bench_run(runs, host) if links is not False else None
    if links and bench is None:
        raise ConfigError("hardware", MEASURED, f"needs a completed `bench comm` run with allreduce from host {host} "
                          f"in {source} to fit α and β; give a preset or --hardware-file")
    try:
        param_bytes, parameters = gradient_sizes(model_config(first))
    except ScalelabError:
        raise
    except Exception as err:  # a user model or a dataset path of the other machine
        raise ConfigError("model", first.get("model"), f"cannot be built here to size its gradients "
                          f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    points = compute_points(compute)
    fit = pm.fit_compute_model(points)
    alpha = beta = 0.0
    if bench is not None:
        sizes, means, ranks = bench_means(bench["files"])
        if len(set(sizes)) < 2:
            raise StoreError(f"{bench['files'].timings_file}: allreduce timed at {len(set(sizes))} size(s); "
                             "the α-β fit needs two or more")
        alpha, beta = fit_alpha_beta(sizes, means, ranks, op="allreduce")
    backend = (bench["config"].get("backend") if bench else None) or first.get("backend") or "auto"
    if backend == "auto":  # as TrainConfig.resolved_backend decided there
        backend = "gloo" if device.endswith("CPU") else "nccl"
    identity = [r["run_id"] for r in compute] + ([bench["run_id"]] if bench else [])
    return Calibration(
        model=first["model"], dataset=first["dataset"], ranks=int(bench["config"]["ranks"]) if bench else
        world(first), threads=first.get("threads"), backend=backend, accumulate=int(first.get("accumulate", 1)),
        compute={s: [fit_of(fit, s).c0, fit_of(fit, s).c1] for s in STAGES},
        points=json.loads(points.to_json(orient="records")), alpha_s=alpha, beta_s_per_byte=beta,
        param_bytes=param_bytes, parameters=parameters, compute_runs=list(points["run_id"]),
        bench_run=bench["run_id"] if bench else "", key=hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:12],
        device=device, host=host)


def largest_batch(cal: Calibration) -> int:
    """The largest per-rank batch the compute runs measured: the default batch of weak scaling from them."""
    return int(max(p["per_rank_batch"] for p in cal.points))


def validation_runs(runs: list[dict], cal: Calibration, strategy: str) -> tuple[list[dict], str | None]:
    """The stored runs of `strategy` on 2+ ranks of the calibrated model, dataset and host (with summaries), or
    ([], why) when there are none or nothing to predict them with (no bench: no links of that machine)."""
    if not cal.bench_run:
        return [], f"no `bench comm` run from host {cal.host} among the runs (the links the runs used)"

    def syncs(cfg: dict) -> str:
        return "ddp" if cfg.get("sync", "auto") == "auto" else cfg["sync"]

    chosen = [with_summary(r) for r in runs if r["status"] == "completed" and r["kind"] == "train"
              and r["host"] == cal.host and world(r["config"]) > 1 and not without_communication(r["config"])
              and syncs(r["config"]) == strategy
              and (r["config"].get("model"), r["config"].get("dataset")) == (cal.model, cal.dataset)]
    if not chosen:
        return [], f"no completed {strategy} run on 2+ ranks of {cal.model} from host {cal.host} among the runs"
    return chosen, None


def predict_from(cal: Calibration, runs: list[dict], *, hardware: Sequence[Hardware], workers: Sequence[int],
                 mode: str, batch: float, strategy: str, bucket_mb: float, compression: str, target: float,
                 validate: bool, out_dir: Path, say: Callable[[str], None] = print) -> Result:
    """The predict experiment's result from a calibration of `calibrate_from`, validated on the stored runs of
    `strategy` (`validation_runs`); the calibration is saved as OUT/calibration-from.json (never over the
    study's own calibration.json)."""
    path = cal.save(Path(out_dir) / "calibration-from.json")
    chosen, why = validation_runs(runs, cal, strategy) if validate else ([], None)
    validation = validate_measured(cal, chosen, say=say) if chosen else pd.DataFrame(columns=VALIDATION_COLUMNS)
    return prediction_result(cal, hardware, workers=workers, mode=mode, batch=batch, strategy=strategy,
                             bucket_mb=bucket_mb, compression=compression, target=target, validation=validation,
                             skipped=why, calibration=f"{path}, from {len(cal.compute_runs)} runs in {source_of(runs)}")


def source_of(runs: list[dict]) -> str:
    """The folder the runs were read from (their common parent)."""
    parents = {str(r["files"].path.parent) for r in runs}
    return parents.pop() if len(parents) == 1 else "several folders"
