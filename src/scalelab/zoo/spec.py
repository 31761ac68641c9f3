"""What a dataset tells a model about its inputs, so models can be built for any built-in dataset."""
from dataclasses import dataclass
from typing import Literal

InputKind = Literal["image", "seq1d", "tokens"]


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Shape of one input sample and the number of classes.

    kind: "image" -> shape (C, H, W); "seq1d" -> shape (C, L) (e.g. MNIST-1D is (1, 40));
    "tokens" -> shape (T,) of int64 token ids, targets are (T,) next tokens and num_classes is the vocabulary.
    """

    kind: InputKind
    shape: tuple[int, ...]
    num_classes: int
