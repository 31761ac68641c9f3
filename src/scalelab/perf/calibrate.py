"""Calibrating the performance model on this machine: the stored runs and benches a calibration is fitted on
(`fit.py` says how), measured or reused through the cell engine, with its resampled refits (`uncertainty.py`).

    cal = calibrate(base, cells, batches=[16, 32], strategies=["gather_scatter"], repeats=2)
    cal_4 = calibrate_compute(cal, base_at_4_nodes, cells, batches=[16, 32])   # compute again at 4 nodes
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence

from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, StoreError
from scalelab.lab.cells import Cell, Cells, with_fields
from scalelab.measure.commbench import CommBenchConfig
from scalelab.perf import perfmodel as pm
from scalelab.perf import modelerror, uncertainty
from scalelab.perf.calibration import OWN_SCALE, STAGES, Calibration, calibration_path, device_name, own_scales_text
from scalelab.perf.fit import Measured, bench_times, cell_run, compute_points, fit, fit_of
from scalelab.perf.links import link_text
from scalelab.perf.sharedhost import step_text
from scalelab.run.execute import RunFailed
from scalelab.run.slurmnodes import allocation, uses_slurm
from scalelab.train.setup import build_inputs

def calibration_cells(base: TrainConfig, batches: Sequence[int]) -> list[Cell]:
    """One run without gradient sync per per-rank batch: same ranks, nodes, threads and data as `base`."""
    if base.nnodes != 1 and not base.local_nodes:
        raise ConfigError("nnodes", base.nnodes, "calibration runs on this machine: allowed 1, or local_nodes")
    if len(set(batches)) < 2 or min(batches) < 1:
        raise ConfigError("batches", list(batches), "allowed: at least two different per-rank batches >= 1")
    bad = [b for b in batches if b % base.accumulate]
    if bad:
        raise ConfigError("batches", bad[0], f"allowed: per-rank batches divisible by accumulate {base.accumulate}")
    quiet = {"net_latency_ms": 0.0, "net_bandwidth_gbps": None, "ddp_hook": "none"}
    sync = {"sync": "noop" if base.world_size > 1 else "auto", "wrapper": "auto"}
    return [Cell(f"compute, per-rank batch {b}", with_fields(base, global_batch=b * base.world_size, **quiet, **sync))
            for b in sorted(set(batches))]


def lone_cells(base: TrainConfig, batches: Sequence[int]) -> list[Cell]:
    """One rank alone on this host per per-rank batch, at a lone rank's default threads, no namespace nodes: the
    compute of a worker with a node of its own (one rank per node: presets, hardware files) and the one-worker
    baseline of speedup and efficiency. None when `base` is one rank alone already (its compute runs are these).
    Over Slurm nodes, a job step on the allocation's first node: a node of the cluster, as the other cells'."""
    if base.world_size == 1 and not base.local_nodes and base.threads is None:
        return []
    alone = with_fields(base, ranks=1, nnodes=1, local_nodes=1 if uses_slurm(base) else 0, link_gbps=None,
                        link_delay_ms=None, threads=None, global_batch=base.per_rank_batch)
    return [dataclasses.replace(c, label=c.label.replace("compute,", "compute of one rank alone,"))
            for c in calibration_cells(alone, batches)]


def insitu_cells(base: TrainConfig, batches: Sequence[int], param_bytes: Sequence[int],
                 strategies: Sequence[str] = ()) -> list[Cell]:
    """Per per-rank batch, one run with per-parameter blocking allreduce and one with overlapped buckets (about a
    quarter of the gradient each, so there is overlap to measure; one per parameter when the last-ready tensor
    alone fills a quarter), and one of each strategy of `strategies` in OWN_SCALE; no emulation; none for one
    rank."""
    if base.world_size < 2:
        return []
    cap = sum(param_bytes) / 4
    if len(pm.bucket_sizes(param_bytes, cap)) < 2:
        cap = min(param_bytes)
    bucket_mb = max(1, cap) / pm.MIB
    own = [s for s in OWN_SCALE if s in strategies]
    return [cell for c in calibration_cells(base, batches) for cell in (
        Cell(f"in situ allreduce, per-rank batch {c.config.per_rank_batch}", with_fields(c.config, sync="allreduce")),
        Cell(f"in situ bucketed, per-rank batch {c.config.per_rank_batch}",
             with_fields(c.config, sync="bucketed", bucket_mb=bucket_mb)),
        *(Cell(f"in situ {s}, per-rank batch {c.config.per_rank_batch}", with_fields(c.config, sync=s))
          for s in own))]


def cross_link_cells(base: TrainConfig, insitu: Sequence[Cell]) -> list[Cell]:
    """The in-situ cells at the largest batch once more over the same namespace nodes with the link unshaped: runs
    the calibration predicts but does not fit on (`modelerror`, OTHER_LINK); none unless `base` runs over a shaped
    namespace link. Their cost: one launch per strategy × repeats, about a tenth of a protocol run."""
    if not (base.local_nodes > 1 and base.link_gbps is not None) or not insitu:
        return []
    top = max(c.config.per_rank_batch for c in insitu)
    return [dataclasses.replace(c, label=c.label.replace("in situ", "other link: in situ") + ", unshaped",
                                config=with_fields(c.config, link_gbps=None))
            for c in insitu if c.config.per_rank_batch == top]


def bench_config(base: TrainConfig, param_bytes: Sequence[int]):
    """The allreduce sweep: 1 KiB up to the whole gradient (at least 4 MiB, at most 64 MiB), ×4. The floor keeps
    the bandwidth term well above the latency for small models: with sizes up to 1 MiB on a loaded host, noise
    could push the fitted β to zero."""

    top, end = min(64 * pm.MIB, max(4 * pm.MIB, sum(param_bytes))), 1024
    while end < top:
        end *= 4
    # over Slurm nodes the sweep is a job step across the same nodes: the cluster's own link (docs/model.md)
    nodes = {"local_nodes": base.local_nodes, "link_gbps": base.link_gbps, "link_delay_ms": base.link_delay_ms,
             "ranks": base.ranks, "nodes_launcher": base.nodes_launcher} if base.local_nodes > 1 else {
        "ranks": max(2, base.ranks)}
    return CommBenchConfig(ops="allreduce", begin=1024, end=end, factor=4, warmup=5, iters=30,
                           backend="auto" if base.backend == "auto" else base.backend, **nodes)


def gradient_sizes(base: TrainConfig) -> tuple[list[int], int]:
    """(bytes per trainable parameter in registration order, parameter elements) of the model, built once."""

    _, model = build_inputs(base)
    params = [p for p in model.parameters() if p.requires_grad]
    return [p.numel() * p.element_size() for p in params], sum(p.numel() for p in params)



def calibrate(base: TrainConfig, cells: Cells, *, batches: Sequence[int], say: Callable[[str], None] = print,
              bench=None, strategies: Sequence[str] = (), repeats: int = 1) -> Calibration:
    """Measure (or reuse) the compute fit, α and β, and the gradient sizes for `base` on this machine.
    `bench` (a CommBenchConfig) replaces the default sweep (`bench_config`). `strategies`: the sync strategies
    the caller will predict; those in OWN_SCALE get in-situ runs of their own (module docstring). `repeats`:
    launches per training cell (interleaved by batch). The calibration carries `uncertainty.REPLICATES` refits
    on resampled launches, steps and bench iterations: the prediction intervals."""
    param_bytes, parameters = gradient_sizes(base)
    compute, insitu = calibration_cells(base, batches), insitu_cells(base, batches, param_bytes, strategies)
    cross, lone = cross_link_cells(base, insitu), lone_cells(base, batches)
    if repeats > 1:
        compute, insitu, cross, lone = ([dataclasses.replace(c, repeats=repeats) for c in group]
                                        for group in (compute, insitu, cross, lone))
    bench = bench or bench_config(base, param_bytes)
    bench = dataclasses.replace(bench, backend=bench.resolved_backend)  # what runs here: the cell's identity
    study = cells.study
    # over a shaped link, a loopback bench (the hosts' own cost per byte, under any link) and one over the same
    # nodes unshaped (the veth path's own cost: perf/links.py)
    host_bench = (dataclasses.replace(bench, local_nodes=0, link_gbps=None, link_delay_ms=None, ranks=2)
                  if bench.link_gbps is not None else None)
    veth_bench = dataclasses.replace(bench, link_gbps=None) if bench.link_gbps is not None else None
    benches = [Cell("bench allreduce", bench, kind="bench")] + (
        [Cell("bench allreduce, loopback (the hosts)", host_bench, kind="bench"),
         Cell("bench allreduce, unshaped namespace link", veth_bench, kind="bench")] if host_bench else [])
    identity = ([c.key for c in compute + insitu + cross + lone] + [json.dumps(b.config.to_dict(), sort_keys=True) for b in benches]
                + ([repeats] if repeats > 1 else []))
    key = hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:12]
    path = calibration_path(cells.store, study)
    if path.exists():
        try:
            old = Calibration.load(path)
        except StoreError:
            old = None
        if old is not None and old.key == key and old.replicates and (old.residuals or not insitu):
            say(f"[{study}] calibration {path} reused")
            return old
    # each batch's compute run, its lone run and its in-situ runs back to back: load from other processes hits
    # them alike (the host slowdown is a ratio of two of them)
    at = {b: [c for c in [*lone, *insitu] if c.config.per_rank_batch == b] for b in {c.config.per_rank_batch
                                                                                     for c in compute}}
    paired = [c for cell in compute for c in [cell, *at[cell.config.per_rank_batch]]]
    results = cells.run([*paired, *cross, *benches], group="calibration", interleave=repeats > 1)
    failed = [r for r in results if r.status != "completed"]
    if failed:
        raise RunFailed(failed[0].run_id or "-", f"calibration cell {failed[0].label}: {failed[0].reason}")
    launches = {res.cell.key: cells.runs([res], all_repeats=True) for res in results}
    bench_runs = [launches[c.key][-1] for c in benches]
    times = [bench_times(r["files"]) for r in bench_runs]
    measured = Measured(compute=[launches[c.key] for c in compute],
                        insitu={sync: [launches[c.key] for c in insitu if c.config.sync == sync]
                                for sync in ("allreduce", "bucketed", *OWN_SCALE)},
                        bench=times[0], host_bench=times[1] if host_bench else None,
                        veth_bench=times[2] if host_bench else None, cross=[launches[c.key] for c in cross],
                        lone=[launches[c.key] for c in lone])
    first = launches[compute[0].key][-1]
    template = Calibration(
        model=base.model, dataset=base.dataset, ranks=bench.world, threads=base.threads,
        backend=bench.resolved_backend, accumulate=base.accumulate, compute={}, points=[], alpha_s=0.0,
        beta_s_per_byte=0.0, param_bytes=param_bytes, parameters=parameters, bench_run=bench_runs[0]["run_id"],
        nodes=max(1, bench.local_nodes), link_gbps=bench.link_gbps, nodes_launcher=bench.nodes_launcher, key=key,
        repeats=repeats,
        batches=sorted({float(c.config.per_rank_batch) for c in compute}), device=device_name(first["config"], first["files"]))
    cal = fit(template, measured)
    cal.replicates = uncertainty.replicates(template, measured)
    cal.residuals = modelerror.residuals(template, measured, cal)
    cal.save(path)
    where = (f" on {bench.local_nodes} Slurm nodes over the cluster's link" if uses_slurm(bench) else
             f" on {bench.local_nodes} nodes over {link_text(bench.link_gbps)}" if bench.local_nodes > 1 else "")
    say(f"[{study}] calibration: {base.world_size} rank(s){where} without sync at per-rank batches "
        f"{', '.join(str(int(p['per_rank_batch'])) for p in cal.points)}"
        f"{f' ({repeats} launches each)' if repeats > 1 else ''}; α = {cal.alpha_s * 1e6:.1f} µs, 1/β = "
        f"{1 / cal.beta_s_per_byte / 1e9 if cal.beta_s_per_byte else float('inf'):.3g} GB/s ({cal.bench_run}); "
        f"with communication: collectives ×{cal.comm_scale:.2f}{own_scales_text(cal)}, compute "
        f"×{cal.compute_scale:.2f}, overlap {cal.overlap:.2f}; {lone_text(cal)}; {len(cal.replicates)} bootstrap "
        f"refits; "
        f"{modelerror.describe(cal)}; wrote {path}")
    return cal


def lone_text(cal: Calibration) -> str:
    """The compute baseline in words (the calibration line): one rank alone's per-sample compute and the slowdown
    of the calibration's ranks sharing this host, which only layouts that share a host get."""
    per_sample = cal.lone_model().step_ms(2.0, 1) - cal.lone_model().step_ms(1.0, 1)
    if not cal.lone:
        return f"compute of one rank alone: {per_sample:.3g} ms per sample (the compute runs)"
    nodes = cal.compute_nodes or cal.nodes
    where = f"{nodes} namespace nodes sharing this host" if nodes > 1 else f"{cal.ranks} ranks sharing this host"
    if nodes > 1 and cal.nodes_launcher == "slurm":  # machines of their own, unless the allocation's share one
        where = f"a rank of {nodes} Slurm nodes against one alone"
    odd = ("; below 1, a rank computed faster sharing the host than alone: a loaded host or threads that do not "
           "pay for this model, so the lone figures are suspect" if cal.host_slowdown < 1 else "")
    return (f"compute of one rank alone: {per_sample:.3g} ms per sample (one rank per node: presets, files); "
            f"{where} ×{cal.host_slowdown:.2f} (applied to this machine's shared-host rows "
            f"only{odd})")


def calibrate_compute(cal: Calibration, base: TrainConfig, cells: Cells, *, batches: Sequence[int],
                      repeats: int = 1) -> Calibration:
    """`cal` with its compute measured again on `base` (runs without sync, `calibration_cells`), e.g. at the
    node count to be predicted: on a host whose nodes share cores, compute at that count is in-sample while
    everything that involves the network stays as calibrated (`compute_nodes` says so). The replicates' compute is
    refitted on resampled launches and steps of these runs."""
    group = calibration_cells(base, batches)
    group = [dataclasses.replace(c, repeats=repeats) for c in group] if repeats > 1 else group
    results = cells.run(group, group=f"compute at {max(1, base.local_nodes)} nodes", interleave=repeats > 1)
    failed = [r for r in results if r.status != "completed"]
    if failed:
        raise RunFailed(failed[0].run_id or "-", f"compute cell {failed[0].label}: {failed[0].reason}")
    launches = [cells.runs([res], all_repeats=True) for res in results]
    points = compute_points([cell_run(c) for c in launches])
    model = pm.fit_compute_model(points)
    computes = uncertainty.compute_replicates(launches, len(cal.replicates))
    return dataclasses.replace(
        cal, compute={s: [fit_of(model, s).c0, fit_of(model, s).c1] for s in STAGES},
        points=json.loads(points.to_json(orient="records")), compute_runs=list(points["run_id"]),
        compute_nodes=max(1, base.local_nodes),
        replicates=[{**rep, "compute": c} for rep, c in zip(cal.replicates, computes)])


# the most namespace nodes whose compute `compute_at_nodes` measures: each is a process on this host's cores, and
# the frozen protocol (docs/model.md) validated the path at 3 and 4
MAX_MEASURED_NODES = 8


def compute_at_nodes(cal: Calibration, base: TrainConfig, cells: Cells, workers: Sequence[int], *,
                     batches: Sequence[int], horizon: float, say: Callable[[str], None] = print) -> dict[int, Calibration]:
    """Per predicted worker count whose node count differs from the calibration's, `cal` with its compute measured
    at that node count (`calibrate_compute`), as the frozen protocol does: namespace nodes share this host's cores,
    so compute at N nodes is not the calibration's. Only for a calibration over namespace nodes (`base.local_nodes`),
    for counts of whole nodes within `horizon` workers and MAX_MEASURED_NODES nodes; the rest keep `cal` (and are
    marked extrapolation: `prediction.apply_horizon`). Over Slurm nodes, up to the allocation's node count (a step
    cannot span more): the nodes may share a host too (the namespace cluster the tests make), and where they are
    machines of their own the runs measure the compute the calibration's count already gave."""
    if base.local_nodes < 2:
        return {}
    most = len(allocation().hosts) if uses_slurm(base) else MAX_MEASURED_NODES
    out: dict[int, Calibration] = {}
    for n in sorted({int(n) for n in workers}):
        nodes, rest = divmod(n, base.ranks)
        if rest or nodes < 2 or nodes == cal.nodes or n > horizon or nodes > most:
            continue
        at = with_fields(base, local_nodes=nodes, nnodes=nodes, global_batch=base.per_rank_batch * base.ranks * nodes)
        out[n] = calibrate_compute(cal, at, cells, batches=batches, repeats=cal.repeats)
        say(f"[{cells.study}] compute at {nodes} nodes: {lone_text(out[n])}{step_text(cal, n, nodes)}")
    return out
