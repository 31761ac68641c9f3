"""How long `scalelab report` takes with the code of two git revisions, side by side: issue 60's changes (the report's
columns and captions, its audit of tables and figures, terminal widths) live in building the report, apart from
the cells a study measures (issue 56's top-ups spend the study's budget on those), so this times the report build
alone, on one saved study, with each revision's own code.

    python benchmarks/report_build.py STORE/studies/NAME [--base 4d960e6] [--head HEAD] [--pairs 5]

Each revision's `src/` is exported (`git archive`, nothing checked out) and gets its own copy of the study folder;
one untimed build per side first saves that revision's own results there (lab.results), so every timed build
renders from saved results, as a rebuilt report does. Then whole `python -m scalelab report COPY` commands, one
per side per pair, the order alternating (base head, head base, ...) so drift hits both alike. Prints each side's
wall and CPU time (the child's user + system: less sensitive to a busy machine than wall) as min / median / max,
and the head / base ratio pair by pair (min / median / max). An exit status of 4 (the report's audit found faults)
counts as a build: the base revision may audit less, or differently, than the head.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUILT = (0, 4)  # exit 4: the report was written and its audit found faults (cli/study.py, EXIT_AUDIT_FAULTS)
MIN_PAIRS = 3


def export(revision: str, into: Path) -> Path:
    """`revision`'s src/ and docs/ under `into` (git archive | tar); returns the folder to put on PYTHONPATH."""
    into.mkdir(parents=True)
    # docs/ too: the package carries docs/definitions.md as a link (report/definitions.md)
    archive = subprocess.run(["git", "archive", revision, "src", "docs"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def build(src: Path, study: Path) -> tuple[float, float]:
    """One whole `scalelab report` of `study` with the code in `src`: (wall s, CPU s of the child)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "scalelab", "report", str(study)], env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in BUILT:
        sys.exit(f"report_build: `scalelab report {study}` with {src} exited {done.returncode}: "
                 f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or ''}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", type=Path, help="a study folder `scalelab study` wrote (its store must be where it was)")
    p.add_argument("--base", default="4d960e6", help="the revision to compare against (default 4d960e6)")
    p.add_argument("--head", default="HEAD", help="the revision measured (default HEAD: committed code only)")
    p.add_argument("--pairs", type=int, default=5, help=f"interleaved pairs (at least {MIN_PAIRS})")
    args = p.parse_args()
    if args.pairs < MIN_PAIRS:
        p.error(f"--pairs {args.pairs}: at least {MIN_PAIRS}")
    if not (args.study / "study.json").is_file():
        p.error(f"{args.study}: no study.json there; give a folder `scalelab study` wrote")
    sides = {"base": args.base, "head": args.head}
    times: dict[str, dict[str, list[float]]] = {side: {"wall": [], "cpu": []} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        src, study = {}, {}
        for side, revision in sides.items():
            src[side] = export(revision, Path(tmp) / side / "code")
            study[side] = Path(tmp) / side / args.study.name
            shutil.copytree(args.study, study[side])
            build(src[side], study[side])  # this revision's own results saved once, untimed
        for i in range(args.pairs):
            for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
                wall, cpu = build(src[side], study[side])
                times[side]["wall"].append(wall)
                times[side]["cpu"].append(cpu)
    print(f"scalelab report {args.study}: {args.pairs} interleaved pairs; seconds as min / median / max")
    for side, revision in sides.items():
        print(f"  {side} ({revision}): wall {spread(times[side]['wall'])}, cpu {spread(times[side]['cpu'])}")
    for what in ("wall", "cpu"):
        ratios = [h / b for h, b in zip(times["head"][what], times["base"][what])]
        print(f"  head / base, {what}, pair by pair: {spread(ratios)}")


if __name__ == "__main__":
    sys.exit(main())
