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

from scalelab.analysis import interpret
from scalelab.analysis.model_grid import grid_table, workers_table
from scalelab.config import TrainConfig, format_model_options
from scalelab.errors import ConfigError
from scalelab.lab.base import Context, Experiment, Option, Result, positive_ints
from scalelab.lab.cells import Cell, CellResult, with_fields
from scalelab.experiments.max_batch import does_not_fit
from scalelab.report import figures
from scalelab.sizes import parse_bytes

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
    from scalelab.zoo.registry import models  # the zoo imports torch

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

    from scalelab.train.setup import build_bundle
    from scalelab.zoo.models import build_model, count_parameters

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
    return [figures.model_grid_heatmaps(grid, out / "model_grid.png"),
            figures.model_grid_memory(grid, out / "model_grid_memory.png")]


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
    interpret=interpret.model_grid_result,
    captions={"model_grid": "Per depth x width x workers: parameters, whether it trained under the memory cap "
                            "(else the reason), median step time and memory by kind per rank.",
              "model_grid_workers": "N workers against 1 per depth x width: memory per rank and step time as "
                                    "ratios (N / 1); `falls`: parts below 0.9x.",
              "model_grid.png": "Median step time and fits / does not fit over depth x width, per worker count.",
              "model_grid_memory.png": "Memory by kind per rank for each cell (stacked), with the peak memory "
                                       "training added."},
)
