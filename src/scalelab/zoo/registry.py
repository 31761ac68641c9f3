"""The registries of built-in models and datasets: one `ModelEntry` per model, one `DatasetEntry` per dataset.

Every module of the scalelab.zoo package that defines a module-level `ENTRIES` (a tuple of ModelEntry and
DatasetEntry) contributes them; the registries find them (pkgutil) the first time they are asked, so adding a
model or a dataset is one entry next to its builder (or one new module here) plus its test. Everything else that
needs model or dataset names reads them from here: `build_model`, `build_data`, their error messages, the CLI's
help. This module imports no zoo module and no user of the registries at import time.

    from scalelab.zoo.registry import datasets, models
    models.names()                    # ("mlp", "cnn", "resnet18", "vgg11", "vit_tiny", "gpt_tiny")
    models.get("cnn").inputs          # ("image", "seq1d")
    datasets.get("mnist").data_path   # "a directory holding the four MNIST IDX files (optionally .gz)"
    models.register(ModelEntry(...)); models.unregister("mine")   # a model defined outside scalelab (tests)
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalelab.registry import Registry
from scalelab.zoo.spec import InputKind


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One built-in model and what the rest of scalelab needs to know about it.

    name         the config's `model` value.
    builder      (spec: DataSpec, **options) -> nn.Module; may raise ConfigError("model", ...) for a shape it
                 cannot take (vgg11 needs 32x32 images).
    description  one line, for help and docs.
    inputs       the DataSpec kinds it takes ("image", "seq1d", "tokens"); `build_model` refuses any other with
                 "<model> needs ... data; dataset gives <kind>".
    options      the size overrides `build_model(name, spec, **overrides)` accepts; None: the builder's
                 parameters after the spec.
    """

    name: str
    builder: Callable[..., Any] = field(compare=False)
    description: str
    inputs: tuple[InputKind, ...]
    options: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.options is None:
            object.__setattr__(self, "options", _keywords(self.builder, skip=1))


@dataclass(frozen=True, kw_only=True)
class DatasetEntry:
    """One built-in dataset and what the rest of scalelab needs to know about it.

    name         the config's `dataset` value.
    builder      (*, path, samples, eval_samples, seed, image_size, seq_len, vocab, augment) -> DataBundle, the
                 arguments already checked by `build_data` (each builder uses the ones it needs).
    description  one line, for help and docs.
    kind         the DataSpec kind its samples have ("image", "seq1d", "tokens"); augmentation exists for images.
    data_path    what --data-path must name (read from disk); None: generated in memory, takes no data path.
    decodes      every sample is decoded (Pillow) when read, so DataLoader workers pay off.
    """

    name: str
    builder: Callable[..., Any] = field(compare=False)
    description: str
    kind: InputKind
    data_path: str | None = None
    decodes: bool = False

    @property
    def on_disk(self) -> bool:
        return self.data_path is not None

    @property
    def augments(self) -> bool:
        return self.kind == "image"


def _keywords(fn: Callable, skip: int) -> tuple[str, ...]:
    """Names of fn's parameters after the first `skip` (no *args / **kwargs)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return tuple(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


models: Registry[ModelEntry] = Registry("model", ModelEntry, package="scalelab.zoo", attribute="ENTRIES",
                                        hint="module:function / path/file.py:function")
datasets: Registry[DatasetEntry] = Registry("dataset", DatasetEntry, package="scalelab.zoo", attribute="ENTRIES",
                                            hint="module:function or path/file.py:function")
