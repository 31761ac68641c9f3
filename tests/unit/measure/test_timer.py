import pytest

from scalelab.measure.timer import STAGES, StepTimer


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
    assert [t[s] for s in STAGES if s not in ("data", "forward", "backward", "optimizer")] == [0.0] * (len(STAGES) - 4)


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
