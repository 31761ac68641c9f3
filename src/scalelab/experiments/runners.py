"""One adapter per experiment: from a study spec to the experiment's own function (resumable through the store).

Each adapter is `run(spec, store, out_dir, say) -> ExperimentResult`; the study names its sub-studies
`<study>/<experiment>` so every experiment resumes on its own.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from scalelab.experiments import basic
from scalelab.experiments.basic import ExperimentResult
from scalelab.store import RunDir, Store

Say = Callable[[str], None]


def _profile(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    return basic.profile(spec.config("profile"), store, spec.name, out, say=say)


def _batch_sweep(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    return basic.batch_sweep(spec.config("batch_sweep"), spec.option("batch_sweep", "batches", [32, 64, 128]),
                             store, spec.name, out, say=say)


def _max_batch(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments.maxbatch import max_batch_table

    return max_batch_table(spec.config("max_batch"), store, spec.name, out,
                           memory_limit=spec.option("max_batch", "memory_limit", None),
                           segments=spec.option("max_batch", "segments", 2),
                           variants=tuple(spec.option("max_batch", "variants", ("base", "amp", "checkpointing"))),
                           say=say)


def _scale(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments.scaling import scale

    return scale(spec.config("scale"), spec.option("scale", "workers", [1, 2]),
                 spec.option("scale", "batches", [64]), store, spec.name, out,
                 modes=tuple(spec.option("scale", "modes", ("strong", "weak"))), say=say)


def _loader(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    return basic.loader_sweep(spec.config("loader"), spec.option("loader", "workers", [0, 1, 2]), store, spec.name,
                              out, pin_memory=spec.option("loader", "pin_memory", [False]),
                              prefetch=spec.option("loader", "prefetch", [2]), say=say)


def _amp(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    return basic.precision(spec.config("amp"), store, spec.name, out, say=say)


def _checkpointing(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    return basic.checkpointing(spec.config("checkpointing"), spec.option("checkpointing", "segments", [0, 2]),
                               store, spec.name, out, say=say)


def _lr_scaling(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments.lrscaling import lr_scaling

    o = spec.options.get("lr_scaling", {})
    return lr_scaling(spec.config("lr_scaling"), o.get("batches", [32, 256]), o.get("rules", ["none", "linear"]),
                      o.get("workers", [1]), store, spec.name, out, target=o.get("target", 0.9), say=say)


def _strategies(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments import compare

    return compare.strategies(spec.config("strategies"), store, spec.name, out,
                              names=spec.option("strategies", "names", None),
                              accumulate=spec.option("strategies", "accumulate", 2), say=say)


def _backends(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments import compare

    return compare.backends(spec.config("backends"), store, spec.name, out, say=say)


def _comm(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    """The collective microbenchmark; a finished run of the same config in this study is reused."""
    import shutil

    from scalelab.experiments.grid import REPLAY, write_table
    from scalelab.measure.commbench import CommBenchConfig, read_results
    from scalelab.run.execute import run_commbench

    o = {k: v for k, v in spec.options.get("comm", {}).items() if k != "set"}
    cfg = CommBenchConfig(**o)
    cfg_dict = {**cfg.to_dict(), "backend": cfg.resolved_backend}
    study = f"{spec.name}/comm"
    run_dir = None
    for run_id in store.list_runs(study=study, kind="bench", status="completed")["run_id"]:
        if store.get(run_id)["config"] == cfg_dict:
            run_dir = store.run_dir(run_id)
            say(f"[{study}] already done ({run_id}), skipped")
            break
    if run_dir is None:
        if REPLAY.get():
            return ExperimentResult("comm", {"comm": pd.DataFrame()}, notes={"missing": study})
        run_dir = run_commbench(cfg, store, study=study, say=say).run_dir
    table = read_results(run_dir)
    paths = write_table(table, out, "comm")
    figure = out / "comm_busbw.png"
    shutil.copyfile(RunDir(run_dir).busbw_plot, figure)
    return ExperimentResult("comm", {"comm": table}, [paths["csv"], paths["json"], figure],
                            {"run": run_dir.name})


def _predict(spec, store: Store, out: Path, say: Say) -> ExperimentResult:
    from scalelab.experiments.prediction import run_prediction

    o = spec.options.get("predict", {})
    base = spec.config("predict")
    return run_prediction(base, store, f"{spec.name}/predict", out, hardware=o.get("hardware", ["measured"]),
                          workers=o.get("workers", [1, 2, 4, 8, 64, 512, 4096]), mode=o.get("mode", "weak"),
                          batch=o.get("batch", base.per_rank_batch), strategy=o.get("strategy", "ddp"),
                          bucket_mb=base.bucket_mb, target=o.get("target", 0.5),
                          calibration_batches=o.get("calibration_batches", [16, 32, 64]),
                          validate=o.get("validate", True), say=say)


RUNNERS: dict[str, Callable[..., ExperimentResult]] = {
    "predict": _predict,
    "strategies": _strategies,
    "backends": _backends,
    "comm": _comm,
    "profile": _profile,
    "batch_sweep": _batch_sweep,
    "max_batch": _max_batch,
    "scale": _scale,
    "loader": _loader,
    "amp": _amp,
    "checkpointing": _checkpointing,
    "lr_scaling": _lr_scaling,
}
