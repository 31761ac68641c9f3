"""From experiment results (tables computed from stored runs) to the report's document model.

Every section answers one of the seeds' questions with its table, its plot and sentences computed from the
numbers (analysis.interpret). Nothing here measures or runs anything.
"""
from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd

from scalelab.analysis.noise import OUTSIDE_CPU_THRESHOLD, STEAL_THRESHOLD
from scalelab.report.document import FigureBlock, Report, Section, TableBlock
from scalelab.store import RunDir, read_jsonl

DEFINITIONS = [
    "Warm-up steps are excluded from every timing. On CUDA stages are bounded by CUDA events on the current stream "
    "and each step waits once, at its end (with --sync-stages every boundary synchronises the device instead).",
    "A step runs from asking the loader for a batch to the end of the optimizer update; `other` is the part of a "
    "step outside every named stage, so the stages sum to the step's wall time. Evaluation runs after a step ends "
    "and is reported on its own, per evaluation.",
    "A step's time is the slowest rank's; stage times are averaged over ranks. A median step carries a 95 % "
    "interval: order statistics over the timed steps, widened for the correlation between consecutive steps.",
    "Compared cells are launched several times in interleaved rounds (the `launches` column); a row pools its "
    "launches and its interval reaches each launch's own median. A ranking or recommendation is made only where "
    "intervals separate; otherwise the report says the difference is within noise. The `quality` column says ok "
    "or why not (implausible beyond its interval, noisy, precision not reached).",
    "Epoch time = mean step time × steps per epoch; without data loading each step's data wait is subtracted. "
    "Throughput = global samples / time over the timed steps. Means (epoch time, stage times, time inside "
    "collectives) carry a 95 % t interval whose standard error is widened for the correlation of consecutive steps; "
    "a rate of a fixed count over such a mean (throughput, algbw, busbw) carries the count over the mean's interval.",
    "Every table's headline column is followed by `n` (the timed steps it rests on, pooled over launches), `ci_low` "
    "and `ci_high` (its 95 % interval); other intervals are named after their figure (step_ci_low(ms), "
    "speedup_ci_low, exposed_ci_low(ms) ...). Ratios of two measured figures (speedup, efficiency, exposed "
    "communication, overlap) take the conservative interval of both sides: every value of one against every value "
    "of the other.",
    "Implausible or noisy rows of compared cells (efficiency above 1, overlap outside [0, 1] or exposed time below 0 "
    "beyond their intervals, time inside collectives longer than the step, collectives faster than the shaped links "
    "of a local-nodes run allow, a run noisy by the rule below) are "
    "measured once more, automatically, from new launches; the quality column then says `re-measured`, or the "
    "reason with \"(persisted when re-measured)\", or that the first and second measurements disagree. Flagged rows "
    "are listed in words under their section and never make a ranking or a recommendation.",
    "speedup(N) = T(1) / T(N) for the same work; efficiency = speedup / N. Strong scaling keeps the global batch; "
    "weak scaling keeps the per-worker batch and compares throughput: efficiency = X(N) / (N·X(1)).",
    "Communication time = the union of each step's collective intervals per rank (overlapping asynchronous "
    "collectives count once; async ones run from launch to completion; on CUDA between CUDA events on the stream "
    "that waits for the collective). Blocking wait = from the last gradient produced to the end of the sync, the "
    "same meaning for every strategy.",
    "Exposed communication = step time with real sync − step time of the same config with no-op collectives (the "
    "strategy's own work kept: DDP's buckets, hook and division, the bucketed copies, rank 0's averaging), never "
    "clipped, with a conservative 95 % interval. Overlap = 1 − exposed / communication; an overlap outside [0, 1] "
    "beyond its interval is flagged in the quality column, not clipped.",
    "Bytes are payload bytes per collective and per step. algbw = S / t with t a collective's own interval, and for "
    "a run S over the union; busbw = algbw·2(n−1)/n for allreduce, (n−1)/n for allgather / reduce_scatter, 1 for "
    "broadcast (the nccl-tests definitions).",
    "Memory by kind is measured per rank on its first step; the largest rank is reported. Activations = the "
    "distinct storages saved for backward in forward (saved_tensors_hooks; parameters and buffers excluded, a "
    "storage saved twice counted once); backward peak = the most of them live at once during backward, what "
    "checkpointing recomputes included. Exact on CPU and CUDA; on CPU the process's peak RSS hides them.",
    "Plots draw each figure's 95 % interval as error bars unless their axis says otherwise.",
    "Noise: while a run is timed, the first rank of each host samples the CPU taken by processes outside the run "
    "(machine busy CPU − the run's own processes'), steal time and load; a run is noisy above "
    f"{OUTSIDE_CPU_THRESHOLD} cores outside the run or {STEAL_THRESHOLD:.0f} % steal. The noise floor (environment) is the drift of one reference cell, measured before the "
    "first experiment and after the last: end / start median step − 1, with the interval of that ratio.",
]

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
    blocks = [TableBlock(key.replace("/", "_"), frame.drop(columns=["run_id"], errors="ignore"),
                         experiment.captions.get(key, "")) for key, frame in tables.items()
              if not key.endswith("_curves")]
    figures = [FigureBlock(Path(p), experiment.captions.get(Path(p).name, "")) for p in result.files
               if str(p).endswith(".png")]
    notes = [f"{k}: {_note_text(v)}" for k, v in result.notes.items() if k not in ("recommended",)]
    notes += [line for key, frame in tables.items() for line in flagged_rows(key, frame)]
    return Section(id=experiment.section, title=experiment.title, question=experiment.question,
                   sentences=sentences, tables=blocks, figures=figures, notes=notes), [rec] if rec else []


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
                 extra_sections: list[Section] | None = None, noise_floor: str | None = None) -> Report:
    """`answered`: (registry entry, result) per experiment, in study order; `noise_floor`: the reference cell's
    drift over the study in one line (experiments.study.noise_floor), shown with the environment."""
    sections, recs = [], []
    for experiment, result in answered:
        section, r = section_for(experiment, result)
        sections.append(section)
        recs += r
    sections += extra_sections or []
    subtitle = (f"study '{spec.name}'{' (quick)' if spec.quick else ''}: {len(spec.experiments)} experiments on "
                f"{provenance.get('host', 'this machine')}")
    return Report(title="scalelab report", subtitle=subtitle, recommendations=recs, sections=sections,
                  definitions=DEFINITIONS, command=command,
                  environment={**environment(provenance, command), **({"noise floor": noise_floor} if noise_floor
                                                                      else {})})


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
    """System metrics over time of the first multi-rank run of the study (the profile run by default)."""
    from scalelab.report.figures import system_metrics

    for result in results.values():
        for frame in result.tables.values():
            for run_id in frame.get("run_id", pd.Series(dtype=str)).dropna():
                files = RunDir(store.run_dir(run_id))
                if len(files.system_files()) >= 2:
                    samples = system_frame(files)
                    fig = system_metrics(samples, out_dir / "system.png")
                    per_rank = samples.groupby("rank")["cpu_process(%)"].mean()
                    sentences = [f"Run {run_id}: mean process CPU " + ", ".join(
                        f"rank {r} {v:.0f} %" for r, v in per_rank.items()) +
                        f"; peak resident memory {samples['rss(bytes)'].max() / 2**20:.0f} MiB."]
                    table = samples.groupby("rank").agg(**{
                        "samples": ("t(s)", "size"), "cpu_mean(%)": ("cpu_process(%)", "mean"),
                        "rss_max(MiB)": ("rss(bytes)", lambda s: s.max() / 2**20)}).reset_index()
                    return Section(id="system", title="System metrics during a run",
                                   question="How busy were CPU, memory and network on each rank? "
                                            "(seed 002 Q1, seed 003 figs 7-12)",
                                   sentences=sentences, tables=[TableBlock("system", table, "Per rank.")],
                                   figures=[FigureBlock(fig, SYSTEM_CAPTION)])
    return None
