"""Command line: parse flags, build a config, call one function. Errors in the input: one line, exit code 2.

    scalelab train --model cnn --dataset synthetic --ranks 2 --global-batch 128 --epochs 1
    scalelab runs list | show RUN | compare RUN RUN...
    scalelab study [--quick]            # everything, then the report (cli_study.py)
    scalelab batch-sweep | profile | max-batch | scale | loader-sweep | amp | checkpointing | lr-scaling
                                        # one experiment each (cli_experiments.py)
    scalelab compare strategies|backends, scalelab bench comm, scalelab predict, scalelab slurm
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import click
import typer

try:  # typer >= 0.24 vendors its own click; its errors are not click's classes
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    _TyperUsageError = click.UsageError
USAGE_ERRORS = (click.UsageError, _TyperUsageError)
from rich.console import Console
from rich.table import Table

from scalelab.cli_experiments import app as experiments_app, compare_app
from scalelab.cli_study import app as study_app
from scalelab.cli_predict import app as predict_app
from scalelab.config import TrainConfig, load_yaml
from scalelab.analysis import keys
from scalelab.errors import ScalelabError, renamed_to
from scalelab.sync import registry as sync_registry
from scalelab.store import open_store

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Run PyTorch data-parallel training experiments and explain them.")
runs_app = typer.Typer(no_args_is_help=True, help="List, show and compare stored runs.")
app.add_typer(runs_app, name="runs")
app.add_typer(experiments_app)  # batch-sweep, profile, amp, checkpointing, loader-sweep, scale, max-batch, ...
app.add_typer(study_app)  # study, report
bench_app = typer.Typer(no_args_is_help=True, help="Microbenchmarks.")
app.add_typer(bench_app, name="bench")
app.add_typer(compare_app, name="compare")  # strategies, backends
app.add_typer(predict_app)  # predict
console = Console()
err_console = Console(stderr=True)

STORE_HELP = "Directory holding runs and the catalog (env SCALELAB_STORE; default ./scalelab-runs)."
StoreOpt = typer.Option(None, "--store", help=STORE_HELP)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML file of config fields; flags override it."),
    model: Optional[str] = typer.Option(None, help="mlp, cnn, resnet18, vgg11, vit_tiny, gpt_tiny, or module:function / file.py:function."),
    dataset: Optional[str] = typer.Option(None, help="synthetic, synthetic_tokens, synthetic_jpeg, mnist1d, cifar10, mnist, imagefolder, or module:function."),
    data_path: Optional[str] = typer.Option(None, help="Directory of an on-disk dataset."),
    samples: Optional[int] = typer.Option(None, help="Training samples of a generated dataset."),
    eval_samples: Optional[int] = typer.Option(None, help="Evaluation samples of a generated dataset."),
    augment: Optional[bool] = typer.Option(None, "--augment/--no-augment", help="Random crop + flip per sample."),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", help="Samples per step over all ranks."),
    epochs: Optional[int] = typer.Option(None, help="Epochs to train."),
    steps: Optional[int] = typer.Option(None, help="Train exactly this many steps (overrides --epochs)."),
    optimizer: Optional[str] = typer.Option(None, help="sgd, adam or adamw."),
    lr: Optional[float] = typer.Option(None, help="Learning rate."),
    momentum: Optional[float] = typer.Option(None, help="SGD momentum."),
    weight_decay: Optional[float] = typer.Option(None, help="Weight decay."),
    ranks: Optional[int] = typer.Option(None, "--ranks", "-n", help="Processes on this node."),
    nnodes: Optional[int] = typer.Option(None, help="Nodes in the run (each runs this command)."),
    node_rank: Optional[int] = typer.Option(None, help="This node's rank, 0..nnodes-1."),
    rdzv_endpoint: Optional[str] = typer.Option(None, help="host:port of node 0 (multi-node)."),
    backend: Optional[str] = typer.Option(None, help="auto, gloo, nccl or mpi."),
    wrapper: Optional[str] = typer.Option(None, help="Model wrapper: auto, single, dp (DataParallel) or ddp."),
    old_strategy: Optional[str] = typer.Option(None, "--strategy", hidden=True, callback=renamed_to("--wrapper"),
                                               expose_value=False),
    sync: Optional[str] = typer.Option(None, help=f"Gradient sync: auto (= ddp); {sync_registry.describe()}."),
    bucket_mb: Optional[float] = typer.Option(None, "--bucket-mb", help="Gradient bucket size in MiB (DDP and bucketed)."),
    accumulate: Optional[int] = typer.Option(None, help="Gradient accumulation micro-steps per optimizer step."),
    ddp_hook: Optional[str] = typer.Option(None, "--ddp-hook", help="DDP comm hook: none, fp16, bf16 or powersgd."),
    powersgd_rank: Optional[int] = typer.Option(None, "--powersgd-rank", help="PowerSGD matrix approximation rank."),
    net_latency_ms: Optional[float] = typer.Option(None, "--net-latency-ms", help="Emulated latency per collective (ms)."),
    net_bandwidth_gbps: Optional[float] = typer.Option(None, "--net-bandwidth-gbps", help="Emulated bandwidth cap per collective (Gbit/s)."),
    noop_collectives: Optional[bool] = typer.Option(None, "--noop-collectives/--real-collectives", help="Keep the sync strategy's work but skip its collectives: the baseline for exposed communication."),
    device: Optional[str] = typer.Option(None, help="auto, cpu or cuda."),
    precision: Optional[str] = typer.Option(None, help="fp32, bf16, or fp16 (CUDA, with GradScaler)."),
    checkpoint_segments: Optional[int] = typer.Option(None, help="Activation checkpointing segments (0 = off)."),
    num_workers: Optional[int] = typer.Option(None, help="DataLoader worker processes per rank."),
    pin_memory: Optional[bool] = typer.Option(None, "--pin-memory/--no-pin-memory", help="Pinned host memory (CUDA)."),
    prefetch_factor: Optional[int] = typer.Option(None, help="Batches prefetched per loader worker."),
    drop_last: Optional[bool] = typer.Option(None, "--drop-last/--keep-last", help="Drop an incomplete last batch."),
    seed: Optional[int] = typer.Option(None, help="Random seed."),
    warmup_steps: Optional[int] = typer.Option(None, help="Steps excluded from timing."),
    eval_every: Optional[int] = typer.Option(None, help="Evaluate every N steps (0: each epoch's end)."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per rank (default: cores / ranks)."),
    lr_rule: Optional[str] = typer.Option(None, help="none, linear, sqrt, linear_warmup or lars (lr tuned at --base-batch)."),
    base_batch: Optional[int] = typer.Option(None, help="Global batch the --lr was tuned for (LR rules scale from it)."),
    lr_warmup_steps: Optional[int] = typer.Option(None, help="Linear warm-up steps (linear_warmup, lars)."),
    memory_limit: Optional[str] = typer.Option(None, help="Memory a CPU rank may add beyond set-up, e.g. 4GiB."),
    run_id: Optional[str] = typer.Option(None, help="Fixed run id (nodes of one multi-node run share it)."),
    hang_timeout_s: Optional[float] = typer.Option(None, "--hang-timeout", help="Fail the run, naming the stuck rank, when no rank makes progress for this many seconds (default 300; 0 = off)."),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every", help="Write a resumable checkpoint every N steps (0 = never)."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue this failed or interrupted run from its last checkpoint (its stored config; no other config flags)."),
    study: Optional[str] = typer.Option(None, help="Group the run under a study name."),
    store: Optional[Path] = StoreOpt,
) -> None:
    """Train once, measuring every step's stages; store the run and print its summary."""
    flags = {k: v for k, v in locals().items() if k not in ("config", "store", "study", "resume") and v is not None}
    from scalelab.experiments.base import parse_bytes
    from scalelab.run.execute import RunFailed, execute, resume_run

    if resume is not None and (flags or config or study):
        extra = ", ".join(f"--{k.replace('_', '-')}" for k in [*flags, *(["config"] if config else []),
                                                               *(["study"] if study else [])])
        raise typer.BadParameter(f"a resumed run keeps its stored config; drop {extra}", param_hint="--resume")
    try:
        if resume is not None:
            outcome = resume_run(resume, open_store(store), say=console.print)
        else:
            if "memory_limit" in flags:
                flags["memory_limit"] = parse_bytes(flags["memory_limit"], "memory_limit")
            data = load_yaml(config) if config else {}
            data.update(flags)
            cfg = TrainConfig.from_dict(data)
            outcome = execute(cfg, open_store(store), argv=sys.argv, study=study, say=console.print)
    except RunFailed as err:
        err_console.print(f"error: {err}", highlight=False, soft_wrap=True)  # one line, however long
        raise typer.Exit(1)
    print_summary(outcome.run_id, outcome.summary)


def print_summary(run_id: str, summary: dict) -> None:
    table = Table(title=f"run {run_id}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    wanted = [keys.EPOCH_S, keys.EPOCH_NO_DATA_S, keys.THROUGHPUT, keys.STEP_MEDIAN_MS,
              *(keys.stage_ms(s) for s in ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval", "other")),
              keys.COMM_TIME_MS, keys.COMM_BYTES_PER_STEP, keys.COMM_BUSBW, keys.MEMORY_PEAK_RSS_GIB,
              keys.MEMORY_CUDA_MAX_ALLOCATED_GIB, keys.TRAIN_LOSS, keys.EVAL_LOSS, keys.EVAL_ACC, keys.STEPS_TIMED]
    for key in wanted:
        if key in summary:
            value = summary[key]
            table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else str(value))
    console.print(table)


@runs_app.command("list")
def runs_list(
    status: Optional[str] = typer.Option(None, help="running, completed, failed or interrupted."),
    kind: Optional[str] = typer.Option(None, help="Kind of run (train, ...)."),
    model: Optional[str] = typer.Option(None, help="Only runs of this model."),
    limit: int = typer.Option(50, help="At most this many runs, newest first."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    store: Optional[Path] = StoreOpt,
) -> None:
    """List stored runs, newest first."""
    st = open_store(store)
    st.mark_stale()
    frame = st.list_runs(status=status, kind=kind, where={"model": model} if model else None, limit=limit)
    cols = [c for c in ("run_id", "created", "kind", "status", "model", "dataset", "ranks", "global_batch",
                        "wrapper", "sync", "precision", "reason") if c in frame]
    if as_json:
        print(frame[cols].to_json(orient="records"))
        return
    table = Table(show_header=True)
    for c in cols:
        table.add_column(c)
    for row in frame[cols].itertuples(index=False):
        table.add_row(*["" if v is None else str(v) for v in row])
    console.print(table)


@runs_app.command("show")
def runs_show(run: str = typer.Argument(..., help="Run id or a unique prefix."), store: Optional[Path] = StoreOpt) -> None:
    """Show one run: status, config and summary."""
    row = open_store(store).get(run)
    print(json.dumps(row, indent=2, default=str))


@runs_app.command("compare")
def runs_compare(
    runs: list[str] = typer.Argument(..., help="Run ids or unique prefixes."),
    metric: Optional[list[str]] = typer.Option(None, "--metric", "-m", help="Summary metrics to show (default: all)."),
    store: Optional[Path] = StoreOpt,
) -> None:
    """Compare runs side by side: one row per run, one column per metric."""
    frame = open_store(store).compare(runs, metric or None)
    console.print(frame.T.to_string())


@app.command()
def slurm(
    config: Path = typer.Option(..., "--config", "-c", help="YAML run config every node reads."),
    nodes: int = typer.Option(2, min=1, help="Nodes."),
    gpus_per_node: int = typer.Option(1, min=0, help="GPUs (ranks) per node."),
    time: str = typer.Option("01:00:00", help="Slurm time limit."),
    partition: Optional[str] = typer.Option(None, help="Slurm partition."),
    account: Optional[str] = typer.Option(None, help="Slurm account."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here (default stdout)."),
) -> None:
    """Write an sbatch script that runs `scalelab train` under torchrun on every node."""
    from scalelab.run.launch import slurm_script

    load_yaml(config)  # fail now, not on the cluster, if the file is missing or not YAML
    script = slurm_script(str(config.resolve()), nodes=nodes, gpus_per_node=gpus_per_node, time=time,
                          partition=partition, account=account)
    if output:
        output.write_text(script)
        console.print(f"wrote {output}")
    else:
        print(script, end="")


@bench_app.command("comm")
def bench_comm(
    ops: str = typer.Option("all", help="Comma-separated: allreduce, allgather, reduce_scatter, broadcast (or all)."),
    begin: str = typer.Option("1K", "--begin", "-b", help="Smallest message size S in bytes (K/M/G = 1024^1..3)."),
    end: str = typer.Option("64M", "--end", "-e", help="Largest message size S in bytes."),
    factor: int = typer.Option(2, "--factor", "-f", help="Each size is the previous one times this."),
    warmup: int = typer.Option(5, help="Untimed iterations per size and op."),
    iters: int = typer.Option(20, help="Timed iterations per size and op."),
    ranks: int = typer.Option(2, "--ranks", "-n", help="Processes on this node."),
    backend: str = typer.Option("auto", help="auto, gloo or nccl (nccl needs a CUDA GPU per rank)."),
    dtype: str = typer.Option("float32", help="float32, float16 or bfloat16."),
    store: Optional[Path] = StoreOpt,
) -> None:
    """Time collectives over a size sweep (algbw, busbw as nccl-tests), check every result element, store the run."""
    from scalelab.measure.commbench import CommBenchConfig, results_rich_table
    from scalelab.run.execute import run_commbench
    from scalelab.run.execute import RunFailed

    cfg = CommBenchConfig(ops=ops, begin=begin, end=end, factor=factor, warmup=warmup, iters=iters, ranks=ranks,
                          backend=backend, dtype=dtype)
    try:
        out = run_commbench(cfg, open_store(store), argv=sys.argv, say=console.print)
    except RunFailed as err:
        err_console.print(f"error: {err}", highlight=False)
        raise typer.Exit(1)
    console.print(results_rich_table(out.table, title=f"run {out.run_id}"))
    console.print(f"wrote {out.run_dir}/results.csv, results.json, busbw.png", highlight=False)
    if out.reason:
        err_console.print(f"error: run {out.run_id} failed: {out.reason}", highlight=False)
        raise typer.Exit(1)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line and exit code 2 for bad input, 130 for Ctrl-C."""
    try:
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except (click.exceptions.Exit, typer.Exit) as e:
        sys.exit(e.exit_code)
    except USAGE_ERRORS as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `scalelab` / `scalelab runs`: show the help
            print(e.format_message())
            sys.exit(0)
        hint = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        sys.exit(2)
    except ScalelabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, click.exceptions.Abort, typer.Abort):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
