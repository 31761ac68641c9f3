"""How long `scalelab study` takes, experiment by experiment, and how true its ETA was: one or more studies run as
whole commands, each in a fresh store, their output lines time-stamped as they arrive.

Per study: the wall time of the command, each experiment's seconds (its `== NAME done in N s` line), the budget's
cuts (`== budget: ...`), and for every study ETA printed once a quarter of the study had run (`== [i/n] NAME (study
ETA m:ss)`), its error against the time that actually remained. Goal (issue 38): within 20 %.

Give a source tree to time another checkout's scalelab with the same interpreter (e.g. main before a change, from
`git worktree add /tmp/base COMMIT`); several `--src` are run interleaved, `--rounds` times each.

    python benchmarks/study_time.py --quick                      # this checkout, the quick study
    python benchmarks/study_time.py --src /tmp/base/src --src src --rounds 2 --quick
    python benchmarks/study_time.py -- --budget 4m               # arguments after -- go to `scalelab study`
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DONE = re.compile(r"^== (\w+) (?:done in (\d+) s|failed)")
ETA = re.compile(r"^== \[(\d+)/(\d+)\] (\w+) \(study ETA (\d+):(\d+)\)")
CUT = re.compile(r"^== budget: (.*)")
WARM = re.compile(r"(warm ranks: .*)")  # how the multi-rank runs started (run/warm.py, Pools.tally)


def run_study(src: str | None, args: list[str]) -> dict:
    """One study in a fresh store: its wall time, experiment seconds, cuts and ETA lines (time, eta seconds)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory(prefix="scalelab-study-time-") as tmp:
        began = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "scalelab", "study", "--store", tmp, *args],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = [(time.monotonic() - began, line.rstrip()) for line in proc.stdout]
        proc.wait()
        wall = time.monotonic() - began
    seconds = {m.group(1): float(m.group(2) or "nan") for _, line in lines if (m := DONE.match(line))}
    etas = [(t, 60 * int(m.group(4)) + int(m.group(5)), m.group(3)) for t, line in lines if (m := ETA.match(line))]
    cuts = [m.group(1) for _, line in lines if (m := CUT.match(line))]
    starts = [m.group(1) for _, line in lines if (m := WARM.search(line))]
    return {"rc": proc.returncode, "wall": wall, "seconds": seconds, "etas": etas, "cuts": cuts, "starts": starts,
            "tail": [line for _, line in lines[-3:]]}


def eta_errors(study: dict) -> list[tuple[str, float, float, float]]:
    """(experiment, elapsed, eta, error as a share of the time that remained) for ETAs past a quarter of the run."""
    out = []
    for t, eta, name in study["etas"]:
        remaining = study["wall"] - t
        if t >= 0.25 * study["wall"] and remaining > 0:
            out.append((name, t, eta, (eta - remaining) / remaining))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", help="a scalelab source tree (default: the installed one)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("rest", nargs="*", help="more `scalelab study` arguments, after --")
    args = parser.parse_args()
    sources = args.src or [None]
    study_args = (["--quick"] if args.quick else []) + args.rest
    results: dict[str | None, list[dict]] = {s: [] for s in sources}
    for _ in range(args.rounds):
        for src in sources:
            results[src].append(run_study(src, study_args))
    for src, studies in results.items():
        print(f"\n{src or 'installed scalelab'}: scalelab study {' '.join(study_args)}")
        for i, s in enumerate(studies, 1):
            print(f"  round {i}: {s['wall']:.0f} s (exit {s['rc']})" + ("" if s["rc"] == 0 else f": {s['tail']}"))
            print("    " + ", ".join(f"{k} {v:.0f}" for k, v in s["seconds"].items()))
            for cut in s["cuts"]:
                print(f"    cut: {cut}")
            for line in s["starts"]:
                print(f"    {line}")
            errors = eta_errors(s)
            if errors:
                worst = max(errors, key=lambda e: abs(e[3]))
                print(f"    study ETA past a quarter of the run: {len(errors)} readings, worst {100 * worst[3]:+.0f} % "
                      f"(at {worst[0]}, {worst[1]:.0f} s in: ETA {worst[2]:.0f} s, "
                      f"{s['wall'] - worst[1]:.0f} s remained)")


if __name__ == "__main__":
    main()
