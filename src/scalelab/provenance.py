"""What is needed to reproduce a run: code versions, library versions, machine, command line, seed."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

_GIT_TIMEOUT_S = 5.0


def _git(cwd: Path, *args: str) -> str | None:
    """stdout of a git command, or None when git is missing, times out or fails (e.g. not a repo)."""
    try:
        res = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                             timeout=_GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def git_state(path: Path) -> tuple[str | None, bool | None]:
    """(HEAD sha, dirty) of the repository containing ``path``; (None, None) outside a repository."""
    if _git(path, "rev-parse", "--show-toplevel") is None:
        return None, None
    sha = _git(path, "rev-parse", "HEAD")  # None in a repository without commits
    # Untracked files are ignored on purpose: run stores and outputs often live inside the repo
    # and would otherwise mark every run after the first as dirty.
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return (sha.strip() or None) if sha else None, (bool(status.strip()) if status is not None else None)


def _package_git_state() -> tuple[str | None, bool | None]:
    """git state of scalelab's own source, only when the package is a tracked file of a checkout."""
    pkg_dir = Path(__file__).resolve().parent
    # Guards against site-packages that merely sit inside some unrelated repository.
    if _git(pkg_dir, "ls-files", "--error-unmatch", "__init__.py") is None:
        return None, None
    return git_state(pkg_dir)


def _version(dist: str, module: str | None = None) -> str | None:
    mod = sys.modules.get(module or dist)
    if mod is not None and getattr(mod, "__version__", None):
        return str(mod.__version__)
    # importlib.metadata avoids importing torch just to learn its version.
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(dist)
    except PackageNotFoundError:
        pass
    except Exception:
        return None
    try:
        import importlib
        return str(getattr(importlib.import_module(module or dist), "__version__", None) or "") or None
    except Exception:
        return None


def _cuda_devices() -> list[str]:
    """The GPUs' names, without initialising CUDA in this process when it is not yet: a probed script's own
    process records the run before the script has chosen its device (torch.cuda.get_device_name would make a
    context on GPU 0 and turn the script's CPU steps into CUDA-event-timed ones). NVML names them then; without
    NVML, the count alone."""
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        count = torch.cuda.device_count()  # NVML or the runtime's count: no context
        if torch.cuda.is_initialized():
            return [torch.cuda.get_device_name(i) for i in range(count)]
        try:
            import pynvml  # optional: nvidia-ml-py

            pynvml.nvmlInit()
            return [str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)]
        except Exception:
            return ["CUDA device (name not read: CUDA not initialised, no NVML)"] * count
    except Exception:  # torch missing or a broken driver: provenance must never fail a run
        return []


def _memory_total() -> int | None:
    try:
        import psutil
        return int(psutil.virtual_memory().total)
    except Exception:
        return None


def collect_provenance(argv: list[str] | None = None, *, seed: int | None = None) -> dict:
    """A JSON-serialisable dict describing code, environment and invocation of this process."""
    cwd = Path.cwd()
    sha, dirty = git_state(cwd)
    pkg_sha, pkg_dirty = _package_git_state()
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv if argv is None else argv),
        "seed": seed,
        "cwd": str(cwd),
        "git_sha": sha,
        "git_dirty": dirty,
        "scalelab_git_sha": pkg_sha,
        "scalelab_git_dirty": pkg_dirty,
        "versions": {
            "python": platform.python_version(),
            "torch": _version("torch"),
            "numpy": _version("numpy"),
            "scalelab": _version("scalelab"),
        },
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": _memory_total(),
        "cuda_devices": _cuda_devices(),
    }
