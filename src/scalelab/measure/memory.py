"""Peak memory of this process: CUDA max allocated, and the CPU's peak resident set size."""
from __future__ import annotations

import gc
import resource
import sys

import torch


def release_cuda_cache() -> None:
    """Give what this process's caching allocator holds back to the GPU once a run here has ended (its tensors
    collected first: a failed run's may sit in reference cycles), so that the next run in this process starts from
    an empty cache, as a fresh process would (its peak counters are reset by the run itself: `reset_peak`)."""
    gc.collect()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # private: absent, the workspaces stay cached
    if clear is not None:  # cuBLAS keeps its workspaces (32 MiB a handle and stream on Hopper) allocated: a fresh
        clear()  # process pays them inside its memory cap, so the next run here pays them inside its own
    torch.cuda.empty_cache()


def freeze_alive() -> None:
    """Collect, then put every object still alive out of the cyclic collector's reach (`gc.freeze`): called at the
    start of each run (a worker's `main`, cold or in a warm rank; the caller's process before a run in it), so that
    the run's full collections scan only the run's own objects, and once a rank process or the zygote has made its
    imports (and a warm rank torch's one-time allocations), so that its first run's call finds little to collect.

    Why: torch, scalelab and torch._dynamo's sympy leave some 300 k tracked objects after import, and each full
    collection scans them all (~150 ms on a 2-core machine): a warm rank paid that after every job, and any run
    paid it inside a timed step whenever the collector's thresholds came due (8 full collections, 1.2 s, in the
    quick study's own process). Frozen objects are still freed by their reference count; a reference cycle among
    them would stay until the process ends, which is why only what is alive is frozen, after a collection. In the
    zygote (run/warm_zygote.py) it also keeps the collector from writing to, and so copying, the pages its forked
    children share."""
    gc.collect()
    gc.freeze()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """Peak RSS of this run and CUDA max allocated. The RSS peak is the kernel's mark (VmHWM), which
    `training_baseline` resets when the run starts training: a run inside a process that ran others before (one
    rank in the caller's process) does not inherit their peaks, as the process-lifetime ru_maxrss would. Where the
    mark cannot be read, ru_maxrss (KiB on Linux, bytes on macOS)."""
    hwm = _status_kib("VmHWM")
    if hwm is not None:
        peak = float(hwm * 1024)
    else:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = float(maxrss if sys.platform == "darwin" else maxrss * 1024)
    out = {"peak_rss(bytes)": peak}
    if device.type == "cuda":
        out["cuda_max_allocated(bytes)"] = float(torch.cuda.max_memory_allocated(device))
        out["cuda_max_reserved(bytes)"] = float(torch.cuda.max_memory_reserved(device))
    return out


def _status_kib(field: str) -> int | None:
    """A `VmXxx:` field of /proc/self/status in KiB (None off Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def training_baseline() -> dict[str, int]:
    """Reset the kernel's peak-RSS mark and return the current footprint, so that what training adds on top of
    set-up (model, data) can be read later with `added_since`."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # 5 = reset the peak resident set size (VmHWM) to the current RSS
    except OSError:
        pass
    return {"rss": (_status_kib("VmRSS") or 0) * 1024, "vms": (_status_kib("VmSize") or 0) * 1024}


def added_since(baseline: dict[str, int], device: torch.device) -> float:
    """Peak memory added since `baseline`: CUDA max allocated on GPU, else peak RSS minus the baseline RSS."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    hwm = _status_kib("VmHWM")
    return float(max(0, hwm * 1024 - baseline["rss"])) if hwm is not None else float("nan")


def cap_address_space(baseline: dict[str, int], limit: int) -> None:
    """Let this process grow its address space by at most `limit` bytes beyond the baseline: an allocation past
    it fails with an out-of-memory error inside this process instead of the kernel killing something."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = baseline["vms"] + limit
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def cap_cuda_memory(device: torch.device, limit: int) -> float:
    """Let this process's CUDA caching allocator hold at most what it holds now plus `limit` bytes on `device`: an
    allocation past it raises torch's OutOfMemoryError, as the GPU's own limit would. Returns the fraction of the
    device's memory set (torch.cuda.set_per_process_memory_fraction, which counts reserved memory)."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(device) + limit) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction
