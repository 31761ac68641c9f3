"""Steps found without the probe (scalelab.run.found_steps), on a fixed clock: a step per synced training forward of
the DDP model, eval forwards and no_sync micro-batches are no step, a skipped or doubled optimizer.step changes
nothing; without DDP the optimizer's step bounds them. Then a real 1-rank DDP model under the probe."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from scalelab.distenv import DistContext
from scalelab.run.found_steps import SPAN, FoundSteps
from scalelab.run.probe import Probe
from scalelab.store.rundir import RunDir
from scalelab.sync import intercept


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Loop:
    """A user's loop as the intercept reports it, on a fixed clock: `batch` samples a forward."""

    def __init__(self, batch: int = 8):
        self.clock, self.got, self.batch = Clock(), [], batch
        self.found = FoundSteps(lambda times, samples, end: self.got.append((times, samples)), clock=self.clock)
        self.net = SimpleNamespace(training=True, require_backward_grad_sync=True)

    def forward(self, seconds: float, *, sync: bool = True, net=None) -> None:
        net = net or self.net
        net.require_backward_grad_sync = sync
        self.found.forward(net, (torch.zeros(self.batch, 3),), {})
        self.clock.t += seconds
        self.found.after_forward(net)

    def optimizer(self, seconds: float) -> None:
        self.found.optimizer_begin()
        self.clock.t += seconds
        self.found.optimizer_end()

    def iteration(self, data: float = 0.5, fwd_bwd: float = 1.0, opt: float = 0.25) -> None:
        self.clock.t += data
        self.forward(fwd_bwd)
        self.optimizer(opt)


def test_a_step_runs_from_the_last_update_to_the_next_with_its_data_wait_and_span():
    loop = Loop()
    for _ in range(3):
        loop.iteration(data=0.5, fwd_bwd=1.0, opt=0.25)
    loop.clock.t += 7.0  # after the loop: no step
    loop.found.close()
    assert len(loop.got) == 3 and loop.found.boundary == "ddp_forward"
    first, *rest = loop.got
    assert first[0]["data"] == 0.0 and first[0]["wall"] == 1.25  # the first step starts at its forward
    for times, samples in rest:
        assert (times["data"], times[SPAN], times["optimizer"], times["other"], times["wall"]) == (
            0.5, 1.0, 0.25, 0.0, 1.75)
        assert samples == 8


def test_no_sync_micro_batches_are_one_step_with_their_samples_summed():
    loop = Loop(batch=4)
    for _ in range(3):
        loop.clock.t += 0.5
        for micro in range(4):
            loop.forward(1.0, sync=micro == 3)  # the first three inside no_sync
        loop.optimizer(0.25)
    loop.found.close()
    assert [s for _, s in loop.got] == [16, 16, 16]
    assert loop.got[1][0][SPAN] == 4.0 and loop.got[1][0]["data"] == 0.5


def test_eval_and_no_grad_forwards_are_no_step_and_their_time_lies_between_steps():
    loop = Loop()
    loop.iteration()
    loop.iteration()
    loop.net.training = False
    loop.forward(3.0)  # model.eval()
    loop.net.training = True
    with torch.no_grad():
        loop.forward(3.0)  # training mode, no grad: an evaluation all the same
    loop.iteration(data=0.5)
    loop.found.close()
    assert len(loop.got) == 3
    assert loop.got[2][0]["data"] == 0.5 and loop.got[2][0]["wall"] == 1.75  # the 6 s of evaluation in no step


def test_a_skipped_update_and_a_double_update_still_make_one_step_each():
    loop = Loop()
    loop.iteration()
    loop.clock.t += 0.5
    loop.forward(1.0)  # GradScaler found an overflow: no optimizer.step; the step ends at the next forward
    loop.clock.t += 0.5
    loop.forward(1.0)
    loop.optimizer(0.25)
    loop.optimizer(0.125)  # a second optimizer in the same iteration
    loop.iteration()
    loop.found.close()
    assert len(loop.got) == 4
    skipped, doubled = loop.got[1][0], loop.got[2][0]
    assert skipped[SPAN] == 1.5 and skipped["optimizer"] == 0.0 and skipped["wall"] == 2.0
    assert doubled["optimizer"] == 0.375 and doubled[SPAN] == 1.0 and doubled["data"] == 0.0


def test_only_the_first_ddp_model_bounds_steps():
    loop = Loop()
    other = SimpleNamespace(training=True, require_backward_grad_sync=True)
    for _ in range(2):
        loop.clock.t += 0.5
        loop.forward(1.0)
        loop.forward(1.0, net=other)  # a second DDP model (a GAN's discriminator) in the same step
        loop.optimizer(0.25)
    loop.found.close()
    assert len(loop.got) == 2 and loop.got[1][0][SPAN] == 2.0


def test_without_ddp_the_optimizer_step_bounds_steps_and_a_second_optimizer_joins_the_next():
    loop = Loop()
    for _ in range(3):
        loop.clock.t += 1.0
        loop.found.collective()  # a gradient all-reduce (Horovod's, or the script's own)
        loop.optimizer(0.25)
        loop.optimizer(0.125)  # a second optimizer: no collective since the first
    loop.found.close()
    assert loop.found.boundary == "optimizer_step"
    assert len(loop.got) == 3
    assert [t["optimizer"] for t, _ in loop.got] == [0.25, 0.375, 0.375]
    assert loop.got[1][0]["wall"] == 1.375


def test_a_real_ddp_model_under_the_probe_leaves_one_record_per_update(group, tmp_path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    probe = Probe(tmp_path, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, warmup_steps=0,
                  find_steps=True).start()
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 6)
    for _ in range(3):  # 4 micro-batches with no_sync, then the update
        for micro in range(4):
            if micro < 3:
                with model.no_sync():
                    model(x).sum().backward()
            else:
                model(x).sum().backward()
        opt.step()
        opt.step()  # a second call in the same iteration
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
    probe.close()
    steps = RunDir(tmp_path).read_steps(0)
    assert [r["samples"] for r in steps] == [20, 20, 20]
    assert all(r["collectives"] == 1 and r[f"{SPAN}(s)"] > 0 and r["optimizer(s)"] > 0 for r in steps), [
        {k: r[k] for k in ("collectives", f"{SPAN}(s)", "optimizer(s)")} for r in steps]
    assert RunDir(tmp_path).read_aggregates()[0]["boundary"] == "ddp_forward"


def test_a_script_that_marks_its_steps_is_not_found_again(group, tmp_path):
    from torch.nn.parallel import DistributedDataParallel as DDP

    probe = Probe(tmp_path, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, warmup_steps=0,
                  find_steps=True).start()
    probe.instrumented = True  # scalelab.probe.open()
    model = DDP(nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with probe.step(samples=5):
            model(torch.randn(5, 6)).sum().backward()
            opt.step()
    probe.close()
    assert len(RunDir(tmp_path).read_steps(0)) == 2
    assert RunDir(tmp_path).read_aggregates()[0]["boundary"] == "probe"


def test_a_scripts_summary_has_the_samples_of_a_step_and_the_data_wait_every_rank_had():
    """Per step the least data wait over ranks (one rank's wait alone is the others' waiting for peers); steps
    that not every rank kept, and warm-up steps, are left out."""
    from scalelab.analysis import keys
    from scalelab.run.script import step_batch_figures

    rec = lambda step, rank, data, warmup=False: {"step": step, "rank": rank, "warmup": warmup, "samples": 16,
                                                  "data(s)": data}
    records = [rec(1, 0, 9.0, True), rec(1, 1, 9.0, True), rec(2, 0, 0.1), rec(2, 1, 0.0), rec(3, 0, 0.05),
               rec(3, 1, 0.2), rec(4, 0, 0.3)]
    got = step_batch_figures(records)
    assert got[keys.SAMPLES_PER_STEP] == 32
    assert got[keys.DATA_WAIT_ALL_RANKS_MS] == pytest.approx(25.0)  # mean of 0 and 50 ms
    low, high = (got[k] for k in keys.ci_keys(keys.DATA_WAIT_ALL_RANKS_MS))
    assert low < 25.0 < high


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_a_found_steps_span_is_charged_for_the_device_work_it_queued():
    """Known truth: `torch.cuda._sleep` queues device work of a known length that the host does not wait for; the
    forward+backward span, bounded by CUDA events, holds it."""
    from conftest import cuda_sleep_cycles

    torch.cuda.init()
    loop = Loop()
    cycles = cuda_sleep_cycles(0.05)
    slept = []
    for _ in range(3):
        loop.found.forward(loop.net, (torch.zeros(8, 3),), {})
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        loop.optimizer(0.0)
        slept.append((a, b))
    loop.found.close()
    slept = [a.elapsed_time(b) / 1e3 for a, b in slept]
    assert loop.found.clock == "cuda_events" and len(loop.got) == 3
    for (times, _), sleep in zip(loop.got, slept):  # the host ran ahead; the events still charge the span
        assert times[SPAN] >= sleep > 0.02, (times, sleep)


def test_without_ddp_a_wrapping_optimizers_step_bounds_the_steps(group, tmp_path):
    """Horovod's DistributedOptimizer is a subclass of the user's optimizer whose step() all-reduces the gradients
    and calls its base's step(): one step per update, with its collective, however deep the calls nest."""

    class Averaging(torch.optim.SGD):
        def step(self, closure=None):
            for p in self.param_groups[0]["params"]:
                dist.all_reduce(p.grad)
            return super().step(closure)

    probe = Probe(tmp_path, DistContext(0, 1, 0, 1, torch.device("cpu")), heartbeat_s=None, warmup_steps=0,
                  find_steps=True).start()
    model = nn.Linear(6, 2)
    opt = Averaging(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(5, 6)).sum().backward()
        opt.step()
        opt.zero_grad()
    probe.close()
    steps = RunDir(tmp_path).read_steps(0)
    assert [r["collectives"] for r in steps] == [2, 2, 2]  # weight and bias, in the step they belong to
    assert RunDir(tmp_path).read_aggregates()[0]["boundary"] == "optimizer_step"
