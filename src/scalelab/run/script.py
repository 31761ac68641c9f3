"""A user's own training script as a run (`scalelab run -- python train.py ARGS`): its config, its kind, its summary.

The script's ranks start under torchrun like `scalelab train`'s (loopback rendezvous on one node; with
`local_nodes`, one torchrun agent per namespaced node, run/nodes.py), each as
`python -m scalelab.run.script_rank --run-dir DIR -- train.py ARGS`: that module opens a probe (scalelab.run.probe)
before the script runs, so a script without a line of scalelab still leaves wall time, system samples and its
collectives (bytes, count, time); a script that calls `scalelab.probe.open()` gets that same probe and marks its
steps and stages. The run goes through run/execute.py's steps like every kind: record, launch, summarise, export,
finish (a failing rank's traceback is the run's error, as for `train`).

Placeholders in the command (`--batch {global_batch}`) are filled from the config: {workers} (ranks over all
nodes), {ranks} (per node), {nnodes}, {global_batch} and {per_worker_batch} (when a global batch is given).
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import string
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.intervals import mean_interval
from scalelab.analysis.sketch import whole_run_figures
from scalelab.config import check_local_nodes, default_threads, local_nnodes
from scalelab.errors import ConfigError, StoreError
from scalelab.run.exports import write_scalars, write_trace
from scalelab.run.kinds import Verdict, collect_summary, trace_on_failure
from scalelab.run.launch import LOOPBACK_ENV, Launcher, LaunchSpec
from scalelab.store.rundir import RunDir

SCRIPT_RANK = "scalelab.run.script_rank"
PLACEHOLDERS = ("workers", "ranks", "nnodes", "global_batch", "per_worker_batch")
# training-config flags that mean the same for a script (an experiment over a script takes these from its flags)
SCRIPT_FLAGS = ("ranks", "local_nodes", "link_gbps", "link_delay_ms", "threads", "warmup_steps", "sample_interval_s",
                "hang_timeout_s")
_PYTHON = re.compile(r"python[0-9.]*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScriptConfig:
    """One run of a user's script. `command` is the user's, as typed: python SCRIPT.py ARGS or python -m MODULE."""

    command: tuple[str, ...]
    ranks: int = 1  # processes per node
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_nodes: int = 0  # nodes made of network namespaces on this machine (sets nnodes)
    link_gbps: float | None = None
    link_delay_ms: float | None = None
    global_batch: int | None = None  # only to fill {global_batch} / {per_worker_batch}
    threads: int | None = None  # torch threads per rank (OMP_NUM_THREADS); default: cores / local ranks
    warmup_steps: int = 2  # marked steps excluded from every timing
    sample_interval_s: float = 0.5
    hang_timeout_s: float = 300.0  # a stage or a collective is progress; 0 turns the watchdog off
    run_id: str | None = None
    cwd: str = dataclasses.field(default_factory=os.getcwd)  # where the command was typed: the script's path base
    # catalog columns (`runs list`): what the run is, as far as scalelab can tell without the script's help
    model: str = ""
    dataset: str = "script"

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("command", "", "allowed: a command after --, e.g. -- python train.py ARGS")
        if not _PYTHON.match(Path(self.command[0]).name):
            raise ConfigError("command", self.command[0], "allowed: python SCRIPT.py ARGS or python -m MODULE ARGS")
        if len(self.command) < 2 or self.command[1] == "-m" and len(self.command) < 3:
            raise ConfigError("command", " ".join(self.command), "allowed: python SCRIPT.py ARGS or python -m MODULE")
        if self.command[1] != "-m" and not (Path(self.cwd) / self.command[1]).is_file():
            raise ConfigError("command", self.command[1], f"no such script (from {self.cwd})")
        for name in ("ranks", "nnodes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "allowed: an integer >= 1")
        check_local_nodes(self)
        object.__setattr__(self, "nnodes", local_nnodes(self))
        if self.global_batch is not None and (self.global_batch < 1 or self.global_batch % self.workers):
            raise ConfigError("global_batch", self.global_batch, f"allowed: a multiple of the {self.workers} workers")
        for arg in self.command[1:]:  # a placeholder that is not a field fails here; one without a value at `argv`
            fill(arg, dict.fromkeys(PLACEHOLDERS, 0), check_only=True)
        if not self.model:
            name = self.command[2] if self.command[1] == "-m" else Path(self.command[1]).name
            object.__setattr__(self, "model", f"script:{name}")

    @property
    def workers(self) -> int:
        return self.ranks * self.nnodes

    @property
    def world_size(self) -> int:
        return self.workers

    def values(self) -> dict[str, int]:
        out = {"workers": self.workers, "ranks": self.ranks, "nnodes": self.nnodes}
        if self.global_batch is not None:
            out.update(global_batch=self.global_batch, per_worker_batch=self.global_batch // self.workers)
        return out

    def argv(self) -> list[str]:
        """The command after the interpreter, placeholders filled: what each rank runs."""
        return [fill(arg, self.values()) for arg in self.command[1:]]

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["command"] = list(self.command)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ScriptConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (tuple(v) if k == "command" else v) for k, v in data.items() if k in names})


def fill(arg: str, values: dict[str, int], *, check_only: bool = False) -> str:
    """`--batch={global_batch}` -> `--batch=256`; a placeholder that is not one, or has no value, is a
    ConfigError."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(arg) if name is not None]
    except ValueError:
        return arg  # a lone brace: not a placeholder
    for name in names:
        if name not in PLACEHOLDERS:
            raise ConfigError("command", "{" + name + "}", f"is not a placeholder; allowed: "
                              f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        if name not in values:
            raise ConfigError("command", "{" + name + "}", "has no value here; allowed: give --global-batch")
    return arg if check_only or not names else arg.format(**values)


def script_env(cfg: ScriptConfig) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(cfg.threads or default_threads(cfg.ranks, cfg.local_nodes))}
    if cfg.nnodes == 1:
        env.update(LOOPBACK_ENV)
    return env


def summarise_script(run_dir: Path) -> dict:
    """A script run's summary from its files: `train`'s summary when steps were marked, and always the script's
    wall time, peak memory and every collective (inside steps and out)."""
    rundir = RunDir(run_dir)
    results = rundir.read_results()
    if not results:
        raise StoreError(f"run {rundir.run_id}: no rank wrote a result file")
    records = rundir.read_steps()
    if records:
        summary = collect_summary(run_dir)
        known = {f"{s}(s)" for s in (*keys.STAGES, "other", "wall", "wait")}
        for name in sorted({k for r in records for k in r if k.endswith("(s)") and ":" not in k} - known):
            if name.startswith(("t_end", "comm_", "evaluation", "checkpoint")):
                continue
            timed = [r.get(name, 0.0) for r in records if not r["warmup"]]
            if timed:  # a stage the user named
                summary[keys.stage_ms(name[:-3])] = 1e3 * sum(timed) / len(timed)
    else:
        summary = {keys.RANKS_REPORTED: len(results), keys.THREADS_USED: min(results, key=lambda r: r["rank"])[
            "threads"]}
        rss = [r["memory"]["peak_rss(bytes)"] for r in results if "peak_rss(bytes)" in r.get("memory", {})]
        if rss:
            summary[keys.memory_gib("peak_rss")] = max(rss) / 2**30
    aggregates = rundir.read_aggregates()
    if any(a["steps"] > a["detailed"] for a in aggregates):
        # a long run kept the records of some steps only (run.probe.Detail): its step figures come from the
        # whole-run aggregates; the intervals and the trace stay those of the kept steps
        summary.update(whole_run_figures(aggregates))
        summary[keys.STEPS_DETAILED] = max(a["detailed"] for a in aggregates)
    if aggregates and "clock_steps" in aggregates[0]:  # which clock timed rank 0's steps (older runs lack it)
        clocks = aggregates[0]["clock_steps"]
        summary[keys.STEPS_HOST_CLOCK] = clocks.get("host", 0)
        summary[keys.STEPS_CUDA_EVENTS] = clocks.get("cuda_events", 0)
    summary[keys.SCRIPT_WALL_S] = max(r["wall(s)"] for r in results)
    summary.update(comm_totals(records, results, aggregates))
    summary[keys.STEPS_BOUNDARY] = (aggregates[0].get("boundary") if aggregates and "boundary" in aggregates[0]
                                    else "probe" if records else "none")
    summary.update(step_batch_figures(records))
    return summary


def step_batch_figures(records: list[dict]) -> dict:
    """From the timed steps' records: the samples of a step over all ranks (median) and the data wait every rank
    had (per step the least over ranks, mean over steps, with its 95 % interval)."""
    by_step: dict[int, list[dict]] = {}
    for r in records:
        if not r["warmup"]:
            by_step.setdefault(r["step"], []).append(r)
    if not by_step:
        return {}
    ranks = max(len(v) for v in by_step.values())
    whole = [by_step[k] for k in sorted(by_step) if len(by_step[k]) == ranks]  # steps every rank kept
    out = {keys.SAMPLES_PER_STEP: float(np.median([sum(r["samples"] for r in v) for v in whole]))}
    waits = [1e3 * min(r.get("data(s)", 0.0) for r in v) for v in whole]
    out[keys.DATA_WAIT_ALL_RANKS_MS] = float(np.mean(waits))
    if len(waits) > 1:
        low, high = mean_interval(waits, positive=True)  # a time: its interval stays >= 0 (analysis.intervals)
        out.update(dict(zip(keys.ci_keys(keys.DATA_WAIT_ALL_RANKS_MS), (low, high))))
    return out


def batch_mismatch(cfg: ScriptConfig, records: list[dict]) -> str | None:
    """With a global batch given and steps marked, the samples a step marked over all ranks must be that batch
    (the script took the batch it was given); the reason in one line when not, else None."""
    if cfg.global_batch is None or not records:
        return None
    per_step: dict[int, int] = {}
    for r in records:
        per_step[r["step"]] = per_step.get(r["step"], 0) + r["samples"]
    wrong = sorted({n for n in per_step.values() if n != cfg.global_batch})
    if not wrong:
        return None
    return (f"samples per step: the script marked {wrong[0]} over all ranks, the global batch is {cfg.global_batch}; "
            "pass {global_batch} or {per_worker_batch} to the script's batch argument")


def comm_totals(records: list[dict], results: list[dict], aggregates: list[dict] = ()) -> dict:
    """Every collective of the run, inside steps (kept or not) and out, per rank (mean over ranks): bytes, count,
    time."""
    if not any(r.get("comm_outside") for r in results) and not any("comm_bytes" in r for r in records):
        return {}
    n = len(results)
    total = {"comm_bytes": 0.0, "collectives": 0.0, "comm_total(s)": 0.0}
    for source in (records, [r.get("comm_outside", {}) for r in results],
                   [a.get("comm_dropped", {}) for a in aggregates]):
        for rec in source:
            for key in total:
                total[key] += rec.get(key, 0)
    return {keys.COMM_BYTES_TOTAL: total["comm_bytes"] / n, keys.COMM_COLLECTIVES_TOTAL: total["collectives"] / n,
            keys.COMM_TIME_TOTAL_MS: 1e3 * total["comm_total(s)"] / n}


class ScriptKind:
    name = "script"

    def prepare(self, cfg: ScriptConfig) -> ScriptConfig:
        cfg.argv()  # every placeholder has its value (before anything is recorded)
        return cfg

    def seed(self, cfg: ScriptConfig) -> int | None:
        return None

    def joins(self, cfg: ScriptConfig) -> bool:
        return cfg.node_rank > 0 and bool(cfg.run_id)

    def owns_shared(self, cfg: ScriptConfig) -> bool:
        return False

    def launcher(self, cfg: ScriptConfig, given: Launcher) -> Launcher:
        return given  # a user's script runs under torchrun (the DDP engine's launcher)

    def describe(self, run_id: str, cfg: ScriptConfig) -> str:
        return f"run {run_id}: {shlex.join([cfg.command[0], *cfg.argv()])}, {cfg.workers} rank(s)"

    def launch_spec(self, cfg: ScriptConfig, run_dir: Path, *, isolate: bool, resume: bool) -> LaunchSpec:
        # always its own processes: the user's script must not run inside scalelab's
        return LaunchSpec(module=SCRIPT_RANK, run_dir=run_dir, nproc_per_node=cfg.ranks, env=script_env(cfg),
                          nnodes=cfg.nnodes, node_rank=cfg.node_rank,
                          endpoint=cfg.rdzv_endpoint if cfg.nnodes > 1 and not cfg.local_nodes else None,
                          quiet=isolate,
                          args=("--", *cfg.argv()))

    def run_here(self, cfg: ScriptConfig, run_dir: Path, *, resume: bool) -> None:
        raise NotImplementedError("a script always runs its ranks under a launcher")

    def watched(self, cfg: ScriptConfig) -> tuple[list[int], float]:
        if cfg.local_nodes:  # every node's ranks heartbeat into the one run directory this process watches
            return list(range(cfg.workers)), cfg.hang_timeout_s
        return list(range(cfg.node_rank * cfg.ranks, (cfg.node_rank + 1) * cfg.ranks)), cfg.hang_timeout_s

    def summarise(self, cfg: ScriptConfig, run_dir: Path) -> Verdict:
        summary = summarise_script(run_dir)
        # only marked steps are held to the batch: a found step's samples are its first input's leading dimension,
        # which is not the batch for every model (a sequence-first one)
        marked = summary.get(keys.STEPS_BOUNDARY) == "probe"
        reason = batch_mismatch(cfg, RunDir(run_dir).read_steps()) if marked else None
        return Verdict(summary, "failed" if reason else "completed", reason)

    def export(self, cfg: ScriptConfig, run_dir: Path) -> None:
        if RunDir(run_dir).step_files():
            write_trace(run_dir)
            write_scalars(run_dir)

    def on_failure(self, run_dir: Path) -> None:
        trace_on_failure(run_dir)


SCRIPT = ScriptKind()
