"""Performance-model experiment (docs/model.md): calibrate the model on this machine, predict, validate.

    cal = calibrate(base, cells, batches=[8, 16, 32, 64])             # stored runs + a `bench comm` run
    table = predict_table(cal, PRESETS["10gbe"], [1, 2, 4, 8, 1024], mode="weak", batch=32, strategy="ddp")
    check = validate_measured(cal, runs)                               # predicted vs measured step time

Calibration (what the model needs) is in `calibration.py`, how it is measured in `calibrate.py`, fitted in `fit.py`;
the validation in `validation.py`, the intervals in `intervals.py`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from scalelab.analysis.hardware import Hardware, placement
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Context, Result
from scalelab.lab.cells import Cell, with_fields
from scalelab.perf import modelerror
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibrate import calibrate, compute_at_nodes, lone_text
from scalelab.perf.calibration import MEASURED, Calibration, calibration_path, own_scales_text
from scalelab.perf.choice import recommendation
from scalelab.perf.hardware import hardware_from_dict, presets
from scalelab.perf.horizon import (
    HORIZON,
    extrapolated,
    host_cores,
    measured_scale,
    reach,
    unseen_share,
)
from scalelab.perf.intervals import efficiency_interval, intervals, step_quantiles
from scalelab.perf.modelerror import seen_shares
from scalelab.perf.sharedhost import applies, step_text
from scalelab.perf.validation import INTERVALS, VALIDATION_COLUMNS, validate_measured, validation_text
from scalelab.run.slurmnodes import allocation, uses_slurm

# ---------------------------------------------------------------- prediction


def resolve_hardware(names: Sequence[str], cal: Calibration, *, file: dict | None = None,
                     gpus_per_node: int | None = None) -> list[Hardware]:
    """Hardware presets by name (the `presets` registry plus "measured" = this machine's fit), then the one of
    `file` (`hardware_from_dict`); `gpus_per_node` overrides every preset's node size."""
    allowed = ", ".join((MEASURED, *presets.names()))
    out = []
    for name in names:
        if name == MEASURED:
            if not cal.bench_run:
                raise ConfigError("hardware", MEASURED, "needs a `bench comm` allreduce run to fit α and β; give "
                                  f"a preset ({', '.join(presets.names())}) or --hardware-file")
            out.append(cal.hardware(gpus_per_node or 1))
            continue
        if name not in presets.names():
            raise ConfigError("hardware", name, f"allowed: {allowed}")
        out.append(presets.get(name).hardware)
    if file is not None:
        out.append(hardware_from_dict(file))
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise ConfigError("gpus_per_node", gpus_per_node, "allowed: an integer >= 1")
        out = [dataclasses.replace(h, gpus_per_node=gpus_per_node) for h in out]
    if not out:
        raise ConfigError("hardware", list(names), f"give at least one of {allowed}")
    return out


def compute_origin(cal: Calibration) -> str:
    """Where the calibration's compute was measured: "this machine", or "<device> (host <h>)" for runs measured
    elsewhere (`predict --from`)."""
    return "this machine" if cal.host is None else f"{cal.device or 'unknown device'} (host {cal.host})"


# an accelerator model as device and preset names write it: A100 in "NVIDIA A100-SXM4-80GB" and in "NVLink 3 (A100)"
_ACCELERATOR = re.compile(r"\b[A-Z]{1,2}\d{2,4}[A-Z]?\b")


def same_device(device: str, hw: Hardware) -> bool:
    """Whether `hw` is hardware of the kind the compute ran on: the accelerator model in `device` is a word of the
    hardware's name (the nvlink3 preset names its A100). A CPU, and a network preset that names no device, never
    are: their rows pair compute measured elsewhere with links that were not measured."""
    return bool(set(_ACCELERATOR.findall(device)) & set(re.findall(r"\w+", hw.name)))


def row_label(cal: Calibration, hw: Hardware) -> str:
    """The hardware column of a prediction row: the calibration's own measured hardware, and hardware of the
    compute's kind, keep their name; any other hardware says whose compute it pairs with its links ("compute of
    this machine on NVLink 3 (A100) ..."), so no row reads as a cluster that was measured."""
    if hw.name == cal.hardware().name or same_device(cal.device, hw):
        return hw.name
    return f"compute of {compute_origin(cal)} on {hw.name}"


def compute_scale(cal: Calibration, hw: Hardware) -> float:
    """cal.compute_scale for this machine's own hardware ("measured"), 1 for any other."""
    return cal.compute_scale if hw.name == cal.hardware().name else 1.0


def compute_models(cal: Calibration, hw: Hardware) -> dict:
    """The compute `perfmodel.predict` takes for `hw`: this machine's own hardware is its ranks sharing this host
    (the calibration's compute, slowdown included) with one rank alone as the one-worker baseline; any other
    hardware (a preset, a file) has one rank per node or device, so every rank computes as one rank alone."""
    if hw.name == cal.hardware().name:
        return {"model": cal.compute_model(), "alone": cal.lone_model()}
    return {"model": cal.lone_model()}


def for_strategy(cal: Calibration, hw: Hardware, strategy: str) -> Hardware:
    """`hw` as `strategy` sees it: this machine's own hardware with the strategy's in-training scale
    (`Calibration.scale_for`), any other unchanged."""
    if hw.name != cal.hardware().name:
        return hw
    return cal.hardware(hw.gpus_per_node, strategy=strategy)


def predict_table(cal: Calibration, hardware: Hardware | Sequence[Hardware], workers: Sequence[int], *,
                  mode: str = "weak", batch: float, strategy: str = "ddp", bucket_mb: float = 25.0,
                  compression: str = "none", accumulate: int = 1, emulation: pm.Emulation | None = None,
                  at: Mapping[int, Calibration] | None = None) -> pd.DataFrame:
    """`perfmodel.predict` per hardware, stacked: pm.COLUMNS plus hardware (`row_label`), strategy, mode, compression.
    `batch` is the global batch in strong mode and the per-rank batch in weak mode. `at`: per worker count, the
    calibration with its compute measured at that count's node count (`calibrate.calibrate_compute`), for this
    machine's own rows: namespace nodes sharing this host compute as they do at that count."""
    if bucket_mb <= 0:
        raise ConfigError("bucket_mb", bucket_mb, "allowed: a number of MiB > 0")
    frames = []
    for hw in [hardware] if isinstance(hardware, Hardware) else hardware:
        own = at if at and hw.name == cal.hardware().name else {}
        groups: dict[int, tuple[Calibration, list[int]]] = {}
        for n in workers:
            c = own.get(int(n), cal)
            groups.setdefault(id(c), (c, []))[1].append(int(n))
        parts = [hardware_rows(c, hw, ns, mode=mode, batch=batch, strategy=strategy, bucket_mb=bucket_mb,
                               compression=compression, accumulate=accumulate, emulation=emulation)
                 .assign(compute_nodes=c.compute_nodes or c.nodes) for c, ns in groups.values()]
        order = {int(n): i for i, n in enumerate(workers)}
        frame = pd.concat(parts, ignore_index=True)
        frame = frame.iloc[sorted(range(len(frame)), key=lambda i: order[int(frame["workers"].iloc[i])])]
        frames.append(frame.reset_index(drop=True).assign(hardware=row_label(cal, hw),
                                                          checked=hardware_checked(cal, hw)))
    return pd.concat(frames, ignore_index=True)


def hardware_rows(cal: Calibration, hw: Hardware, workers: Sequence[int], *, mode: str, batch: float, strategy: str,
                  bucket_mb: float, compression: str, accumulate: int,
                  emulation: pm.Emulation | None) -> pd.DataFrame:
    """`predict_table`'s rows of one hardware from one calibration, with their intervals."""
    batches = {"global_batch": batch} if mode == "strong" else {"per_rank_batch": batch}

    def steps(c: Calibration) -> pd.DataFrame:
        return pm.predict(hardware=for_strategy(c, hw, strategy), workers=workers, param_bytes=c.param_bytes,
                          mode=mode, strategy=strategy, bucket_bytes=bucket_mb * pm.MIB, compression=compression,
                          accumulate=accumulate, emulation=emulation, compute_scale=compute_scale(c, hw),
                          **compute_models(c, hw), **batches)

    frame = steps(cal)
    # the strategy's calibration bias belongs to this machine's own figures (perf/modelerror.py): a preset
    # or a hardware file gets the spread alone; one worker does not communicate, so it has no bias
    own = hardware_checked(cal, hw) == CHECKED
    parts = intervals(cal, frame["step(ms)"].tolist(),
                      step_quantiles(cal, lambda c: steps(c)["step(ms)"].tolist(), len(frame)),
                      strategy=strategy, bias=own,
                      in_flight=modelerror.concurrent(cal, {"sync": strategy, "bucket_mb": bucket_mb}),
                      step=[own and applies(cal, int(n), int(k)) for n, k in zip(frame["workers"], frame["nodes"])])
    factor = pd.Series([p / s if n > 1 else 1.0 for p, s, n in
                        zip(parts["point"], frame["step(ms)"], frame["workers"])], index=frame.index)
    unbiased = factor * frame["step(ms)"] / pd.Series(parts["point"], index=frame.index)  # 1 but for one worker
    for k in ("low", "high", "low50", "high50"):
        parts[k] = (pd.Series(parts[k], index=frame.index) * unbiased).tolist()
    ideal = frame["efficiency"] * frame["step(ms)"]  # per-rank batch / one lone rank's throughput
    frame = frame.assign(**{"step(ms)": frame["step(ms)"] * factor, pm.THROUGHPUT: frame[pm.THROUGHPUT] / factor})
    # efficiency and speedup at most 1 and n, their interval from the step's (`intervals.efficiency_interval`)
    bounded = [efficiency_interval(i, s, lo, hi) if n > 1 else (1.0, math.nan, math.nan) for i, s, lo, hi, n in
               zip(ideal, frame["step(ms)"], parts["low"], parts["high"], frame["workers"])]
    efficiency = pd.Series([b[0] for b in bounded], index=frame.index)
    frame = frame.assign(efficiency=efficiency, speedup=efficiency * frame["workers"],
                         efficiency_ci_low=[b[1] for b in bounded], efficiency_ci_high=[b[2] for b in bounded])
    return frame.assign(**{"step_ci_low(ms)": parts["low"], "step_ci_high(ms)": parts["high"],
                           "step_ci50_low(ms)": parts["low50"], "step_ci50_high(ms)": parts["high50"],
                           "sampling_half_width(%)": parts["sampling_half_width(%)"],
                           "model_half_width(%)": parts["model_half_width(%)"]},
                        strategy=strategy, mode=mode, compression=compression)


# Only the calibrated machine's own hardware was ever checked against runs; a preset or a hardware file was not
# (docs/model.md: a file describing a shaped namespace link, checked by benchmarks/prediction_nodes.py).
UNVALIDATED = "unvalidated (preset or file: compute scale 1, no in-situ scales)"


CHECKED = "calibrated here"


def hardware_checked(cal: Calibration, hw: Hardware) -> str:
    """The `checked` column: CHECKED for the calibration's own hardware, else UNVALIDATED."""
    return CHECKED if hw.name == cal.hardware().name else UNVALIDATED


def efficiency_threshold(table: pd.DataFrame, threshold: float = 0.5) -> dict[str, int | None]:
    """Per hardware: the smallest worker count whose predicted efficiency is below `threshold` (None: none)."""
    return {hw: pm.efficiency_threshold(group, threshold) for hw, group in table.groupby("hardware", sort=False)}


def options_for_efficiency(cal: Calibration, hardware: Hardware, workers: int, *, target: float = 0.5,
                           per_rank_batches: Sequence[float], strategies: Sequence[str] = pm.STRATEGIES[:-1],
                           bucket_mb: float = 25.0, compression: str = "none",
                           accumulate: int = 1) -> pd.DataFrame:
    """Which per-rank batch and strategy keep weak-scaling efficiency >= `target` at `workers` on `hardware`
    (`perfmodel.options_for_efficiency`: those meeting it first, smallest batch first), each efficiency with the
    95 % interval of its step (`option_intervals`)."""
    if not 0 < target <= 1:
        raise ConfigError("target_efficiency", target, "allowed: a number in (0, 1]")
    models = compute_models(cal, hardware)
    table = pm.options_for_efficiency(models.pop("model"), lambda s: for_strategy(cal, hardware, s), workers,
                                      target=target,
                                      per_rank_batches=per_rank_batches, strategies=strategies,
                                      param_bytes=cal.param_bytes, bucket_bytes=bucket_mb * pm.MIB,
                                      compression=compression, accumulate=accumulate,
                                      compute_scale=compute_scale(cal, hardware), **models)
    table = table.assign(**option_intervals(cal, hardware, workers, table, bucket_mb=bucket_mb,
                                            compression=compression, accumulate=accumulate))
    table["meets_target"] = table["efficiency"] >= target
    order = table.assign(_miss=~table["meets_target"], _eff=-table["efficiency"])
    order = order.sort_values(["_miss", "per_rank_batch", "_eff"], kind="stable")
    return order.drop(columns=["_miss", "_eff"]).reset_index(drop=True)


def option_intervals(cal: Calibration, hw: Hardware, workers: int, table: pd.DataFrame, *, bucket_mb: float,
                     compression: str, accumulate: int) -> dict[str, list[float]]:
    """Per option (row of `table`), its efficiency as the prediction table gives it (with the strategy's bias on
    this machine's own hardware) and its 95 % interval: the step's interval at `workers` (sampling and model error,
    `intervals`), carried to efficiency = one worker's step / the step, inversely, with the one-worker baseline at
    its point (it holds no communication, so no model error, and its sampling part moves every option alike)."""
    replicas, checked = cal.replicas(), hardware_checked(cal, hw) == CHECKED
    out = {k: [math.nan] * len(table) for k in ("efficiency", "efficiency_ci_low", "efficiency_ci_high")}
    rows = table.reset_index(drop=True)
    for strategy, group in rows.groupby("strategy", sort=False):
        def steps(c: Calibration, group: pd.DataFrame = group, strategy: str = strategy) -> list[float]:
            models, link = compute_models(c, hw), for_strategy(c, hw, strategy)
            return [pm.predicted_row(models["model"], link, workers, b, params=c.param_bytes, strategy=strategy,
                                     bucket_bytes=bucket_mb * pm.MIB, compression=compression, accumulate=accumulate,
                                     algorithm=None, emulation=None, compute_scale=compute_scale(c, hw),
                                     alone=models.get("alone"))["step(ms)"] for b in group["per_rank_batch"]]

        points = group["step(ms)"].tolist()
        shared = checked and applies(cal, workers, placement(workers, hw.gpus_per_node)[0])
        c = intervals(cal, points, step_quantiles(cal, steps, len(group), replicas), strategy=strategy, bias=checked,
                      in_flight=modelerror.concurrent(cal, {"sync": strategy, "bucket_mb": bucket_mb}),
                      step=[shared] * len(points))
        for j, (i, step) in enumerate(zip(group.index, points)):
            ideal = rows.loc[i, "efficiency"] * step  # efficiency × step: fixed by the one-worker baseline
            if workers > 1:  # at most 1, the interval from the step's (`intervals.efficiency_interval`)
                (out["efficiency"][i], out["efficiency_ci_low"][i],
                 out["efficiency_ci_high"][i]) = efficiency_interval(ideal, c["point"][j], c["low"][j], c["high"][j])
            else:
                out["efficiency"][i] = 1.0
    return out


# ---------------------------------------------------------------- the experiment


def validation_cells(base: TrainConfig, batches: Sequence[int], strategy: str, bucket_mb: float,
                     compression: str) -> tuple[list[Cell], str | None]:
    """The measured points of `run_prediction`: `strategy` on the base's ranks for each calibration batch (in-sample)
    and at the base's own per-rank batch (held out when the calibration did not measure it: the study's scale
    cell, reused), with the base's network emulation, over the base's nodes (ranks on each). ([], why) when nothing
    can be measured here."""
    batches = [*batches, int(base.per_rank_batch)]
    if base.world_size < 2:
        return [], "validation needs ranks >= 2 (one rank does not communicate)"
    if compression != "none" and strategy != "ddp":
        return [], f"compression {compression} is measured only with strategy ddp (as a DDP comm hook)"
    hook = compression if strategy == "ddp" else "none"
    return [Cell(f"{strategy}, per-rank batch {b}", with_fields(base, global_batch=b * base.world_size, sync=strategy,
                                                               wrapper="auto", bucket_mb=bucket_mb, ddp_hook=hook))
            for b in sorted(set(batches))], None


def held_out_nodes(base: TrainConfig, cells: Sequence[Cell]) -> list[Cell]:
    """Under --launcher slurm, when the allocation has more nodes than the calibration ran on: the validation's cell
    at the base's own per-rank batch once more across all of them. Its node count is one no calibration run used,
    so the validation marks it held out (`validation.sample_of`) and reports its error apart."""
    if not uses_slurm(base) or not cells:
        return []
    top = len(allocation().hosts)
    if top <= base.local_nodes:
        return []
    cell = next(c for c in cells if c.config.per_rank_batch == base.per_rank_batch)
    return [Cell(f"{cell.label}, {top} Slurm nodes (held out)",
                 with_fields(cell.config, local_nodes=top, nnodes=top,
                             global_batch=base.per_rank_batch * base.ranks * top))]


def run_prediction(ctx: Context, base: TrainConfig, *, hardware: Sequence[str],
                   hardware_file: dict | None = None, gpus_per_node: int | None = None, workers: Sequence[int],
                   mode: str = "weak", batch: float, strategy: str = "ddp", bucket_mb: float = 25.0,
                   compression: str = "none", target: float = 0.5, calibration_batches: Sequence[int],
                   validate: bool = True, say: Callable[[str], None] = print):
    """Calibrate (or reuse), predict per hardware, find where efficiency falls below 50 % and what keeps it
    >= `target` at the largest worker count, validate on measured runs of this machine; write tables and plots."""
    if not 0 < target <= 1:
        raise ConfigError("target_efficiency", target, "allowed: a number in (0, 1]")
    cal = calibrate(base, ctx.cells, batches=calibration_batches, say=say, strategies=[strategy])
    hws = resolve_hardware(hardware, cal, file=hardware_file, gpus_per_node=gpus_per_node)
    at = compute_at_nodes(cal, base, ctx.cells, workers, batches=calibration_batches, say=say,
                          horizon=HORIZON * measured_scale(cal.ranks, ())) if MEASURED in hardware else {}
    cells, why = validation_cells(base, calibration_batches, strategy, bucket_mb, compression)
    cells += held_out_nodes(base, cells)
    validation = (validate_measured(cal, ctx.cells.runs(ctx.cells.run(cells, group="validation")), say=say)
                  if validate and cells else pd.DataFrame(columns=VALIDATION_COLUMNS))
    return prediction_result(cal, hws, workers=workers, mode=mode, batch=batch, strategy=strategy,
                             bucket_mb=bucket_mb, compression=compression, target=target, validation=validation,
                             skipped=why if validate else None,
                             calibration=str(calibration_path(ctx.cells.store, ctx.cells.study)), at=at)


def apply_horizon(table: pd.DataFrame, cal: Calibration, validation: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The prediction table within the calibration's horizon (perf/horizon.py): the calibrated hardware's own rows
    of a one-host loopback calibration stop at the host's cores, and every row says whether it is `extrapolation`
    (beyond HORIZON x the largest measured scale, or this machine's namespace nodes at a count whose compute was
    not measured). Also the horizon's figures: the measured scale, its HORIZON x
    bound, the cores (None unless that cap applies) and the calibrated hardware's label."""
    validated = validation["workers"] if "workers" in validation and len(validation) else ()
    scale = measured_scale(cal.ranks, validated)
    own = row_label(cal, cal.hardware())
    cores = host_cores(cal.device, cal.host is None) if cal.nodes == 1 else None  # one host's loopback
    if cores is not None:
        table = table[~((table["hardware"] == own) & (table["workers"] > cores))].reset_index(drop=True)
    seen = seen_shares(cal)
    shares = table["exposed_comm(ms)"] / table["step(ms)"]
    # namespace nodes share this host: this machine's rows at a node count whose compute was not measured there
    # (`calibrate.compute_at_nodes`) rest on another count's compute
    unmeasured = ((table["hardware"] == own) & (cal.nodes > 1) & (table["nodes"] > 1)
                  & (table["compute_nodes"] != table["nodes"])) if "compute_nodes" in table else False
    beyond = pd.Series([extrapolated(int(w), scale) or unseen_share(s, seen)
                        for w, s in zip(table["workers"], shares)], index=table.index, dtype=bool)
    table = table.assign(extrapolation=beyond | unmeasured)
    return table, {"scale": scale, "horizon": HORIZON * scale, "cores": cores, "own": own, "shares": seen}


def shared_step_text(cal: Calibration, table: pd.DataFrame) -> str:
    """The shared-host step rule in words (`sharedhost.step_text`) for the most nodes of this machine's rows it
    applies to; "" where it applies to none."""
    own = table[table["hardware"] == row_label(cal, cal.hardware())]
    rows = [(int(n), int(k)) for n, k in zip(own["workers"], own["nodes"]) if applies(cal, int(n), int(k))]
    return step_text(cal, *max(rows, key=lambda r: r[1])) if rows else ""


def horizon_text(horizon: dict, top: int) -> str:
    """The horizon in words (the note, and the sentences' source)."""
    text = (f"predictions beyond {horizon['horizon']} workers ({HORIZON}x the largest measured scale, "
            f"{horizon['scale']} workers) are extrapolation, marked in the table's `extrapolation` column; no "
            "recommendation rests on them")
    if horizon["cores"] is not None and top > horizon["cores"]:
        text += (f"; {horizon['own']} is not predicted beyond {horizon['cores']} workers: its calibration ran over "
                 f"one host's loopback, which says nothing about more ranks than that host's {horizon['cores']} "
                 "cores")
    if horizon.get("shares"):
        high = horizon["shares"][1]
        text += (f"; so are predictions whose exposed communication is more than {100 * high:.0f} % of the step, "
                 "the most in any run the intervals' model-error term was estimated on (those rows may still carry a "
                 "recommendation)")
    return text


def prediction_result(cal: Calibration, hws: Sequence[Hardware], *, workers: Sequence[int], mode: str, batch: float,
                      strategy: str, bucket_mb: float, compression: str, target: float, validation: pd.DataFrame,
                      skipped: str | None, calibration: str, at: Mapping[int, Calibration] | None = None) -> Result:
    """The predict experiment's result from a calibration (made here or from runs measured elsewhere): the
    prediction per hardware within its horizon (`apply_horizon`), the options that keep `target` at each hardware's
    largest worker count that is not extrapolation (perf/horizon.py `reach`), the validation
    (`skipped`: why there is none), notes. `calibration` says where the calibration is."""
    table = predict_table(cal, hws, workers, mode=mode, batch=batch, strategy=strategy, bucket_mb=bucket_mb,
                          compression=compression, accumulate=cal.accumulate, at=at)
    table, horizon = apply_horizon(table, cal, validation)
    top = max(int(n) for n in workers)
    low = max(1.0, batch / top if mode == "strong" else batch)
    candidates = sorted({low * 2**k for k in range(8)})
    # what keeps the target is asked where the model is not extrapolating: each hardware's reach (perf/horizon.py)
    reaches = {row_label(cal, hw): reach(workers, horizon["scale"], horizon["cores"]
                                         if row_label(cal, hw) == horizon["own"] else None) for hw in hws}
    # the default per-rank batch at a hardware's reach: the batch itself (weak), the global batch's share (strong)
    defaults = {label: batch if mode == "weak" else max(1.0, batch / n) for label, n in reaches.items() if n}
    own = cal.hardware().name
    options = pd.concat([options_for_efficiency((at or {}).get(reaches[row_label(cal, hw)], cal)
                                                if hw.name == own else cal, hw, reaches[row_label(cal, hw)], target=target,
                                                per_rank_batches=sorted({*candidates, defaults[row_label(cal, hw)]}),
                                                bucket_mb=bucket_mb,
                                                compression=compression, accumulate=cal.accumulate)
                         .assign(hardware=row_label(cal, hw), workers=reaches[row_label(cal, hw)])
                         for hw in hws if reaches[row_label(cal, hw)] is not None] or [pd.DataFrame()],
                        ignore_index=True)
    below = efficiency_threshold(table, 0.5)
    links = (f"α = {cal.alpha_s * 1e6:.1f} µs, β⁻¹ = "
             f"{1 / cal.beta_s_per_byte / 1e9 if cal.beta_s_per_byte else float('inf'):.3g} GB/s from the bench"
             if cal.bench_run else "no bench: links from the hardware only")
    notes = {"calibration": f"{calibration} (compute of {compute_origin(cal)}; {links}; in training collectives "
                            f"×{cal.comm_scale:.2f}{own_scales_text(cal)}, compute ×{cal.compute_scale:.2f}, "
                            f"overlap {cal.overlap:.2f}; {lone_text(cal)}; "
                            f"{cal.parameters:,} parameters in {len(cal.param_bytes)} tensors"
                            f"{shared_step_text(cal, table)})",
             "efficiency < 50 % from": {hw: (f"{n} workers" + (" (extrapolation)" if extrapolated(n, horizon["scale"])
                                                               else "") if n else f"never up to {top} workers")
                                        for hw, n in below.items()},
             "horizon": horizon_text(horizon, top),
             f"to keep >= {target:.0%} within the horizon": {
                 hw: recommendation(group, int(group["workers"].iloc[0]), target, strategy=strategy,
                                    batch=defaults[hw])
                 for hw, group in options.groupby("hardware", sort=False)} if len(options) else {}}
    notes["intervals"] = INTERVALS + modelerror.describe(cal)
    if len(validation):
        notes["validation"] = validation_text(validation, compute_origin(cal))
    elif skipped:
        notes["validation"] = f"skipped: {skipped}"
    result = Result("predict", {"prediction": table, "options": options}, notes=notes,
                    meta={"mode": mode, "sync": strategy, "batch": batch, "compute_of": compute_origin(cal),
                          "baseline": lone_text(cal),
                          **horizon, "reach": reaches})
    if len(validation):
        result.tables["validation"] = validation
    return result
