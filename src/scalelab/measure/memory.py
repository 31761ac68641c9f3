"""Peak memory of this process: CUDA max allocated, and the CPU's peak resident set size."""
from __future__ import annotations

import resource
import sys

import torch


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak RSS over the process lifetime (ru_maxrss: KiB on Linux, bytes on macOS) and CUDA max allocated."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss(bytes)": float(maxrss if sys.platform == "darwin" else maxrss * 1024)}
    if device.type == "cuda":
        out["cuda_max_allocated(bytes)"] = float(torch.cuda.max_memory_allocated(device))
        out["cuda_max_reserved(bytes)"] = float(torch.cuda.max_memory_reserved(device))
    return out
