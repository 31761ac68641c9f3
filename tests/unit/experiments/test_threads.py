"""The threads experiment: the cells it plans, its table on runs with known step times, and one real tiny sweep."""
from __future__ import annotations

import os

import pandas as pd
import pytest

from conftest import quiet_cells
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.lab import registry
from scalelab.lab.base import Context
from scalelab.analysis.keys import THREADS_USED as USED
from scalelab.experiments.threads import default_threads, thread_cells, threads_table


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", dataset="synthetic", samples=64, eval_samples=16, global_batch=16, steps=3,
                warmup_steps=1)
    return TrainConfig(**{**base, **kw})


def test_cells_on_a_two_core_machine_are_1_2_4_threads_each_in_its_own_processes():
    assert default_threads(2) == [1, 2, 4]
    assert default_threads(3) == [1, 2, 3, 4, 6]
    cells = thread_cells(tiny(), default_threads(2))
    assert [c.config.threads for c in cells] == [1, 2, 4]
    assert [c.label for c in cells] == ["1 threads", "2 threads", "4 threads"]
    assert all(c.isolate and c.kind == "train" and c.config.global_batch == 16 for c in cells)
    assert len({c.key for c in cells}) == 3


def test_more_than_one_rank_or_no_threads_is_refused():
    with pytest.raises(ConfigError) as err:
        thread_cells(tiny(ranks=2), [1, 2])
    assert err.value.field == "ranks"
    with pytest.raises(ConfigError) as err:
        thread_cells(tiny(), [0, 2])
    assert err.value.field == "threads"
    with pytest.raises(ConfigError):
        registry.get("threads").option_values({"threads": "1,x"})


def _run(threads: int, step_ms: float) -> dict:
    return {"run_id": f"r{threads}", "config": {"threads": threads},
            "summary": {"time/step_median(ms)": step_ms, "time/step_min(ms)": step_ms - 1,
                        "time/step_max(ms)": step_ms + 1, "time/epoch(s)": step_ms / 100, USED: threads}}


def test_threads_table_on_known_step_times():
    runs = [_run(4, 40.0), _run(1, 100.0), _run(2, 50.0), _run(3, 80.0)]  # any order: sorted by threads
    t = threads_table(runs, cores=2)
    assert list(t["threads"]) == [1, 2, 3, 4]
    assert list(t["speedup"]) == [1.0, 2.0, 1.25, 2.5]  # 100 / step
    assert list(t["oversubscribed"]) == [False, False, True, True]  # threads > 2 cores
    assert (t["cores"] == 2).all()
    assert list(t[USED]) == [1, 2, 3, 4]
    t4 = threads_table(runs, cores=4)
    assert list(t4["oversubscribed"]) == [False, False, False, False]
    assert len(threads_table([], cores=2)) == 0


@pytest.mark.timeout(300)
def test_real_sweep_writes_its_table_and_figure(store, tmp_path):
    exp = registry.get("threads")
    out = tmp_path / "out"
    ctx = Context(quiet_cells(store, "st"), out, lambda line: None)
    res = exp.execute(ctx, tiny(), exp.option_values({"threads": [1, 2], "launches": 1}))
    t = res.tables["threads"]
    assert list(t["threads"]) == [1, 2]
    # each row is the stored run of that thread count, and the rank really ran with that many torch threads
    assert [store.get(i)["config"]["threads"] for i in t["run_id"]] == [1, 2]
    assert list(t[USED]) == [1, 2]
    assert t.at[0, "speedup"] == 1.0
    assert t.at[1, "speedup"] == t.at[0, "time/step_median(ms)"] / t.at[1, "time/step_median(ms)"]
    assert list(t["oversubscribed"]) == [1 > (os.cpu_count() or 1), 2 > (os.cpu_count() or 1)]
    assert len(store.list_runs(study="st/threads", status="completed")) == 2
    assert (out / "threads.csv").is_file() and (out / "threads.png").is_file()
    assert {p.name for p in res.files} >= {"threads.csv", "threads.json", "threads.png"}
    assert list(pd.read_csv(out / "threads.csv")["threads"]) == [1, 2]
