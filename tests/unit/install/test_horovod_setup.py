"""`scalelab setup horovod` without building anything: each step's command is replaced (a broken download, a
failed check, a kept wheel), and what a user sees is checked: one line naming the step and the log, exit code 2."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest
from pathlib import Path

from scalelab.cli.main import main
from scalelab.install import horovod as setup
from scalelab.install.horovod import HorovodSetupError, Steps, cached_wheel, patch_cxx17, setup_horovod, wheel_dir


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class Recorder:
    """Stands in for `run_logged`: records every command, fails the one whose argv contains `fail_on`."""

    def __init__(self, fail_on: str | None = None, sdist: bool = True, writes: str = ""):
        self.calls: list[list[str]] = []
        self.envs: list[dict | None] = []
        self.fail_on, self.sdist, self.writes = fail_on, sdist, writes

    def __call__(self, argv, log, *, cwd=None, env=None):
        self.calls.append(list(argv))
        self.envs.append(env)
        if self.fail_on and self.fail_on in argv:
            with log.open("a") as out:  # what the failing command printed
                out.write(self.writes)
            raise subprocess.CalledProcessError(1, argv)
        if "download" in argv and self.sdist:  # a real sdist with the two CMake files the patch needs
            _write_sdist(Path(argv[argv.index("-d") + 1]))
        if "wheel" in argv:  # a build writes its wheel where -w says
            out = argv[argv.index("-w") + 1]
            (Path(out) / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")


def _write_sdist(folder: Path) -> None:
    import io
    import tarfile

    with tarfile.open(folder / "horovod-0.28.1.tar.gz", "w:gz") as tar:
        for name in setup.CMAKE_FILES:
            data = b"project(x)\nset(CMAKE_CXX_STANDARD 14)\n"
            info = tarfile.TarInfo(f"horovod-0.28.1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def cmake_4(monkeypatch):
    """A CMake 4 on PATH, as `pip install cmake` gives today."""
    monkeypatch.setattr(setup, "cmake_found", lambda: ("/venv/bin/cmake", (4, 4, 5), "pip, in this environment"))


def test_the_wheel_cache_is_keyed_by_horovod_torch_and_python(tmp_path):
    path = wheel_dir(tmp_path, torch="2.13.0+cpu")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert path == tmp_path / "wheels" / f"horovod-0.28.1-torch-2.13.0+cpu-py{py}"


def test_a_kept_wheel_is_installed_without_deps_and_nothing_is_built():
    directory = wheel_dir()
    directory.mkdir(parents=True)
    wheel = directory / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.write_text("")
    rec = Recorder()
    out = setup_horovod(steps=Steps(rec), say=lambda s: None, check=lambda log: "0.28.1")
    assert out == wheel
    assert not any("download" in c or "wheel" in c for c in rec.calls), rec.calls
    install = next(c for c in rec.calls if "install" in c and str(wheel) in c)
    assert "--no-deps" in install
    named = [arg for c in rec.calls for arg in c if arg.split("=")[0].split(">")[0] == "torch"]
    assert named == [], rec.calls  # torch is never named to pip


def test_a_broken_download_is_one_line_naming_the_step_and_the_log():
    with pytest.raises(HorovodSetupError) as err:
        setup_horovod(steps=Steps(Recorder(fail_on="download")), say=lambda s: None, check=lambda log: "0.28.1")
    message = str(err.value)
    assert "\n" not in message
    assert "step 'download'" in message and str(wheel_dir() / "setup.log") in message
    assert cached_wheel(wheel_dir()) is None


def test_a_download_without_an_sdist_fails_at_unpack(cmake_4):
    with pytest.raises(HorovodSetupError, match="step 'unpack'"):
        setup_horovod(steps=Steps(Recorder(sdist=False)), say=lambda s: None, check=lambda log: "0.28.1")


def test_the_build_runs_with_the_cmake_policy_floor_and_says_which_cmake(cmake_4, monkeypatch):
    monkeypatch.delenv("CMAKE_POLICY_VERSION_MINIMUM", raising=False)
    rec, said = Recorder(), []
    setup_horovod(steps=Steps(rec), say=said.append, check=lambda log: "0.28.1")
    build = next(i for i, c in enumerate(rec.calls) if "wheel" in c)
    env = rec.envs[build]
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5" and env["HOROVOD_WITH_GLOO"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == sysconfig.get_path("scripts")  # a pip cmake is found unactivated
    used = next(line for line in said if line.startswith("using CMake"))
    assert "4.4.5" in used and "/venv/bin/cmake" in used and "pip, in this environment" in used
    assert said.index(used) < next(i for i, line in enumerate(said) if "building" in line)
    assert used in (wheel_dir() / "setup.log").read_text()


def test_a_users_own_policy_floor_is_kept(cmake_4, monkeypatch):
    monkeypatch.setenv("CMAKE_POLICY_VERSION_MINIMUM", "3.10")
    rec = Recorder()
    setup_horovod(steps=Steps(rec), say=lambda s: None, check=lambda log: "0.28.1")
    assert next(e for c, e in zip(rec.calls, rec.envs) if "wheel" in c)["CMAKE_POLICY_VERSION_MINIMUM"] == "3.10"


CANNED = {  # the lines each cause leaves in a real build log
    "too new": ("CMake Error at third_party/gloo/CMakeLists.txt:1 (cmake_minimum_required):\n  Compatibility with "
                "CMake < 3.5 has been removed from CMake.\n", "CMake is too new"),
    "too old": ("CMake Error at CMakeLists.txt:1 (cmake_minimum_required):\n  CMake 3.13 or higher is required.  "
                "You are running version 3.10.2\n", "CMake is too old"),
    "no compiler": ("CMake Error at CMakeLists.txt:2 (project):\n  No CMAKE_CXX_COMPILER could be found.\n",
                    "no C/C++ compiler"),
    "no compiler (setuptools)": ("error: command 'gcc' failed: No such file or directory\n", "no C/C++ compiler"),
    "no torch": ("-- Could NOT find Pytorch (missing: Pytorch_VERSION) (Required is at least version \"1.5.0\")\n"
                 "ModuleNotFoundError: No module named 'torch'\n", "cannot import torch"),
}


@pytest.mark.parametrize("case", sorted(CANNED))
def test_a_failed_build_names_its_known_cause_and_what_to_do(cmake_4, case):
    text, cause = CANNED[case]
    rec = Recorder(fail_on="wheel", writes="[ 10%] Building CXX object ...\n" + text + "error: subprocess failed\n")
    with pytest.raises(HorovodSetupError) as err:
        setup_horovod(steps=Steps(rec), say=lambda s: None, check=lambda log: "0.28.1")
    message = str(err.value)
    assert "\n" not in message and "step 'build'" in message and cause in message, message
    assert "setup.log" in message
    assert any(hint in message for hint in ("pip install", "apt-get install", "CMAKE_POLICY_VERSION_MINIMUM")), message


def test_an_unknown_build_failure_says_its_exit_code(cmake_4):
    rec = Recorder(fail_on="wheel", writes="something else went wrong\n")
    with pytest.raises(HorovodSetupError, match=r"step 'build': exit code 1 \(log: "):
        setup_horovod(steps=Steps(rec), say=lambda s: None, check=lambda log: "0.28.1")


def test_an_earlier_steps_output_is_not_read_as_the_builds_cause(cmake_4):
    """Only what the failing step wrote is diagnosed: a log that mentions torch earlier names no cause."""
    log = wheel_dir() / "setup.log"
    rec = Recorder(fail_on="wheel", writes="plain failure\n")
    real = rec.__call__

    def noisy(argv, log_, **kw):
        if "download" in argv:
            with log_.open("a") as out:
                out.write("No module named 'torch' (an earlier, harmless line)\n")
        return real(argv, log_, **kw)

    with pytest.raises(HorovodSetupError, match="exit code 1"):
        setup_horovod(steps=Steps(noisy), say=lambda s: None, check=lambda log: "0.28.1")
    assert "earlier, harmless" in log.read_text()


def test_an_install_that_does_not_import_fails_at_the_check():
    directory = wheel_dir()
    directory.mkdir(parents=True)
    (directory / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")
    with pytest.raises(HorovodSetupError, match="step 'check'"):
        setup_horovod(steps=Steps(Recorder()), say=lambda s: None, check=lambda log: None)


def test_the_cli_prints_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(setup, "run_logged", Recorder(fail_on="download"))
    monkeypatch.setattr(setup, "cmake_found", lambda: ("/usr/bin/cmake", (3, 25, 1), "this machine's PATH"))
    with pytest.raises(SystemExit) as exit_:
        main(["setup", "horovod", "--rebuild"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step 'download'" in err and "setup.log" in err, err


@pytest.mark.parametrize("before", [None, ("/usr/bin/cmake", (3, 10, 2), "this machine's PATH")])
def test_cmake_is_installed_from_pip_when_missing_or_too_old(monkeypatch, before):
    found = iter([before, ("/venv/bin/cmake", (4, 4, 5), "pip, in this environment")])
    monkeypatch.setattr(setup, "cmake_found", lambda: next(found))
    rec, said = Recorder(fail_on="download"), []
    with pytest.raises(HorovodSetupError):
        setup_horovod(steps=Steps(rec), say=said.append, check=lambda log: "0.28.1")
    assert rec.calls[0][-1] == "cmake" and "install" in rec.calls[0]
    assert any(line.startswith("using CMake 4.4.5") for line in said), said


def test_no_cmake_after_installing_it_is_one_line(monkeypatch):
    monkeypatch.setattr(setup, "cmake_found", lambda: None)
    with pytest.raises(HorovodSetupError, match="step 'cmake': no cmake runs"):
        setup_horovod(steps=Steps(Recorder()), say=lambda s: None, check=lambda log: "0.28.1")


def test_cmake_found_reads_the_version_and_origin(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "cmake"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'cmake version 4.4.5'\necho\necho 'CMake suite maintained by Kitware'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setattr(setup.sysconfig, "get_path", lambda name: str(tmp_path / "nothing"))
    assert setup.cmake_found() == (str(fake), (4, 4, 5), "this machine's PATH")


def test_patch_makes_both_cmake_files_cxx17(tmp_path):
    (tmp_path / "horovod" / "torch").mkdir(parents=True)
    for name in setup.CMAKE_FILES:
        (tmp_path / name).write_text("project(x)\nset(CMAKE_CXX_STANDARD 14)\n")
    patch_cxx17(tmp_path)
    for name in setup.CMAKE_FILES:
        assert "set(CMAKE_CXX_STANDARD 17)" in (tmp_path / name).read_text()
        assert "STANDARD 14" not in (tmp_path / name).read_text()


def test_patch_refuses_a_source_without_the_line(tmp_path):
    (tmp_path / "horovod" / "torch").mkdir(parents=True)
    for name in setup.CMAKE_FILES:
        (tmp_path / name).write_text("project(x)\n")
    with pytest.raises(ValueError, match="CMakeLists.txt"):
        patch_cxx17(tmp_path)
