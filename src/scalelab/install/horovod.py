"""`scalelab setup horovod`: build Horovod for the installed torch, keep the wheel, install it without touching torch.

Horovod 0.28.1 (its last release) compiles as C++14 and torch >= 2.1's headers need C++17 (Horovod issues #3996,
#4014; the fix, PR #3998, was never released). So the source distribution is fetched from the package index, both
`set(CMAKE_CXX_STANDARD 14)` lines (the top-level and the torch one; changing only the torch one fails to link)
become 17, and the wheel is built with gloo as controller and CPU ops, no MPI, TensorFlow or MXNet. The build
takes 5-8 minutes on 2 cores (448 s measured through this command), so the wheel is kept in a cache outside the
checkout, keyed by the Horovod, torch and Python versions; a later setup installs the kept wheel (13 s measured).
NCCL builds are out of scope.

CMake: Horovod asks for 3.13 or newer, and its bundled gloo declares `cmake_minimum_required(VERSION 2.8.12)`, which
CMake 4 refuses ("Compatibility with CMake < 3.5 has been removed"). The build's environment sets
CMAKE_POLICY_VERSION_MINIMUM=3.5 (CMake >= 3.31 reads it, older ones ignore it), so CMake 3.13 to 4.x all build. With
no CMake, or one older than 3.13, the newest is installed with pip into this environment. The set-up's first line and
its log say which CMake it uses and from where. A failed build's one line names its cause when the log shows a
known one (`diagnose`).

    python -m scalelab setup horovod            # build or reuse, install, check hvd.gloo_built()
    python -m scalelab setup horovod --rebuild  # ignore the kept wheel

Every step writes its output to one log file; a failure is one line naming the step and that log (HorovodSetupError).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
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
             "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "gloo",
             # CMake 4 refuses gloo's `cmake_minimum_required(VERSION 2.8.12)` without this floor
             "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
# known causes of a failed build, read from its log: (pattern, the cause and what to do); the first match is named
KNOWN_CAUSES = (
    (r"Compatibility with CMake < 3\.5 has been removed",
     "CMake is too new for Horovod's bundled gloo: set CMAKE_POLICY_VERSION_MINIMUM=3.5 (scalelab sets it unless "
     "the environment overrides it) or use CMake 3.13-3.31"),
    (r"CMake 3\.\d+ or higher is required|cmake_minimum_required.*\n.*You are running version",
     "CMake is too old: Horovod needs 3.13 or newer (`pip install cmake`, then run this again)"),
    (r"No CMAKE_CXX?_COMPILER could be found|CMAKE_CXX?_COMPILER not set|unable to execute '(gcc|g\+\+|c\+\+)'"
     r"|command '(gcc|g\+\+|c\+\+)' failed|is not a full path and was not found in the PATH",
     "no C/C++ compiler was found: install one (e.g. `apt-get install g++`), then run this again"),
    (r"No module named '?torch'?|Could NOT find Pytorch",
     "the build's Python cannot import torch: install torch in this environment first "
     "(`pip install torch==2.13.0`), then run this again"),
)
CMAKE_FLOOR = (3, 13)  # Horovod's CMakeLists.txt: cmake_minimum_required(VERSION 3.13)
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


def diagnose(log_text: str) -> str | None:
    """The known cause of a failed build, from its log, with what to do; None when none matches."""
    for pattern, cause in KNOWN_CAUSES:
        if re.search(pattern, log_text):
            return cause
    return None


def cmake_found() -> tuple[str, tuple[int, ...], str] | None:
    """(path, version, origin) of the `cmake` on PATH; None when there is none or it does not run."""
    path = shutil.which("cmake", path=_search_path())
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"version\s+(\d+(?:\.\d+)*)", out)
    if match is None:
        return None
    inside = Path(path).resolve().is_relative_to(Path(sys.prefix).resolve())
    origin = "pip, in this environment" if inside else "this machine's PATH"
    return path, tuple(int(part) for part in match.group(1).split(".")), origin


def setup_horovod(*, rebuild: bool = False, root: Path | None = None, steps: Steps | None = None,
                  say: Callable[[str], None] = print, check: Callable[[Path], str | None] = installed_version) -> Path:
    """Build (or reuse the kept) Horovod wheel, install it with `--no-deps`, check it; returns the wheel's path."""
    steps = steps or Steps(run_logged)
    directory = wheel_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "setup.log"
    log.write_text(f"scalelab setup horovod {VERSION}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")

    def step(name: str, action: Callable[[], None]) -> None:
        before = log.stat().st_size
        try:
            action()
        except subprocess.CalledProcessError as err:
            with log.open() as text:  # what this step wrote: its known cause, if any, is the one line's detail
                text.seek(before)
                cause = diagnose(text.read())
            raise HorovodSetupError(name, log, cause or f"exit code {err.returncode}") from None
        except (OSError, ValueError, tarfile.TarError) as err:
            raise HorovodSetupError(name, log, str(err).splitlines()[0] if str(err) else type(err).__name__) \
                from None

    wheel = None if rebuild else cached_wheel(directory)
    if wheel is not None:
        say(f"reusing the kept wheel {wheel} (no build; --rebuild builds it again)")
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
    found = cmake_found()
    if found is None or found[1] < CMAKE_FLOOR:
        why = "none on PATH" if found is None else f"{_dotted(found[1])} at {found[0]} is older than " \
                                                   f"{_dotted(CMAKE_FLOOR)}"
        say(f"installing cmake with pip ({why})")
        step("cmake", lambda: steps.pip(["install", "-q", "cmake"], log))
        found = cmake_found()
    if found is None:
        raise HorovodSetupError("cmake", log, "no cmake runs after `pip install cmake`: install CMake 3.13 or newer")
    used = f"using CMake {_dotted(found[1])} ({found[0]}, from {found[2]}); " \
           f"CMAKE_POLICY_VERSION_MINIMUM={_build_env()['CMAKE_POLICY_VERSION_MINIMUM']}"
    say(used)
    with log.open("a") as out:
        out.write(f"\n{used}\n")
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
                                        log, cwd=source, env=_build_env()))
    wheel = cached_wheel(directory)
    if wheel is None:
        raise HorovodSetupError("build", log, "no wheel was written")
    return wheel


def _search_path() -> str:
    """PATH with this interpreter's scripts folder first: a cmake pip put there is found (and used by Horovod's
    setup.py) also when the environment was not activated."""
    return os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", os.defpath)])


def _build_env() -> dict[str, str]:
    """BUILD_ENV with the search path above, and the user's own CMAKE_POLICY_VERSION_MINIMUM kept when set."""
    floor = os.environ.get("CMAKE_POLICY_VERSION_MINIMUM") or BUILD_ENV["CMAKE_POLICY_VERSION_MINIMUM"]
    return {**BUILD_ENV, "CMAKE_POLICY_VERSION_MINIMUM": floor, "PATH": _search_path()}


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)
