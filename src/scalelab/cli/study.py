"""`scalelab study` (run everything, write the report) and `scalelab report DIR` (rebuild it from stored runs)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from scalelab.cli.common import console
from scalelab.cli.options import store_option
from scalelab.errors import ConfigError
from scalelab.lab import registry
from scalelab.lab import results as saved
from scalelab.lab.base import failed_cells
from scalelab.lab.budget import parse_duration
from scalelab.lab.cells import replay_only
from scalelab.lab.progress import PlainProgress, progress_for_output
from scalelab.lab.registry import names as experiment_names
from scalelab.lab.study import audit, default_spec, load_spec, read_spec, run_experiments, save_spec
from scalelab.provenance import collect_provenance
from scalelab.report.audit import report_faults
from scalelab.report.build import build_report, system_section
from scalelab.report.render import write_report
from scalelab.run import warm
from scalelab.store import Store, open_store, read_json, write_json_atomic, write_text_atomic

app = typer.Typer()
# a study that wrote its report but could not measure every cell did not finish clean (2 is for usage errors)
EXIT_FAILED_CELLS = 3
# a study whose report says more than its figures carry (its audit found faults) did not finish clean either
EXIT_AUDIT_FAULTS = 4
AUDIT_FILE = "audit.txt"  # in the report folder: every fault, whole (the terminal shows each cut to its width)
DEFAULT_BUDGET_S, DEFAULT_QUICK_BUDGET_S = 600.0, 150.0  # the README's promise: under 10 minutes, about 2 minutes


def write_study_report(spec, store, out_dir: Path, answered: list[tuple], provenance: dict,
                       command: str) -> tuple[Path, list[str]]:
    """The study's report from its answered experiments and the study-wide figures saved beside them (lab.results);
    returns the HTML file's path and the study's audit (study_audit), written beside the report as AUDIT_FILE."""
    folder = saved.results_dir(out_dir)
    results = {experiment.name: result for experiment, result in answered}
    extra = [s for s in [system_section(store, results, folder)] if s is not None]
    figures = saved.load_study(folder) or {}
    report = build_report(spec, answered, provenance, command, extra_sections=extra,
                          noise_floor=figures.get("noise_floor"), budget=budget_line(figures))
    files = write_report(report, out_dir / "report")
    faults = study_audit(answered, report)
    write_text_atomic(out_dir / "report" / AUDIT_FILE, "".join(f"{f}\n" for f in faults))
    return files["report.html"] if "report.html" in files else out_dir / "report" / "report.html", faults


def study_audit(answered: list[tuple], report) -> list[str]:
    """One line per fault of the study: a sentence, recommendation or decision its figures do not carry
    (lab.study.audit) and a table of the built report that does not hold up as a reader sees it: its shown
    columns, caption and sentences (report.audit.report_faults). None is the bar."""
    return audit(answered) + report_faults(report)


def print_audit(faults: list[str], where: Path) -> None:
    """The audit's verdict in the terminal: passed, or the count and each fault on one line cut to the terminal's
    width (`where` holds them whole)."""
    if not faults:
        console.print("audit: passed (sentences, decisions, every table and figure as the report shows it)", highlight=False)
        return
    console.print(f"audit: {len(faults)} fault(s); whole lines in {where}", highlight=False, soft_wrap=False)
    for fault in faults:
        console.print(clipped(f"  {fault}", console.width), markup=False, highlight=False, soft_wrap=True)


def clipped(line: str, width: int) -> str:
    """`line` cut to `width` characters, its end marked (a fault's whole text is in the audit file)."""
    return line if len(line) <= width else line[:max(width - 1, 0)] + "…"


def budget_line(figures: dict) -> str | None:
    """The time budget in one line for the report: its size and what it reduced or left out."""
    if not figures.get("budget_s"):
        return None
    cuts = figures.get("budget") or []
    return (f"{figures['budget_s']:.0f} s: " + ("; ".join(cuts) if cuts else "every experiment ran as planned"))


@app.command("study")
def study_cmd(quick: bool = typer.Option(False, "--quick", help="A reduced study (about 2 minutes on 2 cores)."),
              config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML study file (see examples/)."),
              only: Optional[str] = typer.Option(None, help="Comma-separated experiments to run (default: all): "
                                                 f"{', '.join(experiment_names())}."),
              name: Optional[str] = typer.Option(None, help="Study name (finished cells of a study are skipped)."),
              out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default STORE/studies/NAME)."),
              budget: Optional[str] = typer.Option(
                  None, "--budget", help="Time for the whole study, e.g. 10m, 150s, 1h, or 'none' (default 10m, "
                  "150s with --quick; none with --config): it measures its pace as it goes and launches compared cells fewer times (never "
                  "under 2) or leaves experiments out to finish within it, and says which."),
              store: Optional[Path] = store_option()) -> None:
    """Run the whole study on this machine (resumable) and write the report (HTML, Markdown, CSV/JSON)."""

    # the default budget is the built-in study's promise, and its pace is read against that study's reference times
    # (lab/budget.py): a study file runs its whole plan unless it is given a budget
    default = None if config else DEFAULT_QUICK_BUDGET_S if quick else DEFAULT_BUDGET_S
    budget_s = None if (budget or "").strip().lower() == "none" or (budget is None and default is None) \
        else parse_duration(budget or default)
    spec = load_spec(config, quick=quick) if config else default_spec(quick=quick)
    if name:
        spec.name = name
    if only:
        chosen = [e.strip() for e in only.split(",") if e.strip()]
        for e in chosen:
            if e not in experiment_names():
                raise ConfigError("only", e, f"allowed: {', '.join(experiment_names())}")
        spec.experiments = chosen
    with warm.ranks() as pools:  # the block run_experiments' cells share
        pools.start_zygote()  # it imports on the other core while this process reads the store and provenance
        _study(spec, store, out, budget_s)


def _study(spec, store: Optional[Path], out: Optional[Path], budget_s: Optional[float]) -> None:
    st = open_store(store)
    out_dir = out or st.root / "studies" / spec.name
    out_dir.mkdir(parents=True, exist_ok=True)
    save_spec(spec, out_dir, st)
    provenance = collect_provenance(sys.argv)
    command = " ".join(["scalelab", *sys.argv[1:]])
    write_json_atomic(out_dir / "provenance.json", {"provenance": provenance, "command": command})
    start = time.monotonic()
    progress = progress_for_output()
    try:
        answered = run_experiments(spec, st, out_dir, progress, budget_s=budget_s)
    finally:
        progress.close()
    html, faults = write_study_report(spec, st, out_dir, answered, provenance, command)
    failed = failed_cells(answered)
    console.print(f"study '{spec.name}' done in {time.monotonic() - start:.0f} s"
                  + (f", {len(failed)} failed cell(s)" if failed else ""), highlight=False)
    console.print(f"report: {html}  (open it in a browser; Markdown beside it, tables as CSV/JSON in "
                  f"{out_dir / 'report' / 'tables'})", highlight=False)
    print_audit(faults, out_dir / "report" / AUDIT_FILE)
    if failed:
        console.print(f"failed: {'; '.join(failed)} (their sections say why); run the same command again to "
                      f"re-measure them (exit {EXIT_FAILED_CELLS})", highlight=False)
        raise typer.Exit(EXIT_FAILED_CELLS)
    if faults:
        raise typer.Exit(EXIT_AUDIT_FAULTS)


@app.command("report")
def report_cmd(study_dir: Path = typer.Argument(..., help="A study folder (holds study.json).")) -> None:
    """Rebuild a study's report from its saved results (those of an older analysis from its stored runs): nothing
    is re-run."""

    if not (study_dir / "study.json").is_file():
        raise ConfigError("study_dir", str(study_dir), "no study.json there; give a folder `scalelab study` wrote")
    spec, store_root = read_spec(study_dir)
    st = Store(store_root)
    recorded = read_json(study_dir / "provenance.json")
    folder = saved.results_dir(study_dir)
    kept = [n for n in spec.experiments if saved.load(registry.get(n), folder) is not None]
    with replay_only():
        answered = run_experiments(spec, st, study_dir, PlainProgress(lambda line: None), reuse_saved=True)
    html, faults = write_study_report(spec, st, study_dir, answered, recorded["provenance"], recorded["command"])
    console.print(f"report rebuilt: {len(kept)} of {len(spec.experiments)} experiments from their saved results, "
                  f"{len(spec.experiments) - len(kept)} derived again from stored runs: {html}", highlight=False)
    print_audit(faults, study_dir / "report" / AUDIT_FILE)
    if faults:
        raise typer.Exit(EXIT_AUDIT_FAULTS)
