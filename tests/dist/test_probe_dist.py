"""A user's own training script measured: `scalelab run` and the probe, on 2 CPU ranks.

The script below is what people write (its own argparse, its own loop, DDP); the probe version adds the lines
marked `# PROBE` (5 added, 1 changed: the loop over `run.data(loader)`), the plain version is the same script
without them. Truths: injected sleeps in forward and backward, `scalelab train` on the same model and batch, and
the plain script's collectives."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CONTROL_RATIO, cli_env, run_cli
from seed_script import SEED, collectives, seed_script
from scalelab.analysis import keys
from scalelab.run.launch import free_port
from scalelab.store import Store
from scalelab.store.rundir import RunDir

pytestmark = pytest.mark.timeout(300)

def test_the_probe_adds_at_most_six_lines(tmp_path):
    added = [ln for ln in SEED.splitlines() if "# PROBE" in ln]
    assert len(added) <= 6


def scalelab_run(store: Path, script: Path, *args: str, ranks: int = 2):
    return run_cli(["run", "--store", str(store), "--ranks", str(ranks), "--", "python", str(script), *args],
                   timeout=240)


def only_run(store: Path) -> dict:
    rows = Store(store).list_runs()
    assert len(rows) == 1, rows
    return Store(store).get(rows["run_id"].iloc[0])


def test_stages_recover_injected_sleeps_and_counts_equal_scalelab_train(tmp_path):
    store = tmp_path / "store"
    done = scalelab_run(store, seed_script(tmp_path, probe=True), "--sleep-forward", "0.1",
                        "--sleep-backward", "0.15")
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run(store)
    assert run["kind"] == "script" and run["status"] == "completed"
    s = run["summary"]
    assert RunDir(run["dir"]).trace_file.exists()

    # the control: `scalelab train` on the script's model, batch and ranks, without the sleeps
    trained = run_cli(["train", "--store", str(tmp_path / "train"), "--model", "mlp", "--model-options",
                       "depth=2,width=64", "--dataset", "synthetic", "--samples", "1024", "--ranks", "2",
                       "--global-batch", "32", "--steps", "8"], timeout=240)
    assert trained.returncode == 0, trained.stderr[-3000:]
    t = only_run(tmp_path / "train")["summary"]
    # the sleep plus the model's own work (and, in backward, the wait for the other rank's all-reduce, which
    # scalelab's loop times as its own stage after backward): a figure of the machine and its load, bounded by the
    # control's, not by a constant
    for stage, sleep_ms, control in (("forward", 100, t[keys.stage_ms("forward")]),
                                     ("backward", 150, t[keys.stage_ms("backward")] + t[keys.stage_ms("comm")])):
        got = s[keys.stage_ms(stage)]
        print(f"\n{stage}: {got:.1f} ms, control {control:.1f} ms, injected {sleep_ms} ms")
        assert sleep_ms <= got <= CONTROL_RATIO * control + 1.3 * sleep_ms, (stage, got, control)
    for key in (keys.STEPS_TOTAL, keys.STEPS_TIMED, keys.COMM_BYTES_BACKWARD_PER_STEP, keys.COMM_BYTES_PER_STEP,
                keys.COMM_COLLECTIVES_PER_STEP):
        assert s[key] == t[key], key
    probe_steps = RunDir(run["dir"]).read_steps()
    train_steps = RunDir(only_run(tmp_path / "train")["dir"]).read_steps()
    assert sorted((r["rank"], r["step"], r["samples"]) for r in probe_steps) == sorted(
        (r["rank"], r["step"], r["samples"]) for r in train_steps)


def test_without_the_probe_the_run_has_the_same_steps_found_at_ddp_and_the_same_collectives(tmp_path):
    plain = scalelab_run(tmp_path / "plain", seed_script(tmp_path, probe=False), "--hook", "after")
    assert plain.returncode == 0, plain.stderr[-3000:]
    probed = scalelab_run(tmp_path / "probed", seed_script(tmp_path, probe=True), "--hook", "after")
    assert probed.returncode == 0, probed.stderr[-3000:]
    without, with_probe = only_run(tmp_path / "plain"), only_run(tmp_path / "probed")
    s = without["summary"]
    assert s[keys.SCRIPT_WALL_S] > 0
    assert s[keys.STEPS_BOUNDARY] == "ddp_forward" and with_probe["summary"][keys.STEPS_BOUNDARY] == "probe"
    # the steps scalelab found are the steps the probe marked: as many, the same samples and gradient bytes each
    found, marked = (sorted((r["rank"], r["step"], r["samples"], r["comm_bytes_backward"])
                            for r in RunDir(run["dir"]).read_steps()) for run in (without, with_probe))
    assert found == marked and s[keys.STEPS_TOTAL] == 8
    assert all(RunDir(without["dir"]).read_system(r) for r in (0, 1))
    assert collectives(without["dir"]) == collectives(with_probe["dir"])
    assert s[keys.COMM_BYTES_TOTAL] == with_probe["summary"][keys.COMM_BYTES_TOTAL] > 0
    assert s[keys.COMM_COLLECTIVES_TOTAL] == with_probe["summary"][keys.COMM_COLLECTIVES_TOTAL]


def test_a_hook_registered_before_the_probe_under_plain_torchrun(tmp_path):
    """No `scalelab run`: the script's probe records its own run; the user's hook was on the model first."""
    script = seed_script(tmp_path, probe=True)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--rdzv-backend", "static", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                             "--master-addr", "127.0.0.1", str(script), "--hook", "before", "--steps", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True,  # the ranks too are stopped if it hangs
                            env=cli_env({"SCALELAB_STORE": str(tmp_path / "store"), "GLOO_SOCKET_IFNAME": "lo"}))
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    run = only_run(tmp_path / "store")
    assert run["status"] == "completed" and run["kind"] == "script"
    rundir = RunDir(run["dir"])
    params = 4 * (3072 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10)
    assert all(r["comm_bytes_backward"] == params for r in rundir.read_steps())
    assert run["summary"][keys.STEPS_TOTAL] == 4


def test_a_script_that_raises_is_recorded_failed_with_its_traceback(tmp_path):
    done = scalelab_run(tmp_path / "store", seed_script(tmp_path, probe=True), "--raise-at", "3")
    assert done.returncode == 1
    run = only_run(tmp_path / "store")
    assert run["status"] == "failed"
    assert "injected failure at step 3" in run["reason"] and run["reason"].startswith("rank ")
    assert "ValueError: injected failure at step 3" in RunDir(run["dir"]).error_file.read_text()


def test_scale_sweeps_workers_over_the_users_script(tmp_path):
    script = seed_script(tmp_path, probe=True)
    done = run_cli(["scale", "--workers", "1,2", "--batches", "32", "--mode", "strong", "--launches", "1", "--store",
                    str(tmp_path / "store"), "--out", str(tmp_path / "out"), "--", "python", str(script),
                    "--batch", "{per_worker_batch}", "--steps", "6"], timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = Store(tmp_path / "store").list_runs()  # a noisy row is measured again (experiments.checked)
    assert set(rows["ranks"]) == {1, 2} and set(rows["kind"]) == {"script"} and set(rows["status"]) == {"completed"}
    table = (tmp_path / "out" / "scale_strong.csv").read_text().splitlines()
    assert len(table) == 3 and table[0].startswith("run_id,mode,workers,global_batch")
