"""`scalelab setup horovod` without building anything: each step's command is replaced (a broken download, a
failed check, a kept wheel), and what a user sees is checked: one line naming the step and the log, exit code 2."""
from __future__ import annotations

import subprocess
import sys

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

    def __init__(self, fail_on: str | None = None, sdist: bool = True):
        self.calls: list[list[str]] = []
        self.fail_on, self.sdist = fail_on, sdist

    def __call__(self, argv, log, *, cwd=None, env=None):
        self.calls.append(list(argv))
        if self.fail_on and self.fail_on in argv:
            raise subprocess.CalledProcessError(1, argv)
        if "wheel" in argv:  # a build writes its wheel where -w says
            out = argv[argv.index("-w") + 1]
            (Path(out) / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")


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


def test_a_failed_build_names_the_build_step(monkeypatch):
    # the download "succeeds" but leaves no sdist: unpack is the step that fails
    with pytest.raises(HorovodSetupError, match="step 'unpack'"):
        setup_horovod(steps=Steps(Recorder()), say=lambda s: None, check=lambda log: "0.28.1")


def test_an_install_that_does_not_import_fails_at_the_check():
    directory = wheel_dir()
    directory.mkdir(parents=True)
    (directory / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_text("")
    with pytest.raises(HorovodSetupError, match="step 'check'"):
        setup_horovod(steps=Steps(Recorder()), say=lambda s: None, check=lambda log: None)


def test_the_cli_prints_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(setup, "run_logged", Recorder(fail_on="download"))
    monkeypatch.setattr(setup.shutil, "which", lambda name: "/usr/bin/cmake")
    with pytest.raises(SystemExit) as exit_:
        main(["setup", "horovod", "--rebuild"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step 'download'" in err and "setup.log" in err, err


def test_cmake_is_installed_from_pip_when_missing(monkeypatch):
    monkeypatch.setattr(setup.shutil, "which", lambda name: None)
    rec = Recorder(fail_on="download")
    with pytest.raises(HorovodSetupError):
        setup_horovod(steps=Steps(rec), say=lambda s: None, check=lambda log: "0.28.1")
    assert rec.calls[0][-1] == "cmake" and "install" in rec.calls[0]


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
