"""Model size on 1 and 2 workers (seed 004): depth x width of the deep-and-wide MLP, each cell trained under a
memory cap so that it fits or does not, with step time and memory by kind (parameters, gradients, optimizer
state, activations) per rank.

The seed saw a deep and wide model run out of GPU memory on one GPU and fit on two. The global batch is kept, so N
workers each hold 1/N of it: data parallelism divides the batch's activations among the workers, while every
worker keeps a full copy of parameters, gradients and optimizer state (and DDP adds its gradient buckets). The
second table shows which part fell and what it cost in step time.

Every cell runs in processes of its own, as a max-batch trial does (`max_batch.does_not_fit`): running out of
memory under the cap is the cell's outcome (fits = False, with the reason), never an error of the experiment. On
CPU the cap is an address-space limit on what a rank adds after building its model (`memory_limit`), so the
parameters themselves are outside it; on CUDA the GPU's memory is the limit.

    scalelab model-grid --depths 2,8 --widths 256,1024 --workers 1,2 --memory-limit 96MiB -b 2048
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.analysis.interpret import fmt
from scalelab.analysis.model_grid import FALLS_BELOW, PEAK_ADDED, STACKED, grid_table, memory_column, workers_table
from scalelab.config import TrainConfig, format_model_options
from scalelab.errors import ConfigError
from scalelab.experiments.max_batch import does_not_fit
from scalelab.lab.base import Context, Experiment, Option, Result, StudyPlan, positive_ints
from scalelab.lab.cells import Cell, CellResult, with_fields
from scalelab.report.figures import Series, plt, save
from scalelab.sizes import parse_bytes
from scalelab.train.setup import build_bundle
from scalelab.zoo.models import build_model, count_parameters
from scalelab.zoo.registry import models

SIZES = ("depth", "width")  # the model options the grid varies


def memory_cap(base: TrainConfig, opts: dict) -> int | None:
    """The cap every cell runs under on CPU: the option, else the base config's (required). On CUDA the GPU's
    memory is the limit (a rank caps only CPU address space): the option is refused there, and a cap the base
    config carries (a study's CPU default) is not given to the cells."""
    if base.resolved_device == "cuda":
        if opts["memory_limit"] is not None:
            raise ConfigError("memory_limit", opts["memory_limit"], "on CUDA the GPU's memory is the limit; "
                                                                    "leave it unset")
        return None
    cap = opts["memory_limit"] if opts["memory_limit"] is not None else base.memory_limit
    if cap is None:
        raise ConfigError("memory_limit", None, "required on CPU (without a cap every cell fits, or fills the "
                                                "machine), e.g. --memory-limit 256MiB")
    return cap


def grid_configs(base: TrainConfig, opts: dict) -> list[tuple[dict, TrainConfig]]:
    """(depth, width, workers) and its config per cell, workers outermost: the global batch of `base` is kept."""

    entry = None if ":" in base.model else models.get(base.model)
    if entry is None or not all(size in entry.options for size in SIZES):
        sized = [m.name for m in models.entries() if all(s in m.options for s in SIZES)]
        raise ConfigError("model", base.model, f"the grid needs a model with depth and width options: "
                                               f"{', '.join(sized)}")
    for n in opts["workers"]:
        if base.global_batch % (n * base.nnodes * base.accumulate):
            raise ConfigError("workers", opts["workers"], f"the global batch {base.global_batch} is kept, so it "
                              f"must divide by every worker count; {n} does not divide it")
    cap = memory_cap(base, opts)
    out = []
    for n in opts["workers"]:
        for depth in opts["depths"]:
            for width in opts["widths"]:
                size = format_model_options({**base.model_overrides, "depth": depth, "width": width})
                cfg = with_fields(base, ranks=n, model_options=size, memory_limit=cap)
                out.append(({"depth": depth, "width": width, "workers": n}, cfg))
    return out


def parameter_counts(base: TrainConfig, sizes: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Trainable parameters per (depth, width), counted on models built on the meta device (nothing allocated)."""
    import torch


    spec = build_bundle(base).spec
    with torch.device("meta"):
        return {(d, w): count_parameters(build_model(base.model, spec,
                                                     **{**base.model_overrides, "depth": d, "width": w}))
                for d, w in sizes}


def cell_status(res: CellResult) -> str:
    """completed | does not fit (out of memory under the cap: an outcome) | failed | missing."""
    if res.status == "failed" and res.cell.accepts("failed", res.reason):
        return "does not fit"
    return res.status


def run_cells(ctx: Context, chosen: list[tuple[dict, TrainConfig]]) -> list[CellResult]:
    """Every cell through the cell engine, smaller models first, one result per cell in `chosen`'s order.

    Once a smaller model (depth and width both no larger) has trained on the same workers, the config is known to
    work, so any failure of a larger one under a memory bound counts as not fitting: under an address-space cap
    native code reports a failed allocation in its own words (gloo's std::bad_alloc inside DDP's comm hook reaches
    the run's reason as a bare traceback line), as the max-batch search found (`max_batch.does_not_fit`)."""
    done: dict[int, CellResult] = {}
    fitted: list[dict] = []
    for i in sorted(range(len(chosen)), key=lambda i: (chosen[i][0]["workers"], chosen[i][0]["depth"],
                                                      chosen[i][0]["width"])):
        where, cfg = chosen[i]
        bounded = cfg.memory_limit is not None or cfg.resolved_device == "cuda"
        lenient = bounded and any(f["workers"] == where["workers"] and f["depth"] <= where["depth"]
                                  and f["width"] <= where["width"] for f in fitted)
        cell = Cell(f"depth {where['depth']} x width {where['width']}, {where['workers']} worker(s)", cfg,
                    isolate=True, outcome_failure=does_not_fit(cfg, lenient))
        [done[i]] = ctx.cells.run([cell], group="model_grid")
        if done[i].status == "completed":
            fitted.append(where)
    return [done[i] for i in range(len(chosen))]


def cap_note(cap: int | None, device: str) -> str:
    """What the cells' memory limit means, for the report's notes."""
    if cap is None:
        return "none: the GPU's memory is the limit"
    if device == "cpu":
        return (f"{cap / 2**20:.0f} MiB per rank: an address-space cap on what a rank adds after building its "
                "model (the parameters are outside it; a virtual quantity, not resident memory)")
    return f"{cap / 2**20:.0f} MiB per rank"


def _run(ctx: Context, base: TrainConfig, opts: dict) -> Result:
    chosen = grid_configs(base, opts)
    results = run_cells(ctx, chosen)
    counts = parameter_counts(base, sorted({(w["depth"], w["width"]) for w, _ in chosen}))
    rows = []
    for (where, cfg), res, stored in zip(chosen, results, ctx.cells.rows(results)):
        rows.append({**where, "global_batch": cfg.global_batch, "parameters": counts[where["depth"], where["width"]],
                     "status": cell_status(res), "reason": res.reason, "run_id": res.run_id,
                     "summary": stored["summary"]})
    grid = grid_table(rows)
    notes = {"memory cap": cap_note(chosen[0][1].memory_limit, base.resolved_device),
             "global batch": f"{base.global_batch}, kept: each of N workers trains on {base.global_batch} / N"}
    return Result("model_grid", {"model_grid": grid, "model_grid_workers": workers_table(grid)}, notes=notes)


def _figures(result: Result, out) -> list:
    grid = result.tables["model_grid"]
    return [model_grid_heatmaps(grid, out / "model_grid.png"),
            model_grid_memory(grid, out / "model_grid_memory.png")]


def _grid(frame: pd.DataFrame, values: pd.Series, depths: list, widths: list) -> pd.DataFrame:
    """`values` (aligned with `frame`) laid out depth (rows) x width (columns)."""
    return (frame.assign(_v=values.astype(float)).pivot(index="depth", columns="width", values="_v")
            .reindex(index=depths, columns=widths))


def model_grid_heatmaps(table: pd.DataFrame, path: Path) -> Path:
    """Per worker count (columns): median step time over depth x width (top; one colour scale) and whether the
    cell fits under the memory cap (bottom). A cell without a number is grey, labelled with its status."""
    from matplotlib.colors import ListedColormap

    workers = sorted(table["workers"].unique())
    depths, widths = sorted(table["depth"].unique()), sorted(table["width"].unique())
    steps = table["step(ms)"].astype(float)
    lo, hi = (float(steps.min()), float(steps.max())) if steps.notna().any() else (0.0, 1.0)
    fig, axes = plt.subplots(2, len(workers), figsize=(1.2 + 3.2 * len(workers), 1.8 + 1.2 * len(depths) * 2),
                             squeeze=False)
    fits = table["fits"].map(lambda v: 1.0 if v is True else 0.0 if v is False else float("nan"))
    time_map, fit_map = plt.get_cmap("viridis").with_extremes(bad="lightgray"), \
        ListedColormap(["tab:red", "tab:green"]).with_extremes(bad="lightgray")
    for j, n in enumerate(workers):
        mine = table[table["workers"] == n]
        step = _grid(mine, steps[mine.index], depths, widths)
        ok = _grid(mine, fits[mine.index], depths, widths)
        status = mine.set_index(["depth", "width"])["status"]
        top, bottom = axes[0][j], axes[1][j]
        image = top.imshow(step.values, origin="lower", aspect="auto", cmap=time_map, vmin=lo, vmax=hi)
        bottom.imshow(ok.values, origin="lower", aspect="auto", cmap=fit_map, vmin=0, vmax=1)
        for y, d in enumerate(depths):
            for x, w in enumerate(widths):
                t, f = step.values[y, x], ok.values[y, x]
                top.text(x, y, "-" if t != t else f"{t:.3g}", ha="center", va="center",
                         color="black" if t != t else "white")
                label = "fits" if f == 1 else "does not fit" if f == 0 else str(status.get((d, w), "not run"))
                bottom.text(x, y, label, ha="center", va="center", color="black" if f != f else "white")
        for ax, what in ((top, "median step (ms)"), (bottom, "fits under the cap")):
            ax.set_xticks(range(len(widths)), [str(w) for w in widths])
            ax.set_yticks(range(len(depths)), [str(d) for d in depths])
            ax.set(xlabel="width (units per layer)", ylabel="depth (layers)",
                   title=f"{n} worker{'s' if n > 1 else ''}: {what}")
        fig.colorbar(image, ax=top, label="median step time (ms)")
    # the colour scale reads step(ms): each colour bar is an axes of its own, after the 2 x workers panels
    return save(fig, path, [Series("", "model_grid", "step(ms)", axis=2 * len(workers) + j)
                            for j in range(len(workers))])


def model_grid_memory(table: pd.DataFrame, path: Path) -> Path:
    """Memory by kind per rank for every cell, stacked (parameters, gradients, optimizer state, saved
    activations), with the activation peak in backward and the peak memory training added as markers."""

    labels = [f"d{int(d)} w{int(w)}\n{int(n)} worker{'s' if n > 1 else ''}"
              for d, w, n in zip(table["depth"], table["width"], table["workers"])]
    x = list(range(len(labels)))
    mib = 2**20
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(labels)), 4.8))
    bottom = pd.Series(0.0, index=table.index)
    series = []
    for kind in STACKED:
        values = table[memory_column(kind)].astype(float).fillna(0) / mib
        recorded = table[memory_column(kind)].notna().any()  # a kind no cell recorded has no legend entry
        ax.bar(x, values, bottom=bottom, label=kind.replace("_", " ") if recorded else None)
        if recorded:
            series.append(Series(kind.replace("_", " "), "model_grid", memory_column(kind), 1 / mib))
        bottom = bottom + values
    peak = table[memory_column("activations_backward_peak")].astype(float) / mib
    added = table[PEAK_ADDED].astype(float) / mib
    for values, style, label, column in ((peak, "kx", "activation peak in backward",
                                          memory_column("activations_backward_peak")),
                                         (added, "kD", "peak memory added by training (measured)", PEAK_ADDED)):
        drawn = values.notna().any()  # a marker no cell recorded has no legend entry
        ax.plot(x, values, style, mfc="none" if style == "kD" else None, label=label if drawn else None)
        if drawn:
            series.append(Series(label, "model_grid", column, 1 / mib))
    top = max([float(v) for v in (bottom.max(), peak.max(), added.max()) if v == v] + [1e-6])
    for i, (fit, stacked) in enumerate(zip(table["fits"], bottom)):
        if fit is not True:
            ax.text(i, 0.02 * top, "does not fit" if fit is False else "failed", ha="center", va="bottom",
                    rotation=90, color="gray")
        elif stacked == 0:
            ax.text(i, 0.02 * top, "by kind not recorded", ha="center", va="bottom", rotation=90, color="gray",
                    fontsize="small")
    ax.set_xticks(x, labels, fontsize="small")
    ax.set(ylabel="memory per rank (MiB, largest rank)", title="Memory by kind per cell")
    ax.set_ylim(0, 1.4 * top)
    if series:  # nothing recorded in any cell: no legend
        ax.legend(fontsize="small", loc="upper left", ncols=2)
    return save(fig, path, series)


def _size(row) -> str:
    return f"depth {int(row['depth'])} x width {int(row['width'])}"


def model_grid_result(result) -> tuple[list[str], str | None]:
    """What N workers changed in the model-size grid: which cells fit, which memory part fell, the step's cost.
    The seed's claim (two workers made a model fit) is checked against the cells, never assumed."""
    grid = result.tables.get("model_grid", pd.DataFrame())
    cmp = result.tables.get("model_grid_workers", pd.DataFrame())
    if not len(grid):
        return [], None
    out = []
    for n, g in grid.groupby("workers"):
        fit = g[g["fits"].eq(True)]
        part = f"On {n} worker{'s' if n > 1 else ''}, {len(fit)} of {len(g)} cells fit"
        if len(fit):
            top = fit.loc[fit["parameters"].idxmax()]
            part += f" (the largest: {_size(top)}, {int(top['parameters']):,} parameters)"
        out.append(part + ".")
    rec = None
    for n, c in cmp.groupby("workers") if len(cmp) else []:
        only_n, only_1 = c[c["fit"] == f"fits only on {n} workers"], c[c["fit"] == "fits only on 1 worker"]
        if len(only_n):
            out.append(f"Fits on {n} workers but not on 1: {', '.join(_size(r) for _, r in only_n.iterrows())}.")
            r = only_n.iloc[0]
            step = grid[(grid["workers"] == n) & (grid["depth"] == r["depth"]) & (grid["width"] == r["width"])]
            rec = (f"Under this memory limit, {_size(r)} needs {n} workers "
                   f"({fmt(float(step['step(ms)'].iloc[0]), ' ms')} per step there).")
        else:
            out.append(f"No cell fits on {n} workers that does not fit on 1: the seed's claim is not seen in this "
                       "grid.")
        if len(only_1):
            out.append(f"Fits on 1 worker but not on {n}: {', '.join(_size(r) for _, r in only_1.iterrows())}.")
        both = c[c["fit"] == "fits on both"]
        kinds = [("activations_saved", "saved activations"), ("activations_backward_peak", "activation peak in "
                 "backward"), ("parameters", "parameters"), ("gradients", "gradients"),
                 ("optimizer_state", "optimizer state"), ("peak_added", "peak memory added by training")]
        ratios = [f"{label} {both[f'{kind}(ratio)'].median():.2f}x" for kind, label in kinds
                  if len(both) and both[f"{kind}(ratio)"].notna().any()]
        if not len(both):
            continue
        if ratios:
            cells = f"the {len(both)} cells" if len(both) > 1 else "the 1 cell"
            out.append(f"From 1 to {n} workers, per rank (median over {cells} that fit on both): "
                       + ", ".join(ratios) + ".")
        if all(both[f"{kind}(ratio)"].isna().all() for kind, _ in kinds[:5]):
            out.append("These runs did not record memory by kind, so which part fell is not measured here.")
        falls = sorted({k for text in both["falls"] for k in text.split(", ") if k})
        step = both["step(ratio)"]
        spread = f" ({step.min():.2f}x to {step.max():.2f}x)" if step.notna().sum() > 1 else ""
        out.append(f"What fell below {FALLS_BELOW:.1f}x: {', '.join(falls) if falls else 'nothing'}; step time "
                   f"{step.median():.2f}x{spread}.")
    return out, rec


def study_options(plan: StudyPlan) -> dict | None:
    """The options in the built-in study. Seed 004: at this batch narrow MLPs are activation-bound (2 workers halve
    that), wide ones parameter-bound (every worker holds all of it). The 96 MiB CPU cap leaves room for the narrow
    ones on 1 and 2 workers (peak RSS added ~60 / ~35 MiB on 2 cores) and none for depth 8 x width 1024 (84 MB of
    gradients and momentum); 64 MiB made width 256 on 1 worker fit in some runs and not in others. The quick study
    keeps one model on 1 and 2 workers (its 150 s budget); the default one the whole grid."""
    q = plan.quick
    gpus = plan.gpus
    return {"depths": [2] if q else [2, 8], "widths": [1024] if q else [256, 1024],
            "workers": [1] if gpus == 1 else [1, 2], "memory_limit": None if gpus else 96 * 2**20,
            "set": {"model": "mlp", "global_batch": 2048, "samples": 2048, "eval_every": 1000,
                    "steps": 3, "warmup_steps": 1}}


EXPERIMENT = Experiment(
    name="model_grid", command="model-grid", section="modelgrid", order=35,
    title="Model size on one and two workers",
    question="Which depth x width of the deep-and-wide MLP fits under a memory limit on 1 and 2 workers, which "
             "part of memory do 2 workers shrink, and at what cost in step time? (seed 004)",
    help="Depth x width of the MLP on 1 and 2 workers under a memory cap: fits, step time, memory by kind.",
    options=(Option(name="depths", default=[2, 8], help="Depths (hidden layers) to try.", parse=positive_ints),
             Option(name="widths", default=[256, 1024], help="Widths (units per hidden layer) to try.",
                    parse=positive_ints),
             Option(name="workers", default=[1, 2], help="Worker counts; the global batch is kept.",
                    parse=positive_ints),
             Option(name="memory_limit", default=None, help="Memory a rank may add after building its model, e.g. "
                                                            "256MiB (required on CPU; default on CUDA: the GPU).",
                    parse=parse_bytes)),
    defaults={"model": "mlp", "global_batch": 256, "steps": 6, "warmup_steps": 2},
    run=_run,
    figures=_figures,
    interpret=model_grid_result,
    captions={"model_grid": "Per depth x width x workers: parameters, whether it trained under the memory cap "
                            "(else the reason), median step time and memory by kind per rank.",
              "model_grid_workers": "N workers against 1 per depth x width: memory per rank and step time as "
                                    "ratios (N / 1); `falls`: parts below 0.9x.",
              "model_grid.png": "Median step time and fits / does not fit over depth x width, per worker count.",
              "model_grid_memory.png": "Memory by kind per rank for each cell (stacked), with the peak memory "
                                       "training added."},
    # what tells a cell apart (depth, width, workers) and what answers the question: fits, step, memory by kind
    columns={"model_grid": ["depth", "width", "workers", "parameters", "fits", "status", "step(ms)",
                            "gradients(bytes)", "optimizer_state(bytes)", "activations_saved(bytes)",
                            "peak_added(bytes)"],
             "model_grid_workers": ["depth", "width", "workers", "fit", "step(ratio)", "parameters(ratio)",
                                    "gradients(ratio)", "optimizer_state(ratio)", "activations_saved(ratio)",
                                    "peak_added(ratio)", "falls"]},
    study_options=study_options,
    version=2,  # issue 60: its columns declared
)
