import pytest

from scalelab.measure.timer import TIMED_STAGES, StepTimer


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += s


def test_stages_on_a_fixed_clock_are_exact_and_other_is_the_untimed_rest():
    clock = FakeClock()
    timer = StepTimer(clock)
    timer.start_step()
    with timer.span("data"):
        clock.advance(0.010)
    clock.advance(0.001)  # bookkeeping between spans: lands in "other"
    with timer.span("forward"):
        clock.advance(0.050)
    with timer.span("backward"):
        clock.advance(0.100)
    with timer.span("optimizer"):
        clock.advance(0.020)
    t = timer.end_step()
    assert t["data"] == pytest.approx(0.010)
    assert t["forward"] == pytest.approx(0.050)
    assert t["backward"] == pytest.approx(0.100)
    assert t["optimizer"] == pytest.approx(0.020)
    assert t["other"] == pytest.approx(0.001)
    assert t["wall"] == pytest.approx(0.181)
    # stages that never ran are exactly zero (none of the 181 ms leaks into them)
    assert [t[s] for s in TIMED_STAGES if s not in ("data", "forward", "backward", "optimizer")] == \
        [0.0] * (len(TIMED_STAGES) - 4)
    assert "eval" not in t and "wait" not in t  # evaluation is timed outside the step; no sync, no wait


def test_spans_of_the_same_name_accumulate_and_add_charges_a_stage():
    clock = FakeClock()
    timer = StepTimer(clock)
    timer.start_step()
    for _ in range(3):
        with timer.span("comm"):
            clock.advance(0.002)
    timer.add("comm", 0.004)
    assert timer.end_step()["comm"] == pytest.approx(0.010)


def test_sync_is_called_at_every_boundary():
    calls = []
    timer = StepTimer(FakeClock(), sync=lambda: calls.append(1))
    timer.start_step()
    with timer.span("forward"):
        pass
    timer.end_step()
    assert len(calls) == 4  # start, span begin, span end, end


def test_span_outside_a_step_is_an_error():
    timer = StepTimer(FakeClock())
    with pytest.raises(RuntimeError):
        with timer.span("forward"):
            pass
    with pytest.raises(RuntimeError):
        timer.end_step()


class FakeEvents:
    """CUDA-event-shaped marks on a device timeline the test moves by hand: a mark is recorded when the stream
    reaches it, which can be later than the host asked (queued kernels); `settle` is the one wait per step."""

    def __init__(self):
        self.device_t = 0.0
        self.settled = []

    def mark(self):
        return {"t": self.device_t}

    def seconds(self, begin, end):
        return end["t"] - begin["t"]

    def settle(self, last):
        self.settled.append(last)

    def done(self, last):
        return True


def test_event_marks_time_stages_on_the_device_timeline_and_wait_once_per_step():
    events, host = FakeEvents(), FakeClock()
    timer = StepTimer(host, marks=events)
    timer.start_step()
    with timer.span("forward"):
        host.advance(0.001)  # the host only launches ...
        events.device_t += 0.040  # ... the device runs the kernels
    with timer.span("backward"):
        events.device_t += 0.080
    t = timer.end_step()
    assert t["forward"] == pytest.approx(0.040)
    assert t["backward"] == pytest.approx(0.080)
    assert t["wall"] == pytest.approx(0.120)
    assert len(events.settled) == 1  # no device-wide sync per stage: one wait, at the step's end


def test_wait_runs_from_the_last_gradient_to_the_end_of_the_sync():
    clock = FakeClock()
    timer = StepTimer(clock)
    timer.start_step()
    with timer.span("backward"):
        for _ in range(3):  # gradients become ready during backward; the last one counts
            clock.advance(0.010)
            timer.ready()
        clock.advance(0.025)  # DDP waits for its buckets inside backward
    with timer.span("comm"):
        clock.advance(0.005)  # and a strategy's after-backward part
    with timer.span("optimizer"):
        clock.advance(0.100)  # not part of the wait
    t = timer.end_step()
    assert t["wait"] == pytest.approx(0.030)


def test_ready_outside_a_step_is_ignored_and_no_comm_span_means_no_wait():
    clock = FakeClock()
    timer = StepTimer(clock)
    timer.ready()
    timer.start_step()
    with timer.span("backward"):
        timer.ready()
    assert "wait" not in timer.end_step()
