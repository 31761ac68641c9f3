"""Every recommendation of a study, decided one way: one `Decision` type, one rule, four answers.

A decision compares a chosen configuration with an alternative on one figure (the median step, a throughput, an
accuracy over seeds), each side with its value, its interval, its n and, where kept, its launches' own medians;
it ends in one of four answers (`verdict`):
- BETTER: "A beats B by x× (interval)": the ratio's interval excludes 1 and the effect is material (MATERIAL, 2 %);
- WORSE: "A is worse than B beyond noise": the same, the other way (never said as "within noise");
- EQUIVALENT: "A and B are equivalent within ±MARGIN": the ratio's whole interval lies inside 1/(1+m) .. 1+m (an
  equivalence test, TOST: two one-sided tests, each at half the interval's error rate);
- UNDECIDED: "undecided after n launches; about k more would decide a difference of the margin" (and the command
  that runs them); also a flagged side or too few launches (MIN_LAUNCHES), with the reason.

The interval is that of ln(figure A / figure B) (docs/definitions.md, "Noise model and decisions"): centred on the
two headline figures, its standard error from the launch-to-launch component of the study's noise model
(scalelab.analysis.noise: pooled over the study's cells on a log scale, a heterogeneous cell with its own), or
from the per-round ratios (paired) where that is narrower; without launch medians (an accuracy over seeds, an
old table) from the two sides' own intervals; an accuracy over seeds with each seed's figure kept, the
difference of the two sides seed by seed (noise.difference_contrast: paired by seed, or on the seed spread
pooled over the cells, Welch's without a pool). Its level is family-wise and sequential: 1 - ALPHA / (family x
MAX_LOOKS), Bonferroni over the k alternatives a choice is compared with and over the at most MAX_LOOKS looks the
study takes at a comparison (its first round and its top-ups: lab/budget.py), so that repeated looks cannot push
the false-decision rate over ALPHA. Two sides whose own 95 % intervals are disjoint are always decided (BETTER or
WORSE; EQUIVALENT only for an effect under MATERIAL): checked by scalelab.analysis.checks.decision_faults.

`pick` applies it to one choice among many: the best trusted side against every other. It keeps a compared side
only: the best when it beats the rest; when some are equivalent to it, the default or the cheapest equivalent
(`cheaper`) that is worse beyond noise than no other side; when a comparison is undecided, the default if it is
compared, else nothing. Only this module calls `separated` on two configurations' figures
(tests/unit/lab/test_decision.py reads the source to hold that). Cards and sentences are rendered from the
decisions (`Decision.card`), and the report's invariant check reads them (`Decision.record`).
"""
from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from scalelab.analysis.compare import trusted
from scalelab.analysis.interpret import (MIN_LAUNCHES, flagged, fmt, interval, launch_range, launches, ratio_words,
                                         span, steps)
from scalelab.analysis.intervals import known, separated, separated_95
from scalelab.analysis.noise import (Contrast, NoiseModel, contrast, difference_contrast, figure_interval, fit,
                                     geometric_shift, launches_needed)
from scalelab.analysis.repeats import LAUNCH_MEDIANS
from scalelab.analysis.stragglers import MATERIAL as STRAGGLER_MATERIAL

# the least effect, as a share of the alternative's figure, that changes a default: the straggler rule's share
MATERIAL = STRAGGLER_MATERIAL
MARGIN = 0.10  # equivalence margin of a time or a rate: the ratio within 1/1.1 .. 1.1 (docs/definitions.md)
MARGIN_POINTS = 2.0  # equivalence margin of an accuracy over seeds, in points
ALPHA = 0.05  # the false-decision rate each choice is held to, over its alternatives and its looks
MAX_LOOKS = 6  # the first round and at most five top-ups (lab/study.top_up): Bonferroni over them
MAX_LAUNCHES = 32  # the most launches per cell a top-up asks for (the option's own limit is 40); the time left
# bounds it too. 24 until a default study ended "undecided after 24 launches each; about 4 more would decide" with
# 79 s of its budget left (Bonferroni over looks holds whatever the looks' sizes: a larger cap costs no error rate)
Z95 = 1.959964  # the normal quantile of a side's own 95 % interval (the fallback's standard error)

BETTER, WORSE, EQUIVALENT, UNDECIDED = "better", "worse", "equivalent", "undecided"
VERDICTS = (BETTER, WORSE, EQUIVALENT, UNDECIDED)  # in order of decisiveness, least last
NOT_ENOUGH_DATA = UNDECIDED  # the name earlier callers use for too few launches or a flagged side

_MODEL: contextvars.ContextVar[NoiseModel | None] = contextvars.ContextVar("scalelab_noise_model", default=None)


@contextmanager
def pooled(model: NoiseModel | None) -> Iterator[None]:
    """Within this block, decisions read `model` (the study's, pooled over all its cells); outside one, a
    choice pools over its own sides."""
    token = _MODEL.set(model)
    try:
        yield
    finally:
        _MODEL.reset(token)


def use_model(model: NoiseModel | None) -> None:
    """From here on in this context (the study's process), decisions read `model` (lab.study sets the study's)."""
    _MODEL.set(model)


@dataclass(frozen=True)
class Side:
    """One configuration of a comparison: its label, figure, interval, n (launches or seeds), the lowest and
    highest launch value where kept, its quality, the values its interval comes from (for its coverage), and
    its launches' own median steps in launch order (the noise model's input; None: not kept)."""
    label: str
    value: float
    interval: tuple[float, float] | None
    n: int
    spread: tuple[float, float] | None = None  # (lowest, highest) launch value; None: the interval
    quality: str = "ok"
    values: int | None = None  # how many values the interval is over (its coverage: interpret.span)
    launch_values: tuple[float, ...] | None = None

    def words(self, unit: str, count: str = "launches") -> str:
        """"12.7 ms (95 % interval 12.1–13.4 ms, n = 2 launches)"."""
        return f"{fmt(self.value, unit)} ({span(self.interval, unit, self.values)}, n = {plural(self.n, count)})"


def plural(n: int, count: str) -> str:
    """"1 launch", "2 launches", "1 seed"."""
    one = {"launches": "launch", "seeds": "seed"}.get(count, count)
    return f"{n} {one if n == 1 else count}"


def _launch_values(row) -> tuple[float, ...] | None:
    values = row.get(LAUNCH_MEDIANS)
    return tuple(float(v) for v in values) if isinstance(values, (list, tuple)) and len(values) else None


def step_side(row, label: str, *, value: str = "step(ms)", low: str = "step_ci_low(ms)",
              high: str = "step_ci_high(ms)") -> Side:
    """A table row's median step as a side: its launches, launch medians and quality (analysis.interpret)."""
    return Side(str(label), float(row.get(value, math.nan)), interval(row, low, high), launches(row),
                launch_range(row, low, high), str(row.get("quality") or "ok"), steps(row), _launch_values(row))


def figure_side(row, label: str, *, value: str, low: str, high: str, n: int | None = None,
                values: int | None = None) -> Side:
    """A row's figure of another kind (a throughput, an accuracy over seeds) as a side; n: its launches (seeds).
    A rate's launches vary as its step's (ln rate = ln work - ln step): the launch medians serve it alike."""
    return Side(str(label), float(row.get(value, math.nan)), interval(row, low, high),
                launches(row) if n is None else int(n), None, str(row.get("quality") or "ok"), values,
                _launch_values(row) if n is None else None)


def material(a: Side, b: Side, share: float = MATERIAL) -> bool:
    """|a - b| reaches `share` of b."""
    return abs(a.value - b.value) >= share * abs(b.value)


def next_launches(need: int, now: int) -> int:
    """The launches per cell a top-up asks for when a card needs `need` in all and each cell has `now`: a fifth
    more than the card asks (its estimate is for 80 % power at a difference of the margin), at least one more, at
    most three times as many (a look should not overshoot an estimate made from few launches) and MAX_LAUNCHES.
    The study (lab.study.top_up) and the rule's own error-rate benchmark (benchmarks/decision_rates.py) both
    grow by it, so that the rates measured are the study's."""
    return max(now, min(max(math.ceil(1.2 * need), now + 1), 3 * now, MAX_LAUNCHES))


def level(family: int) -> float:
    """The error rate of one comparison's interval: ALPHA over the family and the looks (module docstring)."""
    return ALPHA / (max(1, family) * MAX_LOOKS)


@dataclass(frozen=True)
class Decision:
    """What is compared (`chosen` against `against`), on which figure, the verdict and the rule's outcome;
    `keep`: the compared side that stays when the chosen one is not recommended (None: nothing yet);
    `action`: the recommendation's words ("num_workers=2"); `caveat`: what the figures rest on beyond a
    measurement; `interval`: the ratio's (or, for an accuracy, the difference's) interval at `confidence`;
    `more`: the launches each side would need in all to decide (UNDECIDED); `command`: the command that runs them."""
    question: str  # the choice, in words: "loader setting", "gradient sync"
    figure: str  # "median step", "throughput"
    unit: str  # " ms", " samples/s"
    chosen: Side
    against: Side
    verdict: str
    why: str  # the rule's outcome in words
    family: int = 1
    lower_is_better: bool = True
    keep: str | None = None
    action: str | None = None
    caveat: str | None = None
    count: str = "launches"  # what n counts: "launches", "seeds"
    speed: bool = True  # the figure is a time or a rate (said as "× faster"); else a difference ("points above")
    interval: tuple[float, float] | None = None
    confidence: float = 0.95
    more: int | None = None
    command: str | None = None
    worse: tuple[str, ...] = ()  # the compared settings the best beats beyond noise (no more launches: racing)
    withheld: str = ""  # a comparison decided on its figure whose recommendation another figure withholds (amp)

    @property
    def recommends(self) -> bool:
        return self.verdict == BETTER

    def record(self) -> dict:
        """As plain data (what the report's check reads: scalelab.analysis.checks.decision_faults)."""
        return {**asdict(self), "card": self.card(), "material": MATERIAL}

    def ratio(self) -> str:
        """How the chosen side compares with the other, one way: "1.41× faster than 1 thread"; a figure that is not
        a speed (an accuracy) by its difference: "22.5 points above linear"."""
        a, b = self.chosen.value, self.against.value
        if not self.speed:
            return f"{fmt(abs(a - b), self._points())} {'above' if a > b else 'below'} {self.against.label}"
        faster = b / a if self.lower_is_better else a / b
        return ratio_words(faster, self.against.label)

    def _points(self) -> str:
        return " points" if self.unit.strip() == "%" else self.unit

    def _interval_words(self) -> str:
        if self.interval is None:
            return ""
        lo, hi = self.interval
        pct = f"{100 * self.confidence:.3g} % interval"
        if not self.speed:
            return f"{pct} of the difference {lo:+.3g} to {hi:+.3g}{self._points()}"
        return f"{pct} of the speed ratio {lo:.3g}–{hi:.3g}×"

    def margin_words(self) -> str:
        return f"±{MARGIN_POINTS:g}{self._points()}" if not self.speed else f"±{100 * MARGIN:g} %"

    def card(self) -> str:
        """The card's text: the answer, both sides with interval and n, the rule's outcome, the caveat."""
        both = (f"{self.figure.capitalize()} of {self.chosen.label}: {self.chosen.words(self.unit, self.count)}; "
                f"of {self.against.label}: {self.against.words(self.unit, self.count)}.")
        a, b, iv = self.chosen.label, self.against.label, self._interval_words()
        if self.verdict == BETTER:
            text = f"Use {self.action or a}: {a} beats {b}: {self.ratio()} ({iv}), beyond noise ({self.why}). {both}"
        elif self.verdict == WORSE:
            text = (f"Keep {self.keep or b}: {a} is worse than {b} beyond noise: {self.ratio()} ({iv}; {self.why}). "
                    f"{both}")
        elif self.verdict == EQUIVALENT:
            text = (f"Keep {self.keep or a}: {a} and {b} are equivalent within {self.margin_words()} "
                    f"({self.ratio()}; {iv}; {self.why}). {both}")
        else:
            n = min(self.chosen.n, self.against.n)
            head = f"Undecided after {plural(n, self.count)} each: {self.why}"
            flag = "--seeds" if self.count == "seeds" else "--launches"
            run = f"`{self.command} {flag} {self.more}`" if self.command else f"{flag} {self.more}"
            if self.more is not None and n < MIN_LAUNCHES:
                head += f" ({run})"
            elif self.more is not None:
                k = self.more - n
                head += (f"; about {k} more {plural(k, self.count).split(' ', 1)[1]} each would decide a difference of "
                         f"{self.margin_words().lstrip('±')} ({run})")
            keep = f"Keep {self.keep} meanwhile" if self.keep else f"No {self.question} is recommended yet"
            text = f"{head}. {keep}. {both}"
        return text + (f" Caveat: {self.caveat}." if self.caveat else "")


def decide(chosen: Side, against: Side, *, question: str, figure: str = "median step", unit: str = " ms",
           lower_is_better: bool = True, family: int = 1, keep: str | None = None, action: str | None = None,
           caveat: str | None = None, share: float = MATERIAL, count: str = "launches", speed: bool = True,
           command: str | None = None, pool: NoiseModel | None = None) -> Decision:
    """The one rule (module docstring) applied to `chosen` against `against`."""
    base = Decision(question, figure, unit, chosen, against, UNDECIDED, "", family, lower_is_better, keep, action,
                    caveat, count, speed, command=command)
    return replace(base, **_verdict(chosen, against, lower_is_better, family, share, count, speed, pool))


def model_for(sides: Sequence[Side]) -> NoiseModel:
    """The study's noise model when one is set (`pooled`), else one pooled over these sides alone."""
    model = _MODEL.get()
    return model if model is not None else fit([(s.label, s.launch_values or (), math.nan, 0) for s in sides])


def _contrast(a: Side, b: Side, lower: bool, speed: bool, alpha: float, pool: NoiseModel | None) -> Contrast | None:
    """ln(speed of a / speed of b) (positive: a is better) or, for an accuracy, a - b in points."""
    if speed:
        if not (a.value > 0 and b.value > 0):
            return None
        g = math.log(b.value / a.value) if lower else math.log(a.value / b.value)
        if a.launch_values and b.launch_values:
            # centred on the geometric mean of the launch medians, the estimator whose variance the model gives
            # (a median of 4 or 8 launch medians varies more, and would make the interval too narrow); for a
            # rate (ln rate = ln work - ln step) the step's shift counts with the opposite sign: g - shift alike
            shift = geometric_shift(a.launch_values) - geometric_shift(b.launch_values)
            c = contrast(g - shift, a.launch_values, b.launch_values, model_for([a, b]), alpha)
            if c is not None:
                return c
        ses = [(math.log(s.interval[1]) - math.log(s.interval[0])) / (2 * Z95) for s in (a, b)
               if s.interval[0] > 0]
        return Contrast(g, math.hypot(*ses), math.inf) if len(ses) == 2 else None
    if a.launch_values and b.launch_values:  # each seed's figure, in seed order: compared seed by seed
        return difference_contrast(a.launch_values, b.launch_values, lower, alpha, pool)
    d = (b.value - a.value) if lower else (a.value - b.value)
    return Contrast(d, math.hypot(*((s.interval[1] - s.interval[0]) / (2 * Z95) for s in (a, b))), math.inf)


def _model_side(side: Side, model: NoiseModel, time: bool) -> Side:
    """The side with its figure's 95 % interval from the noise model (noise.figure_interval), rather than the
    table's, which from 2 launches is their range (a 50 % interval) and which one slow launch stretches."""
    if len(side.launch_values) < MIN_LAUNCHES:
        return side
    iv = figure_interval(side.value, side.launch_values, model, time)
    return side if iv is None else replace(side, interval=iv, values=None)


def _verdict(a: Side, b: Side, lower: bool, family: int, share: float, count: str, speed: bool,
             pool: NoiseModel | None) -> dict:
    bad = [s for s in (a, b) if not trusted(s.quality)]
    if bad:
        return {"verdict": UNDECIDED, "why": f"{bad[0].label} is flagged ({bad[0].quality})"}
    n = min(a.n, b.n)
    if n < MIN_LAUNCHES:
        few = "each" if a.n == b.n else f"of {(a if a.n < b.n else b).label}"
        return {"verdict": UNDECIDED, "more": MIN_LAUNCHES,
                "why": f"a comparison between configurations needs {MIN_LAUNCHES} or more {count} each"
                       + ("" if few == "each" else f", and {(a if a.n < b.n else b).label} has {plural(n, count)}")}
    if not (known(a.interval) and known(b.interval)):
        return {"verdict": UNDECIDED, "why": "a side has no interval"}
    alpha = level(family)
    c = _contrast(a, b, lower, speed, alpha, pool)
    if c is None or not math.isfinite(c.se):
        return {"verdict": UNDECIDED, "why": "no noise estimate for these sides"}
    lo, hi = c.interval(alpha)
    shown = (lo, hi) if not speed else (math.exp(lo), math.exp(hi))
    out = {"interval": shown, "confidence": 1 - alpha}
    if speed and a.launch_values and b.launch_values:  # each side's own 95 % interval from the model
        a, b = (_model_side(s, model_for([a, b]), lower) for s in (a, b))
        out.update(chosen=a, against=b)
    disjoint = separated_95(a.interval, a.values, b.interval, b.values)
    margin = MARGIN_POINTS if not speed else math.log(1 + MARGIN)
    big = material(a, b, share)
    fam = f", corrected for {family} alternatives and {MAX_LOOKS} looks" if family > 1 else \
        f", corrected for {MAX_LOOKS} looks"
    how = ("paired by seed" if c.paired and count == "seeds" else "paired by round" if c.paired else
           "the seed spread pooled over the experiment's cells" if count == "seeds" and pool is not None else
           "each side's own seed spread (Welch)" if count == "seeds" and math.isfinite(c.dof) else
           "the pooled launch noise" if math.isfinite(c.dof) else "the two sides' own intervals")
    dof = f", {c.dof:.0f} degrees of freedom" if math.isfinite(c.dof) else ""
    each = f"{how}{dof}{fam}, n = {plural(n, count)} each"
    apart = lo > 0 or hi < 0 or disjoint
    if apart and (big or not -margin < lo <= hi < margin):
        up = lo > 0 or (disjoint and c.estimate > 0)
        if not (lo > 0 or hi < 0):  # decided on the sides' disjoint 95 % intervals: say so beside the ratio's
            each = (f"the two sides' own 95 % intervals below do not meet; the ratio's interval ({each}) reaches "
                    f"{1 if speed else 0}")
        return {**out, "verdict": BETTER if up else WORSE, "why": each}
    if -margin < lo and hi < margin:
        return {**out, "verdict": EQUIVALENT, "why": each}
    needed = launches_needed(c, n, margin, alpha)
    return {**out, "verdict": UNDECIDED, "more": needed,
            "why": f"the {100 * (1 - alpha):.3g} % interval of the {'speed ratio' if speed else 'difference'} "
                   f"reaches both sides of {1 if speed else 0} and beyond the {MARGIN_POINTS if not speed else 100 * MARGIN:g}"
                   f"{' points' if not speed else ' %'} margin ({each})"}


def pick(sides: Sequence[Side], *, question: str, default: str | None = None,
         cheaper: Callable[[Side], float] | None = None, **kw) -> Decision | None:
    """One choice among `sides` (>= 2): the best trusted side against every other trusted one, corrected for the
    family; a flagged side is left out (its table's sentences say why), and with fewer than two trusted sides
    nothing is decided (UNDECIDED against a flagged one). What is kept (module docstring) is always a compared
    side: `default` (a label among the sides) or the cheapest equivalent (`cheaper`: lower is cheaper). None for
    fewer than two sides."""
    if len(sides) < 2:
        return None
    lower = kw.get("lower_is_better", True)
    ok = [s for s in sides if trusted(s.quality) and not math.isnan(s.value)]
    labels = {s.label for s in sides}
    if len(ok) < 2:
        bad = next(s for s in sides if s not in ok)
        return replace(decide(ok[0] if ok else sides[0], bad if ok else sides[1], question=question, **kw),
                       keep=_default(default, labels))
    with pooled(model_for(ok)):  # the study's model, else one pooled over this choice's sides
        return _pick(ok, lower, question, default, cheaper, kw)


def _pick(ok: list[Side], lower: bool, question: str, default: str | None,
          cheaper: Callable[[Side], float] | None, kw: dict) -> Decision:
    ordered = sorted(ok, key=lambda s: s.value if lower else -s.value)
    best, others = ordered[0], ordered[1:]
    family = len(others)
    verdicts = [decide(best, o, question=question, family=family, **kw) for o in others]
    worse = tuple(d.against.label for d in verdicts if d.verdict == BETTER)
    return replace(_kept(ok, best, verdicts, question, default, cheaper, family, kw), worse=worse)


def _kept(ok: list[Side], best: Side, verdicts: list[Decision], question: str, default: str | None,
          cheaper: Callable[[Side], float] | None, family: int, kw: dict) -> Decision:
    """The decision `pick` says, from the best side's verdicts against every other (module docstring)."""
    open_ = [d for d in verdicts if d.verdict == UNDECIDED]
    if open_:
        d = open_[0]
        return replace(d, keep=_default(default, {d.chosen.label, d.against.label}))
    tied = [best, *(d.against for d in verdicts if d.verdict == EQUIVALENT)]
    if len(tied) == 1:
        return verdicts[0]  # the best beats every other: the card names the runner-up
    candidates = sorted(tied, key=cheaper) if cheaper is not None else [best]
    if default is not None and default in {s.label for s in tied}:
        candidates = [s for s in tied if s.label == default]
    for keeper in candidates:  # never one that another side beats beyond noise
        if keeper is best or all(decide(keeper, o, question=question, family=family, **kw).verdict != WORSE
                                 for o in ok if o is not keeper):
            break
    else:
        keeper = best
    why = ("the default" if keeper.label == default else "the cheapest equivalent to the best" if keeper is not best
           else "the best")
    if keeper is best:
        return replace(next(d for d in verdicts if d.verdict == EQUIVALENT), keep=f"{best.label}, {why}")
    return replace(decide(keeper, best, question=question, family=family, **kw), keep=f"{keeper.label}, {why}")


def _default(label: str | None, compared: set[str]) -> str | None:
    """What a card keeps when nothing wins: the default, when it is one of the compared sides."""
    return None if label is None or label not in compared else f"{label}, the default"


def remeasured_apart(first: tuple[float, float] | None, second: tuple[float, float] | None) -> bool:
    """Whether two measurements of the same cell disagree (their intervals do not meet): drift between them, not a
    figure to trust (scalelab.lab.checked)."""
    return separated(first, second)


def rank(table, label: str, question: str, *, default: str | None = None,
         cheaper: Callable[[Side], float] | None = None, action: Callable[[str], str] | None = None,
         caveat: str | None = None, command: str | None = None) -> tuple[list[str], Decision | None]:
    """A comparison table's rows (median step, its interval, launches, quality) as one choice: a sentence per
    flagged row set aside (analysis.interpret.flagged), then the decision's card; the decision (None with fewer
    than two rows). `action(label)`: the recommendation's words for a row."""
    kept, left_out = flagged(table, label)
    if len(table) < 2:
        return left_out, None
    if not len(kept):
        return left_out + [f"Every {question} is flagged: no ranking is a finding."], None
    sides = [step_side(r, r[label]) for r in table.to_dict("records")]
    decision = pick(sides, question=question, default=default, cheaper=cheaper, caveat=caveat, command=command)
    if action is not None:
        decision = replace(decision, action=action(decision.chosen.label))
    return left_out + [decision.card()], decision


def card(decisions: Sequence[Decision | None]) -> str | None:
    """The recommendation card of an experiment's decisions (one or several choices: one card)."""
    texts = [d.card() for d in decisions if d is not None]
    return " ".join(texts) if texts else None
