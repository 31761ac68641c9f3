"""The prediction table (pure, from one calibration): per hardware and worker count the model's step with its
95 % and 50 % intervals, its throughput, speedup and efficiency (at most n and 1: `intervals.efficiency_interval`),
and the options that keep a target efficiency at one worker count, each with its efficiency's interval. The
experiment that calibrates, validates and writes them is `prediction.py`.

    table = predict_table(cal, PRESETS["10gbe"], [1, 2, 4, 8, 1024], mode="weak", batch=32, strategy="ddp")
    options = options_for_efficiency(cal, PRESETS["10gbe"], 64, per_rank_batches=[32, 64, 128])
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence

import pandas as pd

from scalelab.analysis.hardware import Hardware, placement
from scalelab.errors import ConfigError
from scalelab.perf import modelerror
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import MEASURED, Calibration
from scalelab.perf.hardware import hardware_from_dict, presets
from scalelab.perf.intervals import efficiency_interval, intervals, step_quantiles
from scalelab.perf.sharedhost import applies



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
