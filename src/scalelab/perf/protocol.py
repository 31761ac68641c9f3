"""A frozen validation protocol for the performance model (benchmarks/prediction_nodes.py, docs/model.md).

A model judged on points it was tuned on is judged on development figures. The protocol fixes, before a run,
what is calibrated and what is held out, and which model code is judged: the git object ids of the model's files
(`MODEL_CODE`) at the commit that froze it. A run refuses a working tree with uncommitted changes or model code
other than the frozen one (`check_frozen`); a model change after a held-out run makes a new protocol, and that
run's figures development figures.

Calibration over the network (the bench, the in-situ runs, the overlap) uses at most `calibration.nodes` nodes;
compute without sync may be measured at the held-out node counts (`compute_in_sample`: on a host whose namespace
nodes share its cores, compute at that count is not what is being predicted), and every such row says so. A
held-out point differs from every network calibration run in node count, link and per-rank batch
(`violations`); a link the calibration measured unshaped is not held out in its link, and its rows say so.
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from scalelab.errors import ConfigError

# the files whose code makes a prediction: the model, its calibration and links, the cost formulas and the sync
# strategies' registered costs, and the benchmark that runs the protocol
MODEL_CODE = ("src/scalelab/perf", "src/scalelab/analysis/synccost.py", "src/scalelab/analysis/hardware.py",
              "src/scalelab/sync", "benchmarks/prediction_nodes.py")


@dataclass(frozen=True)
class Point:
    nodes: int
    link: float | None  # Gbit/s per node (tbf); None: unshaped
    batch: int  # per rank
    sync: str


@dataclass(kw_only=True)
class Protocol:
    frozen: str  # the date it was frozen
    model_code: dict[str, str]  # path -> git object id (`model_code`)
    train: dict  # TrainConfig fields every run shares (model, steps, ...)
    calibration: dict  # nodes, link_gbps, batches, repeats, strategies
    compute_in_sample: dict  # nodes, batches, repeats
    held_out: dict  # nodes, links (null: unshaped), batch, strategies, repeats
    preset_check: dict = field(default_factory=dict)  # links: the shaped held-out links a hardware file describes

    @classmethod
    def load(cls, path: Path) -> "Protocol":
        try:
            data = json.loads(Path(path).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as err:
            raise ConfigError("protocol", str(path), f"a protocol JSON file ({type(err).__name__}: {err})") from None

    def calibration_points(self) -> list[Point]:
        """Every training run over the network the calibration makes (compute, in-situ, and over a shaped link the
        in-situ strategies at the largest batch over the same nodes unshaped: `calibrate.cross_link_cells`)."""
        c = self.calibration
        cross = [Point(c["nodes"], None, max(c["batches"]), s) for s in c["strategies"]] if c["link_gbps"] else []
        return [Point(c["nodes"], c["link_gbps"], b, s) for b in c["batches"] for s in c["strategies"]] + cross

    def compute_points(self) -> list[Point]:
        c = self.compute_in_sample
        return [Point(n, self.calibration["link_gbps"], b, "noop") for n in c["nodes"] for b in c["batches"]]

    def held_out_points(self) -> list[Point]:
        h = self.held_out
        return [Point(n, link, h["batch"], s) for n, link, s in product(h["nodes"], h["links"], h["strategies"])]

    def link_in_sample(self, point: Point) -> bool:
        """An unshaped link is measured by the calibration's bench over the unshaped nodes (perf/links.py)."""
        return point.link is None


def violations(protocol: Protocol) -> list[str]:
    """Why a held-out point is not held out: it shares its node count, link or per-rank batch with a network
    calibration run, or its per-rank batch or link with a compute run (whose node count may be the same)."""
    out = []
    for p in protocol.held_out_points():
        for c in protocol.calibration_points():
            same = [w for w, a, b in (("nodes", p.nodes, c.nodes), ("link", p.link, c.link), ("batch", p.batch, c.batch))
                    if a == b and not (w == "link" and protocol.link_in_sample(p))]
            if same:
                out.append(f"{p} shares {', '.join(same)} with calibration run {c}")
        for c in protocol.compute_points():
            same = [w for w, a, b in (("link", p.link, c.link), ("batch", p.batch, c.batch)) if a == b]
            if same:
                out.append(f"{p} shares {', '.join(same)} with compute run {c}")
    return out


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ConfigError("repository", str(repo), f"a git checkout of scalelab ({err})") from None


def model_code(repo: Path) -> dict[str, str]:
    """The git object id at HEAD of each path in MODEL_CODE (a tree for a folder, a blob for a file)."""
    return {path: _git(repo, "rev-parse", f"HEAD:{path}") for path in MODEL_CODE}


def check_frozen(protocol: Protocol, repo: Path) -> None:
    """Refuse (ConfigError) a working tree with uncommitted changes, or model code other than the protocol's."""
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    if dirty:
        raise ConfigError("working tree", dirty.splitlines()[0].strip(), "a frozen run needs a clean checkout: "
                          "commit or stash every change first")
    now = model_code(repo)
    changed = [path for path, sha in protocol.model_code.items() if now.get(path) != sha]
    if changed or set(now) != set(protocol.model_code):
        raise ConfigError("model code", ", ".join(changed) or "the list of paths",
                          f"differs from the protocol frozen on {protocol.frozen}: its figures would be development "
                          "figures; freeze a new protocol (--freeze) and commit it first")
