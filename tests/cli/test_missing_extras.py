"""An optional feature whose package is missing stops with one line naming what to install, exit 2, no traceback.

The packages are installed in the test environment, so each test hides one from a fresh interpreter with a
meta-path finder that refuses it (as a machine without it would); .ci/wheel-check does the same with a wheel
installed without extras.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES, cli_env

HIDE = textwrap.dedent("""
    import sys
    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {hidden!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}")
    sys.meta_path.insert(0, Hide())
""")


def run_hidden(hidden: set[str], code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE.format(hidden=hidden) + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=cli_env())


def assert_one_line(proc: subprocess.CompletedProcess, install: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert install in lines[0], lines[0]


@pytest.fixture
def stored_run(tmp_path):
    """A copy of the fixture store and the id of a run in it that has step records."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "store_v0", root)
    run = next(p.name for p in sorted((root / "runs").iterdir()) if (p / "steps.rank0.jsonl").is_file())
    return root, run


def test_tensorboard_export_without_tensorboard(stored_run, tmp_path):
    root, run = stored_run
    proc = run_hidden({"tensorboard"}, f"""
        from scalelab.cli import main
        main(["runs", "tensorboard", {run!r}, "--store", {str(root)!r}])
    """, tmp_path)
    assert_one_line(proc, "pip install 'scalelab[tensorboard]'")
    assert not (root / "runs" / run / "tensorboard").exists()


def test_tensorboard_export_writes_events(stored_run, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is optional: pip install 'scalelab[tensorboard]'")
    from scalelab.cli import main

    root, run = stored_run
    try:
        main(["runs", "tensorboard", run, "--store", str(root)])
    except SystemExit as e:
        assert e.code in (0, None)
    assert list((root / "runs" / run / "tensorboard").glob("events.out.tfevents.*"))


def test_lightning_callback_without_lightning(tmp_path):
    proc = run_hidden({"lightning"}, "from scalelab.lightning import ScalelabCallback", tmp_path)
    assert_one_line(proc, "pip install 'scalelab[lightning]'")


def test_horovod_engine_without_horovod(tmp_path):
    proc = run_hidden({"horovod"}, f"""
        from scalelab.cli import main
        main(["train", "--engine", "horovod", "--model", "mlp", "--steps", "4", "--store", {str(tmp_path / 's')!r}])
    """, tmp_path)
    assert_one_line(proc, "scalelab setup horovod")
