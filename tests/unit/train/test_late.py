"""CUDA events read one step late, driven on the CPU by a fake event class whose device timeline the test sets.

The fake device runs the work queued between two marks in order: an event recorded at host time r, after work w
queued behind the previous event (done at d_prev), completes at d = max(d_prev + w, r). `synchronize` on an
unfinished event moves the fake host clock to its completion (the host waited that long); `query` says whether it
has completed by the host's time; `elapsed_time` of an unfinished event is an error, as on CUDA.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from scalelab.config import TrainConfig
from scalelab.distenv import DistContext
from scalelab.measure.timer import TIMED_STAGES, CudaMarks, StepTimer
from scalelab.sync.meter import CommMeter
from scalelab.train import late as late_module
from scalelab.train.late import Ended, LateSteps
from scalelab.train.loop import train
from scalelab.train.setup import build_inputs

MS = 1e-3
# device work (s) queued before the event at each position of a step's marks: start, data begin/end, h2d begin/end,
# forward begin/end, backward begin/end, optimizer begin/end, end
WORK = {4: 1 * MS, 6: 30 * MS, 8: 60 * MS, 10: 10 * MS}
STEP_DEVICE_S = sum(WORK.values())  # 0.101 s of device work per step
MARKS_PER_STEP = 12


class Host:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeDevice:
    """One stream. `host_work[position]`: host seconds spent just before that mark (the loader, say); `hang_from`:
    the step from which the device never finishes its work."""

    def __init__(self, host: Host, host_work: dict[int, float] | None = None, hang_from: int | None = None):
        self.host, self.host_work, self.hang_from = host, host_work or {}, hang_from
        self.last_done = 0.0
        self.recorded = 0
        self.reads: list[tuple[int, int]] = []  # (step whose end was read, steps whose end was recorded by then)
        self.waits = 0

    def event(self, enable_timing: bool = True) -> "FakeEvent":
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice):
        self.device, self.done_at = device, None

    def record(self) -> None:
        dev = self.device
        position, step = dev.recorded % MARKS_PER_STEP, dev.recorded // MARKS_PER_STEP + 1
        dev.host.t += dev.host_work.get(position, 0.0)
        work = math.inf if dev.hang_from is not None and step >= dev.hang_from and position == 6 else \
            WORK.get(position, 0.0)
        self.done_at = max(dev.last_done + work, dev.host.t)
        self.step, self.position = step, position
        dev.last_done = self.done_at
        dev.recorded += 1

    def query(self) -> bool:
        return self.done_at <= self.device.host.t

    def synchronize(self) -> None:
        assert math.isfinite(self.done_at), "a blocking wait on a hung device"
        if not self.query():
            self.device.waits += 1
            self.device.host.t = self.done_at

    def elapsed_time(self, end: "FakeEvent") -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time of an event that has not completed")
        read = [step for step, _ in self.device.reads]
        if end.position == MARKS_PER_STEP - 1 and end.step not in read:  # the step is being read
            self.device.reads.append((end.step, self.device.recorded // MARKS_PER_STEP))
        return (end.done_at - self.done_at) * 1e3  # ms, as torch.cuda.Event


def run(tmp_path, device: FakeDevice, *, model=None, **fields) -> tuple[list[dict], dict, list[str]]:
    cfg = TrainConfig(model="mlp", samples=96, eval_samples=16, global_batch=8, device="cpu", warmup_steps=2,
                      **fields)
    bundle, built = build_inputs(cfg)
    said: list[str] = []
    result = train(cfg, DistContext(0, 1, 0, 1, torch.device("cpu")), bundle, model or built, tmp_path,
                   clock=device.host, say=said.append, marks=CudaMarks(None, event=device.event))
    return read_records(tmp_path), result, said


def read_records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.rank0.jsonl").read_text().splitlines()]


def assert_stages(record: dict, wall: float, data: float = 0.0) -> None:
    expected = {"data": data, "h2d": 1 * MS, "forward": 30 * MS, "backward": 60 * MS, "optimizer": 10 * MS}
    for stage in TIMED_STAGES:
        assert record[f"{stage}(s)"] == pytest.approx(expected.get(stage, 0.0), abs=1e-12), stage
    assert record["wall(s)"] == pytest.approx(wall, abs=1e-12)


def test_a_device_bound_run_reads_each_step_after_the_next_has_ended_with_exact_stages_and_ends(tmp_path):
    """The host queues at no cost: the device sets the pace. Step k is read when step k+1 has ended (the last step
    at the run's end), the read of step k waits for its last event (the device still has step k+1 queued), and
    t_end is the host time that wait returned: where the device finished step k, 0.101 s * k."""
    device = FakeDevice(Host())
    records, result, _ = run(tmp_path, device, steps=6)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # the last step is flushed at the run's end
    assert device.reads == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 6)]
    for r in records:
        assert_stages(r, wall=STEP_DEVICE_S)
        assert r["other(s)"] == pytest.approx(0.0, abs=1e-12)
        assert r["t_end(perf_s)"] == pytest.approx(STEP_DEVICE_S * r["step"], abs=1e-12)
    assert device.waits == 6 and result["steps"] == 6


def test_a_host_bound_run_places_a_step_where_the_device_finished_it_without_waiting(tmp_path):
    """The loader takes 0.2 s of host time a step (before the data span ends): the device idles between steps, so
    step k's last event has completed by the time it is read (no wait), and its end on the host clock is the
    latest of (a mark's host time + the device time from that mark to the end): 0.2 * k + 0.101."""
    device = FakeDevice(Host(), host_work={2: 0.2})
    records, _, _ = run(tmp_path, device, steps=5)
    assert device.reads == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 5)]
    assert device.waits == 1  # only the last step, read at the run's end before the device finished it
    for r in records:
        # the data span on the device: the whole 0.2 s host wait in step 1; from step 2 on it starts when the
        # device has finished the previous step, 0.101 s in
        first = r["step"] == 1
        assert_stages(r, wall=0.301 if first else 0.2, data=0.2 if first else 0.2 - STEP_DEVICE_S)
        assert r["t_end(perf_s)"] == pytest.approx(0.2 * r["step"] + STEP_DEVICE_S, abs=1e-12)


@pytest.mark.parametrize("host_work", [{}, {2: 0.2}], ids=["device-bound", "host-bound"])
def test_auto_length_reads_wall_one_step_late_and_stops_at_a_step_that_does_not_depend_on_the_device(
        tmp_path, host_work):
    """Equal timed walls reach +-3 % at the 6th timed step (step 8, after 2 warm-up steps); its wall is read when
    step 9 has ended, so both runs stop after step 9, however far the device had got: every rank of a run reads
    and decides on the same steps at the same points."""
    device = FakeDevice(Host(), host_work=host_work)
    records, result, _ = run(tmp_path, device, steps="auto", min_timed_steps=6, target_precision=0.03, epochs=3)
    assert result["length"]["stopped_by"] == "precision"
    assert [r["step"] for r in records] == list(range(1, 10))
    assert device.reads[-1] == (9, 9)


def test_the_steps_before_an_evaluation_are_read_first_so_evaluation_does_not_wait_for_the_device(tmp_path):
    device = FakeDevice(Host())
    records, _, _ = run(tmp_path, device, steps=6, eval_every=3)
    assert device.reads[:3] == [(1, 2), (2, 3), (3, 3)]  # step 3 read before its evaluation
    assert [("evaluation(s)" in r) for r in records] == [False, False, True, False, False, True]


class Interrupting(torch.nn.Module):
    """The model, interrupted (Ctrl-C) at its `at`-th forward, after `host_s` of host time."""

    def __init__(self, inner: torch.nn.Module, at: int, host: Host, host_s: float):
        super().__init__()
        self.inner, self.at, self.host, self.host_s, self.calls = inner, at, host, host_s, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            self.host.t += self.host_s
            raise KeyboardInterrupt
        return self.inner(x)


def model_for(cfg_fields: dict) -> torch.nn.Module:
    return build_inputs(TrainConfig(model="mlp", samples=96, eval_samples=16, global_batch=8, device="cpu",
                                    **cfg_fields))[1]


def test_an_interrupt_records_a_queued_step_the_device_finishes_in_time(tmp_path):
    host = Host()
    device = FakeDevice(host)
    model = Interrupting(model_for({}), at=4, host=host, host_s=1.0)  # the device finishes step 3 meanwhile
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, device, model=model, steps=6)
    records = read_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[2]["t_end(perf_s)"] == pytest.approx(3 * STEP_DEVICE_S, abs=1e-12)


def test_an_interrupt_on_a_hung_device_drops_the_unfinished_step_says_so_and_never_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(late_module, "INTERRUPT_BOUND_S", 0.05)
    host = Host()
    device = FakeDevice(host, hang_from=3)  # step 3's forward never finishes on the device
    model = Interrupting(model_for({}), at=4, host=host, host_s=1.0)
    said: list[str] = []
    cfg = TrainConfig(model="mlp", samples=96, eval_samples=16, global_batch=8, device="cpu", steps=6)
    bundle, _ = build_inputs(cfg)
    with pytest.raises(KeyboardInterrupt):  # FakeEvent.synchronize fails the test on any blocking wait
        train(cfg, DistContext(0, 1, 0, 1, torch.device("cpu")), bundle, model, tmp_path, clock=host,
              say=said.append, marks=CudaMarks(None, event=device.event))
    assert [r["step"] for r in read_records(tmp_path)] == [1, 2]
    assert said == ["rank 0: step 3 not recorded: the device had not finished it within 0.05 s of the interruption"]


def test_a_step_can_be_read_after_the_timer_has_moved_on():
    """The timer's state for step k is kept in its EndedStep: reading it after step k+1 has run gives step k."""
    host = Host()
    device = FakeDevice(host)
    timer = StepTimer(host, marks=CudaMarks(None, event=device.event))
    ended = []
    for _ in range(2):
        timer.start_step()
        for name in ("data", "h2d", "forward", "backward", "optimizer"):
            with timer.span(name):
                pass
        ended.append(timer.close_step())
    assert not ended[0].done()
    first, t_end = ended[0].read()
    assert first["forward"] == pytest.approx(0.030, abs=1e-12) and t_end == pytest.approx(STEP_DEVICE_S, abs=1e-12)
    assert ended[1].read()[0]["wall"] == pytest.approx(STEP_DEVICE_S, abs=1e-12)


def test_the_comm_meter_reads_a_steps_events_when_asked_not_when_the_step_ends(monkeypatch):
    host = Host()
    device = FakeDevice(host)
    monkeypatch.setattr(torch.cuda, "Event", device.event)  # the meter's CUDA events come from the fake device
    meter = CommMeter(2, devices=[torch.device("cuda", 0)])
    with meter.collective("allreduce", 1000, phase="backward"):
        device.last_done += 0.004  # the collective runs 4 ms on the device
    ended = meter.close_step()
    assert not ended.done() and meter.idle()  # the next step's collection starts empty
    totals = ended.read()  # waits for the collective's end event
    assert totals["comm_sum(s)"] == pytest.approx(0.004, abs=1e-12) and totals["collectives"] == 1
    assert device.waits == 1


def test_steps_are_handed_over_by_count_alone_whatever_the_device_has_finished():
    class Step:
        def __init__(self, n, done):
            self.step, self._done = n, done

        def done(self):
            return self._done

    for finished in (True, False):
        late = LateSteps(lag=1)
        handed = []
        for n in range(1, 5):
            late.push(Step(n, finished))
            handed.append([s.step for s in late.due()])
        assert handed == [[], [1], [2], [3]]
        assert [s.step for s in late.all()] == [4]


def test_finish_within_polls_for_its_bound_and_drops_the_first_unfinished_step_and_those_after_it(monkeypatch):
    monkeypatch.setattr(late_module, "POLL_S", 0.03125)
    now = [0.0]
    polls = []

    def sleep(s):
        polls.append(s)
        now[0] += s

    class Step:
        def __init__(self, n, done_at):
            self.step, self.done_at = n, done_at

        def done(self):
            return now[0] >= self.done_at

    late = LateSteps(lag=1, bound_s=0.125)
    for n, done_at in ((1, 0.0), (2, 0.0625), (3, math.inf), (4, 0.0)):
        late.push(Step(n, done_at))
    finished, dropped = late.finish_within(clock=lambda: now[0], sleep=sleep)
    assert [s.step for s in finished] == [1, 2] and [s.step for s in dropped] == [3, 4]
    assert now[0] == 0.125 and polls == [0.03125] * 4  # step 2 after two polls, then two more for step 3
    assert not late


def test_an_ended_step_is_done_only_when_its_timer_and_its_collectives_are():
    class Part:
        def __init__(self, done):
            self._done = done

        def done(self):
            return self._done

    assert Ended(1, False, {}, Part(True), None, None, None).done()
    assert not Ended(1, False, {}, Part(True), Part(False), None, None).done()
    assert not Ended(1, False, {}, Part(False), Part(True), None, None).done()
