"""Flags generated from TrainConfig's fields, the shared experiment options, and the one precedence rule.

Every config field is exactly one flag: `--name-with-dashes` unless the field's metadata names another spelling
(`config.doc`), its help is the field's help, a Literal field (and `sync`, from the sync registry) lists its
choices, `model`, `dataset` and `data_path` list the names of the zoo registries. Every command that starts from a
training config takes all of them (`config_params`) and builds its config with `merge`, the only place the
precedence rule is written:

    defaults < YAML file (--config) < --set FIELD=VALUE < flags
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal, Optional, get_args, get_origin, get_type_hints

import typer
import yaml

from scalelab.config import TrainConfig, load_yaml
from scalelab.engines import registry as engines
from scalelab.errors import ConfigError, renamed_to
from scalelab.sync import registry
from scalelab.zoo.registry import datasets, models

KEYWORD = inspect.Parameter.KEYWORD_ONLY


@dataclass(frozen=True)
class ConfigFlag:
    """One config field as a command-line flag."""
    field: str
    decls: tuple[str, ...]  # typer/click declarations, e.g. ("--global-batch", "-b") or ("--augment/--no-augment",)
    help: str  # the field's help, its choices and its default
    choices: tuple[str, ...]  # allowed values of a Literal field (and sync); () for free values
    kind: type  # str, int, float or bool: what the flag's text is converted to
    parse: Callable[[Any, str], Any] | None  # text -> value for fields given as text (memory_limit: 4GiB)

    def param(self) -> inspect.Parameter:
        return inspect.Parameter(self.field, KEYWORD, annotation=Optional[self.kind],
                                 default=typer.Option(None, *self.decls, help=self.help, show_default=False))


def sync_choices() -> tuple[str, ...]:
    return ("auto", *registry.names())


def registry_help(field: str) -> str:
    """The names a field's help lists from the zoo registries ("" for other fields)."""
    if field not in ("model", "dataset", "data_path"):
        return ""

    if field == "model":
        return f" Built-in: {', '.join(models.names())}."
    if field == "dataset":
        return f" Built-in: {', '.join(datasets.names())}."
    return f" On-disk datasets: {', '.join(e.name for e in datasets.entries() if e.on_disk)}."


@cache
def config_flags() -> tuple[ConfigFlag, ...]:
    """One ConfigFlag per TrainConfig field, in the dataclass's order."""
    hints = get_type_hints(TrainConfig)
    out = []
    for f in fields(TrainConfig):
        parse = f.metadata.get("parse")  # a field given as text (a size, "auto" or a number) is parsed by its own rule
        kind, choices = (str, ()) if parse is not None else field_kind(hints[f.name])
        if f.name == "sync":
            choices = sync_choices()
        if f.name == "engine":

            choices = engines.names()
        dashed = f.name.replace("_", "-")
        decls = tuple(f.metadata.get("flag") or ((f"--{dashed}/--no-{dashed}",) if kind is bool else (f"--{dashed}",)))
        text = f.metadata["help"] + registry_help(f.name)
        if choices:
            text += f" Choices: {', '.join(choices)}."
        if f.default is not None:
            text += f" [default: {f.default}]"
        out.append(ConfigFlag(f.name, decls, text, tuple(choices), kind, parse))
    return tuple(out)


def field_kind(hint: Any) -> tuple[type, tuple]:
    """(str | int | float | bool, choices) of a config field's type hint; None is dropped (unset = the default)."""
    args = [a for a in get_args(hint) if a is not type(None)] if get_args(hint) else [hint]
    if get_origin(hint) is Literal:
        return str, tuple(get_args(hint))
    if len(args) == 1 and get_origin(args[0]) is Literal:
        return str, tuple(get_args(args[0]))
    if len(args) != 1 or args[0] not in (str, int, float, bool):
        raise TypeError(f"config field type {hint} has no command-line form")
    return args[0], ()


def parse_sets(sets: Iterable[str] | None) -> dict:
    """--set FIELD=VALUE items -> {field: value}; VALUE is read as YAML (numbers, true/false, lists)."""
    out = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", item, "allowed: FIELD=VALUE, e.g. --set lr=0.1")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except (yaml.YAMLError, ValueError, RecursionError):
            raise ConfigError("--set", item, "VALUE is not valid YAML; e.g. --set lr=0.1 or --set model=cnn") from None
    return out


def merge(defaults: dict | None, yaml_path: Path | None, sets: Iterable[str] | None, flags: dict | None) -> TrainConfig:
    """The one precedence rule: defaults < YAML file < --set FIELD=VALUE < flags (a flag left out is None)."""
    data = dict(defaults or {})
    data.update(load_yaml(yaml_path) if yaml_path else {})
    data.update(parse_sets(sets))
    data.update({k: v for k, v in (flags or {}).items() if v is not None})
    for flag in config_flags():  # text forms (sizes like 4GiB), from any layer
        if flag.parse is not None and isinstance(data.get(flag.field), str):
            data[flag.field] = flag.parse(data[flag.field], flag.field)
    return TrainConfig.from_dict(data)


def config_values(kw: dict) -> dict:
    """The config fields a command's flags set (those given on the command line)."""
    return {f.field: kw[f.field] for f in config_flags() if kw.get(f.field) is not None}


def renamed_param(name: str, old: str, new: str) -> inspect.Parameter:
    """A hidden old spelling that fails with one line naming the new one."""
    return inspect.Parameter(name, KEYWORD, annotation=Optional[str],
                             default=typer.Option(None, old, hidden=True, callback=renamed_to(new),
                                                  expose_value=False))


def config_params(skip: Iterable[str] = (), renamed: dict[str, str] | None = None) -> list[inspect.Parameter]:
    """--config, --set and a flag for every config field not in `skip` (an own option of the command that shadows
    the field; the field is then still settable with --set or the YAML file)."""
    skip = set(skip)
    params = [inspect.Parameter("config", KEYWORD, annotation=Optional[Path],
                                default=typer.Option(None, "--config", "-c", help="YAML file of config fields; "
                                                     "--set and flags override it.")),
              inspect.Parameter("set_", KEYWORD, annotation=Optional[list[str]],
                                default=typer.Option(None, "--set", metavar="FIELD=VALUE", help="FIELD=VALUE for any config field "
                                                     "(repeatable); flags override it."))]
    params += [f.param() for f in config_flags() if f.field not in skip]
    renamed = {"--strategy": "--wrapper"} if renamed is None else renamed
    params += [renamed_param(f"old_{old.strip('-').replace('-', '_')}", old, new) for old, new in renamed.items()]
    return params


STORE_HELP = "Directory holding runs and the catalog (env SCALELAB_STORE; default ./scalelab-runs)."


def field_option(name: str) -> Any:
    """A TrainConfig field's flag for a command that builds another config (bench comm, run): the same default and
    help, so `--local-nodes` means one thing everywhere."""
    f = next(f for f in fields(TrainConfig) if f.name == name)
    return typer.Option(f.default, help=f.metadata["help"])


def store_option() -> Any:
    return typer.Option(None, "--store", help=STORE_HELP)


def place_params(study: str = "default") -> list[inspect.Parameter]:
    """--study, --out and --store: where an experiment's runs, tables and plots go (every experiment command)."""
    return [inspect.Parameter("study", KEYWORD, annotation=str,
                              default=typer.Option(study, help="Study name: runs of a study are resumed, finished "
                                                               "cells skipped.")),
            inspect.Parameter("out", KEYWORD, annotation=Optional[Path],
                              default=typer.Option(None, "--out", help="Directory for tables and plots (default "
                                                                       "STORE/studies/STUDY).")),
            inspect.Parameter("store", KEYWORD, annotation=Optional[Path], default=store_option())]
