"""The physics every row must obey before a sentence, a ranking or a recommendation may use it (pure).

Each check reads one table row (a dict) and returns None when the row obeys it, else why not, in words:
- `hides_while_blocking`: a strategy that syncs after backward and waits for it hides nothing, so its overlap
  interval reaches 0 (within OVERLAP_SLACK);
- `faster_than_baseline`: the sync cannot make a step shorter than the same step without collectives;
- `overlap_above_one`: no strategy hides more than all of its communication;
- `beyond_host_peak`: no training run's collectives move bytes faster (busbw) than the fastest call the
  collective benchmark measured on this host (`bench comm`, the same study), beyond LINK_SLACK, where the
  benchmark reached the run's message size (a bench of small messages says nothing about a large bucket's rate);
  a run over shaped links is held to its links (compare.faster_than_link, applied when its table is built);
- `superlinear`: a speedup above the worker count beyond its interval must be flagged "superlinear" (a finding,
  reported in words), never pass unremarked and never be dropped.
Three more hold the claims made from a table, not its figures (`claim_contradictions`): an accuracy is compared,
and a setting recommended, only from runs that learned (tables with `learned`: scalelab.analysis.learning); no
recommendation rests on a prediction marked extrapolation (`extrapolation`: scalelab.perf.horizon); no batch is
recommended under the study's demonstration memory cap (`limit`: scalelab.experiments.max_batch). One holds a
model's predictions to physics (`predicted_beyond_bounds`): no predicted efficiency or end of its interval above
100 %, no predicted speedup above the worker count, in the tables or in words.

The experiments apply the row checks when they build their tables (the row's `quality`: scalelab.analysis.compare,
scalelab.analysis.scaling); the host's peak spans two experiments, so `mark_host_peak` applies it to a study's
tables before their sentences are written. `contradictions` then reads an experiment's tables, sentences and
recommendation and lists every sentence that relies on a row a check failed: a study must have none
(tests/dist/test_study_dist.py, tests/unit/analysis/test_checks.py).

A stored run obeys its own arithmetic (`run_failures`, one sentence per broken rule; tests/dist/conftest.py holds
every run the distributed tests make to it, so a new figure that breaks arithmetic fails the suite):
- `negative_figures`: a time, a byte count, a rate (a summary key in NONNEGATIVE_UNITS or COUNTS) is >= 0, and so
  are both ends of its interval, the low end not above the high; DIFFERENCES (which may be negative) are exempt;
- `unsummed_steps`: the parts of a step (its stages and `other`) sum to its wall time, per rank and step;
- `unsplit_collectives`: per rank and timed step, waiting for peers + critical communication = the rank's time
  inside collectives (the meter's comm_total(s); scalelab.analysis.peers.rank_split), and the summary's
  comm/critical(ms) and comm/waiting_for_peers(ms) are their stated aggregates (the rank that sets the step; the
  largest over ranks) averaged over the timed steps; Horovod runs take these figures from rank 0's timeline
  (scalelab.analysis.hvdcomm) and are not held to the meter's records;
- `bytes_off_theory`: where theory knows a step's payload, the stored bytes per step equal it: a strategy that
  allreduces the full-precision gradients (FULL_GRADIENT, no compression hook) sends the gradients' bytes in
  backward (memory/gradients(bytes)); a no-op sync or no-op collectives send nothing.

A scale cell's views of one quantity agree (scalelab.analysis.view_checks, issue 57): `cell_view_faults` (table vs
breakdown exposed communication, overlap vs the hidden part, a straggler's cost vs its cell's waiting; part of
`contradictions`), `straggler_steps_over_waiting` (per stored step; part of `run_failures`) and `explain_faults`.

Two more hold the report's words to its numbers: `decision_faults` reads every decision of a study (plain records
of scalelab.lab.decision) and lists a winner whose ratio interval and sides' intervals both fail to separate, two
sides with disjoint 95 % intervals left undecided, a winner that rests on fewer than 2 launches, a card worded as
a winner whose verdict is not "better", a card keeping a setting it did not compare, and a card that does not state
both sides with their figures and n; `ratio_faults` lists a ratio sentence whose size or direction ("× faster" / "× the speed of
... (× slower)") the table's figures do not give.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

import numpy as np

from scalelab.analysis import keys
from scalelab.analysis.compare import LINK_SLACK, OVERLAP_SLACK, trusted, worst_quality
from scalelab.analysis.intervals import separated_95
from scalelab.analysis.hvdcomm import COMM_SOURCE
from scalelab.analysis.peers import rank_split, setter
from scalelab.analysis.scaling import SUPERLINEAR
from scalelab.analysis.summary import STAGE_COLUMNS
from scalelab.analysis.view_checks import cell_view_faults, straggler_steps_over_waiting

WINNER_WORDS = ("Use ", "Train in ", "For ")  # how a card that recommends begins
# words with which a sentence sets a row aside instead of relying on it
SET_ASIDE = ("not used", "left out", "flagged", "implausible", "is not a finding", "not compared", "within noise",
             "indicative")


def _number(row: Mapping, key: str) -> float | None:
    value = row.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def hides_while_blocking(row: Mapping) -> str | None:
    low, high = _number(row, "overlap_ci_low"), _number(row, "overlap_ci_high")
    if row.get("blocks") is True and low is not None and low > OVERLAP_SLACK:
        return (f"a blocking sync hides nothing, yet its overlap interval ({100 * low:.0f}–{100 * high:.0f} %) "
                "excludes 0")
    return None


def faster_than_baseline(row: Mapping) -> str | None:
    high = _number(row, "exposed_ci_high(ms)")
    return "the sync is faster than its no-op baseline beyond noise" if high is not None and high < 0 else None


def overlap_above_one(row: Mapping) -> str | None:
    low = _number(row, "overlap_ci_low")
    return "overlap above 100 % beyond its interval" if low is not None and low > 1 + OVERLAP_SLACK else None


@dataclass(frozen=True)
class HostPeak:
    """The fastest single call the study's collective benchmark measured (busbw_max over every op and size) and
    the largest message it measured."""
    busbw: float
    largest_bytes: float


def beyond_host_peak(row: Mapping, peak: HostPeak | None) -> str | None:
    busbw, payload = _number(row, "busbw(GB/s)"), _number(row, "bytes_per_step")
    count = _number(row, "collectives_per_step")
    if peak is None or busbw is None or busbw <= peak.busbw * (1 + LINK_SLACK):
        return None
    if payload is None or not count or payload / count > peak.largest_bytes:
        return None  # its messages are larger than any the benchmark sent: no ceiling for them
    return (f"collectives faster than this host allows: busbw {busbw:.3g} GB/s, the collective benchmark's fastest "
            f"call here {peak.busbw:.3g} GB/s")


def superlinear(row: Mapping) -> str | None:
    low, workers = _number(row, "speedup_ci_low"), _number(row, "workers")
    if low is None or workers is None or low <= workers:
        return None
    return None if str(row.get("quality", "")).startswith(SUPERLINEAR) else "speedup above N is not flagged superlinear"


ROW_CHECKS: tuple[Callable[[Mapping], str | None], ...] = (hides_while_blocking, faster_than_baseline,
                                                           overlap_above_one, superlinear)


def host_peak(tables: Mapping[str, pd.DataFrame]) -> HostPeak | None:
    """The collective benchmark's fastest single call (busbw_max, over every op and size) and largest message."""
    bench = tables.get("comm")
    # the study's comm table names the fastest call's busbw for what it is (experiments/comm.py, issue 60)
    fastest = next((c for c in ("busbw_single_max(GB/s)", "busbw_max(GB/s)") if bench is not None and c in bench),
                   None)
    if bench is None or not len(bench) or fastest is None:
        return None
    ok = bench[bench["status"] == "ok"] if "status" in bench else bench
    peak = ok[fastest].max() if len(ok) else None
    if peak is None or pd.isna(peak):
        return None
    return HostPeak(float(peak), float(ok["size(B)"].max()))


def mark_host_peak(tables: dict[str, pd.DataFrame], peak: HostPeak | None) -> dict[str, pd.DataFrame]:
    """The tables with every row faster than `peak` marked implausible in its quality (a new frame where any is)."""
    out = dict(tables)
    for name, table in tables.items():
        if name == "comm" or not len(table) or "busbw(GB/s)" not in table or "quality" not in table:
            continue
        reasons = [beyond_host_peak(r, peak) for r in table.to_dict("records")]
        if any(reasons):
            table = table.copy()
            table["quality"] = [q if r is None else worst_quality(f"implausible: {r}", q)
                                for q, r in zip(table["quality"], reasons)]
            out[name] = table
    return out


def failures(tables: Mapping[str, pd.DataFrame], peak: HostPeak | None = None) -> list[tuple[str, dict, str]]:
    """(table, row, why) for every row of `tables` that fails a check."""
    out = []
    for name, table in tables.items():
        if name == "comm" or not isinstance(table, pd.DataFrame) or not len(table):
            continue
        for row in table.to_dict("records"):
            for check in (*ROW_CHECKS, lambda r: beyond_host_peak(r, peak)):
                why = check(row)
                if why:
                    out.append((name, row, why))
    return out


# the column that names a row in sentences, where a table has one (else its first column)
LABELS = ("sync", "backend", "engine", "bucket", "precision", "lr_rule")


def _label(row: Mapping) -> str:
    return str(next((row[c] for c in LABELS if c in row), next(iter(row.values()))))


def _names(row: Mapping, text: str) -> bool:
    """Whether `text` (a sentence) names the row by its label as a whole word."""
    return re.search(rf"(?<![\w+.-]){re.escape(_label(row))}(?![\w+-])", text) is not None


def contradictions(tables: Mapping[str, pd.DataFrame], sentences: list[str], rec: str | None,
                   peak: HostPeak | None = None) -> list[str]:
    """Every sentence or recommendation that relies on a row a check failed, with why: the row's quality must
    set it aside (compare.trusted; superlinear rows must say so), the recommendation must not name it, and a
    sentence may name it only to set it aside (SET_ASIDE)."""
    out = []
    for name, row, why in failures(tables, peak):
        if why.startswith("speedup above N"):
            out.append(f"{name}: {row.get('workers')} workers: {why}")
            continue
        if trusted(row.get("quality")):
            out.append(f"{name}: {_label(row)}: {why}, but its quality is {row.get('quality')!r}")
        if rec and recommends(rec) and _names(row, chosen_part(rec)):
            out.append(f"{name}: the recommendation rests on {_label(row)} ({why}): {rec}")
        out += [f"{name}: {s}" for s in sentences if _names(row, s) and not any(w in s for w in SET_ASIDE)]
    return (out + claim_contradictions(tables, sentences, rec) + cell_view_faults(tables)
            + predicted_beyond_bounds(tables, sentences, rec))


PREDICTED = ("prediction", "options")  # the tables of a model's predictions (scalelab.perf.prediction)
_EFFICIENCY_TEXT = re.compile(r"efficiency (\d+(?:\.\d+)?) %(?: \(95 %: (\d+(?:\.\d+)?)–(\d+(?:\.\d+)?) %\))?")


def predicted_beyond_bounds(tables: Mapping[str, pd.DataFrame], sentences: list[str], rec: str | None) -> list[str]:
    """A predicted efficiency, or an end of its interval, above 100 %, or a predicted speedup above the worker
    count, in a prediction table (PREDICTED) or in the words of the experiment that has one: a model's rank does
    at least a lone rank's work, so neither can be (perf/intervals.efficiency_interval). Measured figures are not
    held to it here: noise may take one past the bound, and `superlinear` asks that it be said."""
    if not any(name in tables for name in PREDICTED):
        return []
    out = []
    for name in PREDICTED:
        table = tables.get(name)
        for row in table.to_dict("records") if isinstance(table, pd.DataFrame) else ():
            ends = [_number(row, k) for k in ("efficiency", "efficiency_ci_low", "efficiency_ci_high")]
            speedup, workers = _number(row, "speedup"), _number(row, "workers")
            if any(e is not None and e > 1 + ROUNDING for e in ends):
                out.append(f"{name}: {_label(row)} at {row.get('workers')} workers: a predicted efficiency above "
                           f"100 % ({', '.join(f'{100 * e:.0f} %' for e in ends if e is not None)})")
            if speedup is not None and workers is not None and speedup > workers * (1 + ROUNDING):
                out.append(f"{name}: a predicted speedup {speedup:.3g} above its {workers:g} workers")
    for text in [*sentences, *([rec] if rec else [])]:
        for match in _EFFICIENCY_TEXT.finditer(text):
            if any(float(v) > 100 for v in match.groups() if v is not None):
                out.append(f"a predicted efficiency above 100 % in words ({match.group(0)}): {text}")
    return out


def recommends(card: str) -> bool:
    """Whether a recommendation card recommends (a decision's card that keeps the default, or recommends nothing,
    names its sides only to compare them: scalelab.lab.decision)."""
    return card.startswith(WINNER_WORDS)


def chosen_part(card: str) -> str:
    """What a card recommends: its words before the first colon ("Use the ddp gradient sync"); the rest compares
    it with an alternative, which the card may name whatever its checks say."""
    return card.split(": ", 1)[0]


NOT_LEARNED = ("did not learn", "not known to have learned", "not compared", "indicative", "chance")


def claim_contradictions(tables: Mapping[str, pd.DataFrame], sentences: list[str], rec: str | None) -> list[str]:
    """Claims that rest on what cannot carry them: an accuracy of a run that did not learn, compared or
    recommended; a recommendation at a worker count where every prediction is extrapolation; a batch recommended
    under the demonstration cap."""
    out = []
    for name, table in tables.items():
        if not isinstance(table, pd.DataFrame) or not len(table):
            continue
        if "learned" in table:
            for row in table[table["learned"].astype(str) != "True"].to_dict("records"):
                if rec and recommends(rec) and _names(row, chosen_part(rec)):
                    out.append(f"{name}: the recommendation names {_label(row)}, which did not learn: {rec}")
                out += [f"{name}: {s}" for s in sentences if _names(row, s) and "accura" in s
                        and not any(w in s for w in NOT_LEARNED)]
        if "extrapolation" in table and "workers" in table and rec:
            beyond = set(table.loc[table["extrapolation"].astype(bool), "workers"].astype(int))
            inside = set(table.loc[~table["extrapolation"].astype(bool), "workers"].astype(int))
            for n in (int(m) for m in re.findall(r"on ([\d,]+) workers", rec.replace(",", ""))):
                if n in beyond and n not in inside:
                    out.append(f"{name}: the recommendation rests on an extrapolation ({n} workers): {rec}")
        if "limit" in table and rec and (table["limit"] == "demonstration").any():
            out.append(f"{name}: a batch is recommended under the study's demonstration cap: {rec}")
    return out


# ------------------------------------------------------------------ a stored run's own arithmetic
NONNEGATIVE_UNITS = ("(ms)", "(s)", "(bytes)", "(GiB)", "(GB/s)", "(samples/s)", "(cores)", "(%)")
COUNTS = (keys.COMM_COLLECTIVES_PER_STEP, keys.COMM_BYTES_PER_STEP, keys.COMM_BYTES_FORWARD_PER_STEP,
          keys.COMM_BYTES_BACKWARD_PER_STEP, keys.COMM_BYTES_OPTIMIZER_PER_STEP, keys.COMM_LOOPBACK_BYTES_PER_STEP,
          keys.COMM_BYTES_TOTAL, keys.COMM_COLLECTIVES_TOTAL)
DIFFERENCES = (keys.MEMORY_TRAIN_ADDED_BYTES,)  # what training adds to the set-up's memory: it may free some
ROUNDING = 1e-9  # below 0 by less than this (in the figure's unit) is float rounding
SUM_SLACK_S = 1e-6  # parts of a step, a rank's split: float sums of stamps within a microsecond
FULL_GRADIENT = ("auto", "ddp", "allreduce", "bucketed")  # strategies that allreduce every gradient once a step


def _nonnegative_key(key: str) -> bool:
    return key not in DIFFERENCES and (key in COUNTS or key.endswith(NONNEGATIVE_UNITS)) and "_ci_" not in key


def negative_figures(summary: Mapping) -> list[str]:
    """Every non-negative figure of a summary that is below 0, or whose interval reaches below 0 or is upside down."""
    out = []
    for key in [k for k in summary if _nonnegative_key(k)]:
        value, (lo_key, hi_key) = _number(summary, key), keys.ci_keys(key)
        low, high = _number(summary, lo_key), _number(summary, hi_key)
        if value is not None and value < -ROUNDING:
            out.append(f"{key} = {value:.6g}: a time, a byte count or a rate is never below 0")
        if low is not None and low < -ROUNDING:
            out.append(f"{key}'s interval reaches below 0 ({low:.6g} to {high if high is None else f'{high:.6g}'})")
        if low is not None and high is not None and low > high + ROUNDING:
            out.append(f"{key}'s interval is upside down ({low:.6g} > {high:.6g})")
    return out


# a step's parts: the loop's stages and `other`, and the one span of forward and backward that a step scalelab found
# in a user's script carries instead of the two (scalelab.run.found_steps)
PART_COLUMNS = (*STAGE_COLUMNS, "forward_backward(s)")


def unsummed_steps(records: list[dict]) -> list[str]:
    """Every step record whose parts (PART_COLUMNS: the named stages and `other`) do not sum to its wall(s)."""
    out = []
    for r in records:
        if "wall(s)" not in r or "other(s)" not in r:
            continue  # not a timed step of the loop (a probe's sketch, an old record)
        parts = sum(float(r.get(col) or 0.0) for col in PART_COLUMNS)
        if abs(parts - float(r["wall(s)"])) > SUM_SLACK_S * (1 + float(r["wall(s)"])):
            out.append(f"rank {r.get('rank')} step {r.get('step')}: its parts sum to {1e3 * parts:.4f} ms, its "
                       f"wall time is {1e3 * float(r['wall(s)']):.4f} ms")
    return out


def unsplit_collectives(records: list[dict], summary: Mapping) -> list[str]:
    """Per rank and timed step, waiting + critical != the rank's time inside collectives; or the summary's
    comm/critical(ms) / comm/waiting_for_peers(ms) not their stated aggregate over ranks and mean over steps."""
    if summary.get(COMM_SOURCE) is not None:  # Horovod: figures from rank 0's timeline (analysis.hvdcomm)
        return []
    by_step: dict = {}
    for r in records:
        if not r.get("warmup") and "comm_events" in r and "comm_total(s)" in r:
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    out, setters, largest = [], [], []
    for step, ranks in sorted(by_step.items()):
        recs = [ranks[k] for k in sorted(ranks)]
        events = [list(e) if isinstance(e, list) else [] for e in (r["comm_events"] for r in recs)]
        split = rank_split(events)
        if split is None:
            continue
        for rec, (critical, waiting, _inside) in zip(recs, split):  # scalelab 0.1: comm_total(s) was their sum
            if "comm_sum(s)" in rec and abs(critical + waiting - float(rec["comm_total(s)"])) > SUM_SLACK_S:
                out.append(f"rank {rec['rank']} step {step}: waiting {1e3 * waiting:.4f} + critical "
                           f"{1e3 * critical:.4f} ms != its time inside collectives "
                           f"{1e3 * float(rec['comm_total(s)']):.4f} ms")
        setters.append(split[setter(events)][0])
        largest.append(max(w for _c, w, _i in split))
    for key, series, aggregate in ((keys.COMM_CRITICAL_MS, setters, "the critical communication of the rank that "
                                    "sets the step"), (keys.COMM_PEERS_WAIT_MS, largest, "the largest waiting over "
                                                       "ranks")):
        stored = _number(summary, key)
        if stored is None or not series:
            continue
        expected = 1e3 * float(np.mean(series))
        if abs(stored - expected) > 1e-6 * (1 + abs(expected)):
            out.append(f"{key} = {stored:.6g}, but the mean over timed steps of {aggregate} is {expected:.6g}")
    return out


def bytes_off_theory(config: Mapping, summary: Mapping) -> str | None:
    """Why the stored bytes per step differ from theory, where theory knows them; None when they agree or
    theory does not know (compression hooks, Horovod, a user's script, a run without collectives)."""
    stored = _number(summary, keys.COMM_BYTES_PER_STEP)
    if stored is None or config.get("engine", "ddp") != "ddp":
        return None
    if config.get("sync") == "noop" or config.get("noop_collectives"):
        return None if stored == 0 else f"{keys.COMM_BYTES_PER_STEP} = {stored:.0f} of a sync that sends nothing"
    gradients, backward = _number(summary, keys.MEMORY_GRADIENTS_BYTES), _number(summary,
                                                                                 keys.COMM_BYTES_BACKWARD_PER_STEP)
    if (config.get("sync") not in FULL_GRADIENT or config.get("ddp_hook", "none") != "none" or gradients is None
            or backward is None):
        return None
    if backward != gradients:
        return (f"{keys.COMM_BYTES_BACKWARD_PER_STEP} = {backward:.0f}, but a full-gradient allreduce "
                f"({config.get('sync')}) sends the gradients' {gradients:.0f} bytes a step")
    return None


def run_failures(run) -> list[str]:
    """Every rule of a stored run's arithmetic that `run` (a scalelab.store.ParsedRun) breaks, in words; empty
    for a run without a summary (running or failed: nothing was concluded from it)."""
    summary = run.summary
    if not summary:
        return []
    records = run.all_steps
    out = negative_figures(summary) + unsummed_steps(records) + unsplit_collectives(records, summary)
    out += straggler_steps_over_waiting(records) if summary.get(COMM_SOURCE) is None else []
    off = bytes_off_theory(run.config or {}, summary)
    return out + ([off] if off else [])


# ---- the report's decisions (scalelab.lab.decision records: Decision.record()) ------------------------------------


def _apart(a, b) -> bool:
    """Two intervals (lists or tuples) that do not meet."""
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])


def decision_faults(records: list[Mapping]) -> list[str]:
    """Every decision worded beyond what the rule carries, or a card that hides its comparison (scalelab.lab.decision:
    four answers): a winner ("better") whose ratio interval does not exclude 1 while its sides' own intervals meet;
    two sides whose own 95 % intervals are disjoint left undecided (or called equivalent for an effect of
    `material` or more); a winner from fewer than 2 launches (seeds) a side; a card worded as a winner whose
    verdict is not "better"; a card that keeps a setting it did not compare; a card without both sides' labels,
    figures and n."""
    out = []
    for d in records:
        chosen, against, card, verdict = d["chosen"], d["against"], d["card"], d["verdict"]
        said = f"{d['question']}: {card}"
        worded_winner = card.startswith(WINNER_WORDS)
        if worded_winner and verdict != "better":
            out.append(f"worded as a winner, verdict {verdict!r}: {said}")
        apart = _apart(chosen["interval"], against["interval"])
        apart_95 = apart and separated_95(tuple(chosen["interval"]), chosen.get("values"),
                                          tuple(against["interval"]), against.get("values"))
        if verdict == "better" or worded_winner:
            if not apart and not _excludes_one(d.get("interval"), d.get("speed", True)):
                out.append(f"a winner whose intervals meet ({chosen['interval']} against {against['interval']}) "
                           f"and whose ratio interval {d.get('interval')} does not exclude no difference: {said}")
            if min(chosen["n"], against["n"]) < 2:
                out.append(f"a winner from {min(chosen['n'], against['n'])} {d.get('count', 'launches')}: {said}")
        # a speed decided beyond noise whose recommendation another figure withholds (amp: accuracy not compared
        # between runs that did not learn) is undecided on purpose, and its card says why
        if apart_95 and _trusted_pair(chosen, against) and min(chosen["n"], against["n"]) >= 2 \
                and not d.get("withheld"):
            effect = abs(chosen["value"] - against["value"]) / abs(against["value"] or 1)
            if verdict not in ("better", "worse") and not (verdict == "equivalent"
                                                           and effect < d.get("material", 0.02)):
                out.append(f"disjoint 95 % intervals ({chosen['interval']} against {against['interval']}) with "
                           f"verdict {verdict!r}, not beats or worse: {said}")
        keep = (d.get("keep") or "").split(", ")[0]
        if keep and keep not in (chosen["label"], against["label"]):
            out.append(f"a card that keeps {keep!r}, which it did not compare: {said}")
        missing = [s["label"] for s in (chosen, against) if s["label"] not in card]
        if missing or card.count("n = ") < 2:
            out.append(f"the card does not state its comparison (both sides, their figures and n): {said}")
    return out


def _excludes_one(interval, speed: bool) -> bool:
    """Whether a decision's interval (of a speed ratio, or of a difference) excludes no difference."""
    if not interval or any(v is None or (isinstance(v, float) and math.isnan(v)) for v in interval):
        return False
    null = 1.0 if speed else 0.0
    return interval[0] > null or interval[1] < null


def _trusted_pair(chosen: Mapping, against: Mapping) -> bool:
    return trusted(chosen.get("quality")) and trusted(against.get("quality"))


_RATIO = re.compile(r"(\d+(?:\.\d+)?)× (faster than|the speed of) ([^,;()]+?)(?: \((\d+(?:\.\d+)?)× slower\))?"
                    r"(?=[,;.)]| \(|$| beyond)")


def ratio_faults(sentences: list[str], expected: list[float]) -> list[str]:
    """Every ratio sentence whose direction or size the numbers behind it do not carry: each "R× faster than X" /
    "R× the speed of X (S× slower)" must match one of `expected` (how many times faster, computed from the
    table) to its printed digits, say "faster" exactly when that is >= 1, and give S = 1 / R."""
    out = []
    for sentence in sentences:
        for m in _RATIO.finditer(sentence):
            r, kind, slower = float(m.group(1)), m.group(2), m.group(4)
            near = [e for e in expected if abs(e - r) <= 0.006 * max(1.0, e)]
            if not near:
                out.append(f"a ratio no figure gives ({r:g}×; the table's: "
                           f"{', '.join(f'{e:.3g}' for e in expected) or 'none'}): {sentence}")
            elif (kind == "faster than") != (near[0] >= 1):
                out.append(f"a ratio worded the wrong way ({near[0]:.3g}× as fast, said '{kind}'): {sentence}")
            if kind == "the speed of" and (slower is None or abs(float(slower) - 1 / r) > 0.05 / r):
                out.append(f"a slower ratio without its inverse: {sentence}")
    return out


def card_faults(cards: list[tuple[str, str | None]], sections: set[str]) -> list[str]:
    """Every recommendation card (text, the section holding its evidence) whose evidence is not in the report."""
    return [f"a card without its evidence (section {section!r}): {text}" for text, section in cards
            if section not in sections]

