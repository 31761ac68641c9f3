"""Load a user's model factory from `package.module:function` or `path/to/file.py:function`.

Every failure becomes a one-line ModelError (or ConfigError for a malformed ref): users see it
printed by the CLI, and a traceback into importlib would hide the cause.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import re
import sys
from pathlib import Path
from typing import Callable

from torch import nn

from scalelab.errors import ConfigError, ModelError
from scalelab.zoo.spec import DataSpec

REF_FORMAT = "module:function or path/file.py:function"
_counter = itertools.count()


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return _one_line(f"SyntaxError at line {exc.lineno}: {exc.msg}")
    if isinstance(exc, ImportError):  # ModuleNotFoundError reads better as the generic ImportError
        return _one_line(f"ImportError: {exc}")
    message = _one_line(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _is_file_ref(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_file(path_text: str, field: str, ref: str):
    path = Path(path_text).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.is_file():
        raise ModelError(f"{field}: cannot import {ref!r} (file not found: {path})")
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_scalelab_user_{stem}_{next(_counter)}"  # unique, so two files named model.py never clash
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelError(f"{field}: cannot import {ref!r} (not a loadable Python file)")
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs so dataclasses/typing lookups by __module__ work; the file's folder is
    # on sys.path meanwhile so it can import its sibling files.
    sys.modules[name] = module
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # user code can raise anything, even sys.exit()
        sys.modules.pop(name, None)
        raise ModelError(f"{field}: cannot import {ref!r} ({_describe(exc)})") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def load_callable(ref: str, field: str) -> Callable:
    """Import `ref` ("package.module:function" or "path/to/file.py:function") and return the callable."""
    target, sep, func = str(ref).rpartition(":")  # rpartition: a Windows drive "C:\..." keeps its colon
    if not sep or not target or not func.isidentifier():
        raise ConfigError(field, ref, REF_FORMAT)
    if _is_file_ref(target):
        module = _load_file(target, field, ref)
        where = Path(target).name
    else:
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as exc:
            raise ModelError(f"{field}: cannot import {ref!r} ({_describe(exc)})") from None
        where = target
    if not hasattr(module, func):
        raise ModelError(f"{field}: cannot import {ref!r} (no function {func!r} in {where})")
    obj = getattr(module, func)
    if not callable(obj):
        raise ModelError(f"{field}: cannot import {ref!r} ({func!r} in {where} is not callable: "
                         f"it is a {type(obj).__name__})")
    return obj


def _wants_spec(fn: Callable, ref: str) -> bool:
    """True if fn takes one positional argument (the DataSpec), False if it takes none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False  # builtins without a signature: call with no arguments
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    required_kw = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if len(required) > 1 or required_kw:
        raise ModelError(f"model: {ref!r} must take no arguments or one (the DataSpec); "
                         f"its signature is {_one_line(inspect.signature(fn))}")
    return bool(positional) or any(p.kind is p.VAR_POSITIONAL for p in params)


def build_user_model(ref: str, spec: DataSpec) -> nn.Module:
    """Call the user's factory (with the DataSpec if it takes one argument) and check it gives a module."""
    fn = load_callable(ref, "model")
    with_spec = _wants_spec(fn, ref)
    try:
        model = fn(spec) if with_spec else fn()
    except (Exception, SystemExit) as exc:
        raise ModelError(f"model: {ref!r} raised {_describe(exc)}") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"model: {ref!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
