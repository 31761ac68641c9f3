"""Every file of a run directory: its name, its writer and its reader, in one place.

    config.json, provenance.json      written when the run is created (Store.create_run)
    status.json, summary.json         the outcome (Store.finish_run)
    steps.rank<r>.jsonl               per-step records of rank r (train/loop.py)
    system.rank<r>.jsonl              system samples of rank r (measure/system.py)
    result.rank<r>.json               rank r's result: evaluations, memory, steps per epoch (run/worker.py)
    aggregates.rank<r>.json           a probed run's whole-run sums and quantile sketches per stage (run/probe.py)
    heartbeat.rank<r>.json            where rank r is, about once a second (train/heartbeat.py)
    failure.node<k>.json              why node k of a --local-nodes run failed (run/nodeagent.py)
    slurm.node<k>.json                where node k of a --launcher slurm run ran, and whether it is done (same)
    clocks.json                       each rank's clock offset to rank 0 at start-up, rank 0 (measure/clocks.py)
    error.txt                         the traceback of a failed run
    (a multi-node run without a shared filesystem: node 0's directory gets every rank's steps, system and result
    files through the process group at the end, run/worker.py; each other node keeps its own)
    trace.json, tensorboard/          exports of a finished run (run/exports.py)
    checkpoints/                      train/checkpoint.py owns what is inside
    logs/                             the ranks' stdout/stderr when torchrun redirects them; horovodrun's output
    horovod_timeline.json             Horovod's timeline (HOROVOD_TIMELINE, rank 0) of a run of the horovod engine
    timings.json, results.csv, results.json, busbw.png      a communication benchmark's outputs

Analyses receive a `ParsedRun` (`RunDir(path).load()`): the files parsed once, no paths.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.store.files import read_json, read_jsonl, write_json_atomic, write_jsonl_atomic, write_text_atomic

_RANK_RE = re.compile(r"\.rank(\d+)\.")


def _rank_of(path: Path) -> int:
    return int(_RANK_RE.search(path.name).group(1))


class RunDir:
    """The directory of one run; `RunDir(path).steps_file(0)` is where rank 0's step records live."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def run_id(self) -> str:
        return self.path.name

    # ------------------------------------------------------------ names
    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def provenance_file(self) -> Path:
        return self.path / "provenance.json"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def trace_file(self) -> Path:
        return self.path / "trace.json"

    @property
    def clocks_file(self) -> Path:
        return self.path / "clocks.json"

    @property
    def error_file(self) -> Path:
        return self.path / "error.txt"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def horovod_timeline(self) -> Path:
        return self.path / "horovod_timeline.json"

    @property
    def timings_file(self) -> Path:
        return self.path / "timings.json"

    @property
    def phases_file(self) -> Path:
        return self.path / "phases.json"

    @property
    def results_csv(self) -> Path:
        return self.path / "results.csv"

    @property
    def results_json(self) -> Path:
        return self.path / "results.json"

    @property
    def busbw_plot(self) -> Path:
        return self.path / "busbw.png"

    def steps_file(self, rank: int) -> Path:
        return self.path / f"steps.rank{rank}.jsonl"

    def system_file(self, rank: int) -> Path:
        return self.path / f"system.rank{rank}.jsonl"

    def result_file(self, rank: int) -> Path:
        return self.path / f"result.rank{rank}.json"

    def aggregates_file(self, rank: int) -> Path:
        return self.path / f"aggregates.rank{rank}.json"

    def heartbeat_file(self, rank: int) -> Path:
        return self.path / f"heartbeat.rank{rank}.json"

    def node_failure_file(self, node: int) -> Path:
        return self.path / f"failure.node{node}.json"

    def slurm_node_file(self, node: int) -> Path:
        return self.path / f"slurm.node{node}.json"

    def rank_files(self, rank: int) -> list[Path]:
        """What rank r leaves for the run's summary, trace and report: its steps, system samples and result."""
        return [self.steps_file(rank), self.system_file(rank), self.result_file(rank), self.aggregates_file(rank)]

    def step_files(self) -> list[Path]:
        return sorted(self.path.glob("steps.rank*.jsonl"))

    def system_files(self) -> list[Path]:
        return sorted(self.path.glob("system.rank*.jsonl"))

    def result_files(self) -> list[Path]:
        return sorted(self.path.glob("result.rank*.json"))

    def heartbeat_files(self) -> list[Path]:
        return sorted(self.path.glob("heartbeat.rank*.json"))

    # ------------------------------------------------------------ readers and writers
    def rank_payload(self, rank: int) -> dict[str, str]:
        """Rank r's files (rank_files) as {name: text}: what another node's rank sends to node 0."""
        return {p.name: p.read_text(encoding="utf-8") for p in self.rank_files(rank) if p.is_file()}

    def add_missing(self, payload: dict[str, str]) -> list[str]:
        """Write the files of a rank_payload that this directory lacks (on a shared filesystem they are there
        already, written by their own rank); returns the names written."""
        names = [n for n in payload if "/" not in n and _RANK_RE.search(n) and not (self.path / n).exists()]
        for name in names:
            write_text_atomic(self.path / name, payload[name])
        return names

    def read_config(self) -> dict:
        return read_json(self.config_file)

    def write_config(self, config: dict) -> None:
        write_json_atomic(self.config_file, config)

    def read_provenance(self) -> dict:
        return read_json(self.provenance_file)

    def write_provenance(self, provenance: dict) -> None:
        write_json_atomic(self.provenance_file, provenance)

    def read_status(self) -> dict:
        return read_json(self.status_file)

    def write_status(self, status: dict) -> None:
        write_json_atomic(self.status_file, status)

    def read_summary(self) -> dict | None:
        """The summary, or None when the run has none (it is running, or it failed)."""
        return read_json(self.summary_file) if self.summary_file.exists() else None

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary_file, summary)

    def read_steps(self, rank: int | None = None) -> list[dict]:
        """Rank `rank`'s step records, or every rank's (in rank-file order) when `rank` is None."""
        if rank is not None:
            return read_jsonl(self.steps_file(rank))
        return [r for p in self.step_files() for r in read_jsonl(p)]

    def write_steps(self, rank: int, records: list[dict]) -> None:
        write_jsonl_atomic(self.steps_file(rank), records)

    def read_system(self, rank: int | None = None) -> list[dict]:
        """Rank `rank`'s system samples, or every rank's (in rank-file order) when `rank` is None."""
        if rank is not None:
            return read_jsonl(self.system_file(rank))
        return [s for p in self.system_files() for s in read_jsonl(p)]

    def read_result(self, rank: int) -> dict:
        return read_json(self.result_file(rank))

    def read_results(self) -> list[dict]:
        """Every rank's result file that exists, in file order."""
        return [read_json(p) for p in self.result_files()]

    def write_result(self, rank: int, result: dict) -> None:
        write_json_atomic(self.result_file(rank), result)

    def read_aggregates(self) -> list[dict]:
        """Every rank's whole-run aggregates (a probed run), in file order."""
        return [read_json(p) for p in sorted(self.path.glob("aggregates.rank*.json"))]

    def write_aggregates(self, rank: int, aggregates: dict) -> None:
        write_json_atomic(self.aggregates_file(rank), aggregates)

    def read_heartbeat(self, rank: int) -> dict:
        return read_json(self.heartbeat_file(rank))

    def write_heartbeat(self, rank: int, beat: dict) -> None:
        write_json_atomic(self.heartbeat_file(rank), beat)

    def read_node_failure(self, node: int) -> dict | None:
        """{"reason", "consequence", "time"} of a failed node of a --local-nodes run; None when it recorded none."""
        path = self.node_failure_file(node)
        return read_json(path) if path.exists() else None

    def write_node_failure(self, node: int, failure: dict) -> None:
        write_json_atomic(self.node_failure_file(node), failure)

    def read_slurm_node(self, node: int) -> dict:
        """Where node `node` of a --launcher slurm run ran (job, step, Slurm node, host) and whether it is done."""
        return read_json(self.slurm_node_file(node))

    def write_slurm_node(self, node: int, record: dict) -> None:
        write_json_atomic(self.slurm_node_file(node), record)

    def read_clocks(self) -> dict | None:
        """The ranks' clock offsets (measure/clocks.py); None for a run that has none (one rank, an older run)."""
        return read_json(self.clocks_file) if self.clocks_file.is_file() else None

    def write_clocks(self, clocks: dict) -> None:
        write_json_atomic(self.clocks_file, clocks)

    def read_horovod_timeline(self) -> str | None:
        """The text of Horovod's timeline (None without one); analysis.timeline parses it."""
        path = self.horovod_timeline
        return path.read_text(errors="replace") if path.is_file() else None

    def write_error(self, text: str) -> None:
        self.error_file.write_text(text)

    def write_trace(self, trace: dict) -> Path:
        write_json_atomic(self.trace_file, trace)
        return self.trace_file

    def read_timings(self) -> dict:
        return read_json(self.timings_file)

    def write_timings(self, timings: dict) -> None:
        write_json_atomic(self.timings_file, timings)

    def read_phases(self) -> dict:
        """Unix times of the launching process's steps of the run (run/execute.py); {} for runs stored before."""
        return read_json(self.phases_file) if self.phases_file.is_file() else {}

    def write_phases(self, phases: dict) -> None:
        write_json_atomic(self.phases_file, phases)

    def read_results_table(self) -> dict:
        """results.json of a benchmark: {"columns": [...], "rows": [...]}."""
        return read_json(self.results_json)

    def write_results_table(self, csv_text: str, table: dict) -> None:
        write_text_atomic(self.results_csv, csv_text)
        write_json_atomic(self.results_json, table)

    def clear_attempt(self) -> None:
        """Remove what a stopped attempt left that a new one must not inherit: results, heartbeats (old ones would
        fool the watchdog), the error."""
        for stale in [*self.result_files(), *self.heartbeat_files(), self.error_file]:
            stale.unlink(missing_ok=True)

    def load(self) -> "ParsedRun":
        """The run's files parsed once (absent optional files give None / empty)."""
        return ParsedRun(
            run_id=self.run_id, rundir=self, config=self.read_config(),
            status=self.read_status() if self.status_file.exists() else None,
            summary=self.read_summary(),
            steps={_rank_of(p): read_jsonl(p) for p in self.step_files()},
            results={_rank_of(p): read_json(p) for p in self.result_files()},
            system={_rank_of(p): read_jsonl(p) for p in self.system_files()},
            clocks=self.read_clocks())


@dataclass
class ParsedRun:
    """A run as analyses see it: config, status, summary, and per-rank step records, results and system samples."""

    run_id: str
    rundir: RunDir
    config: dict
    status: dict | None = None
    summary: dict | None = None
    steps: dict[int, list[dict]] = field(default_factory=dict)
    results: dict[int, dict] = field(default_factory=dict)
    system: dict[int, list[dict]] = field(default_factory=dict)
    clocks: dict | None = None  # the ranks' clock offsets to rank 0 (clocks.json), None where not estimated

    @property
    def all_steps(self) -> list[dict]:
        """Every rank's step records, rank by rank."""
        return [r for rank in sorted(self.steps) for r in self.steps[rank]]
