"""tests/alone.py under two xdist workers (known truth: the interval each test writes down, and its worker): a test
in ALONE runs with no other test beside it, its module fixture included; the `alone` tests of every module
run in one worker, one after the other, first; the other tests do run side by side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = """
import json, os, time
from pathlib import Path

import alone

alone.ALONE.update({"test_c": "a module", "test_a::test_alone_too": "a test", "test_b::test_alone_too": "a test"})
pytest_plugins = ["alone"]


def span(name, seconds):
    Path(os.environ["SPANS"] + ".began").touch()
    began = time.time()
    time.sleep(seconds)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"], began, time.time()]) + "\\n")
"""

SHARED = """
import pytest
from conftest import span


@pytest.mark.parametrize("i", range(6))
def test_shared(i):
    span("{name}", 0.3)


def test_alone_too():
    span("alone {name}", 0.3)
"""

ALONE = """
import os
import time
from pathlib import Path

import pytest
from conftest import span


@pytest.fixture(scope="module")
def measured():
    # give the other worker up to 5 s to start a test beside this one: it can only while nothing holds it back
    began = Path(os.environ["SPANS"] + ".began")
    deadline = time.time() + 5
    while not began.exists() and time.time() < deadline:
        time.sleep(0.02)
    span("alone fixture", 0.3)


@pytest.mark.parametrize("i", range(2))
def test_alone(measured, i):
    span("alone", 0.3)
"""


@pytest.mark.timeout(120)
def test_alone_tests_run_first_in_one_worker_with_nothing_beside_them_and_the_others_share(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (suite / "test_a.py").write_text(SHARED.format(name="a"))
    (suite / "test_b.py").write_text(SHARED.format(name="b"))
    (suite / "test_c.py").write_text(ALONE)
    spans = tmp_path / "spans.jsonl"
    args = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder", "-o",
            "markers=alone: alone", "-o", "addopts=", "--basetemp", str(tmp_path / "basetemp"), str(suite)]
    env = {**os.environ, "SPANS": str(spans), "PYTHONPATH": str(TESTS), "PYTEST_ADDOPTS": ""}
    res = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=tmp_path, capture_output=True, text=True,
                         check=False, timeout=100, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = sorted((json.loads(line) for line in spans.read_text().splitlines()), key=lambda s: s[2])
    alone = [s for s in got if s[0].startswith("alone")]
    others = [s for s in got if not s[0].startswith("alone")]
    assert len(alone) == 5 and len(others) == 12, got
    assert len({worker for _, worker, _, _ in alone}) == 1, alone
    first, last = alone[0][2], alone[-1][3]
    beside = [o for o in others if o[2] < last and first < o[3]]  # began before the last ended, ended after
    assert not beside, (alone, beside)  # one stretch, nothing beside it (a test that ran before it ended first)
    assert not [o for o in others if o[2] < first and o[0] == alone[0][1]], got  # nothing before it in its worker
    a, b = [s for s in others if s[0] == "a"], [s for s in others if s[0] == "b"]
    assert any(x[2] < y[3] and y[2] < x[3] for x in a for y in b), got  # the shared ones did run side by side


def test_every_alone_entry_names_a_test_that_exists():
    import alone

    modules = {p.stem: p for p in TESTS.rglob("test_*.py")}
    for key in alone.ALONE:
        module, _, name = key.partition("::")
        assert module in modules, key
        assert not name or f"def {name}(" in modules[module].read_text(), key
