"""Warm ranks (scalelab.run.warm) against torchrun's cold ranks: equal figures, no state carried between cells,
failures, hangs and interrupts handled as on the cold path."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from conftest import cli_env, faulty_model, step_losses
from scalelab.config import TrainConfig
from scalelab.run import warm
from scalelab.run.execute import RunFailed, execute
from scalelab.store import Store

pytestmark = pytest.mark.timeout(240)


def _cfg(**fields) -> TrainConfig:
    base = dict(model="cnn", dataset="synthetic", samples=512, eval_samples=64, global_batch=32, steps=20,
                warmup_steps=2, ranks=2, seed=3)
    return TrainConfig(**{**base, **fields})


def _run(store: Store, cfg: TrainConfig):
    return execute(cfg, store, say=lambda line: None)


@pytest.mark.parametrize("model", ["cnn", "mlp"])
def test_a_warm_cell_after_another_trains_bit_for_bit_as_a_cold_one(store, model):
    """Losses of every rank, all 20 steps: the same floats cold and warm, also for a warm cell that follows a
    different one (other model, batch, seed, bucket size, sync strategy) in the same ranks: weights, optimizer
    state, RNG and DDP's hooks are the cell's own."""
    cfg = _cfg(model=model)
    with warm.paused():
        cold = _run(store, cfg)
    with warm.ranks() as pools:
        first = _run(store, _cfg(model="mlp" if model == "cnn" else "cnn", global_batch=64, seed=9, bucket_mb=1.0,
                                 sync="allreduce"))
        after = _run(store, cfg)
        assert len(pools.pools) == 1 and not pools.cold, "both cells should have run in the same warm ranks"
    for rank in (0, 1):
        assert step_losses(after.run_dir, rank) == step_losses(cold.run_dir, rank)
        assert len(step_losses(after.run_dir, rank)) == 20
    assert step_losses(first.run_dir) != step_losses(cold.run_dir)
    # the collective meter starts afresh: the same bytes per step as the cold run
    key = "comm/bytes_per_step"
    assert after.summary[key] == cold.summary[key] > 0


def test_a_warm_cell_reads_its_own_peak_memory(store):
    """A small cell after a large one in the same ranks reads the memory figures it read as the ranks' first job:
    what the large cell freed is handed back to the OS and the peak mark is reset at the worker's baseline.
    (A warm rank made torch's one-time allocations before its first job, as a 1-rank cell in the study's process
    has: its `train_added` leaves them out, where a cold rank's includes them.)"""
    small = _cfg(model="mlp", global_batch=8, steps=4)
    with warm.ranks():
        first = _run(store, small)
        big = _run(store, _cfg(model="mlp", global_batch=8192, samples=16384, steps=4, seed=5))
        after = _run(store, small)
    peak, added = "memory/peak_rss(GiB)", "memory/train_added(bytes)"
    print({k: (first.summary[k], big.summary[k], after.summary[k]) for k in (peak, added)})
    # What a warm rank carries over is a small part of what the big cell added, and does not grow with it: measured
    # 20-30 MB of the ~600 MB the big cell added (4 runs), against 20-60 MB of ~110 MB with a 4x smaller big cell,
    # which is why the big cell is this big (the carry-over is glibc's heap and torch's small caches, see
    # docs/distributed.md "Warm ranks"; a bound relative to the small cell's own peak read the machine's noise).
    for key in (peak, added):
        carried = after.summary[key] - first.summary[key]
        assert carried < 0.2 * (big.summary[key] - first.summary[key]), key


def test_a_failed_warm_cell_names_its_rank_and_the_next_cell_starts_fresh_ranks(store, tmp_path):
    """rank 1 raises in its 3rd forward: the run fails naming rank 1 and the error, as on the cold path; the pool
    is closed and the next cell runs in new ranks."""
    model = faulty_model(tmp_path, "crash", call=3, fault="raise ValueError('injected')", rank=1)
    with warm.ranks() as pools:
        _run(store, _cfg(model="mlp", steps=3))
        first_pids = set(next(iter(pools.pools.values())).pids)
        with pytest.raises(RunFailed) as failed:
            _run(store, _cfg(model=model, steps=6))
        assert "rank 1" in failed.value.reason and "ValueError: injected" in failed.value.reason
        assert not pools.pools
        assert not [p for p in first_pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        again = _run(store, _cfg(model="mlp", steps=3))
        assert set(next(iter(pools.pools.values())).pids).isdisjoint(first_pids)
    assert again.summary["steps/timed"] > 0
    rows = store.list_runs().set_index("run_id")
    assert rows.loc[failed.value.run_id, "status"] == "failed"


def test_a_hung_warm_rank_is_named_by_the_watchdog(store, tmp_path):
    """rank 1 sleeps in its 3rd forward: the watchdog names it, ends it, and the run fails with that verdict."""
    model = faulty_model(tmp_path, "hang", call=3, fault="time.sleep(600)", rank=1)
    with warm.ranks() as pools:
        _run(store, _cfg(model="mlp", steps=2))  # the ranks started (the watchdog's timeout is shorter than that)
        began = time.monotonic()
        with pytest.raises(RunFailed) as failed:
            _run(store, _cfg(model=model, steps=6, hang_timeout_s=4.0))
        assert time.monotonic() - began < 120
        assert not pools.pools
    assert "rank 1 hung" in failed.value.reason


def test_a_capped_cell_forked_fresh_trains_as_a_cold_one_and_its_cap_holds(store):
    """A memory-capped 2-rank cell needs a fresh process (RLIMIT_AS cannot be lifted again): a fork pool's servers
    (imports done, no torch op run) fork one per job. Its losses are the cold launch's, bit for bit; a cell over
    its cap (width 4096: 100 MB of gradients and momentum against 64 MiB) fails as out of memory, naming the
    rank, without touching the servers; the next capped cell runs in the same servers."""
    fits = _cfg(model="mlp", model_options="depth=1,width=16", memory_limit=256 * 2**20, steps=6)
    over = _cfg(model="mlp", model_options="depth=1,width=4096", memory_limit=64 * 2**20, steps=6)
    with warm.paused():
        cold = _run(store, fits)
    with warm.ranks() as pools:
        forked = _run(store, fits)
        servers = set(next(iter(pools.pools.values())).pids)
        with pytest.raises(RunFailed) as failed:
            _run(store, over)
        again = _run(store, fits)
        assert set(next(iter(pools.pools.values())).pids) == servers and pools.started == 1, pools.tally()
        assert len(pools.forked) == 3 and not pools.cold and pools.warm == 0, pools.tally()
        assert servers.isdisjoint(_rank_pids(forked.run_dir)), "the job ran in a child, not in the server"
    assert "memory" in failed.value.reason.lower() and "rank" in failed.value.reason, failed.value.reason
    for rank in (0, 1):
        assert step_losses(forked.run_dir, rank) == step_losses(cold.run_dir, rank) == step_losses(again.run_dir,
                                                                                                    rank)
    # a fresh process's memory: the fork's peak is a cold rank's (a warm rank's would leave torch's one-time
    # allocations out)
    peak = "memory/peak_rss(GiB)"
    assert forked.summary[peak] == pytest.approx(cold.summary[peak], rel=0.15), (forked.summary[peak],
                                                                                  cold.summary[peak])


def test_an_isolated_cell_forked_fresh_takes_its_thread_count(store):
    """One isolated rank (a thread-count cell) per fork: 1 then 2 threads in the same layout read back as set, and
    its output goes to the run's logs as torchrun's --redirects would."""
    from scalelab.run.execute import execute as run_isolated

    with warm.ranks() as pools:
        done = {t: run_isolated(_cfg(model="mlp", ranks=1, threads=t, steps=3), store, say=lambda _: None,
                                isolate=True) for t in (1, 2)}
        assert len(pools.forked) == 2 and not pools.cold, pools.tally()
    assert {t: d.summary["threads/used"] for t, d in done.items()} == {1: 1, 2: 2}
    assert (done[1].run_dir / "logs" / "rank0.log").is_file()


def _rank_pids(run_dir) -> set[int]:
    import json

    return {json.loads(p.read_text())["pid"] for p in run_dir.glob("heartbeat.rank*.json")}


SCRIPT = textwrap.dedent("""
    import sys
    from scalelab.config import TrainConfig
    from scalelab.run import warm
    from scalelab.run.execute import execute
    from scalelab.store import Store

    store = Store(sys.argv[1])
    cfg = TrainConfig(model=sys.argv[2], samples=4096, global_batch=8, epochs=5, ranks=2)
    with warm.ranks():
        execute(TrainConfig(model="mlp", samples=256, global_batch=32, steps=2, ranks=2), store, say=print)
        execute(cfg, store, say=print)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_warm_cell_is_marked_and_leaves_no_rank(tmp_path, sleepy_model, sig):
    root = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(root), sleepy_model(0.05)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 150
        while len([f for f in root.glob("runs/*/steps.rank0.jsonl") if f.stat().st_size]) < 2:  # the 2nd cell's
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-1500:]
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the warm ranks should be running"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"left behind: {alive}"
    runs = Store(root).list_runs().sort_values("created")
    assert list(runs["status"]) == ["completed", "interrupted"], err[-1500:]


def test_every_pool_is_forked_from_one_zygote_and_trains_as_a_cold_launch(store):
    """Known truths of the zygote (run/warm_zygote.py): every rank process of a block's pools, warm ranks and fork
    servers alike, is a child of the one zygote (its parent pid), which the launching process started; a cell in
    those ranks trains its 20 steps bit for bit as the same cell launched cold; and when the block ends, no process
    of it is left, the zygote included."""
    cfg = _cfg(model="mlp")
    capped = _cfg(model="mlp", model_options="depth=1,width=16", memory_limit=256 * 2**20, steps=6)
    with warm.paused():
        cold, cold_capped = _run(store, cfg), _run(store, capped)
    with warm.ranks() as pools:
        forked, forked_capped = _run(store, cfg), _run(store, capped)
        zygote = pools.zygote.proc.pid
        assert psutil.Process(zygote).ppid() == psutil.Process().pid
        ranks = [pid for pool in pools.pools.values() for pid in pool.pids]
        assert len(pools.pools) == 2 and pools.zygote_forked == 2, pools.tally()
        assert {psutil.Process(pid).ppid() for pid in ranks} == {zygote}, "each rank process forked by the zygote"
        assert "(2 forked from the zygote)" in pools.tally()
    for rank in (0, 1):
        assert step_losses(forked.run_dir, rank) == step_losses(cold.run_dir, rank)
        assert len(step_losses(forked.run_dir, rank)) == 20
        assert step_losses(forked_capped.run_dir, rank) == step_losses(cold_capped.run_dir, rank)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in (zygote, *ranks) if psutil.pid_exists(p)], timeout=10)
    assert not alive, f"left behind: {alive}"


def test_a_zygote_started_ahead_forks_the_blocks_ranks_and_one_that_died_is_replaced(store, monkeypatch):
    """`scalelab study` starts the zygote before its own start-up (lab/study.py `_start_up`): the block's ranks are
    forked from that zygote although this process meanwhile made torch's one-time allocations (inductor then sets
    TORCHINDUCTOR_CACHE_DIR in its environment, a variable read late); `zygote_ready` waits for its imports. A
    zygote that died before it was ready is dropped, and the first pool starts another."""
    from scalelab.run.worker import warm_up_runtime

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with warm.ranks() as pools:
        pools.start_zygote()
        warm_up_runtime(_cfg())
        pools.zygote_ready()
        ahead = pools.zygote
        assert ahead.ready is not None and ahead.ready["imported"] >= ahead.ready["main"]
        _run(store, _cfg(model="mlp", steps=2))
        ranks = [pid for pool in pools.pools.values() for pid in pool.pids]
        assert pools.zygote is ahead and pools.zygote_forked == 1, pools.tally()
        assert {psutil.Process(pid).ppid() for pid in ranks} == {ahead.proc.pid}
    with warm.ranks() as pools:
        pools.start_zygote()
        dead = pools.zygote
        dead.proc.kill()
        pools.zygote_ready()
        assert pools.zygote is None and dead.proc.poll() is not None
        _run(store, _cfg(model="mlp", steps=2))
        assert pools.zygote is not None and pools.zygote is not dead and pools.zygote_forked == 1, pools.tally()


def test_a_layout_whose_start_variables_differ_starts_its_own_process(store, monkeypatch):
    """A variable read when a process starts (here PYTHONHASHSEED, the interpreter's) set after the zygote started:
    the next new layout's ranks are started by exec, not forked with the zygote's value; the zygote's own pools go
    on forking. A variable read late (OMP_NUM_THREADS, per layout) does not stop a fork."""
    with warm.ranks() as pools:
        _run(store, _cfg(model="mlp", steps=2))
        monkeypatch.setenv("PYTHONHASHSEED", "7")
        _run(store, _cfg(model="mlp", steps=2, threads=2))
        assert pools.started == 2 and pools.zygote_forked == 1, pools.tally()
        newest = list(pools.pools.values())[-1]
        assert newest.zygote is None and {psutil.Process(p).ppid() for p in newest.pids} == {psutil.Process().pid}


def test_a_killed_zygote_is_replaced_and_leaves_nothing(store):
    """SIGKILL to the zygote mid-block: the ranks it forked end too, as a rank whose launching process died does
    (worker.end_with_parent watches a rank's parent, here the zygote); the next cell of the same layout runs in new
    ranks forked from a new zygote, and closing the block ends every process of it."""
    with warm.ranks() as pools:
        _run(store, _cfg(model="mlp", steps=2))
        first = pools.zygote.proc
        ranks = list(next(iter(pools.pools.values())).pids)
        first.kill()
        first.wait()
        _, alive = psutil.wait_procs([psutil.Process(p) for p in ranks if psutil.pid_exists(p)], timeout=15)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], f"orphans of the zygote: {alive}"
        again = _run(store, _cfg(model="mlp", steps=4, seed=4))
        assert again.summary["steps/timed"] > 0
        assert pools.zygote.proc.pid != first.pid and pools.zygote_forked == 2, pools.tally()
        newer = [pools.zygote.proc.pid, *(p for pool in pools.pools.values() for p in pool.pids)]
        assert not set(newer) & set(ranks)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in newer if psutil.pid_exists(p)], timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], f"left behind: {alive}"
