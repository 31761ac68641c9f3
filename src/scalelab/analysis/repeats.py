"""One cell measured in several launches, as one figure with its interval (pure).

Steps of one run cannot see drift between runs (a neighbour that starts between two launches moved a 96 ms step
to 446 ms in one quick study). A cell of compared experiments is therefore launched several times, interleaved
with the cells it is compared with, and its headline figures come from all launches together:
- the median step is the median of every launch's timed steps;
- its interval is the robust median interval over the steps in launch order (on a log scale: a time, never below
  0; intervals.median_interval with positive=True; a shift between launches shows up as
  correlation between consecutive steps and widens it), and never narrower than the spread of the launches' own
  medians: with k launches the true median can sit anywhere between them;
- GPU utilisation is the mean over every launch's NVML samples, and their count the sum;
- every other numeric figure of the summary is the median over the launches; a figure with an interval
  (keys.ci_keys) keeps the median launch's interval, widened to reach every launch's value, by the same reasoning;
- a launch flagged noisy (the machine busy outside it) is set aside when the clean launches are at least 2 and
  at least as many: the figures are the clean launches', and the quality says how many were set aside and why
  (a question the clean launches can decide stays open no longer for one neighbour's burst; a top-up adds
  launches in their place). With fewer clean launches the run's doubts carry over: noisy when any launch was
  noisy (with that launch's reason), and a quality other than ok when any launch had one;
- `launches` says how many there were, and the lowest and highest of the launches' own median steps are kept
  (keys.STEP_LAUNCH_MEDIAN_MIN_MS / _MAX_MS): a finding between two cells needs their launches not to interleave
  (scalelab.analysis.interpret.ranking), and a finding between configurations counts launches, not steps;
- the launches' own median steps, in launch order (LAUNCH_MEDIANS), and the step-to-step variance of log step times
  within a launch, pooled over its launches, with its degrees of freedom (WITHIN_VAR, WITHIN_DOF): the inputs of
  the study's noise model (scalelab.analysis.noise.fit), which pools the launch-to-launch component over cells.
  A single launch keeps them too (its one median: no launch spread, but its steps' spread).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.intervals import median_interval

LAUNCHES = "launches"
# a summary's keys and a table's columns alike (tables.SPREAD, compare.SUMMARY_COLUMNS carry them to the rows)
LAUNCH_MEDIANS = "step_launch_medians(ms)"  # list of each launch's median step, in launch order
WITHIN_VAR = "step_log_var_within"  # variance of ln(step) around its launch's mean, pooled over launches
WITHIN_DOF = "step_log_var_within_dof"
SET_ASIDE = "launches_set_aside"  # launches left out of the figures: flagged noisy, with enough clean ones beside


def pool(summaries: Sequence[dict], steps_ms: Sequence[Sequence[float]]) -> dict:
    """The summary of a cell measured in `len(summaries)` launches; `steps_ms[i]` are launch i's timed step
    times (ms, in order)."""
    if len(summaries) == 1:
        return {**summaries[0], LAUNCHES: 1, **launch_spread(steps_ms)}
    noisy = [i for i, s in enumerate(summaries) if s.get(keys.QUALITY_NOISY)]
    clean = [i for i in range(len(summaries)) if i not in noisy]
    if noisy and len(clean) >= max(2, len(noisy)):
        out = pool([summaries[i] for i in clean], [steps_ms[i] for i in clean])
        if out.get(keys.QUALITY) in (None, "ok"):  # a clean launch's own doubt (implausible, ...) comes first
            reason = summaries[noisy[-1]].get(keys.QUALITY_NOISE_REASON) or "noisy"
            out[keys.QUALITY] = f"{len(noisy)} of {len(summaries)} launches set aside ({reason})"
        out[SET_ASIDE] = len(noisy)
        return out
    out: dict = {}
    for key in dict.fromkeys(k for s in summaries for k in s):  # in order: the same table in every process
        values = [s[key] for s in summaries if key in s]
        numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[key] = float(np.median(numeric)) if len(numeric) == len(values) else values[-1]
    sampled = [(s[keys.GPU_UTIL], s[keys.GPU_UTIL_SAMPLES]) for s in summaries if keys.GPU_UTIL_SAMPLES in s]
    if sampled:  # NVML samples pool across launches: their mean, over all of them
        n = sum(k for _, k in sampled)
        out[keys.GPU_UTIL], out[keys.GPU_UTIL_SAMPLES] = sum(u * k for u, k in sampled) / n, n
    for key in keys.interval_figures(out):
        lo_key, hi_key = keys.ci_keys(key)
        points = [s[key] for s in summaries if _finite(s.get(key))]
        if points:
            out[lo_key] = min(out[lo_key], *points)
            out[hi_key] = max(out[hi_key], *points)
    doubtful = [s for s in summaries if s.get(keys.QUALITY_NOISY)]
    if doubtful:
        out[keys.QUALITY_NOISY] = True
        out[keys.QUALITY_NOISE_REASON] = doubtful[-1].get(keys.QUALITY_NOISE_REASON, "noisy")
    qualities = [s[keys.QUALITY] for s in summaries if s.get(keys.QUALITY) not in (None, "ok")]
    if qualities:
        out[keys.QUALITY] = qualities[-1]
    series = [float(t) for launch in steps_ms for t in launch]
    medians = [float(np.median(launch)) for launch in steps_ms if len(launch)]
    if series:
        low, high = median_interval(series, positive=True)  # NaN from one value: no interval
        if not math.isnan(low) or len(medians) > 1:
            low, high = float(np.nanmin([low, *medians])), float(np.nanmax([high, *medians]))
        out[keys.STEP_MEDIAN_MS] = float(np.median(series))
        out[keys.STEP_MEDIAN_CI_LOW_MS], out[keys.STEP_MEDIAN_CI_HIGH_MS] = low, high
        out[keys.STEP_MIN_MS], out[keys.STEP_MAX_MS] = min(series), max(series)
        out[keys.STEPS_TIMED] = len(series)
        out[keys.STEP_LAUNCH_MEDIAN_MIN_MS], out[keys.STEP_LAUNCH_MEDIAN_MAX_MS] = min(medians), max(medians)
    out[LAUNCHES] = len(summaries)
    out.update(launch_spread(steps_ms))
    return out


def launch_spread(steps_ms: Sequence[Sequence[float]]) -> dict:
    """Each launch's median step (LAUNCH_MEDIANS) and the within-launch variance of ln(step) pooled over the
    launches with its degrees of freedom (sum of steps - 1 per launch); {} without timed steps."""
    times = [np.asarray(launch, dtype=float) for launch in steps_ms]
    times = [t[np.isfinite(t) & (t > 0)] for t in times]
    times = [t for t in times if len(t)]
    if not times:
        return {}
    logs = [np.log(t) for t in times]
    dof = sum(len(x) - 1 for x in logs)
    squares = sum(float(((x - x.mean()) ** 2).sum()) for x in logs)
    return {LAUNCH_MEDIANS: [float(np.median(t)) for t in times],
            WITHIN_VAR: squares / dof if dof else math.nan, WITHIN_DOF: dof}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
