"""`scalelab explain RUN`: the lost-speedup breakdown of one stored run, from stored runs only (nothing is run).

The named runs the breakdown needs (scalelab.analysis.breakdown) are looked up in the store by their configs: the
run's config with ranks=1 (the same global batch, else the same per-rank batch), with sync=noop, and with
noop_collectives=true, each the newest completed run of exactly that config (its cell key: scalelab.lab.cells),
preferring the run's own study. A user's script (kind "script": `scalelab run`, the probe, the Lightning callback)
has only its 1-worker run to find (the same command with one rank; the work per step is the samples a step read
at its forward where no --global-batch was given): scalelab cannot remove the sync of code it did not write, so the
parts that need the no-sync or no-op variant are not measured there, and the data wait is the one every rank had
(keys.DATA_WAIT_ALL_RANKS_MS: one rank's wait alone is the others' waiting for peers, counted there).

What a run is decides what is said: a 1-rank run has no lost speedup (one line); a no-op-collectives variant
points to the real run(s) it serves and is not broken down (its collectives do nothing); a no-sync variant points
to them and is broken down as a run without sync; a run of two or more ranks without timed steps gets one line on
what is missing, and the straggler read from its collectives (scalelab.lab.stragglers).

Suggestions follow the largest measured cause, each with the number it rests on; another bucket size only where a
bucket sweep of the same config is stored (runs that differ from this one in bucket_mb alone).
"""
from __future__ import annotations

import dataclasses
import math
import shlex
import textwrap
from dataclasses import dataclass, field

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.breakdown import (
    LEAVES,
    PARTS,
    SCRIPT_VARIANT,
    breakdown_of_runs,
    largest_cause,
    largest_split,
    exposed_sum,
    rest_too_large,
)
from scalelab.config import TrainConfig
from scalelab.errors import ScalelabError
from scalelab.lab.cells import cell_key, config_identity, with_fields
from scalelab.lab.terminal import wrapped
from scalelab.run.script import ScriptConfig
from scalelab.store.catalog import Store

# the parts' names in a side-by-side table (scalelab.analysis.breakdown.PARTS says what each is)
SHORT = {"ideal": "ideal step", "data": "data wait", "compute": "compute slowdown", "sync_work": "sync's own work",
         "exposed": "exposed communication", "waiting": "  waiting for peers", "wire": "  wire",
         "interference": "  interference", "hidden": "  hidden", "rest": "rest", "measured": "measured step"}
# the fields of the 1-worker run of a config: one process, no nodes, no sync (what a 1-worker cell of `scale` stores)
ONE_WORKER = {"ranks": 1, "nnodes": 1, "local_nodes": 0, "link_gbps": None, "link_delay_ms": None, "wrapper": "auto",
              "sync": "auto", "noop_collectives": False, "ddp_hook": "none", "net_latency_ms": 0.0,
              "net_bandwidth_gbps": None}

@dataclass
class Explanation:
    run: dict
    named: dict[str, dict | None]  # one, nosync, noop -> the stored run used, or None
    table: pd.DataFrame | None  # None: no breakdown (one rank, a no-op variant, no timed steps): `notes` say why
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the run is, before the breakdown
    brief: bool = False  # the notes say it all (a 1-rank run: its table, all zero, only serves `runs compare`)


def _config_of(run: dict):
    config = run.get("config") or {}
    return ScriptConfig.from_dict(config) if run.get("kind") == "script" else TrainConfig.from_dict(config)


def load_run(store: Store, run_id: str) -> dict:
    """The stored run, completed and summarised, else one line saying why it cannot be explained."""
    run = store.get(run_id)  # an unknown id: StoreError, one line
    if run.get("kind") not in ("train", "script"):
        raise ScalelabError(f"run {run['run_id']}: a {run.get('kind')} run has no training steps to explain")
    if run["status"] != "completed":
        raise ScalelabError(f"run {run['run_id']}: {run['status']}"
                            f"{' (' + run['reason'] + ')' if run.get('reason') else ''}; only a completed run "
                            "can be explained")
    return run


def workers_of(run: dict) -> int:
    c = run.get("config") or {}
    return int(c.get("ranks") or 1) * int(c.get("nnodes") or 1)


def _completed_by_key(store: Store, kind: str) -> dict[str, list[dict]]:
    """Every completed stored run of `kind`, by cell key (newest first)."""
    out: dict[str, list[dict]] = {}
    for run_id in store.list_runs(status="completed", kind=kind)["run_id"]:
        run = store.get(run_id)
        try:
            key = cell_key(_config_of(run), kind)
        except (KeyError, TypeError, ValueError, ScalelabError):
            continue  # a config this scalelab cannot read
        out.setdefault(key, []).append(run)
    return out


def _newest(candidates: list[dict], study: str | None) -> dict | None:
    own = [r for r in candidates if study and r.get("study") == study]
    return (own or candidates or [None])[0]


def named_runs(store: Store, run: dict) -> dict[str, dict | None]:
    """The 1-worker run, the no-sync and the no-op-collectives variant of `run` stored in `store` (None: none)."""
    kind, cfg = run["kind"], _config_of(run)
    index = _completed_by_key(store, kind)
    find = lambda c: _newest(index.get(cell_key(c, kind), []), run.get("study"))
    workers = cfg.ranks * cfg.nnodes
    batches = [cfg.global_batch] + ([cfg.global_batch // workers] if cfg.global_batch else [])
    names = {f.name for f in dataclasses.fields(cfg)}
    alone = {k: v for k, v in ONE_WORKER.items() if k in names}
    one = None
    for batch in dict.fromkeys(batches):
        try:
            one = find(with_fields(cfg, **alone, global_batch=batch))
        except (ValueError, ScalelabError):
            continue
        if one is not None:
            break
    if workers == 1:
        one = run
    out = {"one": one, "nosync": None, "noop": None}
    if kind == "train" and cfg.sync == "noop":  # a run without sync is its own no-sync and no-op variant
        out["nosync"] = out["noop"] = run
    elif kind == "train" and workers > 1:
        out["nosync"] = find(with_fields(cfg, sync="noop"))
        out["noop"] = find(with_fields(cfg, noop_collectives=True))
    return out


def commands(run: dict) -> dict[str, str]:
    """The command that would measure each missing variant of `run`."""
    if run["kind"] == "script":
        c = run["config"] or {}
        batch = f" --global-batch {c['global_batch']}" if c.get("global_batch") else ""
        return {"one": f"scalelab run --ranks 1{batch} -- {shlex.join(c.get('command') or ['python', '...'])}",
                "nosync": SCRIPT_VARIANT, "noop": SCRIPT_VARIANT}
    c = run["config"]
    workers = c["ranks"] * c.get("nnodes", 1)
    return {"one": f"scalelab scale --workers 1,{workers} --batches {c['global_batch']} --mode strong "
                   f"(with this run's config)",
            "nosync": "scalelab train (this run's config) --sync noop",
            "noop": "scalelab train (this run's config) --noop-collectives"}


def explain(store: Store, run_id: str) -> Explanation:
    """The breakdown of a stored run against its stored variants, with what to try (the module docstring says
    which runs get none)."""
    run = load_run(store, run_id)
    none = dict.fromkeys(("one", "nosync", "noop"))
    if workers_of(run) < 2:
        timed = (run.get("summary") or {}).get(keys.STEP_MEDIAN_MS)
        work = with_work(run)
        table = breakdown_of_runs(work, one=_ideal(work, work), commands=commands(run)) if timed else None
        return Explanation(run, {**none, "one": run}, table, brief=True, notes=[
            f"run {run['run_id']} ({run['kind']}) has 1 rank: it has no lost speedup (it is the ideal a run of N "
            "ranks is measured against; `scalelab explain` a run of 2 or more ranks)."])
    notes = variant_notes(store, run)
    if (run.get("config") or {}).get("noop_collectives"):
        return Explanation(run, none, None, notes=notes)
    if not (run.get("summary") or {}).get(keys.STEP_MEDIAN_MS):
        boundary = (run.get("summary") or {}).get(keys.STEPS_BOUNDARY, "none")
        return Explanation(run, none, None, notes=notes + [
            f"run {run['run_id']}: no timed steps (steps/boundary: {boundary}): the lost-speedup breakdown needs "
            "steps, which scalelab finds at a DDP model's training forward or an optimizer's step, or the script "
            "marks (scalelab.probe); below, the straggler read from the collectives alone."])
    named = named_runs(store, run)
    real = with_work(run)
    named["one"] = one = _ideal(real, with_work(named["one"]))
    table = breakdown_of_runs(real, **{**named, "one": one}, commands=commands(run))
    return Explanation(run, named, table, suggestions(store, run, table), notes)


def _ideal(real: dict, one: dict | None) -> dict | None:
    """`one`, the 1-worker run `real` is measured against, or None where either has no global batch (a script's
    run that gave none and had none read at a forward): the ideal step, scaled by the batches, is not known."""
    if one is None or not (real["config"].get("global_batch") and one["config"].get("global_batch")):
        return None
    return one


def with_work(run: dict | None) -> dict | None:
    """A script's run as the breakdown reads it: its global batch, when not given, the samples its steps read at
    the forward; its data wait the one every rank had. Other runs as they are."""
    if run is None or run.get("kind") != "script":
        return run
    config, summary = dict(run.get("config") or {}), dict(run.get("summary") or {})
    if not config.get("global_batch") and summary.get(keys.SAMPLES_PER_STEP):
        config["global_batch"] = int(summary[keys.SAMPLES_PER_STEP])
    if keys.DATA_WAIT_ALL_RANKS_MS in summary:
        data = keys.stage_ms("data")
        for mine, theirs in zip((keys.DATA_WAIT_ALL_RANKS_MS, *keys.ci_keys(keys.DATA_WAIT_ALL_RANKS_MS)),
                                (data, *keys.ci_keys(data))):
            summary[theirs] = summary.get(mine, summary[keys.DATA_WAIT_ALL_RANKS_MS])
    return {**run, "config": config, "summary": summary}


def variant_notes(store: Store, run: dict) -> list[str]:
    """A no-op-collectives or no-sync variant (of scalelab's own loop): the real run(s) it serves, in one line."""
    c = run.get("config") or {}
    if run["kind"] != "train" or not (c.get("noop_collectives") or c.get("sync") == "noop"):
        return []
    what, variant = (("no-op-collectives variant", {"noop_collectives": True}) if c.get("noop_collectives")
                     else ("no-sync variant", {"sync": "noop"}))
    mine = cell_key(_config_of(run), "train")
    served = []
    for runs in _completed_by_key(store, "train").values():
        for other in runs:
            oc = other["config"] or {}
            if oc.get("noop_collectives") or oc.get("sync") == "noop":
                continue  # a variant serves a real run, not another variant
            try:
                if cell_key(with_fields(_config_of(other), **variant), "train") == mine:
                    served.append(other)
            except (ValueError, ScalelabError):
                continue
    served.sort(key=lambda r: (r.get("study") != run.get("study"), r["run_id"]))
    if not served:
        return [f"run {run['run_id']} is a {what}: no real run of its config is stored (this run only serves "
                "the breakdown of one)."]
    ids = ", ".join(r["run_id"] for r in served[:3]) + (f" and {len(served) - 3} more" if len(served) > 3 else "")
    return [f"run {run['run_id']} is the {what} of {ids}: it serves their breakdown (`scalelab explain "
            f"{served[0]['run_id']}`)."]


def suggestions(store: Store, run: dict, table: pd.DataFrame) -> list[str]:
    """What to try, from the largest measured cause, each with the measured number behind it."""
    cause, split = largest_cause(table), largest_split(table)
    if cause is None and split is None:
        return ["no part is beyond noise: nothing to suggest from these runs (longer runs narrow the intervals)."]

    def ms(row: dict) -> str:
        return (f"{row['value(ms)']:.3g} ms a step (95 % interval {row['value_ci_low(ms)']:.3g}–"
                f"{row['value_ci_high(ms)']:.3g})")

    s, c = run.get("summary") or {}, run.get("config") or {}
    out = [f"largest cause: {PARTS[cause['part']]}, {ms(cause)}."] if cause is not None else []
    # exposed communication is acted on through its split (breakdown.largest_split): waiting, wire or interference;
    # where exposed communication itself was not measured (a script of the user's), the split is what is known
    part = cause["part"] if cause is not None else None
    # the split as a sum first (exposed_sum): a part of it (wire time) can be larger than exposed itself, and
    # "of it" above a smaller whole read as a contradiction
    whole = exposed_sum(table)
    if whole:
        out.append(whole + ".")
    if split is not None and part in ("exposed", None):
        lead = "the largest term of that sum" if whole else "largest measured part"
        out.append(f"{lead}: {PARTS[split['part']].strip()}, {ms(split)}.")
        part = split["part"]
    if part == "data":
        out.append(f"try more loader workers (num_workers is {c.get('num_workers', 'not recorded')}) or "
                   "pin_memory: `scalelab loader-sweep` measures them.")
    elif part == "compute":
        per_rank = c.get("global_batch", 0) // max(1, c.get("ranks", 1) * c.get("nnodes", 1))
        out.append(f"each rank trains on {per_rank} samples a step: a larger per-rank batch spends the fixed "
                   f"cost of a step on more samples (weak scaling, `scalelab scale --mode weak`); threads per rank: "
                   f"{s.get(keys.THREADS_USED, 'not recorded')}.")
    elif part == "sync_work":
        out.append("another gradient-sync strategy does less of its own work: `scalelab compare strategies`.")
    elif part == "waiting":
        out.append(f"a rank arrives late at the collectives (slowest / median rank's time: "
                   f"{s.get(keys.SKEW, float('nan')):.3g}): look for a straggler or uneven work per rank before "
                   "the network.")
    elif part in ("wire", "interference"):
        bytes_ = s.get(keys.COMM_BYTES_PER_STEP)
        out.append(f"communicate less: {bytes_ / 2**20:.3g} MiB a step at busbw {s.get(keys.COMM_BUSBW, 0):.3g} GB/s; "
                   "gradient compression (ddp_hook fp16 / bf16 / powersgd) or accumulation (accumulate k) "
                   "cuts it." if bytes_ else "communicate less: gradient compression or accumulation.")
        out.extend(bucket_suggestion(store, run))
    return out


def bucket_suggestion(store: Store, run: dict) -> list[str]:
    """"another bucket size" only where runs of the same config with other bucket sizes are stored: the fastest
    one, with its median step beside this run's."""
    if run["kind"] != "train":
        return []
    mine = config_identity(TrainConfig.from_dict(run["config"]))
    mine.pop("bucket_mb", None)
    steps = {}
    for run_id in store.list_runs(status="completed", kind="train")["run_id"]:
        other = store.get(run_id)
        try:
            ident = config_identity(TrainConfig.from_dict(other["config"]))
        except (KeyError, TypeError, ValueError, ScalelabError):
            continue
        bucket = ident.pop("bucket_mb", None)
        step = (other.get("summary") or {}).get(keys.STEP_MEDIAN_MS)
        if ident == mine and step is not None:
            steps.setdefault(bucket, step)
    here = run["config"].get("bucket_mb")
    if len(steps) < 2 or here not in steps:
        return []
    best = min(steps, key=steps.get)
    if best == here:
        return [(f"of the {len(steps)} bucket sizes stored for this config, this one ({here:g} MiB) has the shortest "
                f"step ({steps[here]:.3g} ms).")]
    return [(f"another bucket size: bucket_mb {best:g} measured a {steps[best]:.3g} ms step against this run's "
            f"{steps[here]:.3g} ms ({here:g} MiB; one launch each unless `scalelab bucket-sweep` pooled more).")]


LABEL_WIDTH = 70  # the parts' column: the longest label and 2 spaces, where the terminal allows (unknown: this)
FIGURES_WIDTH = 37  # ms (9), 95 % interval (2 + 17), of gap (2 + 7)


def lines(ex: Explanation, width: int | None = None) -> list[str]:
    """The breakdown as terminal lines: the named runs, one line per part, the largest cause and what to try.
    `width`: the terminal's; the parts' column narrows to leave the figures on the part's line (a label longer
    than it goes on below), and every line is broken to it (lab.terminal.wrapped)."""
    label_width = LABEL_WIDTH if width is None else max(min(LABEL_WIDTH, width - FIGURES_WIDTH), 12)
    return [part for line in _lines(ex, label_width, width) for part in wrapped(line, width)]


def _lines(ex: Explanation, label_width: int, width: int | None) -> list[str]:
    if ex.table is None or ex.brief:
        return list(ex.notes)
    c, s = ex.run["config"] or {}, ex.run["summary"] or {}
    workers = c.get("ranks", 1) * c.get("nnodes", 1)
    out = [f"run {ex.run['run_id']} ({ex.run['kind']}): {workers} rank(s)"
           + (f", sync {c['sync']}" if c.get("sync") else "")
           + (f", global batch {c['global_batch']}" if c.get("global_batch") else "")
           + f"; {s.get(keys.STEPS_TIMED, '?')} timed steps"
           + (f" (found at {s[keys.STEPS_BOUNDARY]})" if s.get(keys.STEPS_BOUNDARY) not in (None, "probe") else "")]
    out = ex.notes + out
    for name, label in (("one", "1-worker run"), ("nosync", "no-sync variant"), ("noop", "no-op collectives")):
        got = ex.named.get(name)
        out.append(f"  {label}: {got['run_id'] if got else 'not stored'}")
    out.append(f"{'part':<{label_width}}{'ms':>9}  {'95 % interval':>17}  {'of gap':>7}")
    said: set[str] = set()  # a long "needs" (a script's variants) is said once, then "as above"
    for row in ex.table.to_dict("records"):
        indent = "    " if row["level"] else ""
        sign = "" if row["part"] in ("ideal", "measured") else "+ " if not row["level"] else "· "
        # a label longer than its column goes on below it, under its own indentation
        first, *more = textwrap.wrap(indent + sign + PARTS[row["part"]], label_width - 2, drop_whitespace=True,
                                     subsequent_indent=indent + "  ") or [""]
        label = first
        if not row["measured"] and row["part"] != "rest":
            row_line, needs = f"{label:<{label_width}}{'not measured':>12}", f"needs: {said_once(row['needs'], said)}"
            # the label's end before what it needs, which goes on below it
            out += [f"{row_line}  {needs}"] if not more else [row_line, *more, f"{indent}    {needs}"]
            continue
        value = row["value(ms)"]
        interval = (f"{row['value_ci_low(ms)']:.3g}–{row['value_ci_high(ms)']:.3g}"
                    if pd.notna(row["value_ci_low(ms)"]) else "")
        share = f"{100 * row['share_of_gap']:.0f} %" if pd.notna(row["share_of_gap"]) else ""
        note = ("  (holds the parts not measured)" if not row["measured"] else
                "  (within noise)" if row["within_noise"] is True and row["value(ms)"] != 0 else "")
        row_line = f"{label:<{label_width}}{value:>9.3g}  {interval:>17}  {share:>7}"
        # the note after the whole label: beside the figures, or after the label's end below them
        lines_of_row = [row_line, *more]
        if note and len(lines_of_row[-1] + note) > (width or math.inf):  # a note of its own, not broken
            lines_of_row.append(f"{indent}  {note.strip()}")
        else:
            lines_of_row[-1] += note
        out += lines_of_row
    if rest_too_large(ex.table):
        out.append("the rest is above 20 % of the gap: a cause is not accounted for (or the runs drifted apart).")
    missing = [p for p in LEAVES if not ex.table.set_index("part").loc[p, "measured"]]
    if missing:
        out.append(f"not measured: {', '.join(missing)}")
    return out + ex.suggestions


def said_once(needs: str, said: set[str]) -> str:
    """A part's needs ("a; b"), each one already said by a part above written "as above"."""
    parts = ["as above" if n in said else n for n in needs.split("; ")]
    said.update(needs.split("; "))
    return "; ".join(dict.fromkeys(parts))


def side_by_side(a: pd.DataFrame, b: pd.DataFrame, name_a: str, name_b: str) -> pd.DataFrame:
    """Two breakdowns as one table: per part each run's value with its interval ("not measured" where it was not)
    and b - a where both were measured."""
    def cell(row) -> str:
        if not row["measured"] and row["part"] != "rest":
            return "not measured"
        interval = (f" ({row['value_ci_low(ms)']:.3g}–{row['value_ci_high(ms)']:.3g})"
                    if pd.notna(row["value_ci_low(ms)"]) else "")
        return f"{row['value(ms)']:.3g}{interval}"

    rows = []
    for ra, rb in zip(a.to_dict("records"), b.to_dict("records")):
        both = ra["measured"] and rb["measured"]
        rows.append({"part": SHORT[ra["part"]], f"{name_a} (ms)": cell(ra), f"{name_b} (ms)": cell(rb),
                     "b - a (ms)": f"{rb['value(ms)'] - ra['value(ms)']:.3g}" if both else ""})
    return pd.DataFrame(rows)
