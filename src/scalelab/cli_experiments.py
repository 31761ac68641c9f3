"""Experiment commands: each builds a base config, runs its grid (resumable) and prints its table.

    scalelab batch-sweep --model resnet18 --batches 32,64,128,256 --steps 20
    scalelab profile --model cnn --ranks 2
    scalelab loader-sweep --dataset synthetic_jpeg --workers 0,1,2,4
    scalelab amp --model cnn --dataset mnist1d
    scalelab checkpointing --model resnet18 --segments 0,2,4,8

Any config field can be set with --set FIELD=VALUE (repeatable) or a YAML --config file.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console

from scalelab.config import TrainConfig, load_yaml
from scalelab.errors import ConfigError

app = typer.Typer()
console = Console()

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML base config; flags override it.")
ModelOpt = typer.Option(None, help="Model (see `scalelab train --help`).")
DatasetOpt = typer.Option(None, help="Dataset (see `scalelab train --help`).")
StepsOpt = typer.Option(None, help="Steps per run.")
RanksOpt = typer.Option(None, "--ranks", "-n", help="Processes per run.")
SetOpt = typer.Option(None, "--set", help="FIELD=VALUE for any config field (repeatable).")
StudyOpt = typer.Option("default", help="Study name: runs of a study are resumed, finished cells skipped.")
OutOpt = typer.Option(None, "--out", help="Directory for tables and plots (default STORE/studies/STUDY).")
StoreOpt = typer.Option(None, "--store", help="Run store (env SCALELAB_STORE; default ./scalelab-runs).")


def say(line: str) -> None:
    """Progress lines are plain text: '[study 1/3]' must not be read as rich markup."""
    console.print(line, markup=False, highlight=False)


def parse_sets(sets: list[str] | None) -> dict:
    out = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "allowed: FIELD=VALUE, e.g. --set lr=0.1")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError, RecursionError):
            raise ConfigError("--set", item, "VALUE is not valid YAML; e.g. --set lr=0.1 or --set model=cnn") from None
    return out


def base_config(config: Path | None, sets: list[str] | None, defaults: dict | None = None, **flags) -> TrainConfig:
    """defaults < YAML file < --set FIELD=VALUE < named flags."""
    data = dict(defaults or {})
    data.update(load_yaml(config) if config else {})
    data.update(parse_sets(sets))
    data.update({k: v for k, v in flags.items() if v is not None})
    return TrainConfig.from_dict(data)


def int_list(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(field, text, "allowed: comma-separated integers, e.g. 32,64,128") from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(field, text, "allowed: comma-separated integers >= 0, e.g. 32,64,128")
    return values


def _store_and_out(store: Path | None, study: str, out: Path | None):
    from scalelab.store import open_store

    st = open_store(store)
    return st, out or st.root / "studies" / study


def show(result) -> None:
    """Each table in full (pandas does not squeeze columns to the terminal width), then notes and files."""
    for name, frame in result.tables.items():
        if name.endswith("_curves"):
            continue
        console.rule(name)
        print(frame.drop(columns=["run_id"], errors="ignore").to_string(index=False, float_format="{:,.4g}".format))
    for key, value in result.notes.items():
        console.print(f"{key}: {value}")
    console.print("wrote " + ", ".join(str(p) for p in result.files))


@app.command("batch-sweep")
def batch_sweep_cmd(batches: str = typer.Option("32,64,128,256", help="Global batch sizes."),
                    config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                    dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
                    ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
                    out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """Epoch time with and without data loading, throughput and peak memory per batch size."""
    from scalelab.experiments import basic

    base = base_config(config, set_, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(basic.batch_sweep(base, int_list(batches, "batches"), st, study, out_dir, say=say))


@app.command("profile")
def profile_cmd(config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
                ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
                out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """Where a step's time goes: stage table and pie chart."""
    from scalelab.experiments import basic

    base = base_config(config, set_, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(basic.profile(base, st, study, out_dir, say=say))


@app.command("amp")
def amp_cmd(config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
            dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
            ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
            out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """fp32 vs bf16 (vs fp16 + GradScaler on CUDA): loss curves, accuracy, memory, time."""
    from scalelab.experiments import basic

    base = base_config(config, set_, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(basic.precision(base, st, study, out_dir, say=say))


@app.command("checkpointing")
def checkpointing_cmd(segments: str = typer.Option("0,1,2,4", help="Checkpoint segments to try (0 = off)."),
                      config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                      dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
                      ranks: Optional[int] = RanksOpt, set_: Optional[list[str]] = SetOpt, study: str = StudyOpt,
                      out: Optional[Path] = OutOpt, store: Optional[Path] = StoreOpt) -> None:
    """Activation checkpointing: peak memory vs step time per number of segments."""
    from scalelab.experiments import basic

    base = base_config(config, set_, model=model, dataset=dataset, steps=steps, ranks=ranks)
    st, out_dir = _store_and_out(store, study, out)
    show(basic.checkpointing(base, int_list(segments, "segments"), st, study, out_dir, say=say))


@app.command("loader-sweep")
def loader_sweep_cmd(workers: Optional[str] = typer.Option(None, help="num_workers values (default 0..2×cores)."),
                     pin_memory: bool = typer.Option(False, "--pin-memory/--no-pin-memory",
                                                     help="Also try pinned memory (useful on CUDA)."),
                     prefetch: str = typer.Option("2", help="prefetch_factor values for workers > 0."),
                     config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                     dataset: Optional[str] = typer.Option("synthetic_jpeg", help="Dataset (per-sample CPU work)."),
                     steps: Optional[int] = StepsOpt, ranks: Optional[int] = RanksOpt,
                     set_: Optional[list[str]] = SetOpt, study: str = StudyOpt, out: Optional[Path] = OutOpt,
                     store: Optional[Path] = StoreOpt) -> None:
    """DataLoader num_workers / pin_memory / prefetch: epoch iteration time, data-wait share, a recommendation."""
    from scalelab.experiments import basic

    base = base_config(config, set_, model=model, dataset=dataset, steps=steps, ranks=ranks)
    cores = os.cpu_count() or 1
    counts = int_list(workers, "workers") if workers else sorted({0, 1, 2, *range(2, 2 * cores + 1, 2)})
    st, out_dir = _store_and_out(store, study, out)
    show(basic.loader_sweep(base, counts, st, study, out_dir, pin_memory=[False, True] if pin_memory else [False],
                            prefetch=int_list(prefetch, "prefetch"), say=say))


def parse_bytes(text: str | None, field: str) -> int | None:
    """'4GiB', '512M', '1.5G', '1000000' -> bytes (K/M/G are powers of 1024)."""
    if text is None:
        return None
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        value = float(num) * units[unit]
    except ValueError:
        raise ConfigError(field, text, "allowed: a size like 4GiB, 512MiB or a number of bytes") from None
    if not 1 <= value < float("inf"):  # also refuses nan and inf, which int() cannot convert
        raise ConfigError(field, text, "allowed: a size > 0, like 4GiB")
    return int(value)


@app.command("max-batch")
def max_batch_cmd(memory_limit: Optional[str] = typer.Option(None, help="CPU memory a trial may add, e.g. 4GiB "
                                                                        "(default: none on CPU; the GPU on CUDA)."),
                  segments: int = typer.Option(2, help="Checkpoint segments for the checkpointing variant."),
                  config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
                  dataset: Optional[str] = DatasetOpt, ranks: Optional[int] = RanksOpt,
                  set_: Optional[list[str]] = SetOpt, study: str = StudyOpt, out: Optional[Path] = OutOpt,
                  store: Optional[Path] = StoreOpt) -> None:
    """The largest batch that fits (each trial its own process), plain, with AMP and with checkpointing."""
    from scalelab.experiments.maxbatch import max_batch_table

    base = base_config(config, set_, model=model, dataset=dataset, ranks=ranks)
    limit = parse_bytes(memory_limit, "memory_limit")
    if limit is None and base.memory_limit is None and base.resolved_device == "cpu":
        raise ConfigError("memory_limit", None, "required on CPU (the search would otherwise fill the machine), "
                                                "e.g. --memory-limit 2GiB")
    st, out_dir = _store_and_out(store, study, out)
    show(max_batch_table(base, st, study, out_dir, memory_limit=limit, segments=segments, say=say))


@app.command("scale")
def scale_cmd(workers: str = typer.Option("1,2", help="Worker counts (ranks)."),
              batches: str = typer.Option("64,256", help="Global batches (strong) / per-worker batches (weak)."),
              mode: str = typer.Option("both", help="strong, weak or both."),
              config: Optional[Path] = ConfigOpt, model: Optional[str] = ModelOpt,
              dataset: Optional[str] = DatasetOpt, steps: Optional[int] = StepsOpt,
              set_: Optional[list[str]] = SetOpt, study: str = StudyOpt, out: Optional[Path] = OutOpt,
              store: Optional[Path] = StoreOpt) -> None:
    """Speedup and efficiency over worker counts (strong and weak), compute vs communication per cell."""
    from scalelab.experiments.scaling import scale

    if mode not in ("strong", "weak", "both"):
        raise ConfigError("mode", mode, "allowed: strong, weak, both")
    base = base_config(config, set_, model=model, dataset=dataset, steps=steps)
    st, out_dir = _store_and_out(store, study, out)
    modes = ("strong", "weak") if mode == "both" else (mode,)
    show(scale(base, int_list(workers, "workers"), int_list(batches, "batches"), st, study, out_dir, modes=modes,
               say=say))


@app.command("lr-scaling")
def lr_scaling_cmd(batches: str = typer.Option("32,256,1024", help="Global batches; the base config's batch is the "
                                                                   "one its lr is tuned for."),
                   rules: str = typer.Option("none,linear,sqrt,linear_warmup,lars", help="LR rules."),
                   workers: str = typer.Option("1", help="Worker counts."),
                   target: float = typer.Option(0.9, help="Target test accuracy for time-to-accuracy."),
                   config: Optional[Path] = ConfigOpt, model: Optional[str] = typer.Option("cnn", help="Model."),
                   dataset: Optional[str] = typer.Option("mnist1d", help="Dataset."),
                   epochs: Optional[int] = typer.Option(40, help="Epochs per cell."),
                   set_: Optional[list[str]] = SetOpt, study: str = StudyOpt, out: Optional[Path] = OutOpt,
                   store: Optional[Path] = StoreOpt) -> None:
    """Batch sizes x LR rules x workers on MNIST-1D: final accuracy, time to target accuracy, curves."""
    from scalelab.experiments.lrscaling import lr_scaling

    base = base_config(config, set_, {"global_batch": 32, "lr": 0.03}, model=model, dataset=dataset, epochs=epochs)
    if not 0 < target <= 1:
        raise ConfigError("target", target, "allowed: an accuracy in (0, 1]")
    st, out_dir = _store_and_out(store, study, out)
    show(lr_scaling(base, int_list(batches, "batches"), [r.strip() for r in rules.split(",") if r.strip()],
                    int_list(workers, "workers"), st, study, out_dir, target=target, say=say))
