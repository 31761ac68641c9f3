"""The Horovod engine on 2 real ranks under horovodrun (gloo, 127.0.0.1), against DDP on the same data.

Model: conftest's bias-free MLP (no buffers), so every byte on the wire is a gradient:
(3072*16 + 16*16 + 16*10) * 4 = 198272 bytes per step, three tensors. Both engines average gradients over the
ranks, so after N steps on the same batches their weights agree to floating-point rounding (checked on the
checkpoint both write at step CHECKPOINT_AT). Skips, with the reason, where Horovod is not installed.
"""
from __future__ import annotations

import json
import subprocess

import psutil
import pytest
import torch

from conftest import TINY_MLP, kill_rank, run_cli, start_cli, wait_for_steps, write_sleepy
from scalelab.analysis import hvdcomm, keys
from scalelab.config import TrainConfig
from scalelab.engines import registry
from scalelab.store import Store, read_jsonl

MISSING = registry.get("horovod").unavailable()
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

PARAM_BYTES = (3072 * 16 + 16 * 16 + 16 * 10) * 4  # 198272
STEPS, CHECKPOINT_AT = 5, 4


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "mlp.py"
    path.write_text(TINY_MLP)
    return f"{path}:make"


def train(root, model: str, *flags: str) -> dict:
    """One CLI run of 2 ranks on the MLP; its stored records."""
    proc = run_cli(["train", "--model", model, "--dataset", "synthetic", "--samples", "128", "--eval-samples", "16",
                    "--global-batch", "16", "--ranks", "2", "--steps", str(STEPS), "--lr", "0.1", "--seed", "3",
                    "--checkpoint-every", str(CHECKPOINT_AT), "--store", str(root), *flags], timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = Store(root).list_runs().iloc[-1]
    run_dir = root / "runs" / run["run_id"]
    state = torch.load(run_dir / "checkpoints" / f"step-{CHECKPOINT_AT:08d}" / "state.pt", weights_only=True)
    return {"row": run, "dir": run_dir, "steps": [read_jsonl(run_dir / f"steps.rank{r}.jsonl") for r in (0, 1)],
            "weights": state["model"], "summary": json.loads((run_dir / "summary.json").read_text())}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, mlp):
    return train(tmp_path_factory.mktemp("ddp"), mlp, "--sync", "ddp")


@pytest.fixture(scope="module")
def hvd(tmp_path_factory, mlp):
    return train(tmp_path_factory.mktemp("hvd"), mlp, "--engine", "horovod")


def test_gradient_bytes_per_step_equal_ddps(ddp, hvd):
    for run in (ddp, hvd):
        for records in run["steps"]:
            assert [r["comm_bytes_backward"] for r in records] == [PARAM_BYTES] * STEPS
            assert all(r["comm_bytes_forward"] == 0 for r in records)  # no buffers: nothing broadcast per step
    assert all(r["collectives"] == 3 for r in hvd["steps"][0])  # one allreduce per gradient tensor


def test_weights_after_n_steps_equal_ddps(ddp, hvd):
    assert ddp["weights"].keys() == hvd["weights"].keys()
    for name, w in ddp["weights"].items():
        torch.testing.assert_close(hvd["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(ddp["weights"]["1.weight"], torch.zeros_like(ddp["weights"]["1.weight"]))


def test_a_horovod_run_has_ddps_records(ddp, hvd):
    row = hvd["row"]
    assert row["status"] == "completed"
    assert json.loads((hvd["dir"] / "config.json").read_text())["engine"] == "horovod"
    # the same stages and the blocking wait, timed around the optimizer's synchronize()
    assert {"data(s)", "forward(s)", "backward(s)", "comm(s)", "optimizer(s)", "wait(s)"} <= set(hvd["steps"][0][-1])
    assert all(r["comm(s)"] > 0 for r in hvd["steps"][0])
    assert set(ddp["summary"]) - set(hvd["summary"]) <= {"comm/loopback_bytes_per_step"}
    assert (hvd["dir"] / "horovod_timeline.json").is_file()
    assert (hvd["dir"] / "trace.json").is_file()


def test_collective_times_come_from_horovods_timeline(hvd):
    """comm/time, comm/critical from rank 0's timeline, every timed step covered, and waiting for peers from every
    rank's enqueues on every timed step (Horovod's response cache leaves the timeline without ready ticks after
    step 1: CI's run of issue 43 got NaN from them); the meter's enqueue -> synchronize() records (which span
    backward) are not the time inside collectives."""
    s = hvd["summary"]
    assert s["comm/source"] == "horovod timeline, rank 0" and s["comm/not_available"] == hvdcomm.RANK0_ONLY
    assert s["comm/timeline_steps"] == s["steps/timed"]
    assert 0 < s["comm/time(ms)"] == s["comm/critical(ms)"] <= s["time/step_max(ms)"]
    assert s["comm/waiting_for_peers(ms)"] >= 0 and s["comm/hvd_fusion_copies(ms)"] >= 0
    assert 0 <= s["comm/waiting_for_peers_ci_low(ms)"] <= s["comm/waiting_for_peers_ci_high(ms)"]
    assert s["comm/time_ci_low(ms)"] <= s["comm/time(ms)"] <= s["comm/time_ci_high(ms)"]
    enqueue_to_sync = [1e3 * r["comm_total(s)"] for r in hvd["steps"][0] if not r["warmup"]]
    assert s["comm/time(ms)"] <= max(enqueue_to_sync) + 1.0  # the collective lies inside enqueue -> synchronize()


def test_a_straggler_is_waiting_for_peers_as_for_ddp(scenario_runs):
    """Known truth (issue 43): rank 1's forward sleeps 40 ms more a step (tests/dist/sense_scenarios.py), so its
    gradients are enqueued 40 ms after rank 0's and rank 0 waits for them: >= 80 % of 40 ms is waiting for peers,
    as test_sense_dist asserts for DDP. The control is the same Horovod config without the sleep, identical ranks:
    their waiting is the ordinary imbalance of 2 ranks on shared cores (a figure of the machine and its load, and
    of Horovod's background thread: above DDP's on the same config, 10.2 ms against DDP's 1 ms once in CI), which
    the straggler's waiting holds too. So no constant and no other engine's figure bounds it: the straggler's
    waiting less the control's is the sleep, at least half of it and at most 1.3 times it (issue 38)."""
    import sense_scenarios as sense

    folder = scenario_runs.folder
    hvd_of = {delay: scenario_runs(with_engine(sense.straggler(folder, delay_s=delay))) for delay in (sense.STRAGGLER_S,
                                                                                                      0.0)}
    injected = 1e3 * sense.STRAGGLER_S
    waiting = {delay: run["summary"][keys.COMM_PEERS_WAIT_MS] for delay, run in hvd_of.items()}
    low, high = (hvd_of[sense.STRAGGLER_S]["summary"][k] for k in keys.ci_keys(keys.COMM_PEERS_WAIT_MS))
    shown = {"injected(ms)": injected, "horovod(ms)": waiting, "interval": (low, high)}
    print(f"\nhorovod straggler: n={hvd_of[sense.STRAGGLER_S]['summary']['steps/timed']} {shown}")
    assert waiting[sense.STRAGGLER_S] >= 0.8 * injected, shown
    assert 0 <= low <= waiting[sense.STRAGGLER_S] <= high, shown
    # the separation of the cause from its absence: the control's waiting lies well below the straggler's, by
    # about the sleep (both hold the same imbalance, so it cancels whatever the machine's speed)
    assert 0.5 * injected <= waiting[sense.STRAGGLER_S] - waiting[0.0] <= 1.3 * injected, shown


def with_engine(cfg: TrainConfig) -> TrainConfig:
    from scalelab.lab.cells import with_fields

    return with_fields(cfg, engine="horovod", sync="auto")


def test_fp16_compression_halves_the_bytes(tmp_path, mlp):
    run = train(tmp_path, mlp, "--engine", "horovod", "--hvd-fp16", "--hvd-cycle-time-ms", "2",
                "--hvd-fusion-threshold", "1MiB")
    assert [r["comm_bytes_backward"] for r in run["steps"][0]] == [PARAM_BYTES // 2] * STEPS


def test_the_baseline_runs_the_same_loop_without_allreduce(tmp_path, mlp):
    run = train(tmp_path, mlp, "--engine", "horovod", "--noop-collectives")
    assert all(r["comm_bytes"] == 0 for records in run["steps"] for r in records)
    assert "comm/source" not in run["summary"]  # nothing handed to Horovod: no timeline figures to take
    # each rank kept its own gradients: the replicas differ after a step
    assert run["row"]["status"] == "completed"


def _rank_pid(proc: subprocess.Popen, rank: int) -> int | None:
    """The pid of Horovod rank `rank`: a worker (not a loader worker) whose HOROVOD_RANK is `rank`."""
    def worker(p: psutil.Process) -> bool:  # python -m scalelab.run.worker (not the shell that starts it)
        cmd = p.cmdline()
        return "scalelab.run.worker" in cmd and cmd[cmd.index("scalelab.run.worker") - 1] == "-m"

    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if worker(child) and not worker(child.parent()) and child.environ().get("HOROVOD_RANK") == str(rank):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


@pytest.fixture(scope="module")
def killed_rank(tmp_path_factory) -> dict:
    """A 2-rank Horovod run of a model sleeping 50 ms a step: the listening sockets its processes hold once both
    ranks train, then rank 1 SIGKILLed and what the run does about it. One run for the two tests below, each
    asserting its own property."""
    from dist.test_reliability_launch import listening_sockets, socket_inodes

    folder = tmp_path_factory.mktemp("killed_rank")
    root = folder / "store"
    proc = start_cli(["train", "--engine", "horovod", "--model", write_sleepy(folder, 0.05), "--samples", "4096",
                      "--global-batch", "8", "--ranks", "2", "--epochs", "3", "--store", str(root)])
    try:
        wait_for_steps(proc, root, rank=1, timeout=180)
        run_dir = wait_for_steps(proc, root, rank=0, timeout=60)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        listening = listening_sockets()
        held = {inode for p in family for inode in socket_inodes(p.pid)}
        victim = _rank_pid(proc, 1)
        assert victim is not None
        err, ended_after = kill_rank(proc, victim, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    _, alive = psutil.wait_procs(family, timeout=20)
    return {"addresses": {listening[i] for i in held if i in listening}, "returncode": proc.returncode,
            "err": err, "ended_after": ended_after, "alive": alive, "runs": Store(root).list_runs(),
            "run_dir": run_dir}


def test_a_killed_rank_fails_the_run_named_and_leaves_nothing(killed_rank):
    assert killed_rank["returncode"] != 0
    assert killed_rank["ended_after"] < 90
    alive = killed_rank["alive"]
    assert not alive, f"left behind: {[(p.pid, p.cmdline()) for p in alive if p.is_running()]}"
    runs = killed_rank["runs"]
    assert list(runs["status"]) == ["failed"]
    reason = runs["reason"][0]
    assert reason == "rank 1 killed by signal SIGKILL", reason
    err = killed_rank["err"]
    assert "rank 1" in err and "SIGKILL" in err, err[-800:]
    assert read_jsonl(killed_rank["run_dir"] / "steps.rank0.jsonl")


def test_every_listening_socket_of_the_run_is_on_loopback(killed_rank):
    """horovodrun's rendezvous server (every interface in Horovod), the side store and gloo: loopback only (read
    while both ranks train)."""
    addresses = killed_rank["addresses"]
    assert len(addresses) >= 3, addresses  # the side store, horovodrun's rendezvous, gloo's listeners
    assert all(host in ("127.0.0.1", "::1") for host, _ in addresses), addresses


def test_accumulation_syncs_once_per_step_and_keeps_the_weights(tmp_path, mlp, ddp):
    """--accumulate 2: Horovod counts two backward passes before it allreduces (backward_passes_per_step); the
    batch mean is the same, so the weights are DDP's (without accumulation) to rounding."""
    run = train(tmp_path, mlp, "--engine", "horovod", "--accumulate", "2")
    assert [r["comm_bytes_backward"] for r in run["steps"][0]] == [PARAM_BYTES] * STEPS
    for name, w in ddp["weights"].items():
        torch.testing.assert_close(run["weights"][name], w, rtol=1e-4, atol=1e-5, msg=name)


FAILS_ONCE = """
import os
import torch
from torch import nn

MARK = {mark!r}

class FailsOnce(nn.Module):
    '''Raises in its 5th training forward on every rank, until the file MARK exists.'''
    def __init__(self, spec):
        super().__init__()
        self.fc = nn.Linear(int(torch.tensor(spec.shape).prod()), spec.num_classes)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 5 and not os.path.exists(MARK):
                raise ValueError("injected failure")
        return self.fc(x.flatten(1))

def make(spec):
    return FailsOnce(spec)
"""


def test_a_failed_run_names_the_error_and_resumes_from_its_checkpoint(tmp_path):
    """A rank's exception is the run's one-line reason; `train --resume` continues under horovodrun from the
    checkpoint (optimizer state broadcast from rank 0) and completes."""
    mark = tmp_path / "fixed"
    model = tmp_path / "fails_once.py"
    model.write_text(FAILS_ONCE.format(mark=str(mark)))
    root = tmp_path / "store"
    first = run_cli(["train", "--engine", "horovod", "--ranks", "2", "--model", f"{model}:make", "--samples", "256",
                     "--global-batch", "16", "--steps", "8", "--checkpoint-every", "2", "--store", str(root)],
                    timeout=240)
    assert first.returncode == 1
    row = Store(root).list_runs().iloc[0]
    assert row["status"] == "failed"
    assert row["reason"].endswith("exited with code 1: ValueError: injected failure"), row["reason"]
    mark.write_text("")
    again = run_cli(["train", "--resume", row["run_id"], "--store", str(root)], timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from the checkpoint at step 4" in again.stdout
    row = Store(root).list_runs().iloc[0]
    assert row["status"] == "completed"
    steps = read_jsonl(root / "runs" / row["run_id"] / "steps.rank1.jsonl")
    assert [r["step"] for r in steps] == list(range(1, 9))
