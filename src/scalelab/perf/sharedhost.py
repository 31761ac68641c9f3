"""The step from the calibrated node count to more namespace nodes sharing this host (docs/model.md, "The step to
more shared-host nodes"): a rule the calibration cannot estimate, so it is fixed from development data.

A calibration over namespace nodes (`predict --local-nodes 2`) measures its in-situ runs at its own node count,
where each rank has a core of its own; compute at a larger count is measured again (`calibrate.compute_at_nodes`),
but the collectives' share of the cores is not: at 3 or 4 nodes on 2 cores the ranks and gloo's threads take
turns. The leave-one-batch-out residuals (perf/modelerror.py) are all at the calibrated count and see none of it.
Every development run that took this step (calibrated at 2 nodes, held out at 3 and 4 on this 2-core host)
under-predicted on the whole (DEVELOPMENT: the frozen protocol's runs of rounds 4-8 and the user path's 2 runs of
issue 61; their run-wide offsets, ln(measured / predicted) at the run's median point). So, for such a row:

- **the bias** b = the mean offset of those runs (+2.2 %), moved into the point on top of the strategy's own;
- **its uncertainty**: the offsets' spread between runs τ (3.3 %; a fresh run has its own offset) and the mean's
  standard error τ/√k, added in quadrature to the model-error part;
- **the spread within a run**, moderated (an empirical-Bayes prior on the variance): the calibration's own σ̂²
  on d d.f. and the development runs' within-run spread S0 = 4.0 % on D0 = 12 d.f. pool to
  (D0·S0² + d·σ̂²)/(D0 + d) on D0 + d d.f. A calibration's 6 residuals (the user path: one launch at 3 batches,
  2 strategies) give t(0.975, 6) = 2.45 and a σ̂ that moved 4.0-9.1 % between four calibrations of one host;
  the held-out points' own spread within a run was 2.8-4.0 %, below every one of those σ̂. At 6 d.f. σ̂ has a
  third of the weight: a noisy calibration stays wider than a quiet one but narrower than its σ̂ alone (σ̂ = 20 %
  gives 12.5 % with τ); no development run was made on a loaded host, where fresh points missed by up to 27 %.

It applies where the step is the development data's: the calibration on namespace nodes of this host with no
more ranks than the host's cores, the row with more nodes and more ranks than those cores. Elsewhere (a host with
cores to spare, Slurm nodes, a preset) nothing changes: no development run checked it there.
"""
from __future__ import annotations

import dataclasses
import math
from statistics import fmean, stdev

from scalelab.perf.calibration import Calibration
from scalelab.perf.horizon import host_cores
from scalelab.perf.modelerror import ErrorTerm

# development runs of the step from 2 to 3 and 4 shared-host nodes: (what, signed error of the run's median point,
# 100·(predicted − measured)/measured, as docs/model.md lists them). Frozen with the rule: a change makes it new.
DEVELOPMENT = (("protocol round 4, run 1", 1.3), ("protocol round 4, run 2", -2.9),
               ("protocol round 5, run 1", 1.1), ("protocol round 5, run 2", -1.4),
               ("protocol round 6, run 1", 4.4), ("protocol round 6, run 2", -2.5),
               ("protocol round 7, run 1", -4.0), ("protocol round 7, run 2", -5.9),
               ("protocol round 8, run 1", -1.7), ("protocol round 8, run 2", -3.8),
               ("user path, issue 61, run 1 (median of 4 points)", -7.5),
               ("user path, issue 61, run 2 (median of 4 points)", -2.1))
S0 = 0.040  # within-run spread of held-out points on the step, in log step: the protocol's runs 2.8-4.0 %, the
#            user path's 8 points 3.0 % around their run means (6 d.f.): the larger
D0 = 12  # the prior's degrees of freedom: twice a user-path calibration's 6 residuals


def offsets() -> list[float]:
    """The development runs' offsets in log step, ln(measured / predicted)."""
    return [-math.log1p(error / 100) for _, error in DEVELOPMENT]


BIAS = fmean(offsets())  # +2.16 %
TAU = stdev(offsets())  # 3.30 % between runs
BIAS_SE = TAU / math.sqrt(len(DEVELOPMENT))  # 0.95 %


def applies(cal: Calibration, workers: int, nodes: int) -> bool:
    """Whether a prediction of `workers` ranks on `nodes` nodes takes the step of the development data: the
    calibration over namespace nodes of this host, within its cores; the row on more nodes, past them."""
    if cal.nodes < 2 or cal.nodes_launcher != "namespaces" or nodes <= cal.nodes:
        return False
    cores = host_cores(cal.device, cal.host is None)
    return cores is not None and cal.ranks <= cores < workers


def step_term(term: ErrorTerm) -> ErrorTerm:
    """`term` for a row that takes the step (module docstring): the bias added, the spread within a run moderated
    toward S0 and the step's own uncertainty added, D0 more degrees of freedom. Without a spread of its own (no
    residuals) only the bias: no interval is made from development data alone."""
    if not (term.dof >= 1 and math.isfinite(term.sigma)):
        return dataclasses.replace(term, bias=term.bias + BIAS)
    pooled = (D0 * S0**2 + term.dof * term.sigma**2) / (D0 + term.dof)
    return ErrorTerm(term.bias + BIAS, math.sqrt(pooled + TAU**2 + BIAS_SE**2), term.dof + D0, term.n)


def step_text(cal: Calibration, workers: int, nodes: int) -> str:
    """The rule in words where it applies (the calibration line of a node count), else ""."""
    if not applies(cal, workers, nodes):
        return ""
    return (f"; the step from {cal.nodes} to {nodes} nodes sharing this host: bias {100 * math.expm1(BIAS):+.1f} % "
            f"and a spread of {100 * TAU:.1f} % between runs, from {len(DEVELOPMENT)} development runs, the "
            f"model error's spread within a run pooled with {100 * S0:.1f} % ({D0} d.f.; docs/model.md)")
