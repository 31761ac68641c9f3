"""`scalelab setup horovod`: build Horovod for the installed torch, keep the wheel, install it without touching torch.

Horovod 0.28.1 (its last release) compiles as C++14 and torch >= 2.1's headers need C++17 (Horovod issues #3996,
#4014; the fix, PR #3998, was never released). So the source distribution is fetched from the package index, both
`set(CMAKE_CXX_STANDARD 14)` lines (the top-level and the torch one; changing only the torch one fails to link)
become 17, and the wheel is built with gloo as controller and CPU ops, no MPI, TensorFlow or MXNet. The build
takes 5-8 minutes on 2 cores (448 s measured through this command), so the wheel is kept in a cache outside the
checkout, keyed by the Horovod, torch and Python versions; a later setup installs the kept wheel (13 s measured).
NCCL builds are out of scope.

    python -m scalelab setup horovod            # build or reuse, install, check hvd.gloo_built()
    python -m scalelab setup horovod --rebuild  # ignore the kept wheel

Every step writes its output to one log file; a failure is one line naming the step and that log (HorovodSetupError).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scalelab.errors import ScalelabError

VERSION = "0.28.1"
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
CXX14, CXX17 = "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"
BUILD_ENV = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
             "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "gloo"}
# what the wheel needs at run time besides torch (its setup.py's require_list); installed apart so that
# `--no-deps` keeps pip away from torch
RUNTIME_DEPS = ("cloudpickle", "psutil", "pyyaml", "packaging", "cffi")
CHECK = ("import horovod, horovod.torch as hvd; "
         "assert hvd.gloo_built(), 'Horovod was built without gloo'; print(horovod.__version__)")


class HorovodSetupError(ScalelabError):
    """A step of the Horovod setup failed; the message names the step and its log file."""

    def __init__(self, step: str, log: Path, detail: str = ""):
        self.step, self.log = step, log
        super().__init__(f"horovod setup failed at step '{step}'{': ' + detail if detail else ''} (log: {log})")


def torch_version() -> str:
    import torch

    return torch.__version__


def cache_root() -> Path:
    """~/.cache/scalelab (or $XDG_CACHE_HOME/scalelab): outside every checkout."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scalelab"


def wheel_dir(root: Path | None = None, *, torch: str | None = None) -> Path:
    """Where the wheel for this Horovod, torch and Python is kept."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (root or cache_root()) / "wheels" / f"horovod-{VERSION}-torch-{torch or torch_version()}-py{py}"


def cached_wheel(directory: Path) -> Path | None:
    wheels = sorted(directory.glob(f"horovod-{VERSION}-*.whl"))
    return wheels[-1] if wheels else None


def patch_cxx17(source: Path) -> None:
    """C++14 -> C++17 in both CMake files; ValueError when a file lacks the line (another Horovod source)."""
    for name in CMAKE_FILES:
        path = source / name
        text = path.read_text()
        if CXX14 not in text:
            raise ValueError(f"{name} has no '{CXX14}'")
        path.write_text(text.replace(CXX14, CXX17))


@dataclass(frozen=True)
class Steps:
    """The commands of the setup, each a function so a test replaces one (a broken download, a failed build)."""

    run: Callable[..., None]  # (argv, log, *, cwd=None, env=None): raises CalledProcessError on failure

    def pip(self, args: list[str], log: Path, **kw) -> None:
        self.run([sys.executable, "-m", "pip", *args], log, **kw)


def run_logged(argv: list[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Run `argv`, appending its output to `log`; CalledProcessError when it fails."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT,
                       check=True)


def installed_version(log: Path | None = None) -> str | None:
    """The Horovod version a fresh interpreter imports with gloo built in; None when it cannot (missing, broken,
    built without gloo). A subprocess: a broken build may crash the interpreter that loads it."""
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    if log is not None:
        with log.open("a") as out:
            out.write(f"\n$ python -c {CHECK!r}\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else None


def setup_horovod(*, rebuild: bool = False, root: Path | None = None, steps: Steps | None = None,
                  say: Callable[[str], None] = print, check: Callable[[Path], str | None] = installed_version) -> Path:
    """Build (or reuse the kept) Horovod wheel, install it with `--no-deps`, check it; returns the wheel's path."""
    steps = steps or Steps(run_logged)
    directory = wheel_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "setup.log"
    log.write_text(f"scalelab setup horovod {VERSION}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")

    def step(name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except subprocess.CalledProcessError as err:
            raise HorovodSetupError(name, log, f"exit code {err.returncode}") from None
        except (OSError, ValueError, tarfile.TarError) as err:
            raise HorovodSetupError(name, log, str(err).splitlines()[0] if str(err) else type(err).__name__) \
                from None

    wheel = None if rebuild else cached_wheel(directory)
    if wheel is not None:
        say(f"reusing {wheel}")
    else:
        began = time.monotonic()
        wheel = _build(directory, log, steps, step, say)
        say(f"built {wheel.name} in {time.monotonic() - began:.0f} s; kept in {directory}")
    step("install", lambda: steps.pip(["install", "-q", "--no-deps", "--force-reinstall", str(wheel)], log))
    step("install dependencies", lambda: steps.pip(["install", "-q", *RUNTIME_DEPS], log))
    version = check(log)
    if version is None:
        raise HorovodSetupError("check", log, "import horovod.torch with gloo built failed")
    say(f"horovod {version} installed (gloo), torch {torch_version()} untouched")
    return wheel


def _build(directory: Path, log: Path, steps: Steps, step, say) -> Path:
    """Download the sdist, patch it to C++17, build the wheel into `directory`."""
    if shutil.which("cmake") is None:
        say("installing cmake (pip)")
        step("cmake", lambda: steps.pip(["install", "-q", "cmake"], log))
    with tempfile.TemporaryDirectory(prefix="scalelab-horovod-") as tmp:
        work = Path(tmp)
        say(f"downloading horovod {VERSION} (source)")
        step("download", lambda: steps.pip(["download", f"horovod=={VERSION}", "--no-deps", "--no-binary", ":all:",
                                            "-d", str(work)], log))
        sdists = sorted(work.glob(f"horovod-{VERSION}.tar.gz"))
        source = work / f"horovod-{VERSION}"

        def unpack() -> None:
            if not sdists:
                raise ValueError(f"no horovod-{VERSION}.tar.gz was downloaded")
            with tarfile.open(sdists[0]) as tar:
                tar.extractall(work, filter="data")

        step("unpack", unpack)
        step("patch", lambda: patch_cxx17(source))
        say("building the wheel (about 5 minutes on 2 cores)")
        step("build", lambda: steps.pip(["wheel", "--no-deps", "--no-build-isolation", "-w", str(directory), "."],
                                        log, cwd=source, env=BUILD_ENV))
    wheel = cached_wheel(directory)
    if wheel is None:
        raise HorovodSetupError("build", log, "no wheel was written")
    return wheel
