"""The calibration of the performance model: what the model needs, measured on this machine (docs/model.md).

A `Calibration` holds the compute fit, α and β of the benches, the in-situ scales and overlap, the gradient sizes,
and the refits on resampled data (`uncertainty`) and the in-calibration residuals (`modelerror`) behind the
prediction intervals; `hardware` and `link_hardware` are the calibrated hosts as training sees them, over the
calibrated link or another (perf/links.py). How the figures are fitted is in `fit.py`, what is measured for them
in `calibrate.py`. The calibration is a JSON file in the study folder (STORE/studies/STUDY/calibration.json); it is
reused while the measurement it describes (same cells, same bench) is unchanged.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.analysis.hardware import Hardware
from scalelab.errors import ConfigError, StoreError
from scalelab.perf import perfmodel as pm
from scalelab.perf.links import NodeLink, link_text, wire_beta
from scalelab.store import RunDir, Store, read_json, write_json_atomic

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
    # where the nodes came from: namespaces of this machine, or a Slurm allocation's (their link the cluster's own)
    nodes_launcher: str = "namespaces"
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
    # the compute of one rank alone on this host (1-rank runs at the calibration's per-rank batches, the default
    # threads of a lone rank): the baseline of one rank per node (presets, hardware files) and of one worker.
    # {} when the compute runs were themselves one rank alone (then `compute` is that baseline)
    lone: dict[str, list[float]] = field(default_factory=dict)
    lone_points: list[dict] = field(default_factory=list)  # the lone runs' compute points (as `points`)
    # the fitted figures refitted on resampled calibration data (`uncertainty`): the prediction intervals
    replicates: list[dict] = field(default_factory=list)
    # in-calibration residuals, each a run predicted by a fit that did not see it (`modelerror`): the model-error
    # part of the prediction intervals
    residuals: list[dict] = field(default_factory=list)
    device: str = ""  # what compute ran on: "<n>-core CPU" or the CUDA device's name ("": a file of an older version)
    host: str | None = None  # the host of runs measured elsewhere (`predict --from`); None: calibrated here
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    def compute_model(self) -> pm.ComputeModel:
        f, b, o, x = (pm.Linear(*self.compute[s]) for s in STAGES)
        return pm.ComputeModel(forward=f, backward=b, optimizer=o, overhead=x)

    def lone_model(self) -> pm.ComputeModel:
        """The compute of one rank alone on this host: a worker with a node (or a device) of its own."""
        if not self.lone:
            return self.compute_model()
        f, b, o, x = (pm.Linear(*self.lone[s]) for s in STAGES)
        return pm.ComputeModel(forward=f, backward=b, optimizer=o, overhead=x)

    def lone_step_ms(self, per_rank_batch: float, accumulate: int | None = None) -> float:
        """One rank alone's step at `per_rank_batch` without communication: the measured median of the lone run at
        that batch where the calibration has one, else the lone fit (`lone_model`)."""
        k = self.accumulate if accumulate is None else accumulate
        lone = self.lone_points or ([] if self.lone or self.ranks > 1 or self.nodes > 1 else self.points)
        for p in lone:
            if abs(p["per_rank_batch"] - per_rank_batch) < 1e-9 and p.get("accumulate", 1) == k:
                return float(p["step(ms)"])
        return self.lone_model().step_ms(per_rank_batch, k)

    @property
    def host_slowdown(self) -> float:
        """How much slower a rank computes while the calibration's ranks share this host than alone: the median
        over the calibration's per-rank batches of the shared compute run's step / the lone run's (1 without lone
        runs). Applied only where a layout shares the host (the measured hardware); never to one rank per node."""
        lone = {p["per_rank_batch"]: p["step(ms)"] for p in self.lone_points}
        ratios = sorted(p["step(ms)"] / lone[p["per_rank_batch"]] for p in self.points
                        if lone.get(p["per_rank_batch"], 0) > 0)
        if not ratios:
            return 1.0
        mid = len(ratios) // 2
        return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2

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
        if self.nodes > 1 and self.nodes_launcher == "slurm":  # not this machine: the allocation's nodes
            where = f", {self.nodes} Slurm nodes over the cluster's link"
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
                    "veth_beta_s_per_byte", "repeats", "compute_nodes", "replicates", "batches", "residuals",
                    "lone", "lone_points", "nodes_launcher"}
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



# strategies whose collectives are not allreduce: comm_scale does not carry over to them (module docstring)
OWN_SCALE = ("gather_scatter",)


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
