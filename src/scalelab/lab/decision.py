"""Every recommendation of a study, decided one way: one `Decision` type and one rule for "beyond noise".

A decision compares a chosen configuration with an alternative on one figure (the median step, a throughput, an
accuracy over seeds), each side with its value, its interval and its n, and says which rule it applied and what
it found (`verdict`):
- BETTER: the chosen side is better beyond noise and by a material effect: it is recommended;
- WITHIN_NOISE: the two sides cannot be told apart: the default (or the cheaper choice) is kept, and the card
  says so;
- NOT_MATERIAL: better beyond noise, but by less than MATERIAL (2 %) of the alternative's figure (the step): a
  1 % win does not move a default (the straggler rule's material share, scalelab.analysis.stragglers);
- NOT_ENOUGH_DATA: too few launches (seeds), no interval, or a flagged side: nothing is recommended, said so.

The rule (`beyond_noise`), between two sides, each of at least MIN_LAUNCHES launches (a finding between
configurations counts launches, not steps: scalelab.analysis.repeats):
1. the intervals are separated, in the right direction, after the family-wise correction: when one choice is
   compared with k alternatives (loader settings, bucket sizes, thread counts), each interval's half-widths are
   widened by z(1 - 0.05 / 2k) / z(0.975) (Bonferroni, on the normal approximation; 1.22 at k = 3, 1.31 at 5),
   so that the chance of naming a winner from noise stays near 5 % over the whole family, not 5 % per pair;
2. the launches do not interleave: the chosen side's worst launch is better than the alternative's best (where a
   row keeps its launch medians; else its interval, which reaches every launch median);
3. the effect is material: |chosen - alternative| >= MATERIAL x alternative.

`pick` applies it to one choice among many: the best trusted row against every other, the card naming the
alternative that came closest. Only this module calls `separated` on two configurations' figures
(tests/unit/lab/test_decision.py reads the source to hold that). Cards and sentences are rendered from the
decisions (`Decision.card`), and the report's invariant check reads them (scalelab.analysis.checks.decision_faults).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist

from scalelab.analysis.compare import trusted
from scalelab.analysis.interpret import (MIN_LAUNCHES, flagged, fmt, interval, launch_range, launches, ratio_words,
                                         span, steps)
from scalelab.analysis.intervals import CONFIDENCE, known, separated
from scalelab.analysis.stragglers import MATERIAL as STRAGGLER_MATERIAL

# the least effect, as a share of the alternative's figure, that changes a default: the straggler rule's share
MATERIAL = STRAGGLER_MATERIAL

BETTER, WITHIN_NOISE, NOT_MATERIAL, NOT_ENOUGH_DATA = "better", "within noise", "not material", "not enough data"
VERDICTS = (BETTER, WITHIN_NOISE, NOT_MATERIAL, NOT_ENOUGH_DATA)
VERDICT_WORDS = {WITHIN_NOISE: "is within noise of", NOT_MATERIAL: "does not win by enough against"}


@dataclass(frozen=True)
class Side:
    """One configuration of a comparison: its label, figure, interval, n (launches or seeds), the lowest and
    highest launch value where kept, its quality, and the values its interval comes from (for its coverage)."""
    label: str
    value: float
    interval: tuple[float, float] | None
    n: int
    spread: tuple[float, float] | None = None  # (lowest, highest) launch value; None: the interval
    quality: str = "ok"
    values: int | None = None  # how many values the interval is over (its coverage: interpret.span)

    def words(self, unit: str, count: str = "launches") -> str:
        """"12.7 ms (95 % interval 12.1–13.4 ms, n = 2 launches)"."""
        return f"{fmt(self.value, unit)} ({span(self.interval, unit, self.values)}, n = {plural(self.n, count)})"


def plural(n: int, count: str) -> str:
    """"1 launch", "2 launches", "1 seed"."""
    one = {"launches": "launch", "seeds": "seed"}.get(count, count)
    return f"{n} {one if n == 1 else count}"


def step_side(row, label: str, *, value: str = "step(ms)", low: str = "step_ci_low(ms)",
              high: str = "step_ci_high(ms)") -> Side:
    """A table row's median step as a side: its launches, launch medians and quality (analysis.interpret)."""
    return Side(str(label), float(row.get(value, math.nan)), interval(row, low, high), launches(row),
                launch_range(row, low, high), str(row.get("quality") or "ok"), steps(row))


def figure_side(row, label: str, *, value: str, low: str = "ci_low", high: str = "ci_high", n: int | None = None,
                values: int | None = None) -> Side:
    """A row's figure of another kind (a throughput, an accuracy over seeds) as a side; n: its launches (seeds)."""
    return Side(str(label), float(row.get(value, math.nan)), interval(row, low, high),
                launches(row) if n is None else int(n), None, str(row.get("quality") or "ok"), values)


def widen(side: Side, family: int) -> tuple[float, float] | None:
    """The side's interval widened for a family of `family` comparisons (module docstring, rule 1)."""
    if side.interval is None or family <= 1:
        return side.interval
    z = NormalDist().inv_cdf
    factor = z(1 - (1 - CONFIDENCE) / (2 * family)) / z(1 - (1 - CONFIDENCE) / 2)
    lo, hi = side.interval
    return side.value - factor * (side.value - lo), side.value + factor * (hi - side.value)


def beyond_noise(a: Side, b: Side, *, lower_is_better: bool = True, family: int = 1) -> bool:
    """Whether `a` is better than `b` beyond noise (rules 1 and 2 of the module docstring), n permitting."""
    if min(a.n, b.n) < MIN_LAUNCHES:
        return False
    ia, ib = widen(a, family), widen(b, family)
    if not separated(ia, ib) or (ia[1] >= ib[0] if lower_is_better else ia[0] <= ib[1]):
        return False
    sa, sb = a.spread or a.interval, b.spread or b.interval
    return sa[1] < sb[0] if lower_is_better else sa[0] > sb[1]


def material(a: Side, b: Side, share: float = MATERIAL) -> bool:
    """|a - b| reaches `share` of b (rule 3)."""
    return abs(a.value - b.value) >= share * abs(b.value)


@dataclass(frozen=True)
class Decision:
    """What is recommended (`chosen`), against what (`against`), on which figure, the rule and the verdict;
    `keep`: what stays when the chosen side does not win (the default or the cheaper choice; None: nothing);
    `action`: the recommendation's words ("num_workers=2"); `caveat`: what the figures rest on beyond a
    measurement (a preset, an extrapolation), said on the card."""
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

    @property
    def recommends(self) -> bool:
        return self.verdict == BETTER

    def record(self) -> dict:
        """As plain data (what the report's check reads: scalelab.analysis.checks.decision_faults)."""
        return {**asdict(self), "card": self.card()}

    def ratio(self) -> str:
        """How the chosen side compares with the other, one way: "1.41× faster than 1 thread"; a figure that is not
        a speed (an accuracy) by its difference: "22.5 points above linear"."""
        a, b = self.chosen.value, self.against.value
        if not self.speed:
            unit = " points" if self.unit.strip() == "%" else self.unit
            return f"{fmt(abs(a - b), unit)} {'above' if a > b else 'below'} {self.against.label}"
        faster = b / a if self.lower_is_better else a / b
        return ratio_words(faster, self.against.label)

    def card(self) -> str:
        """The card's text: the verdict, both sides with interval and n, the rule's outcome, the caveat."""
        both = (f"{self.figure.capitalize()} of {self.chosen.label}: {self.chosen.words(self.unit, self.count)}; "
                f"of {self.against.label}: {self.against.words(self.unit, self.count)}.")
        if self.verdict == BETTER:
            text = f"Use {self.action or self.chosen.label}: {self.ratio()}, beyond noise ({self.why}). {both}"
        else:
            head = f"Keep {self.keep}" if self.keep else f"No {self.question} is recommended"
            text = (f"{head}: {self.why}. {both}" if self.verdict == NOT_ENOUGH_DATA else
                    f"{head}: {self.chosen.label} {VERDICT_WORDS[self.verdict]} {self.against.label} ({self.why}). "
                    f"{both}")
        return text + (f" Caveat: {self.caveat}." if self.caveat else "")


def decide(chosen: Side, against: Side, *, question: str, figure: str = "median step", unit: str = " ms",
           lower_is_better: bool = True, family: int = 1, keep: str | None = None, action: str | None = None,
           caveat: str | None = None, share: float = MATERIAL, count: str = "launches", speed: bool = True) -> Decision:
    """The one rule (module docstring) applied to `chosen` against `against`."""
    verdict, why = _verdict(chosen, against, lower_is_better, family, share, count)
    return Decision(question, figure, unit, chosen, against, verdict, why, family, lower_is_better, keep, action,
                    caveat, count, speed)


def _verdict(a: Side, b: Side, lower: bool, family: int, share: float, count: str) -> tuple[str, str]:
    flagged = [s for s in (a, b) if not trusted(s.quality)]
    if flagged:
        return NOT_ENOUGH_DATA, f"{flagged[0].label} is flagged ({flagged[0].quality})"
    n = min(a.n, b.n)
    if n < MIN_LAUNCHES:
        few = "each" if a.n == b.n else f"of {(a if a.n < b.n else b).label}"
        return NOT_ENOUGH_DATA, (f"{plural(n, count)} {few}; a comparison between configurations needs "
                                 f"{MIN_LAUNCHES} or more {count} each")
    if not (known(a.interval) and known(b.interval)):
        return NOT_ENOUGH_DATA, "a side has no interval"
    fam = f", corrected for {family} alternatives" if family > 1 else ""
    each = f"n = {plural(n, count)} each"
    if not beyond_noise(a, b, lower_is_better=lower, family=family):
        return WITHIN_NOISE, f"the intervals{fam} meet or the {count} interleave, {each}"
    if not material(a, b, share):
        effect = abs(a.value - b.value) / abs(b.value)
        return NOT_MATERIAL, (f"beyond noise{fam} ({each}), but by {100 * effect:.1f} %, under the "
                              f"{100 * share:g} % that changes a default")
    return BETTER, f"intervals{fam} separated and every one of the {count} agrees, {each}"


def pick(sides: Sequence[Side], *, question: str, default: str | None = None,
         cheaper: Callable[[Side], float] | None = None, **kw) -> Decision | None:
    """One choice among `sides` (>= 2): the best trusted side against every other trusted one, corrected for the
    family; a flagged side is left out (its table's sentences say why), and with fewer than two trusted sides
    nothing is decided (NOT_ENOUGH_DATA against a flagged one). The card names the alternative that came closest
    (the first the best fails to beat, else the runner-up). When nothing wins, `default` (a label among the sides)
    is kept, else the cheapest side within noise (`cheaper`: a side's cost, lower is cheaper). None for fewer than
    two sides."""
    if len(sides) < 2:
        return None
    lower = kw.get("lower_is_better", True)
    ok = [s for s in sides if trusted(s.quality) and not math.isnan(s.value)]
    if len(ok) < 2:
        bad = next(s for s in sides if s not in ok)
        return replace(decide(ok[0] if ok else sides[0], bad if ok else sides[1], question=question, **kw),
                       keep=_default(default))
    ordered = sorted(ok, key=lambda s: s.value if lower else -s.value)
    best, others = ordered[0], ordered[1:]
    family = len(others)
    verdicts = [decide(best, o, question=question, family=family, **kw) for o in others]
    failed = [d for d in verdicts if d.verdict != BETTER]
    decision = max(failed, key=lambda d: VERDICTS.index(d.verdict)) if failed else verdicts[0]
    if decision.verdict == BETTER:
        return decision
    keep = _default(default)
    if keep is None and cheaper is not None and decision.verdict != NOT_ENOUGH_DATA:
        tied = [best, *(d.against for d in verdicts if d.verdict in (WITHIN_NOISE, NOT_MATERIAL))]
        keep = f"{min(tied, key=cheaper).label}, the cheapest within noise"
    return replace(decision, keep=keep)


def _default(label: str | None) -> str | None:
    """What a card keeps when nothing wins and a default is known: "ddp, the default"."""
    return None if label is None else f"{label}, the default"


def remeasured_apart(first: tuple[float, float] | None, second: tuple[float, float] | None) -> bool:
    """Whether two measurements of the same cell disagree (their intervals do not meet): drift between them, not a
    figure to trust (scalelab.lab.checked)."""
    return separated(first, second)


def rank(table, label: str, question: str, *, default: str | None = None,
         cheaper: Callable[[Side], float] | None = None, action: Callable[[str], str] | None = None,
         caveat: str | None = None) -> tuple[list[str], Decision | None]:
    """A comparison table's rows (median step, its interval, launches, quality) as one choice: a sentence per
    flagged row set aside (analysis.interpret.flagged), then the decision's card; the decision (None with fewer
    than two rows). `action(label)`: the recommendation's words for a row."""
    kept, left_out = flagged(table, label)
    if len(table) < 2:
        return left_out, None
    if not len(kept):
        return left_out + [f"Every {question} is flagged: no ranking is a finding."], None
    sides = [step_side(r, r[label]) for r in table.to_dict("records")]
    decision = pick(sides, question=question, default=default, cheaper=cheaper, caveat=caveat)
    if action is not None:
        decision = replace(decision, action=action(decision.chosen.label))
    return left_out + [decision.card()], decision


def card(decisions: Sequence[Decision | None]) -> str | None:
    """The recommendation card of an experiment's decisions (one or several choices: one card)."""
    texts = [d.card() for d in decisions if d is not None]
    return " ".join(texts) if texts else None
