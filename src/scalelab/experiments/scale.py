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

from dataclasses import replace
from pathlib import Path

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.breakdown import SCRIPT_VARIANT, scaling_breakdown
from scalelab.analysis.compare import trusted
from scalelab.analysis.interpret import fmt
from scalelab.analysis.nodes import node_table
from scalelab.analysis.scaling import EFFICIENCY_CI, SUPERLINEAR, add_exposed_comm, scaling_table
from scalelab.config import TrainConfig
from scalelab.experiments.scale_lost import lost_speedup_sentences, waterfall
from scalelab.lab.base import (
    Context,
    Experiment,
    Option,
    Result,
    StudyPlan,
    int_list,
    launches_option,
    name_list,
    positive_ints,
)
from scalelab.lab.cells import Cell, with_fields
from scalelab.lab.checked import run_checked
from scalelab.lab.decision import BETTER, Decision, card, decide, step_side
from scalelab.lab.stragglers import SHOWN as STRAGGLER_SHOWN
from scalelab.lab.stragglers import straggler_sentences, straggler_table
from scalelab.report.figures import COMPUTE_LABEL, Series, ci, ci_label, has_values, plt, save
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


def nosync_cells(cells: list[Cell], launches: int = 1) -> list[Cell]:
    """The no-sync variant (`sync: noop`: ranks train apart) of every multi-rank cell of scalelab's own loop whose
    sync is not already none: the lost-speedup breakdown's compute-slowdown run (a user's script has none:
    scalelab cannot remove the sync from code it did not write)."""
    return [Cell(f"{c.label}, no sync", with_fields(c.config, sync="noop"), repeats=launches) for c in cells
            if c.kind == "train" and c.config.ranks * c.config.nnodes > 1 and c.config.sync != "noop"]


def variant_command(mode: str, workers: int, global_batch: int, *, script: bool = False) -> dict[str, str]:
    """The command whose run measures a missing variant of a cell: the scale experiment of that cell runs all (a
    user's script has no variant without its sync)."""
    batch = global_batch if mode == "strong" else global_batch // workers
    line = f"scalelab scale --workers 1,{workers} --batches {batch} --mode {mode}"
    return {"one": line, "nosync": SCRIPT_VARIANT if script else line, "noop": SCRIPT_VARIANT if script else line}


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
        apart = nosync_cells(cells, opts["launches"])

        measured = {}

        def analyse(results, cells=cells, ablation=ablation, mode=mode, measured=measured):
            n, m = len(cells), len(ablation)
            measured["cells"] = results[:n]
            runs, noops, nosyncs = (_completed(ctx.cells.rows(part))
                                    for part in (results[:n], results[n:n + m], results[n + m:]))
            table = add_exposed_comm(scaling_table(runs, mode), runs, noops)
            script = not isinstance(base, TrainConfig)
            measured["lost"] = scaling_breakdown(
                table, runs, noops, nosyncs, needs=lambda w, b, mode=mode: variant_command(mode, w, b, script=script))
            measured["stragglers"] = straggler_table(runs)
            return table

        # worker counts, their no-op and no-sync variants in interleaved rounds (drift between launches hits every
        # cell alike); a cell behind an implausible or noisy row is measured once more
        result.tables[name] = run_checked(ctx, [*cells, *ablation, *apart], group=name, analyse=analyse)
        if len(measured["lost"]):
            result.tables[f"{name}_lost_speedup"] = measured["lost"]
        if len(measured["stragglers"]):
            result.tables[f"{name}_stragglers"] = measured["stragglers"]
        if nodes:
            result.tables[f"{name}_nodes"] = node_table(ctx.cells.runs(measured["cells"], all_repeats=True))
    return result


def _completed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "completed"]


def _figures(result: Result, out) -> list:
    files = []
    for name, table in result.tables.items():
        if name.endswith("_lost_speedup"):
            if len(table):
                files.append(waterfall(table, out / f"{name}.png", name=name))
            continue
        if name.endswith("_nodes"):
            if len(table):
                files.append(per_node(table, out / f"{name}.png", name=name))
            continue
        if name.endswith("_stragglers"):  # a table in words (straggler_sentences), no figure
            continue
        if len(table):
            files.append(speedup_vs_workers(table, out / f"{name}.png", mode=name.split("_")[1], name=name))
            files.append(compute_comm_bars(table, out / f"{name}_breakdown.png", name=name))
    return files


def speedup_vs_workers(table: pd.DataFrame, path: Path, *, mode: str, name: str | None = None) -> Path:
    """Measured speedup per batch size vs workers, with the ideal (linear) line; `name`: the table's key in its
    result, recorded with each series (report.drawn)."""
    key = "global_batch" if mode == "strong" else "per_worker_batch"
    fig, ax = plt.subplots(figsize=(6, 4))
    top = int(table["workers"].max())
    ax.plot([1, top], [1, top], "k:", label="ideal")
    series = [Series("ideal")]
    for value, group in table.groupby(key):
        label = f"{key.replace('_', ' ')} {value}"
        ax.errorbar(group["workers"], group["speedup"], yerr=ci(group, "speedup", "speedup_ci_low", "speedup_ci_high"),
                    fmt="o-", capsize=3, label=label)
        series.append(Series(label, name, "speedup"))
    figure = "epoch times" if mode == "strong" else "throughputs"
    ax.set(xlabel="workers (ranks)", ylabel=f"speedup (x, {figure}),\nbars: {ci_label(table)}",
           title=f"{mode.title()} scaling")
    ax.set_xticks(sorted(table["workers"].unique()))
    ax.legend()
    return save(fig, path, series)


def compute_comm_bars(table: pd.DataFrame, path: Path, *, name: str | None = None) -> Path:
    """Per cell: step time split into compute (COMPUTE_LABEL) and exposed communication (stacked
    bars; a negative exposed part downwards), with the exposed part's 95 % interval."""
    labels = [f"{int(w)}w b{int(b)}" for w, b in zip(table["workers"], table["global_batch"])]
    compute = table["compute(ms)"].astype(float).fillna(table["step(ms)"])
    exposed = table["exposed_comm(ms)"].astype(float).fillna(0)
    fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.9), 4))
    ax.bar(labels, compute, label=COMPUTE_LABEL)
    ax.bar(labels, exposed, bottom=compute, label="exposed communication")
    series = [Series(COMPUTE_LABEL, name, "compute(ms)"), Series("exposed communication", name, "exposed_comm(ms)")]
    if has_values(table, "exposed_ci_low(ms)"):  # a legend entry only for an interval drawn
        low, high = (table[c].astype(float) for c in ("exposed_ci_low(ms)", "exposed_ci_high(ms)"))
        ax.errorbar(labels, compute + exposed, yerr=[(exposed - low).clip(lower=0).fillna(0),
                                                     (high - exposed).clip(lower=0).fillna(0)],
                    fmt="none", ecolor="tab:red", capsize=2, label=f"exposed, {ci_label(table)}")
        series.append(Series(f"exposed, {ci_label(table)}", name, "exposed_ci_low(ms)"))
    if has_values(table, keys.COMM_TIME_MS):
        ax.plot(labels, table[keys.COMM_TIME_MS], "kD", label="time inside collectives")
        series.append(Series("time inside collectives", name, keys.COMM_TIME_MS))
    if has_values(table, "step_ci_low(ms)"):
        ax.errorbar([x - 0.2 for x in range(len(labels))], table["step(ms)"].astype(float),
                    yerr=ci(table, "step(ms)", "step_ci_low(ms)", "step_ci_high(ms)"), fmt="none", ecolor="black",
                    capsize=3, label=f"median step, {ci_label(table)}")
        series.append(Series(f"median step, {ci_label(table)}", name, "step(ms)"))
    ax.set(ylabel="median step time (ms)", title="Compute vs communication per step")
    ax.tick_params(axis="x", rotation=45)
    ax.legend()
    return save(fig, path, series)


def per_node(table: pd.DataFrame, path: Path, *, name: str | None = None) -> Path:
    """Seed 003's tables 1-3 as bars: per cell (node count, batch) one bar per node for time per epoch, CPU user
    and system (% of one core, system stacked on user) and network MB/s sent off the node."""
    cells = list(table.groupby(["nodes", "global_batch"], sort=True))
    most = int(table["node"].max()) + 1
    width = 0.8 / most
    fig, axes = plt.subplots(1, 3, figsize=(max(10, 1.2 * len(cells) * 3), 4))
    series = [Series("", name, "cpu_user(%)", axis=1), Series("", name, "cpu_system(%)", axis=1),
              Series("", name, "net_sent(MB/s)", axis=2)]
    for node in range(most):
        mine = [g[g["node"] == node] for _, g in cells]
        x = [i + (node - (most - 1) / 2) * width for i in range(len(cells))]
        value = lambda col: [float(m[col].iloc[0]) if len(m) and pd.notna(m[col].iloc[0]) else 0.0 for m in mine]
        colour = f"C{node % 10}"
        axes[0].bar(x, value("epoch(s)"), width, color=colour, label=f"node {node}")
        series.append(Series(f"node {node}", name, "epoch(s)"))
        axes[1].bar(x, value("cpu_user(%)"), width, color=colour)
        axes[1].bar(x, value("cpu_system(%)"), width, bottom=value("cpu_user(%)"), color=colour, hatch="//",
                    edgecolor="white")
        axes[2].bar(x, value("net_sent(MB/s)"), width, color=colour)
    names = [f"{int(k)} node{'s' * (k > 1)}\nb{int(b)}" for (k, b), _ in cells]
    for ax, (ylabel, title) in zip(axes, (("time per epoch (s)", "Time per epoch"),
                                          ("CPU (% of one core; hatched: system)", "CPU user / system"),
                                          ("sent (MB/s)", "Network sent off the node"))):
        ax.set_xticks(range(len(cells)), names)
        ax.set(ylabel=ylabel, title=title)
    axes[0].legend()
    fig.tight_layout()
    return save(fig, path, series)


def scale_result(result) -> tuple[list[str], str | None]:
    out, rec = lost_speedup_sentences(result), None
    for mode in ("strong", "weak"):
        out += straggler_sentences(result.tables.get(f"scale_{mode}_stragglers"), f"{mode.title()} scaling")
        t = result.tables.get(f"scale_{mode}")
        if t is None or not len(t) or t["workers"].max() < 2:
            continue
        top = t[t["workers"] == t["workers"].max()]
        for d in top.to_dict("records"):
            batch = d["global_batch"] if mode == "strong" else d["per_worker_batch"]
            part = (f"{mode} scaling to {d['workers']} workers at {'global' if mode == 'strong' else 'per-worker'} "
                    f"batch {batch}: speedup {fmt(d['speedup'])}x, efficiency {100 * d['efficiency']:.0f} %"
                    + (f" (95 % interval {100 * d[EFFICIENCY_CI[0]]:.0f}–{100 * d[EFFICIENCY_CI[1]]:.0f} %)"
                       if not pd.isna(d.get(EFFICIENCY_CI[0], float("nan"))) else ""))
            if d.get("exposed_comm(ms)") is not None and d.get("step(ms)"):
                part += (f"; exposed communication {fmt(d['exposed_comm(ms)'], ' ms')} of a "
                         f"{fmt(d['step(ms)'], ' ms')} step ({100 * d['exposed_comm(ms)'] / d['step(ms)']:.0f} %)")
            out.append(part + ".")
        fair = top[top["quality"].map(trusted)] if "quality" in top else top
        for d in top.drop(fair.index).to_dict("records"):
            out.append(f"{d['workers']} workers at batch {d['global_batch']} are flagged ({d['quality']}): "
                       "their efficiency is not a finding.")
        for d in fair.to_dict("records"):
            if str(d.get("quality", "")).startswith(SUPERLINEAR):
                out.append(f"{d['workers']} workers at batch {d['global_batch']} scale superlinearly: speedup "
                           f"{fmt(d['speedup'])}x on {d['workers']} workers (interval from "
                           f"{fmt(d['speedup_ci_low'])}x), beyond noise. Real causes exist (each worker's share "
                           "fits a cache the whole did not; more threads in all); it is reported, not dropped.")
        if not len(fair) or fair["efficiency"].isna().all():
            continue
        if mode == "strong":
            decisions = [d for d in [workers_decision(t, fair)] if d is not None]
            out += [d.card() for d in decisions]
            rec = card(decisions) or rec
    return out, rec


def _strong(result) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The strong-scaling table's rows at the largest worker count that pass their checks, and the table."""
    t = result.tables.get("scale_strong", pd.DataFrame())
    if not len(t) or t["workers"].max() < 2:
        return t, t.iloc[0:0]
    top = t[t["workers"] == t["workers"].max()]
    return t, top[top["quality"].map(trusted)] if "quality" in top else top


def workers_decision(table: pd.DataFrame, fair: pd.DataFrame) -> Decision | None:
    """Strong scaling: the worker count of the best efficiency against its 1-worker run at the same global batch
    (lab.decision on the median step: beyond noise, by a material effect), recommended only where it also pays
    off (efficiency of 50 % or more, its interval not straddling 50 %)."""
    if not len(fair) or fair["efficiency"].isna().all():
        return None
    best = fair.loc[fair["efficiency"].idxmax()]
    ones = table[(table["workers"] == 1) & (table["global_batch"] == best["global_batch"])]
    if not len(ones) or int(best["workers"]) < 2:
        return None
    chosen, one = step_side(best, f"{int(best['workers'])} workers"), step_side(ones.iloc[0], "1 worker")
    decision = decide(chosen, one, question="worker count", keep=None, command="scalelab scale",
                      action=f"{int(best['workers'])} workers at global batch {int(best['global_batch'])}")
    if decision.verdict != BETTER:
        return decision
    low, high = (best.get(c, float("nan")) for c in EFFICIENCY_CI)
    efficiency = f"strong-scaling efficiency {100 * best['efficiency']:.0f} %{efficiency_interval(low, high)}"
    # faster beyond noise is the answer; whether it pays off is said beside it, never as another verdict
    if not pd.isna(low) and low < 0.5 <= high:
        return replace(decision, caveat=f"whether it pays off is within noise: {efficiency} straddles 50 %")
    if best["efficiency"] < 0.5:
        exposed = best.get("exposed_comm(ms)", float("nan"))
        return replace(decision, action=f"{decision.action} only where wall time matters more than cores",
                       caveat=f"{int(best['workers'])} workers do not pay off: {efficiency}, exposed "
                              f"communication {100 * exposed / best['step(ms)']:.0f} % of the step; fewer workers "
                              "or a larger batch per worker use them better")
    return replace(decision, action=f"{decision.action} ({efficiency})")


def efficiency_interval(low: float, high: float) -> str:
    return "" if pd.isna(low) or pd.isna(high) else f" (95 % interval {100 * low:.0f}–{100 * high:.0f} %)"


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study. Compared cells: launched 3 times in interleaved rounds in the default
    study, twice in the quick one (a comparison needs 2 launches or more: lab.decision; the tables'
    `launches` column says so) the buckets of strategies' DDP: its 2-worker cell and baseline are then one cell with
    the DDP row and baseline of strategies and backends, measured once and reused (6 launches fewer in the default
    study)."""
    q = plan.quick
    comm_model = plan.comm_model
    top = max(2, min(plan.gpus, 8)) if plan.gpus else 2
    workers = sorted({1, 2, top})
    return {"workers": workers, "batches": [64], "launches": 2 if q else 3,  # batch effects: batch_sweep
            "set": {**comm_model, "bucket_mb": 4.0}}


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
                         "its link_gbps on every link), or with --launcher slurm of the Slurm allocation's first "
                         "nodes, instead of worker counts; unset: 1 .. local_nodes when the base has "
                         "local_nodes >= 2.")),
    run=_run,
    takes_command=True,
    figures=_figures,
    interpret=scale_result,
    decide=lambda result: [d for d in [workers_decision(*_strong(result))] if d is not None],
    captions={"scale_strong_stragglers": "Per multi-worker cell: the rank the others waited for at the collectives "
                                         "(none when no rank stands out beyond noise), where it loses its time, and "
                                         "the others' wait for it per step with its 95 % interval.",
              "scale_weak_stragglers": "As for strong scaling: the straggler of each multi-worker cell, if any.",
              "scale_strong.png": "Strong scaling: measured speedup vs workers, with the ideal line.",
              "scale_weak.png": "Weak scaling: throughput speedup vs workers, with the ideal line.",
              "scale_strong_breakdown.png": f"Per cell: {COMPUTE_LABEL} + exposed communication; diamonds: time "
                                            "inside collectives.",
              "scale_weak_breakdown.png": f"Per cell, weak scaling: {COMPUTE_LABEL} + exposed communication; "
                                          "diamonds: time inside collectives.",
              "scale_strong_lost_speedup.png": "Where the speedup went, per cell: from the ideal step (the "
                                               "1-worker step scaled to the same work) to the measured one.",
              "scale_weak_lost_speedup.png": "Where the speedup went, weak scaling: ideal step -> measured step.",
              "scale_strong_lost_speedup": "The lost-speedup breakdown of each multi-worker cell: one row per "
                                           "part, its 95 % interval, whether it was measured and what would "
                                           "measure it (docs/definitions.md). Level 0 parts add up to the gap "
                                           "(their share_of_gap to 100 %); level 1 parts split exposed.",
              "scale_weak_lost_speedup": "The lost-speedup breakdown of each multi-worker cell, weak scaling. "
                                         "Level 0 parts add up to the gap; level 1 parts split exposed.",
              "scale_strong_nodes.png": "Per node (seed 003 tables 1-3): time per epoch, CPU user / system (% of "
                                        "one core) and network MB/s sent off the node, by node count.",
              "scale_weak_nodes.png": "Per node, weak scaling: time per epoch, CPU user / system, network MB/s.",
              "scale_strong": "Strong scaling, one row per worker count and batch: median step and its 95 % "
                              "interval, speedup and efficiency with their intervals, exposed communication; every "
                              "column is in the files.",
              "scale_weak": "Weak scaling, one row per worker count and per-worker batch: median step and its 95 % "
                            "interval, throughput speedup and efficiency with their intervals, exposed communication."},
    columns={name: ["workers", "global_batch", "per_worker_batch", "step(ms)", "step_ci_low(ms)",
                    "step_ci_high(ms)", "speedup", "speedup_ci_low", "speedup_ci_high", "efficiency",
                    *EFFICIENCY_CI, "exposed_comm(ms)", "quality"] for name in ("scale_strong", "scale_weak")}
    | {f"{name}_lost_speedup": ["workers", "global_batch", "part", "level", "value(ms)", "value_ci_low(ms)",
                                "value_ci_high(ms)", "share_of_gap", "within_noise", "measured", "needs"]
       for name in ("scale_strong", "scale_weak")}
    | {f"{name}_stragglers": list(STRAGGLER_SHOWN) for name in ("scale_strong", "scale_weak")},
    study_options=study_options,
    version=3,  # 2: exposed at the no-op's fastest rank, overlap = hidden / (waiting + wire), stragglers pooled;
    # 3: intervals named after their figure (efficiency_ci_low, value_ci_low(ms)), so saved tables are re-derived
)
