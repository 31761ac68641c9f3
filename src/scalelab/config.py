"""Typed run configuration, validated on construction.

Every bad value raises ConfigError naming the field, the value and what is allowed; the CLI turns that into
one line on stderr and exit code 2.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_type_hints

import yaml

from scalelab.engines import registry as engines
from scalelab.errors import ConfigError
from scalelab.sizes import parse_bytes
from scalelab.sync import registry as syncs
from scalelab.zoo.registry import models

Backend = Literal["auto", "gloo", "nccl", "mpi"]
Wrapper = Literal["auto", "single", "dp", "ddp"]
Precision = Literal["fp32", "bf16", "fp16"]
Device = Literal["auto", "cpu", "cuda"]
Optimizer = Literal["sgd", "adam", "adamw"]
NodesLauncher = Literal["namespaces", "slurm"]
DDPHook = Literal["none", "fp16", "bf16", "powersgd"]
LRRule = Literal["none", "linear", "sqrt", "linear_warmup", "lars"]


CUDA_LOADER_WORKERS = 2  # loader workers per rank on CUDA when unset (issue 42: a GPU user expects a few)

# Field names written by earlier versions -> today's name: stored configs keep loading (the only place they live).
LEGACY_KEYS = {"strategy": "wrapper"}


def doc(default: Any, help: str, *, flag: tuple[str, ...] | None = None, parse=None) -> Any:
    """A config field's default with its metadata, the single source the CLI is generated from.

    help   the text `--help` shows; flag: the CLI spelling when it is not --name-with-dashes (a boolean's
    "--on/--off" pair, a short alias); parse: (text, field name) -> value for fields given as text (sizes).
    """
    metadata = {"help": help, **({"flag": flag} if flag else {}), **({"parse": parse} if parse else {})}
    return field(default=default, metadata=metadata)


def cuda_device_count() -> int:
    """Number of visible CUDA devices (0 without CUDA). A function so tests can monkeypatch it."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclass(kw_only=True)
class TrainConfig:
    """One training run. Sizes are global unless the name says per-rank."""

    # the built-in names are listed by the CLI's help from the zoo registries (cli.options.registry_help)
    model: str = doc("cnn", "Model: a built-in one, or module:function / path/file.py:function.")
    model_options: str | None = doc(None, "Size options of a built-in model as NAME=NUMBER pairs, e.g. "
                                          "depth=8,width=2048 for mlp (its builder's size parameters); unset: "
                                          "the model's defaults.")
    dataset: str = doc("synthetic", "Dataset: a built-in one, or module:function / path/file.py:function.")
    data_path: str | None = doc(None, "Directory of an on-disk dataset.")
    samples: int | None = doc(None, "Training samples of a generated dataset (default: the dataset's).")
    eval_samples: int | None = doc(None, "Evaluation samples of a generated dataset (default: the dataset's).")
    augment: bool = doc(False, "Per-sample random crop + flip for image datasets that decode per sample.")

    global_batch: int = doc(64, "Samples per optimizer step summed over all ranks.", flag=("--global-batch", "-b"))
    epochs: int = doc(1, "Epochs to train.")
    steps: int | Literal["auto"] | None = doc(
        None, "Train exactly this many optimizer steps (epochs is then ignored); auto: after the warm-up, take timed "
              "steps until the median step's 95 % interval is within +-target_precision of the median, or "
              "time_budget_s of timed steps is spent, or the epochs run out (the run's summary says which).",
        parse=lambda text, name: parse_steps(text, name))
    optimizer: Optimizer = doc("sgd", "Optimizer.")
    lr: float = doc(0.05, "Learning rate (tuned at base_batch when an LR rule scales it).")
    momentum: float = doc(0.9, "SGD momentum, 0 <= momentum < 1.")
    weight_decay: float = doc(0.0, "Weight decay.")

    ranks: int = doc(1, "Processes per node.", flag=("--ranks", "-n"))
    nnodes: int = doc(1, "Nodes in the run (each node runs the same command).")
    node_rank: int = doc(0, "This node's rank, 0..nnodes-1.")
    rdzv_endpoint: str | None = doc(None, "host:port of node 0 for multi-node runs.")
    local_nodes: int = doc(0, "Make this many nodes out of network namespaces on this machine and run across them "
                              "with the multi-node rendezvous, ranks per node each (sets nnodes; needs root or "
                              "CAP_NET_ADMIN); 0 = off.")
    link_gbps: float | None = doc(None, "With local_nodes: each node's link shaped to this many Gbit/s in both "
                                        "directions by the kernel (tbf); unset: unshaped.")
    link_delay_ms: float | None = doc(None, "With local_nodes: one-way delay (ms) on each node's link (kernel netem; "
                                            "refused where the kernel has no netem).")
    nodes_launcher: NodesLauncher = doc(
        "namespaces", "Where the local_nodes nodes come from: namespaces (network namespaces of this machine) or "
                      "slurm (inside a Slurm allocation: each run a job step, srun, on the allocation's first "
                      "local_nodes nodes; the store on a shared filesystem).", flag=("--launcher",))
    backend: Backend = doc("auto", "Process-group backend; auto: nccl on CUDA, gloo on CPU.")
    wrapper: Wrapper = doc("auto", "Model wrapper: single, dp (DataParallel) or ddp (a process group); auto: ddp "
                                   "with several ranks or a sync strategy, else single.")
    device: Device = doc("auto", "Device; auto: cuda when a GPU is visible, else cpu.")
    sync_stages: bool = doc(False, "On CUDA, synchronise the device at every stage boundary (intrusive: the CPU can "
                                   "no longer run ahead); default: stages bounded by CUDA events, one wait per step.")

    sync: str = doc("auto", "Gradient sync across ranks: auto (= ddp) or a strategy of scalelab.sync.registry; "
                            "any value but auto makes the run distributed, even with one rank.")
    bucket_mb: float = doc(25.0, "MiB per gradient bucket: DDP's bucket_cap_mb and the bucketed strategy's size.",
                           flag=("--bucket-mb",))
    accumulate: int = doc(1, "Micro-steps per optimizer step (gradient accumulation); sync once per optimizer step.")
    ddp_hook: DDPHook = doc("none", "DDP comm hook: none (plain allreduce), fp16 / bf16 compression, powersgd.")
    powersgd_rank: int = doc(1, "PowerSGD matrix approximation rank.")
    net_latency_ms: float = doc(0.0, "Emulated latency (ms) added to every collective, on the caller's side (with "
                                     "the horovod engine: once per step, after synchronize()).",
                                flag=("--net-latency-ms",))
    net_bandwidth_gbps: float | None = doc(None, "Emulated bandwidth cap (Gbit/s) for every collective.")
    noop_collectives: bool = doc(False, "Keep the sync strategy's work but skip its collectives: the baseline for "
                                        "exposed communication.", flag=("--noop-collectives/--real-collectives",))
    engine: str = doc("ddp", "Training engine of scalelab.engines.registry: what starts, connects and syncs the "
                             "ranks (ddp: torchrun and the sync strategy; horovod needs `scalelab setup horovod`); "
                             "any engine but ddp makes the run distributed, even with one rank.")
    hvd_fusion_threshold: int | None = doc(None, "Horovod engine: fusion buffer size, e.g. 64MiB (0 = no fusion; "
                                                 "unset: Horovod's 128 MiB).", parse=parse_bytes)
    hvd_cycle_time_ms: float | None = doc(None, "Horovod engine: ms between fusion cycles (unset: Horovod's 1 ms).")
    hvd_fp16: bool = doc(False, "Horovod engine: fp16 compression of the gradient allreduce.",
                         flag=("--hvd-fp16/--no-hvd-fp16",))

    precision: Precision = doc("fp32", "Precision; fp16 (with GradScaler) needs CUDA.")
    checkpoint_segments: int = doc(0, "Activation checkpointing: the model's blocks in this many contiguous segments, "
                                      "each recomputed in backward (0 = off).")
    num_workers: int | None = doc(None, f"DataLoader worker processes per rank; unset: {CUDA_LOADER_WORKERS} on CUDA "
                                        "(the loader's host work then overlaps the GPU's), 0 on the CPU.")
    pin_memory: bool | None = doc(None, "Pinned host memory for the loader; unset: on with CUDA (asynchronous "
                                        "host-to-device copies), off on the CPU.",
                                  flag=("--pin-memory/--no-pin-memory",))
    prefetch_factor: int | None = doc(None, "Batches prefetched per loader worker (needs num_workers > 0).")
    drop_last: bool = doc(False, "Drop an incomplete last batch.", flag=("--drop-last/--keep-last",))

    lr_rule: LRRule = doc("none", "Large-batch rule: lr is tuned at base_batch and scaled to global_batch.")
    base_batch: int | None = doc(None, "The global batch lr was tuned for (default: global_batch, i.e. no scaling).")
    lr_warmup_steps: int = doc(0, "Linear warm-up steps from lr to the scaled lr (linear_warmup and lars).")
    memory_limit: int | None = doc(None, "Bytes a rank may add to its set-up footprint, e.g. 4GiB (CPU: an "
                                         "address-space cap; CUDA: a cap on torch's caching allocator).",
                                   parse=parse_bytes)

    seed: int = doc(0, "Random seed.")
    warmup_steps: int = doc(2, "First steps excluded from every timing.")
    target_precision: float = doc(0.03, "With steps auto: stop once the median step's 95 % interval is within "
                                        "+- this fraction of the median (0.03 = +-3 %).")
    time_budget_s: float = doc(30.0, "With steps auto: the most wall time (s) spent on timed steps (warm-up, "
                                     "evaluation and set-up not counted).", flag=("--time-budget",))
    min_timed_steps: int = doc(6, "With steps auto: at least this many timed steps before the precision may stop "
                                  "the run (6: the fewest whose full range is a 95 % interval of the median).")
    eval_every: int = doc(0, "Evaluate every N steps; 0 = at the end of each epoch.")
    threads: int | None = doc(None, "Torch intra-op threads per rank (default: cores / local ranks).")
    sample_interval_s: float = doc(0.5, "System sampler period in seconds.", flag=("--sample-interval",))
    run_id: str | None = doc(None, "Fixed run id (the nodes of one multi-node run share it).")
    hang_timeout_s: float = doc(300.0, "Fail the run, naming the stuck rank, when no rank makes progress for this "
                                       "many seconds (0 = no watchdog).", flag=("--hang-timeout",))
    checkpoint_every: int = doc(0, "Write a resumable checkpoint every N optimizer steps (0 = never).",
                                flag=("--checkpoint-every",))
    auto_note: str | None = doc(None, "Written by scalelab when it resolves a run (leave it unset): the unset fields "
                                      "it chose for the device, with the reason (loader workers and pinned memory "
                                      "on CUDA).")

    def __post_init__(self) -> None:
        _check_types(self)
        _positive(self, "global_batch", "epochs", "ranks", "nnodes", "accumulate", "powersgd_rank",
                  "min_timed_steps")
        if isinstance(self.steps, int) and self.steps < 1:
            raise ConfigError("steps", self.steps, "allowed: an integer >= 1, auto, or leave unset")
        if not 0 < self.target_precision < 1:
            raise ConfigError("target_precision", self.target_precision,
                              "allowed: a fraction of the median, 0 < target_precision < 1 (0.03 = +-3 %)")
        if self.time_budget_s <= 0:
            raise ConfigError("time_budget_s", self.time_budget_s, "allowed: seconds > 0")
        if self.lr <= 0:
            raise ConfigError("lr", self.lr, "allowed: a number > 0")
        if not 0 <= self.momentum < 1:
            raise ConfigError("momentum", self.momentum, "allowed: 0 <= momentum < 1")
        for name in ("weight_decay", "warmup_steps", "eval_every", "num_workers", "checkpoint_segments", "seed",
                     "lr_warmup_steps", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 0:  # only num_workers may be None (unset: the device's default)
                raise ConfigError(name, value, "allowed: an integer >= 0" + (" (or leave unset)" * (name == "num_workers")))
        for name in ("samples", "eval_samples", "prefetch_factor", "threads", "base_batch", "memory_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, value, "allowed: an integer >= 1 (or leave unset)")
        if self.lr_rule == "lars" and self.optimizer != "sgd":
            raise ConfigError("lr_rule", "lars", f"LARS replaces SGD; use optimizer sgd (got {self.optimizer})")
        if self.prefetch_factor is not None and self.resolved_num_workers == 0:
            raise ConfigError("prefetch_factor", self.prefetch_factor, "allowed only with num_workers > 0 (unset: 0 "
                                                                       "on the CPU)")
        if not self.hang_timeout_s >= 0:  # also refuses NaN
            raise ConfigError("hang_timeout_s", self.hang_timeout_s, "allowed: seconds >= 0 (0 turns the watchdog off)")
        if self.sample_interval_s <= 0:
            raise ConfigError("sample_interval_s", self.sample_interval_s, "allowed: a number > 0")
        check_local_nodes(self)
        self.nnodes = local_nnodes(self)
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError("node_rank", self.node_rank, f"allowed: 0..{self.nnodes - 1} (nnodes={self.nnodes})")
        if self.nnodes > 1 and not self.rdzv_endpoint and not self.local_nodes:
            raise ConfigError("rdzv_endpoint", self.rdzv_endpoint, "required with nnodes > 1: host:port of node 0")
        if self.rdzv_endpoint is not None:
            _check_endpoint(self.rdzv_endpoint)
        if self.global_batch % self.world_size:
            raise ConfigError(
                "global_batch", self.global_batch,
                f"must be divisible by the number of ranks ({self.world_size}); e.g. "
                f"{max(self.world_size, self.global_batch // self.world_size * self.world_size)}",
            )
        unit = self.world_size * self.accumulate
        if self.global_batch % unit:
            raise ConfigError("global_batch", self.global_batch, f"must be divisible by ranks x accumulate ({unit}); "
                              f"e.g. {max(unit, self.global_batch // unit * unit)}")
        self._check_model_options()
        self._check_sync()
        self._check_hardware()
        self._check_engine()

    def _check_model_options(self) -> None:
        if self.model_options is None:
            return
        options = parse_model_options(self.model_options)
        self.model_options = format_model_options(options)  # one spelling per size: equal sizes are one cell
        if ":" in self.model:
            raise ConfigError("model_options", self.model_options, "user models take no options; leave it unset")

        if self.model in models.names():  # an unknown model is refused where it is built, naming the models
            allowed = models.get(self.model).options
            for name in options:
                if name not in allowed:
                    raise ConfigError("model_options", name, f"{self.model} accepts: {', '.join(allowed)}")

    @property
    def model_overrides(self) -> dict[str, int | float]:
        """The model's size options as keyword arguments of its builder ({} when unset)."""
        return parse_model_options(self.model_options) if self.model_options is not None else {}

    def _check_sync(self) -> None:
        allowed = ("auto", *syncs.names())
        if self.sync not in allowed:
            raise ConfigError("sync", self.sync, f"allowed: {', '.join(allowed)}")
        if self.bucket_mb <= 0:
            raise ConfigError("bucket_mb", self.bucket_mb, "allowed: a number of MiB > 0")
        if self.net_latency_ms < 0:
            raise ConfigError("net_latency_ms", self.net_latency_ms, "allowed: a number of ms >= 0")
        if self.net_bandwidth_gbps is not None and self.net_bandwidth_gbps <= 0:
            raise ConfigError("net_bandwidth_gbps", self.net_bandwidth_gbps, "allowed: Gbit/s > 0 (or leave unset)")
        if self.sync != "auto" and self.wrapper in ("single", "dp"):
            raise ConfigError("sync", self.sync, f"allowed with wrapper {self.wrapper}: auto only (no process group)")
        if self.ddp_hook != "none" and self.resolved_sync != "ddp":
            raise ConfigError("ddp_hook", self.ddp_hook, f"allowed only with sync ddp (sync is {self.sync}); or none")
        emulated = self.net_latency_ms > 0 or self.net_bandwidth_gbps is not None
        if emulated and not self.distributed:
            raise ConfigError("net_latency_ms" if self.net_latency_ms > 0 else "net_bandwidth_gbps",
                              self.net_latency_ms if self.net_latency_ms > 0 else self.net_bandwidth_gbps,
                              "allowed only with a process group (ranks > 1 or a sync strategy other than auto)")
        if emulated and self.resolved_backend == "nccl":
            # NCCL returns at launch: a delay on the caller's side pads the launch, not the collective on the GPU
            raise ConfigError("net_latency_ms" if self.net_latency_ms > 0 else "net_bandwidth_gbps",
                              self.net_latency_ms if self.net_latency_ms > 0 else self.net_bandwidth_gbps,
                              "allowed only with the gloo backend (NCCL returns at launch, so a caller-side delay "
                              "would not pad its collectives); or shape a real link with --local-nodes")
        if self.noop_collectives and not self.distributed:
            raise ConfigError("noop_collectives", True,
                              "allowed only with a process group (ranks > 1 or a sync strategy other than auto)")

    def _check_engine(self) -> None:
        engine = engines.get(self.engine, "engine")
        if self.hvd_fusion_threshold is not None and self.hvd_fusion_threshold < 0:
            raise ConfigError("hvd_fusion_threshold", self.hvd_fusion_threshold, "allowed: bytes >= 0 (0 = no fusion)")
        if self.hvd_cycle_time_ms is not None and self.hvd_cycle_time_ms <= 0:
            raise ConfigError("hvd_cycle_time_ms", self.hvd_cycle_time_ms, "allowed: ms > 0 (or leave unset)")
        for other in engines.entries():
            for name in other.options:
                value = getattr(self, name)
                if other is not engine and value not in (None, False):
                    raise ConfigError(name, value, f"allowed only with engine {other.name} (engine is {self.engine})")
        engine.check(self)

    def _check_hardware(self) -> None:
        gpus = cuda_device_count()
        if self.device == "cuda" and gpus == 0:
            raise ConfigError("device", "cuda", "no CUDA device is visible; allowed here: cpu or auto")
        on_cuda = self.resolved_device == "cuda"
        if self.backend == "nccl" and not on_cuda:
            raise ConfigError("backend", "nccl", "nccl needs CUDA; allowed here: gloo or auto")
        if self.precision == "fp16" and not on_cuda:
            raise ConfigError("precision", "fp16", "fp16 with GradScaler needs CUDA; allowed here: fp32 or bf16")
        wrapper = self.resolved_wrapper
        if wrapper == "dp" and gpus < 2:
            raise ConfigError("wrapper", "dp", f"DataParallel needs at least 2 GPUs (found {gpus}); use ddp")
        if wrapper in ("single", "dp") and self.world_size > 1:
            raise ConfigError("wrapper", wrapper, f"runs one process; with {self.world_size} ranks use ddp")
        if on_cuda and self.ranks > gpus and wrapper == "ddp":
            raise ConfigError("ranks", self.ranks, f"at most {gpus} per node on CUDA (one GPU per rank)")

    @property
    def auto_length(self) -> bool:
        """The run's timed length is chosen by precision and budget (steps: auto), not fixed."""
        return self.steps == "auto"

    @property
    def world_size(self) -> int:
        return self.ranks * self.nnodes

    @property
    def per_rank_batch(self) -> int:
        return self.global_batch // self.world_size

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if cuda_device_count() > 0 else "cpu"

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.resolved_device == "cuda" else "gloo"

    @property
    def resolved_wrapper(self) -> str:
        if self.wrapper != "auto":
            return self.wrapper
        return "ddp" if self.world_size > 1 or self.sync != "auto" or self.engine != "ddp" else "single"

    @property
    def distributed(self) -> bool:
        """True when the run needs a process group (and therefore torchrun): several ranks, or a sync strategy."""
        return self.resolved_wrapper == "ddp"

    @property
    def resolved_sync(self) -> str:
        """The gradient-sync strategy that runs: auto is ddp; "none" without a process group."""
        if not self.distributed:
            return "none"
        if self.engine != "ddp":  # the engine's own sync (hvd.DistributedOptimizer)
            return self.engine
        return "ddp" if self.sync == "auto" else self.sync

    @property
    def resolved_num_workers(self) -> int:
        """Loader workers per rank: as set, else CUDA_LOADER_WORKERS on CUDA and 0 on the CPU."""
        if self.num_workers is not None:
            return self.num_workers
        return CUDA_LOADER_WORKERS if self.resolved_device == "cuda" else 0

    @property
    def resolved_pin_memory(self) -> bool:
        """Pinned loader memory: as set, else on with CUDA and off on the CPU."""
        if self.pin_memory is not None:
            return self.pin_memory
        return self.resolved_device == "cuda"

    def resolved(self) -> "TrainConfig":
        """The same config with "auto" and unset defaults replaced by what runs on this machine (device, backend,
        wrapper, sync, loader workers, pinned memory); `auto_note` says which device defaults were chosen and why
        (none on the CPU, whose defaults are the fields' old fixed ones)."""
        sync = self.resolved_sync if self.distributed and self.engine == "ddp" else "auto"
        notes = [self.auto_note] if self.auto_note else []
        if self.resolved_device == "cuda":
            if self.num_workers is None:
                notes.append(f"num_workers={self.resolved_num_workers}: unset, the CUDA default (the loader's host "
                             "work overlaps the GPU's instead of leaving it idle)")
            if self.pin_memory is None:
                notes.append("pin_memory=True: unset, the CUDA default (host-to-device copies from pinned memory "
                             "run asynchronously)")
        return dataclasses.replace(self, device=self.resolved_device, backend=self.resolved_backend,
                                   wrapper=self.resolved_wrapper, sync=sync, num_workers=self.resolved_num_workers,
                                   pin_memory=self.resolved_pin_memory, auto_note="; ".join(notes) or None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "a mapping of field: value is required")
        known = {f.name for f in fields(cls)}
        data = {LEGACY_KEYS.get(k, k) if LEGACY_KEYS.get(k) not in data else k: v for k, v in data.items()}
        for key in data:
            if key not in known:
                raise ConfigError("config", key, f"unknown field; allowed: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> "TrainConfig":
        data = load_yaml(path)
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_dict(data)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping safely (no object construction)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config", str(path), "file not found; give the path of a YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise ConfigError("config", str(path), f"cannot be read ({err.strerror or type(err).__name__})") from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:  # ValueError: bad UTF-8, !!int/!!float/dates
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) if isinstance(err, yaml.YAMLError) else str(err)
        detail = f": {' '.join(str(problem).split())[:200]}" if problem else ""
        raise ConfigError("config", str(path), f"is not valid YAML{where}{detail}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", str(path), "must hold a mapping of field: value")
    return data


def parse_steps(text: Any, field: str = "steps") -> int | str:
    """The steps flag's text: "auto" or an integer (a YAML file or --set gives the value already typed)."""
    if not isinstance(text, str) or text == "auto":
        return text
    try:
        return int(text.strip())
    except ValueError:
        raise ConfigError(field, text, "allowed: an integer >= 1, auto, or leave unset") from None


def parse_model_options(text: str, field: str = "model_options") -> dict[str, int | float]:
    """'depth=8, width=2048' -> {"depth": 8, "width": 2048}: names are identifiers, values finite numbers >= 0."""
    allowed = "allowed: NAME=NUMBER pairs separated by commas, numbers >= 0, e.g. depth=8,width=2048"
    options: dict[str, int | float] = {}
    for item in str(text).split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name.isidentifier() or name in options:
            raise ConfigError(field, text, allowed)
        try:
            number = int(value) if value.lstrip("+").isdigit() and value.isascii() else float(value)
        except ValueError:
            raise ConfigError(field, text, allowed) from None
        if not (math.isfinite(number) and 0 <= number < 2**63):
            raise ConfigError(field, text, allowed)
        options[name] = int(number) if number == int(number) else number  # 8.0 is the size 8
    return options


def format_model_options(options: dict[str, int | float]) -> str:
    """{"width": 2048, "depth": 8} -> "depth=8,width=2048" (sorted by name: the one stored spelling)."""
    return ",".join(f"{name}={options[name]!r}" for name in sorted(options))


def _check_types(cfg: TrainConfig) -> None:
    hints = get_type_hints(type(cfg))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        allowed = _allowed(hints[f.name])
        if not any(_is_instance(value, a) for a in allowed):
            names = ", ".join(repr(a) if not isinstance(a, type) else a.__name__ for a in allowed)
            raise ConfigError(f.name, value, f"allowed: {names}")
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every `<` check below
            raise ConfigError(f.name, value, "allowed: a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise ConfigError(f.name, value, "allowed: an integer that fits in 64 bits (|value| < 2**63)")


def _allowed(hint: Any) -> list[Any]:
    """Flatten a type hint into the concrete types and literal values it admits."""
    args = get_args(hint)
    if not args:
        return [hint]
    if getattr(hint, "__origin__", None) is Literal:
        return list(args)
    out: list[Any] = []
    for a in args:
        out.extend(_allowed(a))
    return out


def _is_instance(value: Any, allowed: Any) -> bool:
    if allowed is type(None):
        return value is None
    if isinstance(allowed, type):
        if allowed is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if allowed is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, allowed)
    return value == allowed and type(value) is type(allowed)


def _positive(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        if hasattr(cfg, name) and getattr(cfg, name) < 1:
            raise ConfigError(name, getattr(cfg, name), "allowed: an integer >= 1")


def _check_endpoint(endpoint: str) -> None:
    host, _, port = endpoint.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError("rdzv_endpoint", endpoint, "allowed: host:port with port 1..65535")


def check_local_nodes(cfg: Any) -> None:
    """The fields of a cluster of network namespaces (`local_nodes`, `link_gbps`, `link_delay_ms`), shared by every
    config that launches ranks."""
    if cfg.local_nodes < 0:
        raise ConfigError("local_nodes", cfg.local_nodes, "allowed: an integer >= 0 (0 = off)")
    for name in ("link_gbps", "link_delay_ms"):
        value = getattr(cfg, name)
        if value is None:
            continue
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and value > 0):
            raise ConfigError(name, value, "allowed: a number > 0 (or leave unset)")
        if not cfg.local_nodes:
            raise ConfigError(name, value, "allowed only with local_nodes >= 1 (a link of namespaced nodes)")
        if getattr(cfg, "nodes_launcher", "namespaces") == "slurm":
            raise ConfigError(name, value, "allowed only with nodes_launcher namespaces: scalelab cannot shape the "
                                           "links of a Slurm cluster's nodes")


def local_nnodes(cfg: Any) -> int:
    """The node count of a config: local_nodes N is a run of nnodes N whose node ranks and endpoint scalelab
    chooses (a stored run then counts its workers, ranks x nnodes, like any multi-node run); without local nodes,
    nnodes as given."""
    if not cfg.local_nodes:
        return cfg.nnodes
    if cfg.nnodes not in (1, cfg.local_nodes):
        raise ConfigError("nnodes", cfg.nnodes, f"set by local_nodes ({cfg.local_nodes}); leave it 1")
    if cfg.node_rank != 0:
        raise ConfigError("node_rank", cfg.node_rank, "chosen by local_nodes for each node; leave it 0")
    if cfg.rdzv_endpoint is not None:
        raise ConfigError("rdzv_endpoint", cfg.rdzv_endpoint,
                          "chosen by local_nodes (node 0's private address); leave it unset")
    return cfg.local_nodes


def namespace_nodes(cfg: Any) -> int:
    """The config's nodes that are namespaces of this machine (they share its cores): local_nodes, or 0 when the
    nodes are a Slurm allocation's machines."""
    return 0 if getattr(cfg, "nodes_launcher", "namespaces") == "slurm" else cfg.local_nodes


def default_threads(local_ranks: int, local_nodes: int = 0) -> int:
    """Intra-op threads per rank so that the ranks on this machine do not oversubscribe its cores: a node's ranks,
    times the nodes when they are namespaces of this machine (local_nodes; a rank there sees only its own node's
    ranks as local)."""
    return max(1, (os.cpu_count() or 1) // (max(1, local_ranks) * max(1, local_nodes)))
