"""Experiment commands, generated from the experiment registry: one command per registered experiment that has
one, its flags from the experiment's options plus the shared ones (base config, study, store, output).

    scalelab batch-sweep --model resnet18 --batches 32,64,128,256 --steps 20
    scalelab profile --model cnn --ranks 2
    scalelab loader-sweep --dataset synthetic_jpeg --workers 0,1,2,4
    scalelab compare strategies --strategies ddp,bucketed,noop

Any config field can be set with --set FIELD=VALUE (repeatable) or a YAML --config file.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console

from scalelab.config import TrainConfig, load_yaml
from scalelab.errors import ConfigError

app = typer.Typer()
compare_app = typer.Typer(no_args_is_help=True, help="Gradient-sync strategies or backends side by side (exposed "
                                                     "comm, bytes, bandwidth).")
console = Console()


def say(line: str) -> None:
    """Progress lines are plain text: '[study 1/3]' must not be read as rich markup."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def parse_sets(sets: list[str] | None) -> dict:
    out = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "allowed: FIELD=VALUE, e.g. --set lr=0.1")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError, RecursionError):
            raise ConfigError("--set", item, "VALUE is not valid YAML; e.g. --set lr=0.1 or --set model=cnn") from None
    return out


def base_config(config: Path | None, sets: list[str] | None, defaults: dict | None = None, **flags) -> TrainConfig:
    """defaults < YAML file < --set FIELD=VALUE < named flags."""
    data = dict(defaults or {})
    data.update(load_yaml(config) if config else {})
    data.update(parse_sets(sets))
    data.update({k: v for k, v in flags.items() if v is not None})
    return TrainConfig.from_dict(data)


def experiment_context(store, study: str, out_dir: Path, write=say):
    """A one-experiment context: the study's cell engine with progress lines, tables and plots into `out_dir`."""
    from scalelab.experiments.base import Context
    from scalelab.experiments.cells import Cells
    from scalelab.experiments.progress import PlainProgress

    progress = PlainProgress(write)
    return Context(Cells(store, study, progress=progress), out_dir, progress.say)


def _store_and_out(store: Path | None, study: str, out: Path | None):
    from scalelab.store import open_store

    st = open_store(store)
    return st, out or st.root / "studies" / study


def show(result) -> None:
    """Each table in full (pandas does not squeeze columns to the terminal width), then notes and files."""
    for name, frame in result.tables.items():
        if name.endswith("_curves"):
            continue
        console.rule(name)
        print(frame.drop(columns=["run_id"], errors="ignore").to_string(index=False, float_format="{:,.4g}".format))
    for key, value in result.notes.items():
        console.print(f"{key}: {value}")
    console.print("wrote " + ", ".join(str(p) for p in result.files))


# Shared options of every experiment command that starts from a training config, defined once.
SHARED = {
    "config": (Optional[Path], typer.Option(None, "--config", "-c", help="YAML base config; flags override it.")),
    "model": (Optional[str], typer.Option(None, help="Model (see `scalelab train --help`).")),
    "dataset": (Optional[str], typer.Option(None, help="Dataset (see `scalelab train --help`).")),
    "steps": (Optional[int], typer.Option(None, help="Steps per run.")),
    "ranks": (Optional[int], typer.Option(None, "--ranks", "-n", help="Processes per run.")),
    "set_": (Optional[list[str]], typer.Option(None, "--set", help="FIELD=VALUE for any config field (repeatable).")),
}
PLACE = {
    "study": (str, typer.Option("default", help="Study name: runs of a study are resumed, finished cells skipped.")),
    "out": (Optional[Path], typer.Option(None, "--out", help="Directory for tables and plots (default "
                                                             "STORE/studies/STUDY).")),
    "store": (Optional[Path], typer.Option(None, "--store", help="Run store (env SCALELAB_STORE; default "
                                                                 "./scalelab-runs).")),
}
BASE_FLAGS = ("model", "dataset", "steps", "ranks")


def _option_param(option) -> inspect.Parameter:
    flag = option.flag or f"--{option.name.replace('_', '-')}"
    default = option.default if not isinstance(option.default, list) else ",".join(map(str, option.default))
    shown = f" [default: {default}]" if default is not None else ""
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                             default=typer.Option(None, flag, help=option.help + shown, show_default=False))


def command_for(experiment):
    """A typer command for `experiment`: its options as text flags (parsed by the option), the shared ones."""
    def command(**kw) -> None:
        from scalelab.experiments.cells import Cells  # noqa: F401 - the engine the context holds

        given = {o.name: kw[o.name] for o in experiment.options if kw.get(o.name) is not None}
        opts = experiment.option_values({k: yaml.safe_load(v) if _looks_like_yaml(v) else v
                                         for k, v in given.items()})
        base = base_config(kw["config"], kw["set_"], experiment.defaults,
                           **{k: kw[k] for k in BASE_FLAGS}) if experiment.base else None
        st, out_dir = _store_and_out(kw["store"], kw["study"], kw["out"])
        show(experiment.execute(experiment_context(st, kw["study"], out_dir), base, opts))

    params = [_option_param(o) for o in experiment.options]
    shared = {**(SHARED if experiment.base else {}), **PLACE}
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=ann, default=opt)
               for name, (ann, opt) in shared.items()]
    command.__signature__ = inspect.Signature(params)
    command.__doc__ = experiment.help
    command.__name__ = experiment.name
    return command


def _looks_like_yaml(text: str) -> bool:
    """true/false and YAML lists are read as YAML; everything else stays text for the option's parser."""
    return text.strip().lower() in ("true", "false") or text.strip().startswith("[")


def register_commands() -> None:
    from scalelab.experiments.registry import experiments

    for experiment in experiments().values():
        if experiment.command is None:
            continue
        words = experiment.command.split()
        target = compare_app if words[0] == "compare" else app
        target.command(words[-1], help=experiment.help)(command_for(experiment))


register_commands()
