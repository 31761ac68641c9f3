"""`scalelab study`: every experiment on one spec, resumable, then one report.

The spec is plain data (YAML-able): the experiments to run, a base config shared by all, and per-experiment
options, each of which may override base fields with `set:`. `default_spec()` is tuned for the machine at hand:
on a CPU-only box, small models, gloo, 1 and 2 ranks, minutes not hours; `quick` shrinks it further.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.config import TrainConfig, cuda_device_count, load_yaml
from scalelab.errors import ConfigError
from scalelab.store import Store, read_json, write_json_atomic

EXPERIMENTS = ("profile", "batch_sweep", "max_batch", "scale", "strategies", "backends", "comm", "loader", "amp",
               "checkpointing", "lr_scaling", "predict")


@dataclass(kw_only=True)
class StudySpec:
    name: str = "default"
    experiments: list[str] = field(default_factory=lambda: list(EXPERIMENTS))
    quick: bool = False
    base: dict = field(default_factory=dict)  # TrainConfig fields shared by every experiment
    options: dict = field(default_factory=dict)  # experiment name -> its options (+ "set": config overrides)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ConfigError("study.name", self.name, "allowed: a non-empty name without '/'")
        if not isinstance(self.experiments, (list, tuple)):
            raise ConfigError("study.experiments", self.experiments, f"allowed: a list of {', '.join(EXPERIMENTS)}")
        if not isinstance(self.quick, bool):
            raise ConfigError("study.quick", self.quick, "allowed: true or false")
        if not isinstance(self.base, dict):
            raise ConfigError("study.base", self.base, "allowed: a mapping of config field: value")
        if not isinstance(self.options, dict):
            raise ConfigError("study.options", self.options, "allowed: a mapping of experiment: options")
        for name in self.experiments:
            if name not in EXPERIMENTS:
                raise ConfigError("study.experiments", name, f"allowed: {', '.join(EXPERIMENTS)}")
        for name in self.options:
            if name not in EXPERIMENTS:
                raise ConfigError("study.options", name, f"allowed keys: {', '.join(EXPERIMENTS)}")
            opts = self.options[name]
            if not isinstance(opts, dict) or not isinstance(opts.get("set", {}), dict):
                raise ConfigError("study.options", {name: opts}, "allowed: each experiment's options a mapping of "
                                                                 "option: value, its `set:` a mapping of config fields")
        TrainConfig.from_dict(self.base)  # fail now on a bad base field, not after an hour of runs

    def config(self, experiment: str, **extra) -> TrainConfig:
        """The base config with the experiment's `set:` overrides and the caller's extra fields."""
        data = {**self.base, **self.options.get(experiment, {}).get("set", {}), **extra}
        return TrainConfig.from_dict(data)

    def option(self, experiment: str, key: str, default):
        return self.options.get(experiment, {}).get(key, default)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StudySpec":
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError("study", key, f"unknown key; allowed: {', '.join(sorted(known))}")
        return cls(**data)


def default_spec(quick: bool = False, name: str | None = None) -> StudySpec:
    """The built-in study for this machine. Compute-side experiments use the small CNN on synthetic images;
    communication-side ones the MLP, whose 25 MB of gradients make communication costs visible on loopback."""
    gpus = cuda_device_count()
    top = max(2, min(gpus, 8)) if gpus else 2
    workers = sorted({1, 2, top})
    q = quick
    base = {"model": "cnn", "dataset": "synthetic", "samples": 1024 if q else 2048, "eval_samples": 256,
            "global_batch": 64, "steps": 8 if q else 16, "warmup_steps": 2}
    comm_model = {"model": "mlp", "steps": 6 if q else 12}
    options = {
        "profile": {"set": {"ranks": 2}},
        "batch_sweep": {"batches": [16, 64, 256] if q else [16, 32, 64, 128, 256]},
        "max_batch": {"memory_limit": 96 * 2**20 if q else 256 * 2**20, "segments": 2,
                      "variants": ["base"] if q else ["base", "amp", "checkpointing"],
                      "set": {"model": "resnet18"}},
        "scale": {"workers": workers, "batches": [64] if q else [64, 256], "set": comm_model},
        "strategies": {"names": ["allreduce", "bucketed", "ddp", "noop"] if q else None,
                       "set": {**comm_model, "ranks": 2, "bucket_mb": 4.0}},
        "backends": {"set": {**comm_model, "ranks": 2, "bucket_mb": 4.0}},  # shares cells with strategies
        "comm": {"begin": "4K", "end": "4M" if q else "32M", "iters": 5 if q else 10, "ranks": 2},
        "loader": {"workers": [0, 2] if q else [0, 1, 2, 4], "set": {"dataset": "synthetic_jpeg", "augment": True,
                                                                     "steps": 8 if q else 20}},
        "amp": {"set": {"steps": 20 if q else 60, "eval_every": 10}},
        "checkpointing": {"segments": [0, 2, 4], "set": {"model": "resnet18", "global_batch": 32,
                                                          "steps": 3 if q else 5, "warmup_steps": 1}},
        "lr_scaling": {"batches": [32, 256] if q else [32, 256, 1024], "workers": [1], "target": 0.9,
                       "rules": ["none", "linear", "lars"] if q else ["none", "linear", "sqrt", "linear_warmup",
                                                                     "lars"],
                       "set": {"model": "cnn", "dataset": "mnist1d", "global_batch": 32, "lr": 0.03,
                               "epochs": 4 if q else 40, "steps": None, "samples": None, "eval_samples": None,
                               "warmup_steps": 1}},
        "predict": {"workers": [1, 2, 4, 8, 16, 64, 256, 1024, 4096], "hardware": ["measured", "10gbe", "ib_hdr",
                                                                                    "nvlink3"],
                    # 2 ranks calibrate in situ and validate on measured runs; the quick study keeps to one rank
                    "set": {**comm_model, "ranks": 1 if q else 2}},
    }
    return StudySpec(name=name or ("quick" if q else "default"), quick=q, base=base, options=options)


def load_spec(path: str | Path, *, quick: bool = False) -> StudySpec:
    """A YAML study file: keys of StudySpec; options merge over the defaults experiment by experiment."""
    data = load_yaml(path)
    spec = default_spec(quick=bool(data.get("quick", quick)))
    merged = spec.to_dict()
    for key, value in data.items():
        if key == "options":
            if not isinstance(value, dict):
                raise ConfigError("study.options", value, "allowed: a mapping of experiment: options")
            for exp, opts in value.items():
                if opts is not None and not isinstance(opts, dict):
                    raise ConfigError("study.options", {exp: opts},
                                      "allowed: each experiment's options a mapping of option: value")
                merged["options"].setdefault(exp, {}).update(opts or {})
        elif key == "base":
            if value is not None and not isinstance(value, dict):
                raise ConfigError("study.base", value, "allowed: a mapping of config field: value")
            merged["base"].update(value or {})
        else:
            merged[key] = value
    return StudySpec.from_dict(merged)


def spec_path(out_dir: Path) -> Path:
    return out_dir / "study.json"


def save_spec(spec: StudySpec, out_dir: Path, store: Store) -> None:
    write_json_atomic(spec_path(out_dir), {"spec": spec.to_dict(), "store": str(store.root.resolve())})


def read_spec(out_dir: Path) -> tuple[StudySpec, Path]:
    data = read_json(spec_path(out_dir))
    return StudySpec.from_dict(data["spec"]), Path(data["store"])


def run_experiments(spec: StudySpec, store: Store, out_dir: Path, say: Callable[[str], None] = print) -> dict:
    """Run (or, under grid.replay_only, read back) every experiment of the spec; name -> ExperimentResult."""
    from scalelab.experiments.runners import RUNNERS

    from scalelab.errors import ScalelabError
    from scalelab.experiments.basic import ExperimentResult
    from scalelab.run.execute import RunFailed

    results = {}
    for i, name in enumerate(spec.experiments, 1):
        say(f"== [{i}/{len(spec.experiments)}] {name}")
        began = time.monotonic()
        try:
            results[name] = RUNNERS[name](spec, store, out_dir / "tables", say)
            say(f"== {name} done in {time.monotonic() - began:.0f} s")
        except (RunFailed, ScalelabError, RuntimeError) as err:
            # One experiment failing must not lose the others: its section says why, the rest goes on.
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            say(f"== {name} failed: {reason}")
            results[name] = ExperimentResult(name, {}, notes={"failed": reason})
    return results


def cores() -> int:
    return os.cpu_count() or 1
