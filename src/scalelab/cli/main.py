"""The `scalelab` command: parse flags, build a config, call one function. Bad input: one line, exit code 2.

    scalelab train --model cnn --dataset synthetic --ranks 2 --global-batch 128 --epochs 1   (train.py)
    scalelab run --ranks 2 -- python train.py ARGS                                          (script.py)
    scalelab runs list | show RUN | compare RUN RUN... | tensorboard RUN                     (runs.py)
    scalelab explain RUN                                                                    (explain.py)
    scalelab study [--quick] | report DIR                                                    (study.py)
    scalelab batch-sweep | profile | max-batch | scale | loader-sweep | amp | checkpointing | lr-scaling | threads
    scalelab compare strategies|backends                       (experiments.py, generated from the registry)
    scalelab bench comm | predict | slurm                      (bench.py, predict.py, slurm.py)
    scalelab setup horovod                                     (setup.py)

Every command that starts from a training config takes every config field as a flag (options.py), and builds the
config by one rule: defaults < YAML file (--config) < --set FIELD=VALUE < flags.
"""
from __future__ import annotations

import sys

import typer

from scalelab.cli import bench, experiments, explain, predict, runs, script, setup, slurm, study, train
from scalelab.errors import ScalelabError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Run PyTorch data-parallel training experiments and explain them.")
app.command("train")(train.train)
app.command("run")(script.run_script)  # a user's own script
app.add_typer(runs.app, name="runs")
app.command("explain")(explain.explain_cmd)  # why N workers are not N times faster, from stored runs
app.add_typer(experiments.app)  # batch-sweep, profile, amp, checkpointing, loader-sweep, scale, max-batch, ...
app.add_typer(study.app)  # study, report
app.add_typer(bench.app, name="bench")
app.add_typer(experiments.compare_app, name="compare")  # strategies, backends
app.command("predict")(predict.predict_cmd)
app.command("slurm")(slurm.slurm)
app.add_typer(setup.app, name="setup")  # setup horovod


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line and exit code 2 for bad input, 1 for a failed run, 130 for Ctrl-C."""
    try:
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # typer's own (vendored) click errors: a bad flag or value
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `scalelab` / `scalelab runs`: show the help
            print(e.format_message())
            sys.exit(0)
        ctx = getattr(e, "ctx", None)  # usage errors know their command
        hint = f" (see {ctx.command_path} --help)" if ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2) or 2)
    except ScalelabError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
