"""The test summary's Horovod lines (tests/conftest.py): a run where Horovod went untested says so where it ends."""
from __future__ import annotations

from types import SimpleNamespace

from conftest import horovod_skips


def skipped(reason: str) -> SimpleNamespace:
    return SimpleNamespace(longrepr=("tests/dist/test_x.py", 1, reason))


def test_horovod_skips_are_counted_with_their_reason():
    reports = [skipped("Skipped: horovod is not installed (run `scalelab setup horovod`)")] * 15
    reports += [skipped("Skipped: no CUDA device"), SimpleNamespace(longrepr="a string, not a skip tuple")]
    lines = horovod_skips(reports, None)
    assert lines == ["horovod: 15 test(s) skipped (horovod is not installed (run `scalelab setup horovod`))"]


def test_a_failed_setup_is_named_first():
    failure = "error: horovod setup failed at step 'build': CMake is too new ... (log: /x/setup.log)"
    lines = horovod_skips([skipped("Skipped: horovod is not installed")] * 3, failure)
    assert lines[0] == f"HOROVOD UNTESTED: the set-up failed: {failure}"
    assert lines[1].startswith("horovod: 3 test(s) skipped")


def test_nothing_is_said_when_horovod_ran():
    assert horovod_skips([skipped("Skipped: no CUDA device")], None) == []
