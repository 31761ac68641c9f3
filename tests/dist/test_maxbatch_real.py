"""Max-batch search on real trial processes: a test model with a known memory per sample, under a set cap."""
from __future__ import annotations

import math

import psutil
import pytest

from conftest import PER_SAMPLE, faulty_model, hungry_model as model_file, quiet_cells
from scalelab.config import TrainConfig
from scalelab.experiments.max_batch import max_batch
from scalelab.run import warm
from scalelab.run.execute import RunFailed

pytestmark = pytest.mark.timeout(240)


def search(cfg: TrainConfig, cells, memory_limit: int):
    """max_batch's search, its trials forked from one zygote: each trial is a Cells.run, which opens a
    `warm.ranks()` block of its own unless one is open, so without this block each trial started a zygote (~2 s of
    imports) and a fork pool for its one forked child. Each trial still runs in a process of its own, and the
    block's processes end with the search."""
    with warm.ranks():
        return max_batch(cfg, cells, "trials", memory_limit=memory_limit, say=lambda s: None)


def test_finds_the_exact_limit_within_log2_plus_3_trials(store, tmp_path):
    limit = 12
    cap = int((limit + 0.5) * PER_SAMPLE)
    cfg = TrainConfig(model=model_file(tmp_path), samples=64, eval_samples=8)
    res = search(cfg, quiet_cells(store, "mb"), cap)
    assert res.max_batch == limit
    assert res.n_trials <= math.ceil(math.log2(limit)) + 3
    failed = [t for t in res.trials if not t.fits]
    assert failed and all("memory" in t.reason for t in failed)
    again = search(cfg, quiet_cells(store, "mb"), cap)  # resumed from stored trials
    assert again.max_batch == limit and len(store.list_runs(study="mb/trials")) == res.n_trials


def test_a_trial_killed_by_the_kernel_counts_as_not_fitting(store, tmp_path):
    cfg = TrainConfig(model=model_file(tmp_path, kill_above=5), samples=64, eval_samples=8)
    res = search(cfg, quiet_cells(store, "kill"), 64 * PER_SAMPLE)
    assert res.max_batch == 5
    assert any("SIGKILL" in (t.reason or "") for t in res.trials)


def test_a_failure_that_is_not_memory_stops_the_search_and_says_why(store, tmp_path):
    """Batch 3 and below fit under a cap of 64 samples; above 3 the model raises a ValueError, which is not memory:
    before issue 29 it counted as "does not fit", and the search bracketed it and reported 3 as the largest batch
    that fits."""
    cfg = TrainConfig(model=model_file(tmp_path, fail_above=3), samples=64, eval_samples=8)
    res = search(cfg, quiet_cells(store, "nomem"), 64 * PER_SAMPLE)
    assert res.stopped is not None and res.stopped.batch > 3 and res.max_batch <= 3
    assert res.trials[-1] is res.stopped  # the search went no further
    assert "a deliberate failure that is not memory" in res.stopped.reason and not res.stopped.memory


def test_two_ranks_agree_when_only_one_runs_out(store, tmp_path):
    """Only rank 1 allocates, so only rank 1 can run out: every trial still has one verdict for both ranks,
    the failing ones name rank 1, and no run is left hanging or unmarked."""
    cap = int(3.5 * PER_SAMPLE)
    cfg = TrainConfig(model=model_file(tmp_path, rank_only=1), samples=64, eval_samples=8, ranks=2, global_batch=2)
    before = set(psutil.Process().children(recursive=True))  # e.g. multiprocessing's resource tracker
    res = search(cfg, quiet_cells(store, "two"), cap)
    # memory back to baseline: each trial ran in processes of its own, and every one of them is gone
    assert not set(psutil.Process().children(recursive=True)) - before
    assert res.max_batch >= 2 and all(t.batch % 2 == 0 for t in res.trials)
    fails = [t for t in res.trials if not t.fits]
    assert fails and all(t.reason.startswith("rank 1 ") for t in fails)
    assert min(t.batch for t in fails) == res.max_batch + 2  # the bracket closed on adjacent batches
    runs = store.list_runs(study="two/trials")
    assert set(runs["status"]) == {"completed", "failed"}  # every trial marked, none left running
    best = store.get(next(t.run_id for t in res.trials if t.batch == res.max_batch))
    assert best["summary"]["ranks/reported"] == 2


def test_a_failure_before_any_batch_fits_says_it_may_be_the_cap(store, tmp_path):
    """Native code may report a failed allocation in its own words; before anything fitted, that is ambiguous:
    the error keeps the reason and says the cap may be the cause."""
    model = faulty_model(tmp_path, "primitive", call=1, fault="raise RuntimeError('could not create a primitive')")
    cfg = TrainConfig(model=model, samples=64, eval_samples=8)
    with pytest.raises(RunFailed) as err:
        search(cfg, quiet_cells(store, "amb"), 64 * PER_SAMPLE)
    assert "failed under the memory cap of 512 MiB before any batch fitted" in err.value.reason
    assert "could not create a primitive" in err.value.reason and "raise --memory-limit" in err.value.reason
