"""What a run's process leaves to the cyclic collector (measure/memory.py `freeze_alive`): garbage made before is
collected, what is alive is frozen, and a full collection afterwards scans only what came later. Each case runs in
its own interpreter, so that pytest's process is not frozen."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def _python(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=100)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_garbage_is_collected_and_what_is_alive_is_frozen():
    out = _python("""
        import gc, weakref
        from scalelab.measure.memory import freeze_alive

        class Node:
            pass

        dead, alive = Node(), Node()
        dead.me, alive.me = dead, alive  # two reference cycles: one dropped, one kept
        gone = weakref.ref(dead)
        del dead
        gc.disable()  # only freeze_alive's own collection may collect it
        freeze_alive()
        tracked = {id(o) for o in gc.get_objects()}
        print(gone() is None, id(alive) in tracked, gc.get_freeze_count() > 0)
        later = Node()
        later.me = later
        print(id(later) in {id(o) for o in gc.get_objects()})
    """).split()
    # the dropped cycle is gone, the kept one is frozen (not tracked by any generation), a later one is tracked
    assert out == ["True", "False", "True", "True"]


def test_a_rank_process_after_its_imports_leaves_a_full_collection_almost_nothing_to_scan():
    """Known truth: torch and scalelab's imports leave ~300 k tracked objects; after `import_for_jobs` (a warm
    rank's and the zygote's start) a full collection scans a handful."""
    out = _python("""
        import gc
        from scalelab.run import warm_rank

        warm_rank.import_for_jobs()
        print(gc.get_freeze_count(), len(gc.get_objects()))
    """).split()
    frozen, tracked = map(int, out)
    assert frozen > 100_000
    assert tracked < 1_000
