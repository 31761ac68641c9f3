"""The model's own error, estimated from the calibration alone: the part of a prediction interval that the
calibration's sampling noise (`uncertainty`) leaves out (docs/model.md, "Prediction intervals").

The rule (part of the model code a frozen protocol hashes; every prediction prints its two parts):
- residuals: inside the calibration, each launch of each in-situ run is predicted by a calibration that did not
  see it, and r = ln(measured step / predicted step) is kept (`residuals`):
  - leave one batch out (LEAVE_BATCH_OUT): the fit again without the in-situ runs at one calibration batch (its
    in-situ scales and overlap then come from the other batches), predicting those runs; compute keeps every
    batch (a linear fit needs two);
  - another link (OTHER_LINK; a calibration over a shaped namespace link only): the in-situ strategies once more
    over the same nodes with the link unshaped, at the largest batch, predicted by the whole calibration, whose
    training runs never crossed that link.
- the assumption: a prediction's error ln(measured / predicted) is normal with mean 0 and the spread σ of those
  residuals, σ̂² = mean r² (a bias counts as error). With n residuals a new error over σ̂ then follows Student's t
  with n degrees of freedom, so the model-error part of the P interval is ± t((1 + P)/2, n)·σ̂ in log step
  (`ErrorTerm.half`). It is tested on the residuals themselves (Shapiro-Wilk, `ErrorTerm.normality_p`); with 5-20
  residuals that test sees only gross departures.
- the interval: the sampling part (the replicas' percentiles) and the model-error part add in quadrature in log
  step, h = √(s² + m²), around the point: [point·e^−h, point·e^h] for the 95 % and the 50 % interval (`combine`).
  The residuals' launches carry their own sampling noise too, so the sum leans wide, not narrow.
- where it cannot hold: a regime the residual runs never had. They ran at the calibration's node count, its
  links and batches, with a share of exposed communication in the step between the smallest and the largest in
  `seen_shares`; a prediction outside that share range is marked `extrapolation` (perf/horizon.py `unseen_share`).
- a link refused (`refusal`): when the calibration's own runs over a link its training never crossed are
  predicted with a median residual beyond the 95 % model-error bound of the leave-one-batch-out residuals, the
  model is wrong there by more than anywhere it was checked: predictions over that link are refused in one line,
  and those residuals stay out of σ̂.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from scalelab.analysis import keys
from scalelab.perf.calibration import Calibration
from scalelab.perf.fit import Measured, fit, world
from scalelab.perf.links import NodeLink, link_text
from scalelab.perf.runmodel import predict_run

LEAVE_BATCH_OUT = "leave batch out"
OTHER_LINK = "other link"
LEVELS = (0.95, 0.5)


def link_key(link: NodeLink) -> str:
    """A link as a residual row names it: "loopback", else `links.link_text` ("an unshaped link", ...)."""
    return "loopback" if not link.namespaced else link_text(link.gbps)


def _batch(run: dict) -> float:
    return run["config"]["global_batch"] / world(run["config"])


def residual_row(cal: Calibration, run: dict, check: str) -> dict | None:
    """One launch predicted by `cal`: r = ln(measured / predicted) and the predicted share of exposed
    communication in the step; None where the model has no prediction or the launch no step."""
    predicted, step = predict_run(cal, run["config"]), (run.get("summary") or {}).get(keys.STEP_MEDIAN_MS)
    if predicted is None or not step or not predicted["step(ms)"] > 0:
        return None
    return {"check": check, "run_id": run["run_id"], "sync": run["config"].get("sync"),
            "per_rank_batch": _batch(run), "link": link_key(NodeLink.of(run["config"])),
            "predicted(ms)": float(predicted["step(ms)"]), "measured(ms)": float(step),
            "residual": math.log(step / predicted["step(ms)"]),
            "comm_share": float(predicted["exposed_comm(ms)"] / predicted["step(ms)"])}


def residuals(template: Calibration, measured: Measured, cal: Calibration) -> list[dict]:
    """The in-calibration residuals (module docstring): leave each batch's in-situ runs out of the fit of
    `template` on `measured` and predict them; predict the other-link runs (`measured.cross`) with `cal`, the fit
    on everything."""
    rows = []
    batches = sorted({_batch(cell[0]) for cells in measured.insitu.values() for cell in cells if cell})
    for b in batches if len(batches) > 1 else []:
        kept = {sync: [c for c in cells if c and _batch(c[0]) != b] for sync, cells in measured.insitu.items()}
        without = fit(template, dataclasses.replace(measured, insitu=kept))
        rows += [residual_row(without, run, LEAVE_BATCH_OUT)
                 for cells in measured.insitu.values() for c in cells if c and _batch(c[0]) == b for run in c]
    rows += [residual_row(cal, run, OTHER_LINK) for c in measured.cross for run in c]
    return [r for r in rows if r is not None]


@dataclass(frozen=True)
class ErrorTerm:
    """The model-error part of the intervals from residuals r = ln(measured / predicted) (module docstring)."""

    residuals: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.residuals)

    @property
    def sigma(self) -> float:
        """σ̂ = √(mean r²): the spread around 0, a bias included; NaN with fewer than 2 residuals."""
        return float(np.sqrt(np.mean(np.square(self.residuals)))) if self.n >= 2 else math.nan

    def half(self, level: float) -> float:
        """The model-error half-width of the `level` interval in log step: t((1 + level)/2, n)·σ̂."""
        from scipy.stats import t  # here: ranks import this package, and scipy costs them start-up time

        return float(t.ppf((1 + level) / 2, self.n) * self.sigma) if self.n >= 2 else math.nan

    @property
    def normality_p(self) -> float:
        """Shapiro-Wilk's p for the residuals being normal (NaN below 3 residuals or when all are equal)."""
        from scipy.stats import shapiro

        if self.n < 3 or np.ptp(self.residuals) == 0:
            return math.nan
        return float(shapiro(self.residuals).pvalue)


def refusal(cal: Calibration, link: NodeLink | str) -> str | None:
    """Why predictions over `link` (or its `link_key`) are refused, in one line, or None (module docstring): the
    calibration's own runs over that link, which its training never crossed, missed by more than its other
    residuals allow."""
    key = link if isinstance(link, str) else link_key(link)
    other = [r["residual"] for r in cal.residuals if r["check"] == OTHER_LINK and r["link"] == key]
    bound = ErrorTerm(tuple(r["residual"] for r in cal.residuals if r["check"] == LEAVE_BATCH_OUT)).half(0.95)
    if not other or not math.isfinite(bound):
        return None
    miss = float(np.median(other))
    if abs(miss) <= bound:
        return None
    allowed = math.exp(-math.copysign(bound, miss)) - 1  # the bound on the same side, as an error of the prediction
    return (f"refused over {key}: the calibration's own {len(other)} launches over it were predicted "
            f"{100 * (math.exp(-miss) - 1):+.0f} % off (median), beyond the {100 * allowed:+.0f} % that its "
            "leave-one-batch-out residuals allow at 95 %")


def used(cal: Calibration) -> list[dict]:
    """The residual rows the error term is estimated from: all but those of a refused link."""
    refused = {r["link"] for r in cal.residuals if r["check"] == OTHER_LINK and refusal(cal, r["link"])}
    return [r for r in cal.residuals if not (r["check"] == OTHER_LINK and r["link"] in refused)]


def error_term(cal: Calibration) -> ErrorTerm:
    return ErrorTerm(tuple(r["residual"] for r in used(cal)))


def seen_shares(cal: Calibration) -> tuple[float, float] | None:
    """(smallest, largest) predicted share of exposed communication in the step among the residual runs the error
    term uses; None without residuals."""
    shares = [r["comm_share"] for r in used(cal)]
    return (min(shares), max(shares)) if shares else None


def combine(point: float, sampling: tuple[float, float, float, float], term: ErrorTerm) -> dict:
    """The 95 % and 50 % intervals of a prediction `point` from its sampling percentiles (2.5, 25, 75, 97.5 over
    the replicas) and the model-error term, in quadrature in log step; the half-widths in % of the point of the
    95 % interval's two parts. NaN where either part is missing (never a made-up interval)."""
    q025, q25, q75, q975 = sampling
    out = {}
    for level, (low, high) in zip(LEVELS, ((q025, q975), (q25, q75))):
        s = math.log(high / low) / 2 if low > 0 and high > 0 else math.nan
        m = term.half(level)
        h = math.hypot(s, m) if math.isfinite(s) and math.isfinite(m) else math.nan
        out[level] = (point * math.exp(-h), point * math.exp(h))
        if level == 0.95:
            out["sampling_half_width(%)"] = 100 * math.sinh(s)
            out["model_half_width(%)"] = 100 * math.sinh(m)
    return out


def describe(cal: Calibration) -> str:
    """The error term in words: from what, how wide, whether normality held, which link is refused."""
    term, rows = error_term(cal), used(cal)
    if term.n < 2:
        return ("no model-error term (fewer than 2 in-calibration residuals: one rank, one batch, or runs measured "
                "elsewhere), so no prediction interval")
    counts = {check: sum(r["check"] == check for r in rows) for check in (LEAVE_BATCH_OUT, OTHER_LINK)}
    p = term.normality_p
    refused = sorted({r["link"] for r in cal.residuals if r["check"] == OTHER_LINK and refusal(cal, r["link"])})
    return (f"model error from {term.n} in-calibration residuals ({counts[LEAVE_BATCH_OUT]} leave-one-batch-out, "
            f"{counts[OTHER_LINK]} over a link the training did not cross): σ = {100 * term.sigma:.1f} % in log "
            f"step, ±{100 * math.sinh(term.half(0.95)):.1f} % at 95 %, ±{100 * math.sinh(term.half(0.5)):.1f} % at "
            f"50 % (Student t, {term.n} d.f.; normality {'not rejected' if not p < 0.05 else 'REJECTED'}, "
            f"Shapiro-Wilk p = {p:.2f})" + "".join(f"; {refusal(cal, key)}" for key in refused))
