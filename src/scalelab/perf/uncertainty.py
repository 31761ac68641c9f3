"""The calibration's own uncertainty, carried through the model: prediction intervals.

A calibration is fitted on a few launches of a few runs and a bench sweep, each a sample. To see how much the
fitted figures could move, the whole fit (`fit.fit`) is repeated REPLICATES times on data drawn again from
what was measured (a nonparametric bootstrap):
- every training cell: its launches drawn with replacement, then each drawn launch's timed steps drawn with
  replacement (the step median and the stage means recomputed from them, pooled over launches as one cell's
  launches are: `analysis.repeats.pool`);
- every bench size: its timed iterations drawn with replacement; the mean per iteration moves by their ratio.
Each refit (a replicate) keeps only the fitted figures (`FITTED`). A prediction made with every replicate gives a
distribution of step times; its percentiles are the sampling part of the 95 % and 50 % intervals
(`intervals.step_quantiles`). That part is the calibration's sampling uncertainty only: a model that is wrong in its
form is the model-error part's (`modelerror`), and a machine that changed between calibration and run is in
neither; the validation's coverage (how often the measured step falls inside) says how far they hold.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.summary import STAGE_COLUMNS, per_step, steps_frame
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import STAGES
from scalelab.perf.fit import compute_points, fit, fit_of

REPLICATES = 100
FITTED = ("compute", "alpha_s", "beta_s_per_byte", "host_alpha_s", "host_beta_s_per_byte", "veth_alpha_s",
          "veth_beta_s_per_byte", "comm_scale", "compute_scale", "overlap", "sync_scales", "lone")


def _steps(run: dict, cache: dict) -> "np.ndarray":
    """A launch's timed steps as rows [train(s), forward(s), backward(s), optimizer(s)] (read once)."""
    if run["run_id"] not in cache:
        steps = per_step(steps_frame(run["files"].read_steps()))
        cols = ["train(s)", *(c for c in STAGE_COLUMNS if c[:-3] in ("forward", "backward", "optimizer"))]
        cache[run["run_id"]] = steps[cols].to_numpy(float)
    return cache[run["run_id"]]


def resampled_run(launches: list[dict], rng: np.random.Generator, cache: dict) -> dict:
    """One cell drawn again: launches with replacement, then steps within each; its summary holds what the fit
    reads (the median step over all drawn steps, each stage's median over launches of its mean)."""
    picked = [launches[i] for i in rng.integers(0, len(launches), len(launches))]
    drawn = []
    for run in picked:
        rows = _steps(run, cache)
        drawn.append(rows[rng.integers(0, len(rows), len(rows))] if len(rows) else rows)
    every = np.concatenate(drawn) if drawn else np.empty((0, 4))
    summary = {**picked[-1]["summary"], keys.STEP_MEDIAN_MS: 1e3 * float(np.median(every[:, 0]))}
    for j, stage in enumerate(("forward", "backward", "optimizer"), start=1):
        summary[keys.stage_ms(stage)] = 1e3 * float(np.median([d[:, j].mean() for d in drawn if len(d)]))
    return {**picked[-1], "summary": summary}


def resampled_bench(bench, rng: np.random.Generator):
    """A bench sweep drawn again: per size its iterations with replacement; the mean moves by the drawn mean over
    the measured one (the measured mean may come from a back-to-back loop, which has no per-call times)."""
    means = []
    for mean, its in zip(bench.means, bench.iterations):
        its = np.asarray(its, float)
        means.append(mean * float(its[rng.integers(0, len(its), len(its))].mean() / its.mean()) if len(its) else mean)
    return dataclasses.replace(bench, means=means)


def resample(measured, rng: np.random.Generator, cache: dict):
    """Another `fit.Measured`, drawn from `measured`."""
    return dataclasses.replace(
        measured, compute=[[resampled_run(c, rng, cache)] for c in measured.compute],
        insitu={sync: [[resampled_run(c, rng, cache)] for c in cells] for sync, cells in measured.insitu.items()},
        bench=resampled_bench(measured.bench, rng), lone=[[resampled_run(c, rng, cache)] for c in measured.lone],
        host_bench=resampled_bench(measured.host_bench, rng) if measured.host_bench else None,
        veth_bench=resampled_bench(measured.veth_bench, rng) if measured.veth_bench else None)


def replicates(template, measured, n: int = REPLICATES, seed: int = 0) -> list[dict]:
    """The fitted figures (`FITTED`) of `n` refits of `fit.fit` on resampled data."""
    rng, cache = np.random.default_rng(seed), {}
    out = []
    for _ in range(n):
        cal = fit(template, resample(measured, rng, cache))
        out.append({name: getattr(cal, name) for name in FITTED})
    return out


def compute_replicates(launches: list[list[dict]], n: int, seed: int = 1) -> list[dict]:
    """`n` compute fits (stage -> [c0, c1]) on resampled launches and steps of runs without sync."""
    rng, cache = np.random.default_rng(seed), {}
    out = []
    for _ in range(n):
        model = pm.fit_compute_model(compute_points([resampled_run(c, rng, cache) for c in launches]))
        out.append({s: [fit_of(model, s).c0, fit_of(model, s).c1] for s in STAGES})
    return out
