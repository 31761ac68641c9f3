"""From experiment results (tables computed from stored runs) to the report's document model.

Every section answers one of the seeds' questions with its table, its plot and sentences computed from the
numbers (analysis.interpret). Nothing here measures or runs anything.
"""
from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd

from scalelab.analysis import interpret
from scalelab.report.document import FigureBlock, Report, Section, TableBlock
from scalelab.store import RunDir

DEFINITIONS = [
    "Warm-up steps are excluded from every timing; on CUDA every stage boundary synchronises the device.",
    "A step runs from asking the loader for a batch to the end of the optimizer update; `other` is the part of a "
    "step outside every named stage, so the stages sum to the step's wall time.",
    "A step's time is the slowest rank's; stage times are averaged over ranks; training time excludes evaluation.",
    "Epoch time = mean step time × steps per epoch; without data loading each step's data wait is subtracted. "
    "Throughput = global samples / time over the timed steps.",
    "speedup(N) = T(1) / T(N) for the same work; efficiency = speedup / N. Strong scaling keeps the global batch; "
    "weak scaling keeps the per-worker batch and compares throughput: efficiency = X(N) / (N·X(1)).",
    "Communication time = time inside collectives as the caller sees it (async ones: launch to completion). "
    "Exposed communication = step time with real sync − step time with no sync (same config, measured). "
    "Overlap = 1 − exposed / communication.",
    "Bytes are payload bytes per collective and per step. algbw = S / t; busbw = algbw·2(n−1)/n for allreduce, "
    "(n−1)/n for allgather / reduce_scatter, 1 for broadcast (the nccl-tests definitions).",
    "Timing figures show the median over the timed steps with min..max bars unless they say otherwise.",
]

SECTIONS = {  # experiment -> (section id, title, the seeds' question)
    "profile": ("profile", "Where a step's time goes",
                "Which stage dominates a training step: data, copy, forward, backward, communication, optimizer? "
                "(seed 001 part 2b, seed 003 task 1)"),
    "batch_sweep": ("batch", "Batch size: epoch time, throughput, memory",
                    "How do epoch time (with and without data loading) and throughput change with the batch size? "
                    "(seed 000 Q1)"),
    "max_batch": ("maxbatch", "The largest batch that fits",
                  "What is the largest batch that fits, and how much do mixed precision and activation "
                  "checkpointing raise it? (seed 000 Q1, seed 004)"),
    "scale": ("scaling", "How it scales",
              "What speedup and efficiency do more workers give, strong and weak, and how much of each step is "
              "communication? (seed 000 Q2-Q3, seed 002 Q3, seed 003 table 1)"),
    "strategies": ("strategies", "Gradient synchronisation strategies",
                   "Which gradient-sync strategy is fastest, how many bytes does each move and how much "
                   "communication does it hide? (seed 003 tasks 2a/2b/3, seed 000 Q5/Q7, seed 004 exp 5)"),
    "backends": ("backends", "Communication backends", "gloo vs NCCL (vs MPI): which is faster here? (seed 004 exp 4)"),
    "comm": ("comm", "Communication microbenchmark",
             "What bandwidth do collectives reach per message size? (seed 000 Q3.2)"),
    "loader": ("loader", "Data loading", "Which DataLoader setting removes the data wait? (seed 001 part 2a)"),
    "amp": ("amp", "Mixed precision", "Is lower precision faster, and does it cost accuracy? (seed 001 part 2c)"),
    "checkpointing": ("checkpointing", "Activation checkpointing",
                      "How much memory does checkpointing save and what does it cost in time? (seed 001 part 1b)"),
    "lr_scaling": ("lrscaling", "Large-batch learning-rate rules",
                   "Which learning-rate rule keeps accuracy as the batch grows? (seed 000 Q4, seed 002 Q5-6)"),
    "predict": ("prediction", "What larger clusters would do",
                "What would 8, 64 or 1000 workers give, and where does efficiency fall below 50 %? "
                "(seed 003 conclusion, seed 000 Q2)"),
}


def _sentences(name: str, result) -> tuple[list[str], list[str]]:
    """(sentences, recommendations) for one experiment's result."""
    t = result.tables
    recs: list[str] = []
    if not t or all(len(frame) == 0 for frame in t.values()):
        return [], []  # failed or missing: the section's notes say why
    if name == "profile":
        out, rec = interpret.profile(t["profile"])
    elif name == "batch_sweep":
        out, rec = interpret.batch_sweep(t["batch_sweep"])
    elif name == "amp":
        out, rec = interpret.precision(t["amp"])
    elif name == "checkpointing":
        out, rec = interpret.checkpointing(t["checkpointing"])
    elif name == "loader":
        out, rec = interpret.loader(t["loader_sweep"], result.notes.get("recommended", {}))
    elif name in interpret.BY_EXPERIMENT:
        out, rec = interpret.BY_EXPERIMENT[name](result)
    else:
        out, rec = [], None
    if rec:
        recs.append(rec)
    return out, recs


def _note_text(value) -> str:
    """A note's value as prose: a mapping (one entry per hardware, variant …) as "key: value; key: value"."""
    if isinstance(value, dict):
        return "; ".join(f"{k}: {v}" for k, v in value.items())
    return str(value)


def section_for(name: str, result) -> tuple[Section, list[str]]:
    sid, title, question = SECTIONS[name]
    sentences, recs = _sentences(name, result)
    tables = [TableBlock(key.replace("/", "_"), frame.drop(columns=["run_id"], errors="ignore"), caption)
              for key, frame in result.tables.items() if not key.endswith("_curves")
              for caption in [TABLE_CAPTIONS.get(key, "")]]
    figures = [FigureBlock(Path(p), FIGURE_CAPTIONS.get(Path(p).stem, "")) for p in result.files
               if str(p).endswith(".png")]
    notes = [f"{k}: {_note_text(v)}" for k, v in result.notes.items() if k not in ("recommended",)]
    return Section(id=sid, title=title, question=question, sentences=sentences, tables=tables, figures=figures,
                   notes=notes), recs


TABLE_CAPTIONS = {
    "batch_sweep": "Per global batch: epoch time with and without data loading (s), throughput (samples/s), "
                   "peak memory (GiB), step time min/median/max over timed steps (ms).",
    "profile": "Mean time per step of each stage (ms) and its share (%).",
    "max_batch": "Largest global batch that trains under the memory limit; trials in their own processes.",
    "loader_sweep": "Per loader setting: data wait (ms/step, % of step), throughput, and one epoch of the loader alone.",
    "amp": "Per precision: final accuracy and loss, peak memory, throughput, step time spread.",
    "checkpointing": "Per number of checkpoint segments: peak memory and step time.",
    "lr_scaling": "Per rule and batch: final and best test accuracy, time and epochs to the target accuracy.",
}

FIGURE_CAPTIONS = {
    "batch_sweep": "Epoch time and step time (median, bars min..max) vs global batch.",
    "profile": "Share of a step per stage (mean over timed steps).",
    "loader_sweep": "Throughput and data-wait share per loader setting.",
    "checkpointing": "Peak memory and step time vs checkpoint segments.",
    "amp_curves": "Training loss per step, fp32 vs lower precision (rank 0).",
    "lr_scaling": "Final test accuracy vs batch size per learning-rate rule (same number of epochs).",
    "lr_curves": "Test accuracy per epoch per rule, one panel per batch size.",
    "scale_strong": "Strong scaling: measured speedup vs workers, with the ideal line.",
    "scale_weak": "Weak scaling: throughput speedup vs workers, with the ideal line.",
    "scale_strong_breakdown": "Per cell: compute (step with no sync) + exposed communication; diamonds: time "
                              "inside collectives.",
    "scale_weak_breakdown": "Per cell: compute + exposed communication (weak scaling).",
    "system": "System metrics per rank over time: CPU %, resident memory, loopback bytes/s.",
}


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


def build_report(spec, results: dict, provenance: dict, command: str,
                 extra_sections: list[Section] | None = None) -> Report:
    sections, recs = [], []
    for name in spec.experiments:
        if name not in results:
            continue
        section, r = section_for(name, results[name])
        sections.append(section)
        recs += r
    sections += extra_sections or []
    subtitle = (f"study '{spec.name}'{' (quick)' if spec.quick else ''}: {len(spec.experiments)} experiments on "
                f"{provenance.get('host', 'this machine')}")
    return Report(title="scalelab report", subtitle=subtitle, recommendations=recs, sections=sections,
                  definitions=DEFINITIONS, environment=environment(provenance, command), command=command)


def system_frame(run_dir: Path) -> pd.DataFrame:
    """All ranks' system samples of one run, with loopback bytes/s derived from the counters."""
    from scalelab.store import read_jsonl

    frames = []
    for path in RunDir(run_dir).system_files():
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
                run_dir = store.run_dir(run_id)
                if len(RunDir(run_dir).system_files()) >= 2:
                    samples = system_frame(run_dir)
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
                                   figures=[FigureBlock(fig, FIGURE_CAPTIONS["system"])])
    return None
