"""The kinds of run (`RunKind`): what differs between a training run and a benchmark run, behind one interface.

run/execute.py takes every run through the same steps (record → launch → summarise → export → finish) and asks
the kind for its parts: how to check and resolve its config, how its ranks are started, how its stored files
are summarised, what it exports. Adding a kind is one class here; the steps do not change.
"""
from __future__ import annotations

import dataclasses
import traceback
from pathlib import Path
from typing import Any, Protocol

from scalelab.analysis import keys
from scalelab.analysis.hvdcomm import horovod_comm
from scalelab.analysis.summary import add_rate_intervals, loopback_bytes_per_step, summarize
from scalelab.config import TrainConfig, default_threads
from scalelab.engines import registry as engines
from scalelab.errors import ConfigError, StoreError
from scalelab.measure import commbench
from scalelab.measure.commbench import CommBenchConfig
from scalelab.measure.memory import freeze_alive, release_cuda_cache
from scalelab.run.exports import plot_busbw, write_scalars, write_trace
from scalelab.run import warm
from scalelab.run.hvdnode import horovod_launch
from scalelab.run.launch import LOOPBACK_ENV, Launcher, LaunchSpec, torchrun_args, torchrun_launch, train_launch_spec

# the engines' launchers by the name their EngineEntry gives
LAUNCHERS: dict[str, Launcher] = {"torchrun": torchrun_launch, "horovodrun": horovod_launch}
from scalelab.distenv import DistContext
from scalelab.store.rundir import RunDir
from scalelab.train.setup import build_inputs


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A finished run's summary and the status it ends with (a benchmark with wrong results is "failed")."""

    summary: dict
    status: str = "completed"
    reason: str | None = None


class RunKind(Protocol):
    name: str  # the catalog's kind column

    def prepare(self, cfg: Any) -> Any:
        """Check what can be checked before a run is recorded; return the config as it will run."""

    def seed(self, cfg: Any) -> int | None:
        """The seed recorded in the provenance."""

    def joins(self, cfg: Any) -> bool:
        """Whether this process joins a run directory another node created (multi-node on a shared filesystem)."""

    def owns_shared(self, cfg: Any) -> bool:
        """Whether this process is node 0 of a multi-node run on a shared filesystem: it adopts the run directory
        when another node happened to create it first."""

    def describe(self, run_id: str, cfg: Any) -> str:
        """The line said when the run starts."""

    def launch_spec(self, cfg: Any, run_dir: Path, *, isolate: bool, resume: bool) -> LaunchSpec | None:
        """How the ranks are started; None: one rank in this process (`run_here`)."""

    def run_here(self, cfg: Any, run_dir: Path, *, resume: bool) -> None:
        """Run the single rank in this process."""

    def launcher(self, cfg: Any, given: Launcher) -> Launcher:
        """The launcher that starts the ranks: the engine's, unless the caller gave its own (not torchrun)."""

    def watched(self, cfg: Any) -> tuple[list[int], float]:
        """The ranks of this node the hang watchdog watches, and its timeout (0: no watchdog)."""

    def summarise(self, cfg: Any, run_dir: Path) -> Verdict:
        """The run's summary from its stored files alone."""

    def export(self, cfg: Any, run_dir: Path) -> None:
        """Files derived from a finished run (trace, TensorBoard, plots)."""

    def on_failure(self, run_dir: Path) -> None:
        """Best-effort exports of a failed run; must not raise."""


# ---------------------------------------------------------------- train

_CHECKED: set[tuple] = set()  # inputs of built-in models and datasets this process built once already


def _inputs_key(cfg: TrainConfig) -> tuple | None:
    """What `check_inputs` builds from; None for a user's model or dataset (its file may change between runs)."""
    if ":" in cfg.model or ":" in cfg.dataset:
        return None
    return (cfg.model, cfg.model_options, cfg.dataset, cfg.data_path, cfg.samples, cfg.eval_samples, cfg.seed,
            cfg.augment, cfg.checkpoint_segments, cfg.global_batch, cfg.drop_last)


def check_inputs(cfg: TrainConfig) -> None:
    """Build the data and the model once here, so a bad dataset or model fails before any run is recorded. A study
    checks the same built-in inputs for many cells: each is built once per process."""
    key = _inputs_key(cfg)
    if key is not None and key in _CHECKED:
        return
    _check_inputs(cfg)
    if key is not None:
        _CHECKED.add(key)


def _check_inputs(cfg: TrainConfig) -> None:
    try:
        bundle, _ = build_inputs(cfg)
    except (MemoryError, RuntimeError) as err:  # torch reports a failed allocation as RuntimeError
        if not isinstance(err, MemoryError) and "allocate" not in str(err):
            raise
        raise ConfigError("samples", cfg.samples, "the dataset does not fit in this machine's memory; "
                          "allowed: fewer samples") from None
    n = len(bundle.train)
    if cfg.drop_last and n < cfg.global_batch:  # no full batch: an epoch of zero steps
        raise ConfigError("global_batch", cfg.global_batch, f"more than the {n} training samples of "
                          f"{cfg.dataset} with drop_last; allowed: at most {n}, or keep the last batch")


def collect_summary(run_dir: Path) -> dict:
    """Summarise a training run from its stored per-rank files alone."""
    rundir = RunDir(run_dir)
    results = rundir.read_results()
    if not results:
        raise StoreError(f"run {rundir.run_id}: no rank wrote a result file")
    records = rundir.read_steps()
    main = min(results, key=lambda r: r["rank"])
    config = rundir.read_config() if rundir.config_file.exists() else {}
    one_clock = config.get("nnodes", 1) == 1 or _one_machine(config, rundir)
    summary = summarize(records, steps_per_epoch=main["steps_per_epoch"], evals=main["evals"],
                        memory=[r["memory"] for r in results], system=rundir.read_system(),
                        target_precision=main.get("length", {}).get("target_precision"), one_clock=one_clock)
    if config.get("engine") == "horovod" and summary.get(keys.COMM_BYTES_PER_STEP):
        # Horovod's collective intervals come from its own timeline (rank 0), not from the meter's enqueue ->
        # synchronize() records, which span backward (analysis/hvdcomm.py); its baseline hands Horovod no bytes
        summary.update(horovod_comm(rundir.read_horovod_timeline(), records,
                                    latency_ms=config.get("net_latency_ms") or 0.0, one_clock=one_clock))
        add_rate_intervals(summary)
    summary[keys.RANKS_REPORTED] = len(results)
    if "threads" in main:
        summary[keys.THREADS_USED] = main["threads"]
    if keys.COMM_BYTES_PER_STEP in summary and rundir.system_file(0).exists():
        # beside the metered bytes: what the host's loopback carried (gloo on one node runs over it)
        loopback = loopback_bytes_per_step(rundir.read_system(0), records)
        if loopback is not None:
            summary[keys.COMM_LOOPBACK_BYTES_PER_STEP] = loopback
    return summary


class TrainKind:
    name = "train"

    def prepare(self, cfg: TrainConfig) -> TrainConfig:
        missing = engines.get(cfg.engine).unavailable()
        if missing:  # refused before anything is recorded
            raise ConfigError("engine", cfg.engine, missing)
        check_inputs(cfg)
        # Store what actually runs: "auto" resolved to this machine's device, backend and strategy.
        return cfg.resolved()

    def seed(self, cfg: TrainConfig) -> int | None:
        return cfg.seed

    def joins(self, cfg: TrainConfig) -> bool:
        return cfg.node_rank > 0 and bool(cfg.run_id)

    def owns_shared(self, cfg: TrainConfig) -> bool:
        # --local-nodes makes one run directory in one process: nothing to adopt there
        return cfg.nnodes > 1 and cfg.node_rank == 0 and bool(cfg.run_id) and not cfg.local_nodes

    def describe(self, run_id: str, cfg: TrainConfig) -> str:
        return (f"run {run_id}: {cfg.model} on {cfg.dataset}, {cfg.world_size} rank(s){_on_nodes(cfg)}, global batch "
                f"{cfg.global_batch}, {cfg.resolved_wrapper}/{cfg.resolved_backend if cfg.distributed else '-'}, "
                f"{cfg.precision}{'' if cfg.engine == 'ddp' else f', engine {cfg.engine}'}")

    def launch_spec(self, cfg: TrainConfig, run_dir: Path, *, isolate: bool, resume: bool) -> LaunchSpec | None:
        # One rank without a process group runs in this process, unless it must be isolated (a CPU memory cap:
        # RLIMIT_AS cannot be raised again; a cell whose out-of-memory must not touch the caller): then torchrun
        # starts it as one rank. A CUDA memory cap is the caching allocator's fraction, undone after the run.
        cpu_cap = bool(cfg.memory_limit) and cfg.resolved_device == "cpu"
        if not (cfg.distributed or cpu_cap or isolate or cfg.local_nodes):
            return None
        return train_launch_spec(cfg, run_dir, quiet=isolate, resume=resume)

    def run_here(self, cfg: TrainConfig, run_dir: Path, *, resume: bool) -> None:
        import torch

        from scalelab.run.worker import run_rank

        device = torch.device("cuda", 0) if cfg.resolved_device == "cuda" else torch.device("cpu")
        freeze_alive()  # what this process made before (imports, earlier runs, the study) is not this run's to scan
        try:
            run_rank(cfg, run_dir, DistContext(0, 1, 0, 1, device), resume=resume)
        except BaseException as err:
            if device.type == "cuda":  # a failed step's tensors live on in its frames' locals: drop them
                traceback.clear_frames(err.__traceback__)
            raise
        finally:
            if device.type == "cuda":  # the next run here starts from an empty cache, as a fresh process would
                release_cuda_cache()

    def launcher(self, cfg: TrainConfig, given: Launcher) -> Launcher:
        chosen = LAUNCHERS[engines.get(cfg.engine).launcher] if given is torchrun_launch else given
        return warm.launcher_for(cfg, chosen)  # warm ranks inside a `warm.ranks()` block, where the run allows

    def watched(self, cfg: TrainConfig) -> tuple[list[int], float]:
        if cfg.local_nodes:  # every node's ranks heartbeat into the one run directory this process watches
            return list(range(cfg.world_size)), cfg.hang_timeout_s
        return list(range(cfg.node_rank * cfg.ranks, (cfg.node_rank + 1) * cfg.ranks)), cfg.hang_timeout_s

    def summarise(self, cfg: TrainConfig, run_dir: Path) -> Verdict:
        return Verdict(collect_summary(run_dir))

    def export(self, cfg: TrainConfig, run_dir: Path) -> None:
        write_trace(run_dir)
        write_scalars(run_dir)

    def on_failure(self, run_dir: Path) -> None:
        trace_on_failure(run_dir)


def trace_on_failure(run_dir: Path) -> None:
    """The trace of whatever a failed run recorded; a failure to write it must not hide the run's own."""
    try:
        write_trace(run_dir)
    except Exception:  # noqa: BLE001 - best effort on an already failed run
        pass


# ---------------------------------------------------------------- bench

BENCH_WORKER = "scalelab.measure.commbench_worker"


def commbench_env(cfg: CommBenchConfig) -> dict[str, str]:
    """Threads split over the ranks; on one node collectives kept on loopback (local nodes: on the node's link)."""
    return {"OMP_NUM_THREADS": str(default_threads(cfg.ranks, cfg.local_nodes)), **(LOOPBACK_ENV if cfg.nnodes == 1 else {})}


def bench_launch_spec(cfg: CommBenchConfig, run_dir: Path) -> LaunchSpec:
    """The benchmark's ranks: one node on loopback, or `ranks` on each local node (the launcher places them)."""
    return LaunchSpec(module=BENCH_WORKER, run_dir=run_dir, nproc_per_node=cfg.ranks, env=commbench_env(cfg),
                      nnodes=cfg.nnodes)


def commbench_argv(cfg: CommBenchConfig, run_dir: Path, *, port: int | None = None) -> list[str]:
    """torchrun arguments for the benchmark's ranks: one node, static rendezvous on 127.0.0.1, a free port."""
    return torchrun_args(bench_launch_spec(cfg, run_dir), port=port)


class BenchKind:
    name = "bench"

    def prepare(self, cfg: CommBenchConfig) -> CommBenchConfig:
        return dataclasses.replace(cfg, backend=cfg.resolved_backend)  # store what actually runs

    def seed(self, cfg: CommBenchConfig) -> int | None:
        return None

    def joins(self, cfg: CommBenchConfig) -> bool:
        return False

    def owns_shared(self, cfg: CommBenchConfig) -> bool:
        return False

    def describe(self, run_id: str, cfg: CommBenchConfig) -> str:
        fs = commbench.format_size
        return (f"run {run_id}: bench comm {','.join(cfg.ops)}, {fs(cfg.begin)}..{fs(cfg.end)} ×{cfg.factor}, "
                f"{cfg.world} ranks{_on_nodes(cfg)}, {cfg.backend}, {cfg.dtype}, "
                f"{cfg.warmup}+{cfg.iters_label} iterations")

    def launch_spec(self, cfg: CommBenchConfig, run_dir: Path, *, isolate: bool, resume: bool) -> LaunchSpec:
        return bench_launch_spec(cfg, run_dir)

    def run_here(self, cfg: CommBenchConfig, run_dir: Path, *, resume: bool) -> None:
        raise NotImplementedError("a benchmark always runs its ranks under a launcher")

    def launcher(self, cfg: CommBenchConfig, given: Launcher) -> Launcher:
        return warm.launcher_for(cfg, given)

    def watched(self, cfg: CommBenchConfig) -> tuple[list[int], float]:
        return list(range(cfg.world)), 0.0  # the benchmark's ranks publish no heartbeat

    def summarise(self, cfg: CommBenchConfig, run_dir: Path) -> Verdict:
        table = commbench.read_results(run_dir)
        # A bandwidth measured on wrong results means nothing: the run is kept, with its table, but marked failed.
        reason = commbench.wrong_reason(table)
        return Verdict(commbench.summarize_table(table), "failed" if reason else "completed", reason)

    def export(self, cfg: CommBenchConfig, run_dir: Path) -> None:
        plot_busbw(commbench.read_results(run_dir), RunDir(run_dir).busbw_plot, title=busbw_title(cfg))

    def on_failure(self, run_dir: Path) -> None:
        pass


def _one_machine(config: dict, rundir: RunDir) -> bool:
    """Whether a multi-node run's ranks shared one clock: namespace nodes of one machine do; Slurm nodes do when
    every node agent ran on one host (a cluster of namespaces under Slurm, as the tests make)."""
    if not config.get("local_nodes"):
        return False
    if config.get("nodes_launcher", "namespaces") != "slurm":
        return True
    try:
        hosts = rundir.read_provenance().get("slurm", {}).get("hosts") or []
    except (OSError, ValueError, StoreError):
        return False
    return len(hosts) > 0 and None not in hosts and len(set(hosts)) == 1


def busbw_title(cfg: Any) -> str:
    """The busbw plot's title: what the bench ran on (ranks, nodes, backend, dtype, iterations)."""
    return f"{cfg.world} ranks{_on_nodes(cfg)}, {cfg.backend}, {cfg.dtype}, {cfg.iters_label} iterations per point"


def _on_nodes(cfg: Any) -> str:
    """' on 2 local nodes (link 0.2 Gbit/s)' for a run across namespaced nodes; '' otherwise."""
    if not cfg.local_nodes:
        return ""
    if getattr(cfg, "nodes_launcher", "namespaces") == "slurm":
        return f" on {cfg.local_nodes} Slurm node{'s' * (cfg.local_nodes > 1)}"
    link = f"{cfg.link_gbps:g} Gbit/s" if cfg.link_gbps else "unshaped"
    delay = f", +{cfg.link_delay_ms:g} ms" if cfg.link_delay_ms else ""
    return f" on {cfg.local_nodes} local nodes (link {link}{delay})"


TRAIN = TrainKind()
BENCH = BenchKind()
