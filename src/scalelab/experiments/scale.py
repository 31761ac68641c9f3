"""Scaling study: worker counts x batch sizes, strong and weak, with compute vs communication per cell
(seed 000 Q2-Q3, seed 002 Q3, seed 003 table 1).

Each multi-worker cell also runs once with no-op collectives (the same sync strategy and wrapper, only its
collectives skipped): the difference of step times is the exposed communication, measured rather than taken as a
remainder, and that baseline's step is the cell's compute.

Over nodes (seed 003): with `nodes` (or a base config of local_nodes >= 2, which sweeps 1 .. local_nodes) the
cells are node counts of a cluster of network namespaces, the base's ranks on each node and its link on every
one; a per-node table (time per epoch, CPU user / system, network MB/s of each node) comes beside each mode's.
"""
from __future__ import annotations

from scalelab.analysis import interpret
from scalelab.analysis.nodes import node_table
from scalelab.analysis.scaling import add_exposed_comm, scaling_table
from scalelab.config import TrainConfig
from scalelab.lab.base import Context, Experiment, Option, Result, int_list, launches_option, name_list, \
    positive_ints
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked
from scalelab.report import figures
from scalelab.sync import registry as syncs

MODES = ("strong", "weak")


def mode_cells(base, mode: str, workers: list[int], batches: list[int],
               say=lambda line: None, launches: int = 1, nodes: list[int] | None = None) -> tuple[list[Cell], list[Cell]]:
    """(cells, their no-sync ablations): strong mode keeps `batches` as global batches, weak as per-worker.
    With `nodes` the cells are node counts (local_nodes), `base.ranks` on each, instead of `workers` ranks.
    `base` a TrainConfig, or a user's script (a ScriptConfig: its cells run the script, with no ablation, since
    scalelab cannot skip the collectives of code it did not write)."""
    script = not isinstance(base, TrainConfig)
    cells, ablation = [], []
    for b in batches:
        for k in nodes or workers:
            n = k * base.ranks if nodes else k
            global_batch = b if mode == "strong" else b * n
            if global_batch % n:
                say(f"[scale_{mode}] skip {n} workers x batch {b}: not divisible")
                continue
            place = (dict(local_nodes=k, nnodes=k), f"{k} node{'s' * (k > 1)} x {base.ranks} rank{'s' * (base.ranks > 1)}") \
                if nodes else (dict(ranks=n), f"{n} workers")
            cfg = with_fields(base, **place[0], global_batch=global_batch)
            cells.append(Cell(f"{mode}: {place[1]}, batch {global_batch}", cfg, repeats=launches,
                              kind="script" if script else "train"))
            if n > 1 and not script:
                ablation.append(Cell(f"{mode}: {place[1]}, batch {global_batch}, no-op collectives",
                                     with_fields(cfg, **syncs.baseline_fields(cfg)), repeats=launches))
    return cells, ablation


def node_counts(base, nodes: list[int] | None) -> list[int] | None:
    """The node counts to sweep: the option's, else 1 .. local_nodes of a base cluster of 2 or more, else none
    (scalelab's loop or a user's script alike)."""
    if nodes:
        return nodes
    return list(range(1, base.local_nodes + 1)) if base.local_nodes >= 2 else None


def _modes(value, name: str) -> list[str]:
    """"both", "strong", "weak", or a list of strong / weak."""
    modes = name_list(value, name, (*MODES, "both"))
    return list(MODES) if "both" in modes else [m for m in MODES if m in modes]


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    result = Result("scale", {})
    nodes = node_counts(base, opts.get("nodes"))
    if nodes:
        ctx.say(f"[scale] over {', '.join(map(str, nodes))} local nodes x {base.ranks} rank(s) each "
                f"(the workers option is not used)")
    for mode in opts["mode"]:
        name = f"scale_{mode}"
        cells, ablation = mode_cells(base, mode, opts["workers"], opts["batches"], ctx.say, opts["launches"], nodes)

        measured = {}

        def analyse(results, cells=cells, mode=mode, measured=measured):
            measured["cells"] = results[:len(cells)]
            runs, nosync = (_completed(ctx.cells.rows(part)) for part in (results[:len(cells)], results[len(cells):]))
            return add_exposed_comm(scaling_table(runs, mode), runs, nosync)

        # worker counts and their baselines in interleaved rounds (drift between launches hits every cell alike);
        # a cell behind an implausible or noisy row is measured once more
        result.tables[name] = run_checked(ctx, [*cells, *ablation], group=name, analyse=analyse)
        if nodes:
            result.tables[f"{name}_nodes"] = node_table(ctx.cells.runs(measured["cells"], all_repeats=True))
    return result


def _completed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "completed"]


def _figures(result: Result, out) -> list:
    files = []
    for name, table in result.tables.items():
        if name.endswith("_nodes"):
            if len(table):
                files.append(figures.per_node(table, out / f"{name}.png"))
            continue
        if len(table):
            files.append(figures.speedup_vs_workers(table, out / f"{name}.png", mode=name.split("_")[1]))
            files.append(figures.compute_comm_bars(table, out / f"{name}_breakdown.png"))
    return files


EXPERIMENT = Experiment(
    name="scale", command="scale", section="scaling", order=40,
    title="How it scales",
    question="What speedup and efficiency do more workers give, strong and weak, and how much of each step is "
             "communication? (seed 000 Q2-Q3, seed 002 Q3, seed 003 table 1)",
    help="Speedup and efficiency over worker counts (strong and weak), compute vs communication per cell; "
         "after -- a script of yours: scale --workers 1,2 -- python train.py --batch {per_worker_batch}.",
    options=(Option(name="workers", default=[1, 2], help="Worker counts (ranks).", parse=positive_ints),
             Option(name="batches", default=[64, 256], help="Global batches (strong) / per-worker batches (weak).",
                    parse=int_list),
             Option(name="mode", default="both", help="strong, weak or both.", parse=_modes), launches_option(),
             Option(name="nodes", default=None, parse=positive_ints,
                    help="Node counts of a cluster of network namespaces (local_nodes; the base's ranks on each, "
                         "its link_gbps on every link) instead of worker counts; unset: 1 .. local_nodes when the "
                         "base has local_nodes >= 2.")),
    run=_run,
    takes_command=True,
    figures=_figures,
    interpret=interpret.scale_result,
    captions={"scale_strong.png": "Strong scaling: measured speedup vs workers, with the ideal line.",
              "scale_weak.png": "Weak scaling: throughput speedup vs workers, with the ideal line.",
              "scale_strong_breakdown.png": "Per cell: compute (step with no sync) + exposed communication; "
                                            "diamonds: time inside collectives.",
              "scale_weak_breakdown.png": "Per cell: compute + exposed communication (weak scaling).",
              "scale_strong_nodes.png": "Per node (seed 003 tables 1-3): time per epoch, CPU user / system (% of "
                                        "one core) and network MB/s sent off the node, by node count.",
              "scale_weak_nodes.png": "Per node, weak scaling: time per epoch, CPU user / system, network MB/s."},
)
