"""`scalelab predict`: calibrate the performance model on this machine, predict step time, speedup and efficiency
on more workers and other hardware, and check the model against measured runs.

    scalelab predict --model cnn                                   # measured, 10gbe, ib_hdr, nvlink3; weak
    scalelab predict --model resnet18 --hardware 100gbe --hardware nvlink3 --per-rank-batch 64
    scalelab predict --mode strong --global-batch 8192 --workers 1,2,4,8,16,32,64,128,256,512,1024
    scalelab predict --hardware-file cluster.yaml --sync allreduce --target-efficiency 0.7
    scalelab predict --net-latency-ms 5 --net-bandwidth-gbps 1 --sync bucketed    # validate on an emulated network
    scalelab predict --from gpubox-store --hardware nvlink3 --workers 1,8,64    # runs copied from another machine

Every config field is a flag as in `scalelab train`, except the three predict reads itself: --global-batch (strong
mode's batch), --sync (the strategy to predict) and --bucket-mb; set the base config's with --set or the YAML file.
The calibration (runs without sync at several per-rank batches, in-situ allreduce and bucketed runs with 2+ ranks,
in-situ gather/scatter runs when --sync gather_scatter is predicted, a `bench comm` allreduce sweep) is stored in the
study and reused; `--no-validate` skips the measured runs of the chosen sync.

With --from DIR, nothing runs: compute (and α, β when a `bench comm` run is there) comes from the stored runs in DIR
(perf/elsewhere.py). Rows pairing compute measured on one device with another hardware's links say so:
"compute of this machine on <hardware>", "compute of <device> (host <h>) on <hardware>".
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Optional

import typer

from scalelab.cli.tables import print_fitted
from scalelab.cli.common import console, experiment_context, run_failed, store_and_out
from scalelab.cli.options import KEYWORD, config_params, config_values, merge, parse_sets, place_params
from scalelab.config import load_yaml
from scalelab.errors import ConfigError
from scalelab.lab.base import int_list
from scalelab.lab.registry import get as get_experiment
from scalelab.perf.calibration import MEASURED
from scalelab.perf.elsewhere import calibrate_from, largest_batch, predict_from, stored_runs
from scalelab.perf.hardware import hardware_from_dict, presets
from scalelab.perf.horizon import HORIZON
from scalelab.perf.perfmodel import COMPRESSION, modelled_syncs
from scalelab.perf.prediction import run_prediction
from scalelab.perf.table import resolve_hardware
from scalelab.run.execute import RunFailed
from scalelab.sync import registry as sync_registry

DEFAULT_WORKERS = [2**k for k in range(13)]  # 1 .. 4096
DEFAULT_HARDWARE = ["measured", "10gbe", "ib_hdr", "nvlink3"]
DEFAULTS = {"ranks": 2, "steps": 20}  # per calibration run, below the YAML file, --set and flags
# the prediction as printed, one table per hardware: columns in this order, kept in WANTED's while they fit the
# terminal (cli/tables.py); every column of prediction.csv with --wide
SHOWN = ["workers", "step(ms)", "95 % (ms)", "efficiency", "extrapolation", "speedup", "nodes", "per_rank_batch",
         "compute(ms)", "exposed_comm(ms)", "50 % (ms)", "sampling ±%", "model ±%"]
WANTED = ["workers", "step(ms)", "95 % (ms)", "efficiency", "extrapolation", "speedup", "nodes", "exposed_comm(ms)",
          "compute(ms)", "per_rank_batch", "50 % (ms)", "sampling ±%", "model ±%"]
VALIDATION_SHOWN = ["sync", "per_rank_batch", "network", "sample", "predicted", "95 % (ms)", "measured", "error(%)",
                    "inside", "50 % (ms)", "inside50", "compute(ms)", "exposed_comm(ms)", "refused"]
VALIDATION_WANTED = ["per_rank_batch", "sample", "predicted", "95 % (ms)", "measured", "error(%)", "inside", "sync",
                     "50 % (ms)", "inside50", "network", "compute(ms)", "exposed_comm(ms)", "refused"]


def predictable_syncs() -> tuple[str, ...]:
    """The sync strategies `predict` models and measures: every registered one with a cost, except noop."""

    return tuple(s for s in modelled_syncs() if s != "noop")


def check_choice(field: str, value: str, allowed) -> str:
    if value not in allowed:
        raise ConfigError(field, value, f"allowed: {', '.join(allowed)}")
    return value


def default_calibration_batches(per_rank: int, accumulate: int) -> list[int]:
    """b/4, b/2, 2b (rounded to multiples of accumulate, at least two different values): not b itself, so that
    the validation's run at the base's batch b is held out (the fit never saw that batch)."""
    out = sorted({max(accumulate, int(per_rank * f) // accumulate * accumulate) for f in (0.25, 0.5, 2)} - {per_rank})
    return out if len(out) > 1 else [accumulate, 2 * accumulate, 4 * accumulate]


def shown_rows(table, limit: int = 8):
    """At most `limit` worker counts per hardware, spread over the list (first and last always)."""
    counts = sorted(table["workers"].unique())
    step = max(1, -(-len(counts) // limit))
    keep = set(counts[::step]) | {counts[-1]}
    return table[table["workers"].isin(keep)]


def own(name: str, annotation: Any, option: Any) -> inspect.Parameter:
    return inspect.Parameter(name, KEYWORD, annotation=annotation, default=option)


PREDICT_OPTIONS = [
    own("workers", Optional[str], typer.Option(None, help="Worker counts to predict (default 1,2,4,...,4096).")),
    own("gpus_per_node", Optional[int], typer.Option(None, "--gpus-per-node", help="Ranks per node for every "
                                                     "hardware (default: the preset's; 1 for measured).")),
    own("hardware", Optional[list[str]], typer.Option(None, "--hardware", help="Hardware preset (repeatable): "
        f"measured (this machine's fit), {', '.join(presets.names())}. Default: {', '.join(DEFAULT_HARDWARE)}.")),
    own("hardware_file", Optional[Path], typer.Option(None, "--hardware-file", help="YAML hardware: preset, "
        "intra/inter links, latency_*(us), bandwidth_*(GB/s), gpus_per_node, overlap (0..1).")),
    own("mode", str, typer.Option("weak", help="strong (global batch fixed) or weak (per-rank batch fixed).")),
    own("global_batch", Optional[int], typer.Option(None, "--global-batch", help="Strong mode: the global batch "
                                                    "(default: the config's).")),
    own("per_rank_batch", Optional[int], typer.Option(None, "--per-rank-batch", help="Weak mode: the per-rank batch "
                                                      "(default: the config's).")),
    own("sync", str, typer.Option("ddp", help="Gradient sync the model predicts: " + ", ".join(
        s for s in sync_registry.names() if sync_registry.get(s).cost is not None and s != "noop") + ".")),
    own("bucket_mb", Optional[float], typer.Option(None, "--bucket-mb", help="Bucket size in MiB (default: the "
                                                   "config's).")),
    own("compression", str, typer.Option("none", help="Gradient compression on the wire: none, fp16 or bf16.")),
    own("target_efficiency", float, typer.Option(0.5, "--target-efficiency", help="Efficiency the options must "
                                                 "keep.")),
    own("calibration_batches", Optional[str], typer.Option(None, "--calibration-batches", help="Per-rank batches "
                                                           "of the compute runs (default b/4, b/2, b, 2b).")),
    own("validate", bool, typer.Option(True, "--validate/--no-validate", help="Measure the sync at the calibration "
                                       "batches on this machine and compare with the prediction (with --from: "
                                       "compare with the stored runs of the sync).")),
    own("wide", bool, typer.Option(False, "--wide", help="Every column and every note in full, however wide.")),
    own("from_", Optional[Path], typer.Option(None, "--from", help="Calibrate from runs measured elsewhere and "
        "start no process: a run directory, a store, a study directory or a folder of runs copied from another "
        "machine. Needs runs without sync (1 rank, --sync noop or --noop-collectives) at 2+ per-rank batches; "
        "--hardware measured also a `bench comm` run. Default hardware: 10gbe, ib_hdr, nvlink3 (and measured "
        "when a bench run is there); default per-rank batch: the largest measured.")),
]
OWN = {p.name for p in PREDICT_OPTIONS}


def predict_cmd(**kw) -> None:
    """Predict step time, speedup and efficiency for more workers and other hardware from measurements here."""

    mode, sync, workers = kw["mode"], kw["sync"], kw["workers"]
    global_batch, per_rank_batch, bucket_mb = kw["global_batch"], kw["per_rank_batch"], kw["bucket_mb"]
    # every input is checked before anything runs
    flags = {k: v for k, v in config_values(kw).items() if k not in OWN}
    base = merge(DEFAULTS, kw["config"], kw["set_"], flags)
    check_choice("mode", mode, ("strong", "weak"))
    check_choice("sync", sync, predictable_syncs())
    check_choice("compression", kw["compression"], tuple(COMPRESSION))
    if not 0 < kw["target_efficiency"] <= 1:
        raise ConfigError("target_efficiency", kw["target_efficiency"], "allowed: a number in (0, 1]")
    names = kw["hardware"] if kw["hardware"] else ([] if kw["hardware_file"] else DEFAULT_HARDWARE)
    for name in names:
        check_choice("hardware", name, (MEASURED, *presets.names()))
    hw_file = load_yaml(kw["hardware_file"]) if kw["hardware_file"] else None
    if hw_file is not None:
        hardware_from_dict(hw_file)
    if kw["gpus_per_node"] is not None and kw["gpus_per_node"] < 1:
        raise ConfigError("gpus_per_node", kw["gpus_per_node"], "allowed: an integer >= 1")
    if bucket_mb is not None and bucket_mb <= 0:
        raise ConfigError("bucket_mb", bucket_mb, "allowed: a number of MiB > 0")
    counts = int_list(workers, "workers") if workers else list(DEFAULT_WORKERS)
    if min(counts) < 1:
        raise ConfigError("workers", workers, "allowed: worker counts >= 1, e.g. 1,2,4,8")
    cal = runs = None
    if kw["from_"] is not None:  # the calibration is read, not measured: it decides the defaults below
        cal, runs, names = calibrated_elsewhere(kw, flags, names)
    accumulate = cal.accumulate if cal else base.accumulate
    if mode == "strong":
        if per_rank_batch is not None:
            raise ConfigError("per_rank_batch", per_rank_batch, "allowed only with --mode weak (use --global-batch)")
        batch = global_batch if global_batch is not None else base.global_batch
        most = batch // accumulate
        if workers is None:  # the default list stops where a rank would get less than one sample
            counts = [n for n in counts if n <= most]
        elif max(counts) > most:
            raise ConfigError("workers", max(counts), f"strong scaling with global batch {batch} allows at most "
                                                      f"{most} workers")
    else:
        if global_batch is not None:
            raise ConfigError("global_batch", global_batch, "allowed only with --mode strong (use --per-rank-batch)")
        default = largest_batch(cal) if cal else base.per_rank_batch
        batch = per_rank_batch if per_rank_batch is not None else default
    if batch < 1:
        raise ConfigError("per_rank_batch" if mode == "weak" else "global_batch", batch, "allowed: an integer >= 1")
    if cal is not None:

        hws = resolve_hardware(names, cal, file=hw_file, gpus_per_node=kw["gpus_per_node"])
        st, out_dir = store_and_out(kw["store"], kw["study"], kw["out"])
        result = predict_from(cal, runs, hardware=hws, workers=counts, mode=mode, batch=batch, strategy=sync,
                              bucket_mb=bucket_mb if bucket_mb is not None else base.bucket_mb,
                              compression=kw["compression"], target=kw["target_efficiency"],
                              validate=kw["validate"], out_dir=out_dir, say=console.print)
        get_experiment("predict").write(result, out_dir)
        show(result, wide=kw["wide"])
        return
    cal_batches = (int_list(kw["calibration_batches"], "calibration_batches") if kw["calibration_batches"]
                   else default_calibration_batches(base.per_rank_batch, base.accumulate))
    st, out_dir = store_and_out(kw["store"], kw["study"], kw["out"])
    try:
        result = run_prediction(experiment_context(st, kw["study"], out_dir, console.print), base, hardware=names,
                                hardware_file=hw_file, gpus_per_node=kw["gpus_per_node"], workers=counts, mode=mode,
                                batch=batch, strategy=sync,
                                bucket_mb=bucket_mb if bucket_mb is not None else base.bucket_mb,
                                compression=kw["compression"], target=kw["target_efficiency"],
                                calibration_batches=cal_batches, validate=kw["validate"], say=console.print)
    except RunFailed as err:
        raise run_failed(err)
    get_experiment("predict").write(result, out_dir)
    show(result, wide=kw["wide"])


def calibrated_elsewhere(kw: dict, flags: dict, names: list[str]):
    """(calibration, stored runs, hardware names) for --from: the hardware defaults to DEFAULT_HARDWARE's presets,
    plus measured when the runs hold a bench of the compute's host. Nothing is launched."""

    if kw["calibration_batches"]:
        raise ConfigError("calibration_batches", kw["calibration_batches"], "allowed only without --from (the "
                          "batches are those of the stored runs)")
    chosen = bool(kw["hardware"] or kw["hardware_file"])
    given = {**(load_yaml(kw["config"]) if kw["config"] else {}), **parse_sets(kw["set_"]), **flags}
    runs = stored_runs(kw["from_"])
    cal = calibrate_from(runs, source=kw["from_"], model=given.get("model"), dataset=given.get("dataset"),
                         links=True if chosen and MEASURED in names else None)  # a bench also validates
    if not chosen:
        names = [n for n in DEFAULT_HARDWARE if n != MEASURED or cal.bench_run]
    return cal, runs, names


predict_cmd.__signature__ = inspect.Signature([
    *PREDICT_OPTIONS, *config_params(skip=OWN, renamed={"--strategy": "--sync"}), *place_params("predict")])


def show(result, *, wide: bool = False) -> None:
    """The prediction a person reads first, in the terminal's width: per hardware its worker counts, step with its
    95 % interval, efficiency and whether it is extrapolation (cli/tables.py keeps what fits); the validation
    likewise; then the notes as a short list. `wide`: every column and every note in full."""
    pred = result.tables["prediction"]
    console.rule(f"prediction ({pred['mode'].iloc[0]} scaling, {pred['strategy'].iloc[0]}, "
                 f"compression {pred['compression'].iloc[0]})")
    rows = pred if wide else shown_rows(pred)
    for hw, group in rows.groupby("hardware", sort=False):
        console.print(f"{hw} ({group['checked'].iloc[0]})", markup=False, highlight=False)
        print_fitted(console, printed(group), order=SHOWN, wanted=WANTED, wide=wide,
                            keep=("workers",), elsewhere="--wide, and prediction.csv")
    if "validation" in result.tables:
        where = result.meta.get("compute_of", "this machine")
        console.rule(f"validation: predicted vs measured median step (ms) on {where}")
        print_fitted(console, printed(result.tables["validation"], point="predicted", low="predicted_ci_low",
                                             high="predicted_ci_high", low50="predicted_ci50_low",
                                             high50="predicted_ci50_high"),
                            order=VALIDATION_SHOWN, wanted=VALIDATION_WANTED, wide=wide,
                            keep=("per_rank_batch",), elsewhere="--wide, and validation.csv")
    console.print("notes" + ("" if wide else " (in full: --wide)") + ":", highlight=False)
    for line in (full_notes(result.notes) if wide else brief_notes(result)):
        console.print(f"- {line}", markup=False, highlight=False)
    console.print("wrote " + ", ".join(str(p) for p in result.files), highlight=False)


def number(value) -> str:
    """A figure as printed: 4 significant digits, thousands separated; nothing for a missing one."""
    return "" if value is None or value != value else "{:,.4g}".format(value)


def printed(frame, *, point: str = "step(ms)", low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)",
            low50: str = "step_ci50_low(ms)", high50: str = "step_ci50_high(ms)"):
    """`frame` with its figures as text and each interval in one column ("41.2–55.0"; nothing without one)."""
    def span(lo, hi) -> str:
        return "" if lo != lo or hi != hi else f"{number(lo)}–{number(hi)}"

    out = frame.assign(**{"95 % (ms)": [span(a, b) for a, b in zip(frame[low], frame[high])],
                          "50 % (ms)": [span(a, b) for a, b in zip(frame[low50], frame[high50])]})
    if "efficiency" in out:
        out["efficiency"] = [f"{100 * e:.0f} %" for e in out["efficiency"]]
    if "extrapolation" in out:
        out["extrapolation"] = ["yes" if bool(x) else "" for x in out["extrapolation"]]
    for col in ("sampling_half_width(%)", "model_half_width(%)"):
        if col in out:
            out[col.split("_")[0] + " ±%"] = [number(v) for v in out[col]]
    for col in (point, "measured", "compute(ms)", "exposed_comm(ms)", "speedup", "per_rank_batch", "error(%)"):
        if col in out:
            out[col] = [number(v) for v in out[col]]
    return out.astype(object).where(out.notna(), "")


def full_notes(notes: dict) -> list[str]:
    """Every note in full, one entry per note (and per hardware where a note has one per hardware)."""
    out = []
    for key, value in notes.items():
        out += [f"{key}: {hw}: {text}" for hw, text in value.items()] if isinstance(value, dict) else [
            f"{key}: {value}"]
    return out


def brief_notes(result) -> list[str]:
    """The notes as a short list: what keeps the target, where efficiency falls below 50 %, the horizon, the
    compute baseline, the validation's coverage."""
    meta, notes, out = result.meta, result.notes, []
    keep = next((k for k in notes if k.startswith("to keep")), None)
    for hw, text in (notes.get(keep) or {}).items():
        out.append(f"{keep} ({hw}): {text}")
    for hw, text in (notes.get("efficiency < 50 % from") or {}).items():
        out.append(f"efficiency < 50 % ({hw}): from {text}" if text[0].isdigit() else
                   f"efficiency < 50 % ({hw}): {text}")
    if "horizon" in meta:
        out.append(f"extrapolation (marked): beyond {meta['horizon']:g} workers ({HORIZON}x the "
                   f"{meta['scale']:g} measured)"
                   + (f", or more than {100 * meta['shares'][1]:.0f} % of the step in communication"
                      if meta.get("shares") else ""))
    if meta.get("baseline"):
        out.append(meta["baseline"])
    val = result.tables.get("validation")
    if val is not None and len(val):
        held = val[val["sample"] != "in-sample"] if "sample" in val else val
        part = held if len(held) else val
        inside = part["inside"].dropna()
        out.append(f"validation ({'held out' if len(held) else 'in-sample only'}): {len(part)} run(s), median "
                   f"|error| {part['error(%)'].abs().median():.1f} %, "
                   + (f"inside the 95 % interval {int(inside.sum())} of {len(inside)}" if len(inside)
                      else "no interval"))
    elif "validation" in notes:
        out.append(f"validation: {notes['validation']}")
    return out
