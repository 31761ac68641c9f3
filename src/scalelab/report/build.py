"""From experiment results (tables computed from stored runs) to the report's document model.

Every section answers one of the seeds' questions with its table, its plot and sentences computed from the
numbers (analysis.interpret). Nothing here measures or runs anything.
"""
from __future__ import annotations

import platform
from importlib import resources
from pathlib import Path

import pandas as pd

from scalelab.analysis.shown_checks import alike, describing, honest_caption, named_columns
from scalelab.analysis.tables import intervals_of
from scalelab.report.document import FigureBlock, Recommendation, Report, Section, TableBlock
from scalelab.report.drawn import read_record
from scalelab.store import RunDir, read_jsonl

def definitions() -> list[str]:
    """The measurement definitions, one string per bullet of docs/definitions.md: the one place they are written
    (the package carries that page as report/definitions.md, a link to it)."""
    text = resources.files("scalelab.report").joinpath("definitions.md").read_text(encoding="utf-8")
    bullets: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            bullets.append(line[2:].strip())
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
    return bullets


DEFINITIONS = definitions()

def _note_text(value) -> str:
    """A note's value as prose: a mapping (one entry per hardware, variant …) as "key: value; key: value"."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def section_for(experiment, result) -> tuple[Section, list[str]]:
    """One experiment's section: `experiment` is its registry entry (section, title, question, captions,
    interpret), `result` its tables, files and notes."""
    sentences, rec = [], None
    tables = result.tables
    if experiment.interpret is not None and tables and any(len(frame) for frame in tables.values()):
        sentences, rec = experiment.interpret(result)  # failed or missing experiments: the notes say why
    ids = experiment.section in RUN_IDS_SHOWN
    shown = {key: frame if ids else frame.drop(columns=["run_id"], errors="ignore") for key, frame in tables.items()
             if not key.endswith("_curves")}
    blocks = []
    for key, frame in shown.items():
        caption = honest_caption(experiment.captions.get(key, ""), frame)
        columns = telling_rows_apart(named_by(answer_columns(frame, experiment.columns.get(key)), frame,
                                              [caption, *sentences]), frame)
        blocks.append(TableBlock(key.replace("/", "_"), frame, caption, with_run_id(columns, frame)))
    figures = [figure_block(Path(p), experiment.captions.get(Path(p).name, ""), tables) for p in result.files
               if str(p).endswith(".png")]
    notes = [f"{k}: {_note_text(v)}" for k, v in result.notes.items() if k not in ("recommended",)]
    notes += [line for key, frame in tables.items() for line in flagged_rows(key, frame)]
    return Section(id=experiment.section, title=experiment.title, question=experiment.question,
                   sentences=sentences, tables=blocks, figures=figures, notes=notes), [rec] if rec else []


def figure_block(path: Path, caption: str, tables: dict[str, pd.DataFrame]) -> FigureBlock:
    """A figure with the record of what it drew (report.drawn) and its caption as it may stand: where a table it
    reads has intervals on fewer values than make a 95 % one, the caption says what they cover (honest_caption)."""
    drawn = read_record(path)
    for table in dict.fromkeys(s.get("table") for s in (drawn or {}).get("series") or []):
        if table in tables:
            caption = honest_caption(caption, tables[table])
    return FigureBlock(path, caption, drawn)


# sections whose tables show each row's run id: a reader finds the run a sentence speaks of (`scalelab explain RUN`)
RUN_IDS_SHOWN = ("scaling",)


def with_run_id(columns: list[str] | None, frame: pd.DataFrame) -> list[str] | None:
    """The answer columns with the run id last, where the table has one (None: every column, the id among them)."""
    if columns is None or "run_id" not in frame.columns or "run_id" in columns:
        return columns
    return [*columns, "run_id"]


# what a table's answer is usually made of, in the order shown after its describing columns; each figure is
# followed by its own interval where the table has one (analysis.tables.intervals_of: matched by name)
ANSWER = ["status", "step(ms)", "time/step_median(ms)", "time/epoch(s)", "throughput(samples/s)", "speedup",
          "efficiency", "compute(ms)", "comm(ms)", "exposed_comm(ms)", "overlap", "busbw(GB/s)", "max_batch",
          "final_acc"]
MOST_COLUMNS = 12  # a table this wide or narrower is shown whole


def answer_columns(frame: pd.DataFrame, declared: list[str] | None = None, most: int = 10) -> list[str] | None:
    """The columns a table's answer needs (None: show them all): the experiment's own choice, else its first
    column and the usual answer columns it has, each figure with its interval, at most `most`, its quality flag
    last."""
    if declared:
        return [c for c in declared if c in frame.columns]
    if frame.shape[1] <= MOST_COLUMNS:
        return None
    room = most - 1 if "quality" in frame.columns else most
    chosen = [frame.columns[0]]
    for figure in (c for c in ANSWER if c in frame.columns and c != frame.columns[0]):
        group = [figure, *intervals_of(figure, frame.columns)]
        if len(chosen) + len(group) > room:
            break
        chosen += group
    return chosen + (["quality"] if "quality" in frame.columns else [])


def named_by(columns: list[str] | None, frame: pd.DataFrame, texts: list[str]) -> list[str] | None:
    """The columns shown, with every column the caption or a sentence names (shown_checks.named_columns) added
    before the quality flag: a word about a figure the page does not show sends the reader to the files."""
    if columns is None:
        return None
    missing = [c for c in named_columns(frame, texts) if c not in columns and c != "run_id"]
    return _before_quality(columns, missing)


def telling_rows_apart(columns: list[str] | None, frame: pd.DataFrame) -> list[str] | None:
    """The columns shown, with the table's own describing columns (in its order; shown_checks.describing) added
    until no two rows read alike in them: the column that tells rows apart (a width, a worker count, a batch, a
    level) is part of the answer."""
    if columns is None or not len(frame):
        return columns
    chosen = list(columns)
    for column in describing(frame, [c for c in frame.columns if c not in chosen]):
        if not alike(frame, chosen).any():
            break
        if alike(frame, [*chosen, column]).sum() < alike(frame, chosen).sum():
            keys = describing(frame, chosen)
            at = next((i for i, c in enumerate(chosen) if c not in keys), len(chosen))  # after the leading keys
            chosen = [*chosen[:at], column, *chosen[at:]]
    return chosen


def _before_quality(columns: list[str], extra: list[str]) -> list[str]:
    at = columns.index("quality") if "quality" in columns else len(columns)
    return [*columns[:at], *extra, *columns[at:]]


def flagged_rows(name: str, frame: pd.DataFrame) -> list[str]:
    """One line per row of a table whose quality is not ok: which row (its first describing columns) and why."""
    if "quality" not in frame or not len(frame):
        return []
    describe = [c for c in frame.columns if c not in ("run_id", "status", "reason", "mode")][:2]
    out = []
    for _, row in frame[frame["quality"].notna() & (frame["quality"] != "ok")].iterrows():
        which = ", ".join(f"{c} {row[c]}" for c in describe)
        out.append(f"flagged in {name} ({which}): {row['quality']}")
    return out


SYSTEM_CAPTION = "System metrics per rank over time: CPU %, resident memory, loopback bytes/s."


def environment(provenance: dict, command: str) -> dict[str, str]:
    versions = provenance.get("versions", {})
    return {
        "host": str(provenance.get("host", platform.node())),
        "platform": str(provenance.get("platform", platform.platform())),
        "CPU cores": str(provenance.get("cpu_count")),
        "memory": f"{(provenance.get('memory_total_bytes') or 0) / 2**30:.1f} GiB",
        "CUDA devices": ", ".join(provenance.get("cuda_devices") or []) or "none",
        **{f"{k} version": str(v) for k, v in sorted(versions.items())},
        "git": f"{provenance.get('scalelab_git_sha') or provenance.get('git_sha') or 'n/a'}"
               f"{' (dirty)' if provenance.get('scalelab_git_dirty') else ''}",
        "command": command,
    }


def build_report(spec, answered: list[tuple], provenance: dict, command: str,
                 extra_sections: list[Section] | None = None, noise_floor: str | None = None,
                 budget: str | None = None) -> Report:
    """`answered`: (registry entry, result) per experiment, in study order; `noise_floor`: the reference cell's
    drift over the study in one line (experiments.study.noise_floor), shown with the environment; `budget`: the
    study's time budget and what it reduced or left out (lab/budget.py), likewise."""
    sections, recs = [], []
    for experiment, result in answered:
        section, r = section_for(experiment, result)
        sections.append(section)
        recs += [Recommendation(text, section.id) for text in r]
    sections += extra_sections or []
    # the quick study: fewer steps a cell, compared cells launched twice (lab.decision decides from 2 launches each
    # on the study's pooled noise model), no max-batch search and no Horovod
    quick = (" (quick: fewer steps a cell, compared cells launched twice, no max-batch search)"
             if spec.quick else "")
    subtitle = (f"study '{spec.name}'{quick}: {len(spec.experiments)} experiments on "
                f"{provenance.get('host', 'this machine')}")
    return Report(title="scalelab report", subtitle=subtitle, recommendations=recs, sections=sections,
                  definitions=DEFINITIONS, command=command,
                  environment={**environment(provenance, command),
                               **({"noise floor": noise_floor} if noise_floor else {}),
                               **({"time budget": budget} if budget else {})})


def system_frame(files: RunDir) -> pd.DataFrame:
    """All ranks' system samples of one run (`files`: its RunDir), with loopback bytes/s derived from the
    counters."""

    frames = []
    for path in files.system_files():
        f = pd.DataFrame(read_jsonl(path))
        if "lo_sent(bytes)" in f and len(f) > 1:
            f["lo_sent(bytes/s)"] = f["lo_sent(bytes)"].diff() / f["t(s)"].diff()
        frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def system_section(store, results: dict, out_dir: Path) -> Section | None:
    """System metrics over time of the study's multi-rank run with the most samples (a 2-sample run says nothing
    over time): CPU, memory and the loopback network per rank, with the number of samples behind each figure."""
    from scalelab.report.figures import system_metrics

    best = None
    for result in results.values():
        for frame in result.tables.values():
            for run_id in frame.get("run_id", pd.Series(dtype=str)).dropna().unique()[:MAX_SYSTEM_RUNS]:
                files = RunDir(store.run_dir(run_id))
                if len(files.system_files()) >= 2:
                    samples = system_frame(files)
                    if best is None or len(samples) > len(best[1]):
                        best = (run_id, samples)
    if best is None:
        return None
    run_id, samples = best
    fig = system_metrics(samples, out_dir / "system.png")
    net = "lo_sent(bytes/s)" in samples
    table = samples.groupby("rank").agg(**{
        "samples": ("t(s)", "size"), "cpu_mean(%)": ("cpu_process(%)", "mean"),
        "rss_max(MiB)": ("rss(bytes)", lambda x: x.max() / 2**20),
        **({"loopback_sent_mean(MB/s)": ("lo_sent(bytes/s)", lambda x: x.mean() / 1e6)} if net else {})
    }).reset_index()
    per_rank = samples.groupby("rank")["cpu_process(%)"].mean()
    sentences = [f"Run {run_id}: mean process CPU " + ", ".join(f"rank {r} {v:.0f} %" for r, v in per_rank.items())
                 + f"; peak resident memory {samples['rss(bytes)'].max() / 2**20:.0f} MiB."]
    if net:
        sentences.append(f"The host's loopback interface (every rank's traffic, the collectives' network here) "
                         f"sent {table['loopback_sent_mean(MB/s)'].mean():.3g} MB/s on average over the run.")
    fewest = int(table["samples"].min())
    if fewest < FEW_SAMPLES:
        most = int(table["samples"].max())
        counted = f"{fewest}" if fewest == most else f"{fewest} to {most}"
        sentences.append(f"Each rank's figures rest on {counted} samples (one per sampling interval, "
                         "sample_interval_s, over the run): too few to show load over time; a longer run or a "
                         "shorter interval samples more.")
    return Section(id="system", title="System metrics during a run",
                   question="How busy were CPU, memory and network on each rank? (seed 002 Q1, seed 003 figs 7-12)",
                   sentences=sentences, tables=[TableBlock("system", table, SYSTEM_TABLE_CAPTION)],
                   figures=[FigureBlock(fig, SYSTEM_CAPTION, read_record(fig))])


MAX_SYSTEM_RUNS = 8  # runs read per table while looking for the one with the most samples
FEW_SAMPLES = 5  # below this many samples per rank the section says its figures rest on too few
SYSTEM_TABLE_CAPTION = ("Per rank: system samples, mean process CPU (%), peak resident memory (MiB) and mean bytes/s "
                        "the host's loopback interface sent (all ranks: one counter per host).")
