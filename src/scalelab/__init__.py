"""scalelab: measured PyTorch data-parallel training experiments."""

__version__ = "0.1.0"
