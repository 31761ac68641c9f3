"""Experiment commands, generated from the experiment registry: one command per registered experiment that has
one. Its flags: the experiment's own options, then (when it starts from a training config) every config field as
in `scalelab train`, --config and --set, then --study, --out and --store.

    scalelab batch-sweep --model resnet18 --batches 32,64,128,256 --steps 20
    scalelab profile --model cnn --ranks 2 --sync bucketed
    scalelab loader-sweep --dataset synthetic_jpeg --workers 0,1,2,4
    scalelab compare strategies --strategies ddp,bucketed,noop

An own option with the name of a config field (threads --threads, max-batch --memory-limit, loader-sweep
--pin-memory, compare strategies --accumulate) is the experiment's sweep and takes that flag; the field itself is
then set with --set or the YAML file.
"""
from __future__ import annotations

import inspect
from typing import Optional

import typer
import yaml

from scalelab.cli.common import experiment_context, show_result, store_and_out
from scalelab.cli.options import KEYWORD, config_params, config_values, merge, place_params
from scalelab.lab.registry import experiments
from scalelab.run import warm
from scalelab.run.script import SCRIPT_FLAGS, ScriptConfig

app = typer.Typer()
compare_app = typer.Typer(no_args_is_help=True, help="Gradient-sync strategies, backends or engines side by side "
                                                     "(exposed comm, bytes, bandwidth).")


def option_param(option) -> inspect.Parameter:
    """An experiment's own option as a text flag; the option's parser reads the text."""
    flag = option.flag or f"--{option.name.replace('_', '-')}"
    default = option.default if not isinstance(option.default, list) else ",".join(map(str, option.default))
    shown = f" [default: {default}]" if default is not None else ""
    return inspect.Parameter(option.name, KEYWORD, annotation=Optional[str],
                             default=typer.Option(None, flag, help=option.help + shown, show_default=False))


def looks_like_yaml(text: str) -> bool:
    """true/false and YAML lists are read as YAML; everything else stays text for the option's parser."""
    return text.strip().lower() in ("true", "false") or text.strip().startswith("[")


def command_for(experiment):
    """A typer command for `experiment`: its own options, every config field (when it has a base), the place."""
    own = {o.name for o in experiment.options}

    def command(**kw) -> None:
        given = {name: kw[name] for name in own if kw.get(name) is not None}
        opts = experiment.option_values({k: yaml.safe_load(v) if looks_like_yaml(v) else v for k, v in given.items()})
        base = None
        if kw.get("command"):  # a user's script: its config from the command and the flags that apply to it

            base = ScriptConfig(command=tuple(kw["command"]),
                                **{k: kw[k] for k in SCRIPT_FLAGS if kw.get(k) is not None})
        elif experiment.base:
            flags = {k: v for k, v in config_values(kw).items() if k not in own}
            base = merge(experiment.defaults, kw["config"], kw["set_"], flags)
        st, out_dir = store_and_out(kw["store"], kw["study"], kw["out"])
        # one warm block for the command's cells, as a study's: a block per Cells.run would start a zygote for each
        # (a max-batch search's every trial)
        with warm.ranks():
            result = experiment.execute(experiment_context(st, kw["study"], out_dir), base, opts)
        show_result(result, wide=bool(kw.get("wide")), columns=getattr(experiment, "columns", None),
                    captions=getattr(experiment, "captions", None))

    params = [option_param(o) for o in experiment.options]
    if experiment.base:
        params += config_params(skip=own)
    params += place_params()
    params.append(inspect.Parameter("wide", KEYWORD, annotation=bool, default=typer.Option(
        False, "--wide", help="Every column of every table, however wide (default: those that fit the terminal; "
                              "the CSV and JSON hold them all).")))
    if experiment.takes_command:
        params.append(inspect.Parameter("command", KEYWORD, annotation=Optional[list[str]], default=typer.Argument(
            None, help="After --, a script of yours instead of the built-in loop: python train.py ARGS, with "
                       "{global_batch}, {per_worker_batch} or {workers} where the script takes them.")))
    command.__signature__ = inspect.Signature(params)
    command.__doc__ = experiment.help
    command.__name__ = experiment.name
    return command


def register_commands() -> None:
    for experiment in experiments().values():
        if experiment.command is None:
            continue
        words = experiment.command.split()
        target = compare_app if words[0] == "compare" else app
        target.command(words[-1], help=experiment.help)(command_for(experiment))


register_commands()
