"""Where a study cell's time goes outside its timed steps: the fixed cost of a cell, cold or warm.

One process runs a short sequence of cells through the cell engine, as `scalelab study` does (1-rank cells in
this process, 2-rank cells as ranks of their own), and reads back the unix times every run stores: the launching
process's steps (`phases.json`: start, prepared, recorded, launch, ranks_done, summarised, exported, finished), each
rank's set-up (`phases(unix_s)` in its result: process, start, connected, clocks, inputs, trained) and the step
records' end times. The first cell of each world size pays one-time costs (imports, a warm pool's start) and is
left out; the table gives the median over the later cells of each phase, in ms, and the spread (min-max).

Phases, in order (a rank's are rank 0's):
  prepare    the config checked and the dataset and model built once in this process (kinds.check_inputs)
  record     the run directory and catalog row, with the provenance (git, versions)
  start      launch to the rank's process start (torchrun's agent, spawning the process); 0 for a warm rank
  imports    process start to the worker's main (Python, torch, scalelab); 0 for a warm rank
  pg         the process group (rendezvous, gloo's connections)
  clocks     the ranks' clock offsets (ping-pong rounds)
  inputs     the dataset and the model built in the rank
  warm-up    inputs to the first timed step's start: the loader, DDP, warm-up steps
  timed      the timed steps (what the cell is for)
  exit       the last step's end to the launcher's return (evaluation, result files, the ranks' exit)
  summary, export, catalog   the launching process's summary, trace/TensorBoard export and catalog row

    python benchmarks/cell_cost.py --launch cold        # today's path: torchrun for every multi-rank cell
    python benchmarks/cell_cost.py --launch warm        # warm ranks (scalelab.run.warm)
    python benchmarks/cell_cost.py --launch both        # cold then warm, one table each and the ratio
    python benchmarks/cell_cost.py --fresh              # cells that need a fresh process (a memory cap, here
                                                        # one that fits): torchrun cold, a fork pool's child warm
    python benchmarks/cell_cost.py --layouts 3          # what a NEW layout's rank processes cost mid-study

--layouts N: after a 1-rank cell in this process (torch has run here, as mid-study), N times a new layout of 2 ranks
of each kind (a warm pool and a fork pool, their rank processes started by exec or forked from a zygote:
run/warm_zygote.py), interleaved, each running two cells. From "a pool is needed" to "its first job can start",
split from the pool's `start_phases` (the slower rank's): spawn (the launching process starts the process, or the
zygote's fork returns), exec (to the rank's main: the interpreter and its first imports; for a fork, the child's
first line), imports (torch, scalelab, torch._dynamo; none in a fork), warm-up (a warm rank's torch one-time
allocations), handshake (to the pool reading it ready); then the first job's process group (pg) and what its fixed
cost exceeds the second job's (first-job). The zygote's own start, paid once a study, is printed apart. A forked
rank starts before the zygote's answer reaches the pool, so its exec part can be a few ms below 0.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("prepare", "record", "start", "imports", "pg", "clocks", "inputs", "warm-up", "timed", "exit",
          "summary", "export", "catalog")
FIXED = tuple(p for p in PHASES if p != "timed")


def cells(n: int, fresh: bool = False):
    """`n` cells alternating 1 and 2 ranks, two models, each with its own seed (so no cell is reused); `fresh`:
    each with a memory cap it fits under, so each needs a fresh process (run/warm.py, `fresh_reason`)."""
    from scalelab.config import TrainConfig
    from scalelab.lab.cells import Cell

    out = []
    for i in range(n):
        ranks = 1 if i % 2 == 0 else 2
        model = "cnn" if (i // 2) % 2 == 0 else "mlp"
        cfg = TrainConfig(model=model, dataset="synthetic", samples=1024, eval_samples=256, global_batch=64,
                          steps=8, warmup_steps=2, ranks=ranks, seed=i, memory_limit=2**31 if fresh else None)
        out.append(Cell(f"{model} {ranks} rank(s) seed {i}", cfg))
    return out


def phases_of(run_dir: Path) -> dict[str, float]:
    """One run's phases in ms (see the module docstring)."""
    from scalelab.store import RunDir

    rundir = RunDir(run_dir)
    p = rundir.read_phases()
    rank = rundir.read_result(0).get("phases(unix_s)", {})
    steps = [r for r in rundir.read_steps(0)]
    timed = [r for r in steps if not r["warmup"]]
    first = timed[0]["t_end(unix_s)"] - timed[0]["wall(s)"]
    last = timed[-1]["t_end(unix_s)"]
    # a warm rank's process started before the launch (its start-up was paid once, by the first cell)
    process = max(rank.get("process", p["launch"]), p["launch"])
    start = rank.get("start", process)

    def ms(a: float, b: float) -> float:
        return 1e3 * (b - a)

    return {"prepare": ms(p["start"], p["prepared"]), "record": ms(p["prepared"], p["recorded"]),
            "start": max(0.0, ms(p["launch"], process)), "imports": max(0.0, ms(process, start)),
            "pg": ms(start, rank["connected"]), "clocks": ms(rank["connected"], rank["clocks"]),
            "inputs": ms(rank["clocks"], rank["inputs"]), "warm-up": ms(rank["inputs"], first),
            "timed": ms(first, last), "exit": ms(last, p["ranks_done"]),
            "summary": ms(p["ranks_done"], p["summarised"]), "export": ms(p["summarised"], p["exported"]),
            "catalog": ms(p["exported"], p["finished"]), "total": ms(p["start"], p["finished"])}


def run(launch: str, n: int, fresh: bool = False) -> dict[int, list[dict[str, float]]]:
    """Run `n` cells with `launch` (cold or warm); phases per world size, the first cell of each left out."""
    from scalelab.lab.cells import Cells
    from scalelab.lab.progress import PlainProgress
    from scalelab.run import warm
    from scalelab.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        engine = Cells(store, "bench", progress=PlainProgress(lambda _line: None))
        by_world: dict[int, list[dict[str, float]]] = {1: [], 2: []}
        pool = warm.ranks() if launch == "warm" else contextlib.nullcontext()
        with pool:
            for cell in cells(n, fresh):
                began = time.time()
                (result,) = engine.run([cell], group="cells")
                if result.status != "completed":
                    sys.exit(f"cell {cell.label}: {result.status} ({result.reason})")
                row = phases_of(store.run_dir(result.run_id))
                row["cell"] = 1e3 * (time.time() - began)
                by_world[cell.config.ranks].append(row)
    return {w: rows[1:] for w, rows in by_world.items()}


def table(launch: str, by_world: dict[int, list[dict[str, float]]]) -> dict[int, float]:
    """Print the medians and spreads; returns each world size's median fixed cost (ms)."""
    fixed = {}
    print(f"\n{launch}: median ms (min-max) over the later cells of each world size")
    print(f"{'phase':<10}" + "".join(f"{f'{w} rank(s), n={len(rows)}':>26}" for w, rows in by_world.items()))
    for phase in (*PHASES, "fixed", "cell"):
        line = f"{phase:<10}"
        for w, rows in by_world.items():
            values = [sum(r[p] for p in FIXED) if phase == "fixed" else r[phase] for r in rows]
            med = statistics.median(values)
            line += f"{med:>12.0f} ({min(values):>5.0f}-{max(values):>5.0f})"
            if phase == "fixed":
                fixed[w] = med
        print(line)
    return fixed


LAYOUT_PHASES = ("spawn", "exec", "imports", "warm-up", "handshake", "start", "pg", "first-job", "layout")


def layout_starts(n: int) -> dict[str, list[dict[str, float]]]:
    """`n` new 2-rank layouts, warm and forked, started mid-study (module docstring): their phases in ms."""
    from scalelab.lab.cells import with_fields
    from scalelab.run import warm
    from scalelab.run.execute import execute
    from scalelab.run.launch import worker_env
    from scalelab.run.warm_zygote import Zygote
    from scalelab.store import Store

    one, two = (c.config for c in cells(2))
    out: dict[str, list[dict[str, float]]] = {"exec warm": [], "exec fork": [], "zygote warm": [], "zygote fork": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store")
        execute(one, store, say=lambda _line: None)  # a 1-rank cell here first: torch has run in this process
        zygote = Zygote()
        zygote.wait_ready()
        print(f"the zygote's own start (once a study): {1e3 * (time.time() - zygote.started):.0f} ms")
        for i in range(n):
            for mode in out:
                # a layout no pool had: a variable of its own in the ranks' environment (read late: forkable)
                pool = warm.Pool(2, {**worker_env(two), "SCALELAB_LAYOUT_PROBE": f"{i}"}, fork=mode.endswith("fork"),
                                 zygote=zygote if mode.startswith("zygote") else None)
                try:
                    runs = [execute(with_fields(two, seed=100 + 2 * i + j), store, launcher=pool.run,
                                    say=lambda _line: None) for j in (0, 1)]
                finally:
                    pool.close()
                first, second = (phases_of(r.run_dir) for r in runs)
                out[mode].append({**start_split(pool.start_phases), "pg": first["pg"],
                                  "first-job": sum(first[p] for p in FIXED) - sum(second[p] for p in FIXED)})
                out[mode][-1]["layout"] = out[mode][-1]["start"] + out[mode][-1]["first-job"]
        zygote.close()
    return out


def start_split(stamps: list[dict[str, float]]) -> dict[str, float]:
    """A pool's start in ms, from its ranks' unix stamps (warm.Pool.start_phases): the slower rank's parts."""
    last = max(stamps, key=lambda r: r["ready"])
    edges = ("asked", "spawned", "main", "imported", "warmed", "ready")
    parts = {name: 1e3 * (last[b] - last[a]) for name, a, b in zip(LAYOUT_PHASES, edges, edges[1:])}
    return {**parts, "start": 1e3 * (last["ready"] - last["asked"])}


def layout_table(by_mode: dict[str, list[dict[str, float]]]) -> None:
    print("\nnew layout of 2 ranks mid-study: median ms (min-max)")
    print(f"{'phase':<10}" + "".join(f"{f'{mode}, n={len(rows)}':>26}" for mode, rows in by_mode.items()))
    for phase in LAYOUT_PHASES:
        line = f"{phase:<10}"
        for rows in by_mode.values():
            values = [r[phase] for r in rows]
            line += f"{statistics.median(values):>12.0f} ({min(values):>5.0f}-{max(values):>5.0f})"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--cells", type=int, default=8, help="cells per launch mode (alternating 1 and 2 ranks)")
    parser.add_argument("--fresh", action="store_true", help="cells that need a fresh process (a memory cap)")
    parser.add_argument("--layouts", type=int, default=0, help="instead: N new layouts' start-up, warm and fork")
    args = parser.parse_args()
    if args.layouts:
        layout_table(layout_starts(args.layouts))
        return
    modes = ("cold", "warm") if args.launch == "both" else (args.launch,)
    fixed = {mode: table(mode, run(mode, args.cells, args.fresh)) for mode in modes}
    if len(fixed) == 2:
        for w in fixed["cold"]:
            print(f"{w} rank(s): fixed cost cold / warm = {fixed['cold'][w] / fixed['warm'][w]:.2f}x")


if __name__ == "__main__":
    main()
