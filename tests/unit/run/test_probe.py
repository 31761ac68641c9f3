"""The probe on a fixed clock: steps from the loader, stages, samples, implicit steps, the files it writes."""
from __future__ import annotations

import pytest
import torch

from scalelab.distenv import DistContext
from scalelab.run.probe import Probe, add_totals, batch_samples, first_tensor
from scalelab.store.rundir import RunDir


class Clock:
    """A clock that moves only when told to."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class SlowLoader:
    """Batches of `n` samples; asking for one takes `wait` seconds of the clock."""

    def __init__(self, clock: Clock, batches: int, n: int, wait: float):
        self.clock, self.batches, self.n, self.wait = clock, batches, n, wait

    def __iter__(self):
        for _ in range(self.batches):
            self.clock.t += self.wait
            yield torch.zeros(self.n, 3), torch.zeros(self.n, dtype=torch.long)


def probe_on(tmp_path, clock, **kw) -> Probe:
    return Probe(tmp_path, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, clock=clock, **kw)


def test_steps_from_the_loader_time_each_stage_and_count_samples(tmp_path):
    clock = Clock()
    probe = probe_on(tmp_path, clock, warmup_steps=1)
    for x, y in probe.data(SlowLoader(clock, batches=3, n=8, wait=0.5)):
        with probe.stage("forward"):
            clock.t += 0.25
        with probe.stage("backward"):
            clock.t += 1.0
        with probe.stage("augment"):  # a stage of the user's own
            clock.t += 0.125
        clock.t += 0.0625  # outside every stage: "other"
    probe.close()
    steps = RunDir(tmp_path).read_steps(0)
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert [r["warmup"] for r in steps] == [True, False, False]
    for r in steps:
        assert (r["data(s)"], r["forward(s)"], r["backward(s)"], r["augment(s)"]) == (0.5, 0.25, 1.0, 0.125)
        assert r["other(s)"] == 0.0625 and r["wall(s)"] == 1.9375
        assert r["samples"] == 8
    result = RunDir(tmp_path).read_result(0)
    assert result["steps"] == 3 and result["steps_per_epoch"] == 3


def test_a_loop_left_right_after_asking_for_a_batch_adds_no_step(tmp_path):
    clock = Clock()
    probe = probe_on(tmp_path, clock)
    for i, _ in enumerate(probe.data(SlowLoader(clock, batches=10, n=4, wait=0.1))):
        if i == 2:
            break
        with probe.stage("forward"):
            clock.t += 1.0
    probe.close()
    assert [r["step"] for r in RunDir(tmp_path).read_steps(0)] == [1, 2]


def test_stages_without_a_step_open_one_per_round(tmp_path):
    clock = Clock()
    probe = probe_on(tmp_path, clock)
    for _ in range(4):
        with probe.stage("forward"):
            clock.t += 2.0
        with probe.stage("backward"):
            clock.t += 3.0
        probe.mark(samples=5, loss=0.5)
    probe.close()
    steps = RunDir(tmp_path).read_steps(0)
    assert len(steps) == 4
    assert all(r["wall(s)"] == 5.0 and r["samples"] == 5 and r["loss"] == 0.5 for r in steps)


def test_an_explicit_step_and_a_failed_close(tmp_path):
    clock = Clock()
    probe = probe_on(tmp_path, clock)
    with probe.step(samples=7):
        with probe.stage("optimizer"):
            clock.t += 1.0
    probe.close(failed=True)
    rundir = RunDir(tmp_path)
    assert rundir.read_steps(0)[0]["samples"] == 7
    assert not rundir.result_file(0).exists()  # a failed rank writes no result, as in `scalelab train`


def test_first_tensor_and_totals():
    x = torch.zeros(3, 2)
    assert first_tensor((x, 1)) is x and first_tensor({"a": [x]}) is x and first_tensor([1, "a"]) is None
    assert batch_samples(x) == 3 and batch_samples([x, x]) == 3 and batch_samples(torch.tensor(1.0)) is None
    assert batch_samples({"y": "text"}) is None
    acc = add_totals({}, {"comm_bytes": 4, "comm_events": [["allreduce", "backward", 0.0, 1.0, 4]]})
    add_totals(acc, {"comm_bytes": 6, "comm_events": []})
    assert acc == {"comm_bytes": 10, "comm_events": [["allreduce", "backward", 0.0, 1.0, 4]]}



@pytest.mark.parametrize("fold_every", [4096, 7, 1])  # the stage times folded at the end, in chunks, per step
def test_a_long_run_keeps_records_of_its_windows_and_sums_every_step(tmp_path, monkeypatch, fold_every):
    from scalelab.analysis import keys
    from scalelab.run import probe as probe_module
    from scalelab.run.probe import Detail
    from scalelab.run.script import summarise_script

    monkeypatch.setattr(probe_module, "FOLD_EVERY", fold_every)
    clock = Clock()
    probe = probe_on(tmp_path, clock, warmup_steps=1, detail=Detail(first=3, every=10, length=2, windows=2))
    for i, _ in enumerate(probe.data(SlowLoader(clock, batches=50, n=4, wait=0.5))):
        with probe.stage("forward"):
            clock.t += 1.0 + (i % 2)  # 1 s or 2 s
        if i == 10:
            with probe.stage("rare"):  # a stage of the user's, entered once
                clock.t += 4.0
    probe.close()
    rundir = RunDir(tmp_path)
    assert [r["step"] for r in rundir.read_steps(0)] == [1, 2, 3, 4, 5, 14, 15]
    summary = summarise_script(tmp_path)
    assert summary[keys.STEPS_TOTAL] == 50 and summary[keys.STEPS_TIMED] == 49 and summary[keys.STEPS_DETAILED] == 7
    assert (summary[keys.STEPS_HOST_CLOCK], summary[keys.STEPS_CUDA_EVENTS]) == (50, 0)  # no CUDA: the host clock
    assert {r["clock"] for r in rundir.read_steps(0)} == {"host"}
    assert summary[keys.stage_ms("forward")] == pytest.approx(1e3 * (24 * 1.0 + 25 * 2.0) / 49)
    assert summary[keys.stage_ms("rare")] == pytest.approx(1e3 * 4.0 / 49)
    assert summary[keys.STEP_MEDIAN_MS] == 2500.0 and summary[keys.STEP_MAX_MS] == 5500.0
    assert summary[keys.THROUGHPUT] == pytest.approx(49 * 4 / (24 * 1.5 + 25 * 2.5 + 4.0))


def test_detail_windows_and_their_bad_values():
    from scalelab.run.probe import Detail

    d = Detail(first=2, every=5, length=1, windows=0)
    assert [s for s in range(1, 20) if d.keeps(s)] == [1, 2, 3, 8, 13, 18]
    with pytest.raises(ValueError, match="every: 0 is not allowed"):
        Detail(every=0)


def test_marked_samples_must_be_the_global_batch_given(tmp_path):
    from scalelab.run.script import ScriptConfig, batch_mismatch

    (tmp_path / "t.py").write_text("")
    cfg = ScriptConfig(command=("python", "t.py"), ranks=2, global_batch=64, cwd=str(tmp_path))
    steps = [{"step": s, "rank": r, "samples": 32} for s in (1, 2) for r in (0, 1)]
    assert batch_mismatch(cfg, steps) is None
    steps[0]["samples"] = 16
    assert batch_mismatch(cfg, steps).startswith("samples per step: the script marked 48 over all ranks, the global "
                                                 "batch is 64")
    assert batch_mismatch(ScriptConfig(command=("python", "t.py"), cwd=str(tmp_path)), steps) is None
