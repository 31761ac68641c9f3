"""CUDA paths of the step timing, the blocking wait and the max-batch search (issue 12's GPU proof). They skip
without a GPU; the collective timing itself is in test_cuda_collective_timing.py.

Known truths: `torch.cuda._sleep` queues device work of a known length (timed by its own events) that the host
does not wait for; a model that allocates a known number of bytes per sample on the GPU runs out of memory at a
batch the GPU's size decides.
"""
from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from conftest import cuda_sleep_cycles

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.timeout(600)]

SLEEP_S = 0.05


def _slept(cycles: int) -> float:
    """Queue a _sleep and return how long it took on the device (its own events, waited for)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def test_event_marks_charge_a_stage_for_the_kernels_it_queued_without_a_sync_per_stage():
    from scalelab.measure.timer import CudaMarks, StepTimer

    cycles = cuda_sleep_cycles(SLEEP_S)
    sleep = _slept(cycles)
    timer = StepTimer(marks=CudaMarks(torch.device("cuda", 0)))
    timer.start_step()
    host = time.perf_counter()
    with timer.span("forward"):
        torch.cuda._sleep(cycles)  # the host returns at once
    with timer.span("backward"):
        torch.cuda._sleep(cycles)
    launched = time.perf_counter() - host
    t = timer.end_step()
    assert launched < 0.5 * sleep  # nothing waited for the device while the stages ran
    assert t["forward"] == pytest.approx(sleep, rel=0.2)
    assert t["backward"] == pytest.approx(sleep, rel=0.2)
    assert t["wall"] >= 2 * 0.8 * sleep  # the step waited once, at its end


def test_a_device_wide_sync_per_stage_gives_the_same_stages_when_asked_for():
    from scalelab.measure.timer import StepTimer

    cycles = cuda_sleep_cycles(SLEEP_S)
    sleep = _slept(cycles)
    timer = StepTimer(sync=torch.cuda.synchronize)
    timer.start_step()
    with timer.span("forward"):
        torch.cuda._sleep(cycles)
    assert timer.end_step()["forward"] == pytest.approx(sleep, rel=0.2)


def test_the_wait_includes_device_work_queued_after_the_last_gradient_while_the_collective_excludes_it():
    """One NCCL rank: the step's wait runs from the last gradient's event to the end of the sync on the device, so
    a sleep queued between them is in it; the collective's own events exclude it."""
    import torch.distributed as dist

    from scalelab.measure.timer import CudaMarks, StepTimer
    from scalelab.run.launch import free_port
    from scalelab.sync.meter import CommMeter

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        cycles = cuda_sleep_cycles(SLEEP_S)
        sleep = _slept(cycles)
        t = torch.ones(2**20, device="cuda")
        results = []
        for _ in range(2):  # the second counts (NCCL's first call sets up its communicator)
            meter = CommMeter(1, devices=[torch.device("cuda", 0)])
            timer = StepTimer(marks=CudaMarks(torch.device("cuda", 0)))
            timer.start_step()
            with timer.span("backward"):
                timer.ready()  # the last gradient
            torch.cuda._sleep(cycles)  # queued work the sync has to wait behind
            with timer.span("comm"):
                with meter.collective("allreduce", t.numel() * 4, phase="backward"):
                    dist.all_reduce(t)
            results.append((timer.end_step(), meter.take_step()))
        times, comm = results[-1]
        assert times["wait"] >= 0.8 * sleep
        assert comm["comm_total(s)"] < 0.5 * sleep
    finally:
        dist.destroy_process_group()


def test_training_on_cuda_with_events_and_with_sync_stages(store):
    """Both timings run the real loop end to end; stages and `other` still sum to the step."""
    from scalelab.config import TrainConfig
    from scalelab.run.execute import execute

    for sync_stages in (False, True):
        cfg = TrainConfig(model="cnn", dataset="synthetic", samples=256, eval_samples=32, global_batch=32, steps=6,
                          warmup_steps=2, device="cuda", sync_stages=sync_stages)
        out = execute(cfg, store, say=lambda line: None)
        s = out.summary
        assert s["stage/forward(ms)"] > 0 and s["stage/backward(ms)"] > 0, sync_stages
        parts = sum(s[f"stage/{k}(ms)"] for k in ("data", "h2d", "forward", "backward", "comm", "optimizer", "other"))
        assert parts == pytest.approx(1e3 * _mean_wall(out.run_dir), rel=1e-6), sync_stages


def _mean_wall(run_dir) -> float:
    from scalelab.store import read_jsonl

    walls = [r["wall(s)"] for r in read_jsonl(run_dir / "steps.rank0.jsonl") if not r["warmup"]]
    return sum(walls) / len(walls)


def test_reading_ended_steps_scalars_does_not_wait_for_the_work_queued_after_them():
    """The loop reads losses of steps that ended on the device (scalar_reader): with a known sleep queued on the
    main stream after them, the read returns before the sleep ends, where `.item()` on the main stream waits for
    it (the control)."""
    from scalelab.train.loop import scalar_reader

    read = scalar_reader(torch.device("cuda"))
    ended = [torch.tensor(3.5, device="cuda"), torch.tensor(17, device="cuda")]
    torch.cuda.synchronize()
    cycles = cuda_sleep_cycles(0.5)
    times = {}
    for how in ("reader", "item"):
        done = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        done.record()
        began = time.perf_counter()
        got = read(ended) if how == "reader" else [ended[0].item(), ended[1].item()]
        times[how] = (time.perf_counter() - began, done.query())
        assert got == [3.5, 17.0]
        torch.cuda.synchronize()
    assert not times["reader"][1] and times["item"][1], times  # the sleep was still running when the read returned


def test_max_batch_on_cuda_stops_at_the_gpus_memory(store, tmp_path):
    """A CUDA out-of-memory error ends a trial as "does not fit"; the largest batch that fits, times the bytes
    per sample, lies within the GPU's memory."""
    from conftest import hungry_model, run_experiment
    from scalelab.config import TrainConfig

    per = 2 * 2**30  # 2 GiB per sample: a handful of trials on any GPU
    torch.cuda.empty_cache()  # what earlier tests left cached in this process
    free = torch.cuda.mem_get_info()[0]  # what the trials can have: this process's context and NCCL hold the rest
    base = TrainConfig(model=hungry_model(tmp_path, per_sample=per), dataset="synthetic", samples=256, eval_samples=16,
                       global_batch=1, steps=2, warmup_steps=1, device="cuda")
    result = run_experiment("max_batch", base, store, "mb", tmp_path / "out", variants=["base"], memory_limit=None)
    table = result.tables["max_batch"]
    best = int(table["max_batch"].iloc[0])
    # batch `best` fitted beside a trial's own context, `best + 1` did not (a context is smaller than a sample)
    assert 1 <= best and best * per <= free < (best + 2) * per, (best, free / 2**30, table["tried"].iloc[0],
                                                                 table["failure"].iloc[0])


def test_max_batch_on_cuda_in_this_process_finds_the_per_process_batch(store, tmp_path):
    """One rank's trials on CUDA run in this process (an OOM is caught, the cache emptied and the cap undone after
    each): the same largest batch as a process per trial, under the same cap; afterwards this process holds no
    more than before and can allocate past the cap again."""
    from conftest import hungry_model, quiet_cells
    from scalelab.config import TrainConfig
    from scalelab.experiments.max_batch import max_batch

    per, cap = 256 * 2**20, 2 * 2**30  # 256 MiB a sample under a 2 GiB cap: batch 7, in a handful of trials
    base = TrainConfig(model=hungry_model(tmp_path, per_sample=per), dataset="synthetic", samples=64, eval_samples=8,
                       global_batch=1, steps=2, warmup_steps=0, device="cuda", memory_limit=cap)
    torch.cuda.empty_cache()
    held = torch.cuda.memory_allocated()
    here = max_batch(base, quiet_cells(store, "mb-here"), "here", memory_limit=cap, say=lambda line: None)
    assert torch.cuda.memory_allocated() == held and torch.cuda.memory_reserved() <= held + 2**30
    apart = max_batch(base, quiet_cells(store, "mb-apart"), "apart", memory_limit=cap, say=lambda line: None,
                      here=False)
    tried = [" ".join(f"{t.batch}{'+' if t.fits else '-'}" for t in r.trials) for r in (here, apart)]
    tried += [f"{t.batch}: {t.reason}" for r in (here, apart) for t in r.trials if not t.fits]
    assert here.max_batch == apart.max_batch and 1 <= here.max_batch <= cap // per, tried
    assert all(t.memory for t in here.trials if not t.fits), [t.reason for t in here.trials]
    big = torch.empty(cap + 2**30, dtype=torch.uint8, device="cuda")  # the trials' cap is undone
    del big
    torch.cuda.empty_cache()


def test_a_memory_limit_on_cuda_caps_the_caching_allocator(store, tmp_path):
    """A model that allocates a known 64 MiB per sample: batch 4 (256 MiB) fits without a limit and runs out of
    memory under a 128 MiB limit, as a real CUDA OOM (the run fails naming it)."""
    from conftest import hungry_model
    from scalelab.config import TrainConfig
    from scalelab.run.execute import RunFailed, execute

    cfg = TrainConfig(model=hungry_model(tmp_path, per_sample=64 * 2**20), dataset="synthetic", samples=64,
                      eval_samples=8, global_batch=4, steps=2, warmup_steps=1, device="cuda")
    out = execute(cfg, store, say=lambda line: None)
    assert out.summary["memory/cuda_max_allocated(GiB)"] * 2**30 >= 4 * 64 * 2**20
    with pytest.raises(RunFailed) as info:
        execute(dataclasses.replace(cfg, memory_limit=128 * 2**20), store, say=lambda line: None)
    assert "out of memory" in str(info.value).lower()


LAZY = """
import torch
from torch import nn
from scalelab import probe

run = probe.open(store={store!r}, warmup_steps=1)
model = nn.Linear(64, 10)
for i in range(8):
    if i == 3:  # the script initialises CUDA only now
        model = model.cuda()
    dev = next(model.parameters()).device
    with run.step(samples=32):
        with run.stage("forward"):
            loss = model(torch.randn(32, 64, device=dev)).square().mean()
        with run.stage("backward"):
            loss.backward()
"""


def test_a_probed_script_that_initialises_cuda_late_moves_to_event_timing(tmp_path):
    """Steps before CUDA is initialised are host-timed, steps after it event-timed; the records and the summary
    say which clock timed each."""
    import subprocess
    import sys

    from scalelab.analysis import keys
    from scalelab.run.script import summarise_script
    from scalelab.store import read_jsonl

    script = tmp_path / "lazy.py"
    script.write_text(LAZY.format(store=str(tmp_path / "store")))
    subprocess.run([sys.executable, str(script)], check=True, timeout=300)
    [run_dir] = [p for p in (tmp_path / "store" / "runs").iterdir() if p.is_dir()]
    clocks = [r["clock"] for r in read_jsonl(run_dir / "steps.rank0.jsonl")]
    assert clocks == ["host"] * 3 + ["cuda_events"] * 5
    summary = summarise_script(run_dir)
    assert (summary[keys.STEPS_HOST_CLOCK], summary[keys.STEPS_CUDA_EVENTS]) == (3, 5)
