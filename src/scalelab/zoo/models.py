"""Built-in models (no torchvision) and their registry entries (`ENTRIES`, read by `scalelab.zoo.registry`).

Every model keeps its repeated body in `blocks: nn.Sequential` and runs it through `run_blocks`, so
activation checkpointing can be switched on for any of them with `set_checkpoint_segments`.
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from scalelab.errors import ConfigError, ModelError
from scalelab.zoo.registry import ModelEntry, models
from scalelab.zoo.spec import DataSpec


def segment_bounds(n: int, segments: int) -> list[tuple[int, int]]:
    """`n` blocks in `segments` contiguous pieces as even as possible, the longer ones first: [(start, stop)]."""
    size, longer = divmod(n, segments)
    bounds, start = [], 0
    for i in range(segments):
        stop = start + size + (i < longer)
        bounds.append((start, stop))
        start = stop
    return bounds


def run_blocks(blocks: nn.Sequential, x: torch.Tensor, segments: int,
               recompute_context: Callable[[], AbstractContextManager] | None = None) -> torch.Tensor:
    """Run `blocks` on x, checkpointed in `segments` pieces when training with grad (0 = plain).

    Every segment is checkpointed, the last one too (torch's checkpoint_sequential runs its last segment plainly,
    so one segment there checkpoints nothing). `recompute_context` (the train layer's memory probe) is entered
    around each segment's recomputation in backward.
    """
    if segments <= 0 or not blocks.training or not torch.is_grad_enabled():
        return blocks(x)
    context_fn = (lambda: (nullcontext(), recompute_context())) if recompute_context else noop_context_fn
    for start, stop in segment_bounds(len(blocks), segments):
        x = checkpoint(blocks[start:stop], x, use_reentrant=False, context_fn=context_fn)
    return x


def set_checkpoint_segments(model: nn.Module, segments: int) -> None:
    """Set how many checkpoint segments the model's `blocks` are split into (0 switches it off)."""
    name = type(model).__name__
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential):
        raise ModelError(f"{name} has no 'blocks' nn.Sequential, so checkpoint segments {segments} "
                         "cannot be applied; allowed: 0 only")
    if isinstance(segments, bool) or not isinstance(segments, int) or not 0 <= segments <= len(blocks):
        raise ModelError(f"{name}: checkpoint segments {segments!r} out of range; "
                         f"allowed 0..{len(blocks)} (it has {len(blocks)} blocks)")
    model.checkpoint_segments = segments


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter elements."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by trainable parameters (what gradients and all-reduce move)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class _Body(nn.Module):
    """Base: holds `blocks`, `checkpoint_segments` and `recompute_context` (set by the train layer's memory probe
    for the step it measures; None otherwise)."""

    blocks: nn.Sequential
    checkpoint_segments: int = 0
    recompute_context: Callable[[], AbstractContextManager] | None = None

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return run_blocks(self.blocks, x, self.checkpoint_segments, self.recompute_context)


# ---------------------------------------------------------------- mlp
class MLP(_Body):
    """Flatten -> `depth` x (Linear+ReLU, `width` wide) -> Linear.

    Tokens: each position is embedded (dim `embed`) and the MLP is applied per position, so the
    output is (B, T, vocab). Flattening the whole sequence would let position t see token t+1,
    which is its own target.
    """

    def __init__(self, spec: DataSpec, *, width: int = 1024, depth: int = 4, embed: int = 64):
        super().__init__()
        self.tokens = spec.kind == "tokens"
        if self.tokens:
            self.stem = nn.Embedding(spec.num_classes, embed)
            n_in = embed
        else:
            self.stem = nn.Flatten()
            n_in = math.prod(spec.shape)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(n_in if i == 0 else width, width), nn.ReLU())
                                      for i in range(depth)])
        self.head = nn.Linear(width if depth else n_in, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


# ---------------------------------------------------------------- cnn
class SmallCNN(_Body):
    """`depth` x (Conv stride 2, padding 1, ReLU) -> flatten -> Linear. Conv1d for seq1d, Conv2d for image.

    Defaults for seq1d follow the MNIST-1D paper's ConvBase: 25 channels, kernels 5,3,3 (`first_kernel`,
    `kernel`); images use 32 channels and kernel 3.
    """

    def __init__(self, spec: DataSpec, *, width: int | None = None, depth: int = 3,
                 first_kernel: int | None = None, kernel: int = 3):
        super().__init__()
        image = spec.kind == "image"
        conv = nn.Conv2d if image else nn.Conv1d
        width = width or (32 if image else 25)
        first_kernel = first_kernel or (3 if image else 5)
        channels, sizes = spec.shape[0], list(spec.shape[1:])
        layers = []
        for i in range(depth):
            k = first_kernel if i == 0 else kernel
            layers.append(nn.Sequential(conv(channels if i == 0 else width, width, k, stride=2, padding=1),
                                        nn.ReLU()))
            sizes = [(s + 2 - k) // 2 + 1 for s in sizes]
            if min(sizes) < 1:
                raise ConfigError("model", "cnn", f"input {spec.shape} is too small for {depth} stride-2 convs")
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear((width if depth else channels) * math.prod(sizes),
                                                          spec.num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


# ---------------------------------------------------------------- resnet18
class BasicBlock(nn.Module):
    """Two 3x3 conv+BN with an identity (or 1x1 projection) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(_Body):
    """CIFAR-style ResNet: 3x3 stem (no maxpool), BasicBlocks `layers` per stage, widths `width`*(1,2,4,8)."""

    def __init__(self, spec: DataSpec, *, width: int = 64, layers: tuple[int, ...] = (2, 2, 2, 2)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(spec.shape[0], width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        blocks, c_in = [], width
        for stage, n in enumerate(layers):
            c_out = width * 2 ** stage
            for i in range(n):
                blocks.append(BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, spec.num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


# ---------------------------------------------------------------- vgg11
VGG11_CONFIG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG11(_Body):
    """CIFAR-style VGG-11 with BatchNorm; channels scale with `width` (64 = standard). Needs H, W >= 32.

    Each block is one conv+BN+ReLU, with the following max-pool folded in, so there are 8 blocks.
    """

    def __init__(self, spec: DataSpec, *, width: int = 64):
        super().__init__()
        blocks, c_in = [], spec.shape[0]
        for item in VGG11_CONFIG:
            if item == "M":
                blocks[-1].append(nn.MaxPool2d(2))
                continue
            c_out = item * width // 64
            blocks.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()))
            c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, spec.num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


# ---------------------------------------------------------------- transformers
def _encoder_layer(dim: int, heads: int, dropout: float) -> nn.TransformerEncoderLayer:
    return nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=dropout, activation="gelu",
                                      batch_first=True, norm_first=True)


class ViTTiny(_Body):
    """ViT: Conv2d patch embedding (`patch`), cls token, learned positions, `depth` pre-norm encoder
    layers of `dim` with `heads` heads and `dropout`, LayerNorm + Linear on the cls token."""

    def __init__(self, spec: DataSpec, *, patch: int = 4, dim: int = 192, depth: int = 6, heads: int = 3,
                 dropout: float = 0.0):
        super().__init__()
        c, h, w = spec.shape
        self.patch_embed = nn.Conv2d(c, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, (h // patch) * (w // patch) + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[_encoder_layer(dim, heads, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.body(x))[:, 0])


class CausalLayer(nn.Module):
    """An encoder layer that builds its own causal mask, so it can live inside an nn.Sequential."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.layer = _encoder_layer(dim, heads, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device, dtype=x.dtype)
        return self.layer(x, src_mask=mask, is_causal=True)


class GPTTiny(_Body):
    """Decoder-only LM: token + learned position embedding (up to `context`, default T), `depth` causal
    pre-norm layers of `dim` with `heads` heads and `dropout`, LayerNorm + Linear -> (B, T, vocab)."""

    def __init__(self, spec: DataSpec, *, dim: int = 128, depth: int = 4, heads: int = 4,
                 context: int | None = None, dropout: float = 0.0):
        super().__init__()
        self.context = context or spec.shape[0]
        self.tok_embed = nn.Embedding(spec.num_classes, dim)
        self.pos_embed = nn.Parameter(torch.randn(1, self.context, dim) * 0.02)
        self.blocks = nn.Sequential(*[CausalLayer(dim, heads, dropout) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.context:
            raise ModelError(f"GPTTiny: sequence length {t} exceeds its context {self.context}")
        return self.head(self.norm(self.body(self.tok_embed(x) + self.pos_embed[:, :t])))


# ---------------------------------------------------------------- registry entries
def _options(cls: type) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(cls).parameters if p != "spec")


def vgg11(spec: DataSpec, **kw) -> nn.Module:
    """CIFAR VGG-11-BN; images must be at least 32x32 (five 2x poolings)."""
    if min(spec.shape[1:]) < 32:
        raise ConfigError("model", "vgg11", f"vgg11 needs images of at least 32x32; dataset gives "
                                            f"{spec.shape[1]}x{spec.shape[2]}")
    return VGG11(spec, **kw)


def vit_tiny(spec: DataSpec, **kw) -> nn.Module:
    """ViT-Tiny; H and W must divide by the patch."""
    patch = kw.get("patch", 4)
    if spec.shape[1] % patch or spec.shape[2] % patch:
        raise ConfigError("model", "vit_tiny", f"vit_tiny needs image sides divisible by patch {patch}; "
                                               f"dataset gives {spec.shape[1]}x{spec.shape[2]}")
    return ViTTiny(spec, **kw)


# The built-in models, in listing order; their size options and defaults are the builders' keyword parameters.
ENTRIES = (
    ModelEntry(name="mlp", builder=MLP, inputs=("image", "seq1d", "tokens"),
               description="deep, wide MLP (applied per position on tokens)"),
    ModelEntry(name="cnn", builder=SmallCNN, inputs=("image", "seq1d"),
               description="small stride-2 CNN, Conv1d on sequences (MNIST-1D ConvBase), Conv2d on images"),
    ModelEntry(name="resnet18", builder=ResNet18, inputs=("image",),
               description="CIFAR-style ResNet-18 (3x3 stem, no maxpool)"),
    ModelEntry(name="vgg11", builder=vgg11, options=_options(VGG11), inputs=("image",),
               description="CIFAR-style VGG-11 with BatchNorm; images of at least 32x32"),
    ModelEntry(name="vit_tiny", builder=vit_tiny, options=_options(ViTTiny), inputs=("image",),
               description="ViT-Tiny (patch embedding, cls token); image sides divisible by the patch"),
    ModelEntry(name="gpt_tiny", builder=GPTTiny, inputs=("tokens",),
               description="tiny decoder-only GPT, next-token logits per position"),
)


def build_model(name: str, spec: DataSpec, **overrides) -> nn.Module:
    """Build a registered model by name (`registry.models`), or a user model from `module:function` /
    `path/file.py:function`.

    `overrides` are size options of the registered model (its entry's `options`).
    """
    if ":" in name:
        if overrides:
            raise ConfigError("model options", sorted(overrides), "user models take no options")
        from scalelab.zoo.user import build_user_model  # lazy: user.py imports nothing from here

        return build_user_model(name, spec)
    entry = models.get(name)
    if spec.kind not in entry.inputs:
        raise ConfigError("model", name, f"{name} needs {' or '.join(entry.inputs)} data; dataset gives {spec.kind}")
    unknown = sorted(set(overrides) - set(entry.options))
    if unknown:
        raise ConfigError("model options", unknown, f"{name} accepts: {', '.join(entry.options)}")
    return entry.builder(spec, **overrides)
