"""Performance-model experiment (docs/model.md): calibrate the model on this machine, predict, validate.

    cal = calibrate(base, cells, batches=[8, 16, 32, 64])             # stored runs + a `bench comm` run
    table = predict_table(cal, PRESETS["10gbe"], [1, 2, 4, 8, 1024], mode="weak", batch=32, strategy="ddp")
    check = validate_measured(cal, runs)                               # predicted vs measured step time

Calibration (what the model needs) is in `calibration.py`, how it is measured in `calibrate.py`, fitted in `fit.py`;
the prediction table and the options in `table.py`, the validation in `validation.py`, the intervals in
`intervals.py`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from scalelab.analysis.hardware import Hardware
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab.base import Context, Result
from scalelab.lab.cells import Cell, with_fields
from scalelab.perf import modelerror
from scalelab.perf.calibrate import calibrate, compute_at_nodes, lone_text
from scalelab.perf.calibration import MEASURED, Calibration, calibration_path, own_scales_text
from scalelab.perf.choice import recommendation
from scalelab.perf.horizon import (
    HORIZON,
    extrapolated,
    host_cores,
    measured_scale,
    reach,
    unseen_share,
)
from scalelab.perf.modelerror import seen_shares
from scalelab.perf.sharedhost import applies, step_text
from scalelab.perf.table import (
    compute_origin,
    efficiency_threshold,
    options_for_efficiency,
    predict_table,
    resolve_hardware,
    row_label,
)
from scalelab.perf.validation import INTERVALS, VALIDATION_COLUMNS, validate_measured, validation_text
from scalelab.run.slurmnodes import allocation, uses_slurm

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
