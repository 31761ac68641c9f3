"""The model's own error, estimated from the calibration alone: the part of a prediction interval that the
calibration's sampling noise (`uncertainty`) leaves out (docs/model.md, "Prediction intervals").

The rule (part of the model code a frozen protocol hashes; every prediction prints its parts):
- residuals: inside the calibration, each launch of each in-situ run is predicted by a calibration that did not
  see it, and r = ln(measured step / predicted step) is kept (`residuals`):
  - leave one batch out (LEAVE_BATCH_OUT): the fit again without the in-situ runs at one calibration batch (its
    in-situ scales and overlap then come from the other batches), predicting those runs; compute keeps every
    batch (a linear fit needs two);
  - another link (OTHER_LINK; a calibration over a shaped namespace link only): the in-situ strategies once more
    over the same nodes with the link unshaped, at the largest batch, predicted by the whole calibration, whose
    training runs never crossed that link.
- the error of a prediction over the calibrated kind of link (a shaped link, or loopback) is estimated from the
  leave-one-batch-out residuals alone, regression-style (`pooled`): per strategy a bias b_s (the mean of its
  residuals: the model may miss one strategy systematically, e.g. bucketed, whose buckets gloo runs two at a time
  on its worker threads while the model serves them one at a time, so its overlap fit stops at 1), moved into the
  point (point·e^b_s) only when the residuals tell it from noise: |b_s| > t(0.975, n − k)·s_k/√n_s, s_k² the
  spread around all k means (`spreads`). A bias estimated from a few residuals and moved anyway turns a chance
  into a systematic error (2 residuals once moved a tiny calibration's prediction 26 % off its known truth); one
  that fails the test stays 0 and its residuals count as error around 0. Around the biases the pooled spread s²,
  n residuals and k' biases moved, n − k' degrees of freedom. Residuals are per launch, the target is the median
  of a point's `launches`: the spread within a cell (launches of one run, predicted by the same fit) is launch
  noise, which a median of m launches divides by m, so the target's variance is max(s² − w², 0) + w²/m with w²
  the within-cell variance; a moved bias's own uncertainty adds s²/n_s. A strategy the calibration did not run has
  no bias of its own: the mean of its regime's biases, and their spread around it adds to its variance.
- a link the training did not cross, with residuals of its own (the unshaped runs), is predicted from those
  alone (`own`: bias 0, σ̂² = mean r², n degrees of freedom), unless refused.
- the assumption: a prediction's error ln(measured / predicted), the bias taken out, is normal with the variance
  above; with d degrees of freedom the model-error part of the P interval is ± t((1 + P)/2, d)·σ̂ in log step
  (`ErrorTerm.half`). It is tested on the residuals less their strategy's bias (Shapiro-Wilk, `normality_p`);
  with 6-20 residuals that test sees only gross departures.
- the interval: the sampling part (the replicas' percentiles) and the model-error part add in quadrature in log
  step, h = √(s² + m²), around the point with its bias: [p·e^(b−h), p·e^(b+h)] for the 95 % and the 50 %
  interval (`combine`).
- where it cannot hold: a regime the residual runs never had. They ran at the calibration's node count, its
  links and batches, with a share of exposed communication in the step between the smallest and the largest in
  `seen_shares`; a prediction outside that share range is marked `extrapolation` (perf/horizon.py `unseen_share`).
  A bias carries over only as far as its cause does (bucketed's comes from several buckets in flight at once).
- a link refused (`refusal`): when any of the calibration's own runs over a link its training never crossed (a
  cell: the median of its launches) lies outside the 95 % interval that the calibrated link's error term gives
  that strategy, the model is wrong there by more than anywhere it was checked: predictions over that link are
  refused in one line, and those residuals stay out of every error term.
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
from scalelab.perf import perfmodel as pm
from scalelab.perf.runmodel import predict_run
from scalelab.sync import registry

LEAVE_BATCH_OUT = "leave batch out"
OTHER_LINK = "other link"
LEVELS = (0.95, 0.5)


def link_key(link: NodeLink) -> str:
    """A link as a residual row names it: "loopback", else `links.link_text` ("an unshaped link", ...)."""
    return "loopback" if not link.namespaced else link_text(link.gbps)


def _batch(run: dict) -> float:
    return run["config"]["global_batch"] / world(run["config"])


def concurrent(cal: Calibration, config: dict) -> bool:
    """Whether a run's strategy has several collectives in flight at once: more than one overlapped bucket (a
    strategy that does not block after backward). gloo runs them on its worker threads, two at a time, where the
    model serves them one at a time: a regime of its own (module docstring)."""
    sync = config.get("sync", "auto")
    strategy = "ddp" if sync == "auto" else sync
    if registry.blocks(config) or strategy not in pm.modelled_syncs():
        return False
    cost = pm.sync_cost(strategy, param_bytes=cal.param_bytes, n=2, hardware=cal.hardware(), backward_s=0.0,
                        bucket_bytes=config.get("bucket_mb", 25.0) * pm.MIB)
    return cost.collectives > 1


def residual_row(cal: Calibration, run: dict, check: str) -> dict | None:
    """One launch predicted by `cal`: r = ln(measured / predicted) and the predicted share of exposed
    communication in the step; None where the model has no prediction or the launch no step."""
    predicted, step = predict_run(cal, run["config"]), (run.get("summary") or {}).get(keys.STEP_MEDIAN_MS)
    if predicted is None or not step or not predicted["step(ms)"] > 0:
        return None
    return {"check": check, "run_id": run["run_id"], "sync": run["config"].get("sync"),
            "concurrent": concurrent(cal, run["config"]),
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


def _t(level: float, dof: int) -> float:
    from scipy.stats import t  # here: ranks import this package, and scipy costs them start-up time

    return float(t.ppf((1 + level) / 2, dof))


@dataclass(frozen=True)
class ErrorTerm:
    """The model-error part of one prediction's intervals, in log step (module docstring): the bias moved into the
    point, the spread of the error around it, its degrees of freedom and the residuals behind it."""

    bias: float
    sigma: float
    dof: int
    n: int

    def half(self, level: float) -> float:
        """The model-error half-width of the `level` interval in log step: t((1 + level)/2, dof)·σ̂; NaN without
        a degree of freedom."""
        return _t(level, self.dof) * self.sigma if self.dof >= 1 and math.isfinite(self.sigma) else math.nan


NONE = ErrorTerm(0.0, math.nan, 0, 0)


def _groups(rows: list[dict], *keys: str) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = {}
    for r in rows:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r["residual"])
    return out


def _group(row: dict) -> tuple[str, bool]:
    return row["sync"], bool(row.get("concurrent", False))


@dataclass(frozen=True)
class Spread:
    """Leave-one-batch-out residuals summed up (module docstring): each group's mean residual, its bias (the mean,
    or 0 where the residuals do not tell it from noise), the groups whose bias is moved into the point, the pooled
    variance s² around the biases, the within-cell variance w² and the degrees of freedom n − (biases moved)."""

    means: dict[tuple[str, bool], float]
    bias: dict[tuple[str, bool], float]
    moved: frozenset
    s2: float
    w2: float
    dof: int


def _pooled_variance(by_group: dict[tuple[str, bool], list[float]], bias: dict, dof: int) -> float:
    sse = sum((x - bias.get(g, 0.0)) ** 2 for g, r in by_group.items() for x in r)
    return sse / dof if dof >= 1 else math.nan


def spreads(rows: list[dict]) -> Spread:
    """The biases, their gate, s², w² and degrees of freedom of leave-one-batch-out residual rows, a group being a
    strategy in one regime (`concurrent`; module docstring); s² NaN without a degree of freedom, w² 0 without a
    cell of two launches."""
    by_group: dict[tuple[str, bool], list[float]] = {}
    for r in rows:
        by_group.setdefault(_group(r), []).append(r["residual"])
    means = {g: float(np.mean(r)) for g, r in by_group.items()}
    # the gate: each bias tested against the spread around all of them (n − k d.f.); a bias the residuals cannot
    # tell from noise at 5 % stays out of the point, and its residuals count as error around 0
    full_dof = len(rows) - len(by_group)
    full = _pooled_variance(by_group, means, full_dof)
    moved = frozenset(g for g, b in means.items()
                      if math.isfinite(full) and abs(b) > _t(0.95, full_dof) * math.sqrt(full / len(by_group[g])))
    bias = {g: (b if g in moved else 0.0) for g, b in means.items()}
    dof = len(rows) - len(moved)
    cells = _groups(rows, "sync", "per_rank_batch", "link").values()
    within_dof = sum(len(c) - 1 for c in cells)
    within = sum(float(np.sum(np.square(np.subtract(c, np.mean(c))))) for c in cells)
    # below strategies + 1 residuals no bias can be tested: no term at all (describe says so)
    s2 = _pooled_variance(by_group, bias, dof) if full_dof >= 1 else math.nan
    return Spread(means, bias, moved, s2, within / within_dof if within_dof else 0.0, dof)


def pooled(rows: list[dict], strategy: str | None, launches: int = 1, in_flight: bool = False) -> ErrorTerm:
    """The error term of a prediction of `strategy` (several collectives `in_flight` or one at a time) whose target
    is the median of `launches` launches, from leave-one-batch-out residual rows (module docstring)."""
    sp = spreads(rows)
    if not math.isfinite(sp.s2):
        return NONE
    target = max(sp.s2 - sp.w2, 0.0) + sp.w2 / max(1, launches)
    group = (strategy, in_flight)

    def count(groups) -> int:
        return sum(_group(r) in groups for r in rows)

    if group in sp.bias:  # a moved bias adds its own uncertainty, s²/n_g
        extra = sp.s2 / count({group}) if group in sp.moved else 0.0
        return ErrorTerm(sp.bias[group], math.sqrt(target + extra), sp.dof, len(rows))
    # a strategy not run in this regime: the mean bias of the strategies that were, and their spread around it;
    # none in this regime: bias 0, and every group's bias counts as error
    same = [g for g in sp.bias if g[1] == in_flight]
    if same:
        b = float(np.mean([sp.bias[g] for g in same]))
        extra = sp.s2 / count(set(same)) if sp.moved & set(same) else 0.0
        return ErrorTerm(b, math.sqrt(target + float(np.mean([(sp.bias[g] - b) ** 2 for g in same])) + extra),
                         sp.dof, len(rows))
    return ErrorTerm(0.0, math.sqrt(target + float(np.mean(np.square(list(sp.bias.values()))))), sp.dof, len(rows))


def own(residuals: list[float]) -> ErrorTerm:
    """A link's own error term from its residuals: bias 0, σ̂² = mean r² (a bias counts as error), n d.f."""
    n = len(residuals)
    return ErrorTerm(0.0, float(np.sqrt(np.mean(np.square(residuals)))), n, n) if n >= 2 else NONE


def _key(link: NodeLink | str | None) -> str | None:
    return link if isinstance(link, str) or link is None else link_key(link)


def _calibrated(cal: Calibration) -> list[dict]:
    return [r for r in cal.residuals if r["check"] == LEAVE_BATCH_OUT]


def _other(cal: Calibration, key: str | None) -> list[dict]:
    return [r for r in cal.residuals if r["check"] == OTHER_LINK and r["link"] == key]


def error_term(cal: Calibration, strategy: str | None = None, link: NodeLink | str | None = None,
               launches: int = 1, in_flight: bool = False) -> ErrorTerm:
    """The model-error term of a prediction of `strategy` (several collectives `in_flight`: `concurrent`) over
    `link` (None: the calibrated one) whose target is the median of `launches` launches: a link with other-link
    residuals from those (`own`), any other from the calibrated link's (`pooled`)."""
    other = _other(cal, _key(link))
    if other:
        return own([r["residual"] for r in other])
    return pooled(_calibrated(cal), strategy, launches, in_flight)


def refusal(cal: Calibration, link: NodeLink | str) -> str | None:
    """Why predictions over `link` (or its `link_key`) are refused, in one line, or None (module docstring): a
    cell of the calibration's own runs over that link, which its training never crossed, outside the 95 %
    interval the calibrated link's error term gives it."""
    key = _key(link)
    worst = None
    for (sync, flight, batch), values in _groups(_other(cal, key), "sync", "concurrent", "per_rank_batch").items():
        term = pooled(_calibrated(cal), sync, len(values), bool(flight))
        miss = float(np.median(values)) - term.bias  # a median of two launches is their mean
        if not math.isfinite(term.half(0.95)) or abs(miss) <= term.half(0.95):
            continue
        if worst is None or abs(miss) - term.half(0.95) > abs(worst[2]) - worst[3]:
            worst = (sync, batch, miss, term.half(0.95), len(values))
    if worst is None:
        return None
    sync, batch, miss, bound, n = worst
    return (f"refused over {key}: the calibration's own {sync} run over it (per-rank batch {batch:g}, median of {n} "
            f"launches) was predicted {100 * (math.exp(-miss) - 1):+.0f} % off, beyond the "
            f"±{100 * math.sinh(bound):.0f} % that the calibrated link's model error allows it at 95 %")


def used(cal: Calibration) -> list[dict]:
    """The residual rows the error terms are estimated from: all but those of a refused link."""
    refused = {r["link"] for r in cal.residuals if r["check"] == OTHER_LINK and refusal(cal, r["link"])}
    return [r for r in cal.residuals if not (r["check"] == OTHER_LINK and r["link"] in refused)]


def normality_p(rows: list[dict]) -> float:
    """Shapiro-Wilk's p for the leave-one-batch-out residuals less their strategy's bias being normal (NaN below 3
    residuals or when all are equal)."""
    from scipy.stats import shapiro

    bias = spreads(rows).bias if rows else {}
    values = [r["residual"] - bias[_group(r)] for r in rows]
    if len(values) < 3 or np.ptp(values) == 0:
        return math.nan
    return float(shapiro(values).pvalue)


def seen_shares(cal: Calibration) -> tuple[float, float] | None:
    """(smallest, largest) predicted share of exposed communication in the step among the residual runs the error
    terms use; None without residuals."""
    shares = [r["comm_share"] for r in used(cal)]
    return (min(shares), max(shares)) if shares else None


def combine(point: float, sampling: tuple[float, float, float, float], term: ErrorTerm) -> dict:
    """The 95 % and 50 % intervals of a prediction `point` from its sampling percentiles (2.5, 25, 75, 97.5 over
    the replicas) and its model-error term: around point·e^bias (`point`), the parts in quadrature in log step;
    the half-widths in % of that point of the 95 % interval's two parts and the bias in %. NaN where either part
    is missing (never a made-up interval)."""
    q025, q25, q75, q975 = sampling
    center = point * math.exp(term.bias)
    out = {"point": center, "bias(%)": 100 * (math.exp(term.bias) - 1)}
    for level, (low, high) in zip(LEVELS, ((q025, q975), (q25, q75))):
        s = math.log(high / low) / 2 if low > 0 and high > 0 else math.nan
        m = term.half(level)
        h = math.hypot(s, m) if math.isfinite(s) and math.isfinite(m) else math.nan
        out[level] = (center * math.exp(-h), center * math.exp(h))
        if level == 0.95:
            out["sampling_half_width(%)"] = 100 * math.sinh(s)
            out["model_half_width(%)"] = 100 * math.sinh(m)
    return out


def describe(cal: Calibration) -> str:
    """The error terms in words: from what, the biases, how wide, whether normality held, which link is refused."""
    rows = _calibrated(cal)
    sp = spreads(rows) if rows else None
    if sp is None or not math.isfinite(sp.s2):
        return ("no model-error term (fewer in-calibration residuals than strategies + 1: one rank, one batch, or "
                "runs measured elsewhere), so no prediction interval")
    p = normality_p(rows)

    def named(groups) -> str:
        return ", ".join(f"{sync}{' (several buckets in flight)' if flight else ''} "
                         f"{100 * (math.exp(sp.means[(sync, flight)]) - 1):+.1f} %" for sync, flight in groups)

    kept = [g for g in sp.means if g not in sp.moved]
    biases = (f"bias per strategy moved into the point where its residuals tell it from noise at 5 % "
              f"({named(sp.moved) if sp.moved else 'none'}); not moved ({named(kept) if kept else 'none'}), "
              f"their residuals count as error around 0")
    first = next(iter(sp.means))
    one = pooled(rows, *first)
    text = (f"model error from {len(rows)} leave-one-batch-out residuals over the calibrated link: {biases}; "
            f"spread s = {100 * math.sqrt(sp.s2):.1f} % in log step ({sp.dof} d.f.), of it launch noise within a "
            f"cell w = {100 * math.sqrt(sp.w2):.1f} %; a one-launch prediction of {first[0]} "
            f"±{100 * math.sinh(one.half(0.95)):.1f} % at 95 %, ±{100 * math.sinh(one.half(0.5)):.1f} % at 50 % "
            f"(Student t, {sp.dof} d.f.; normality {'not rejected' if not p < 0.05 else 'REJECTED'}, Shapiro-Wilk "
            f"p = {p:.2f})")
    for key in sorted({r["link"] for r in cal.residuals if r["check"] == OTHER_LINK}):
        line = refusal(cal, key)
        other = own([r["residual"] for r in _other(cal, key)])
        text += f"; {line}" if line else (f"; over {key} from its own {other.n} residuals: "
                                          f"±{100 * math.sinh(other.half(0.95)):.1f} % at 95 %")
    return text
