"""The lost-speedup breakdown on real ranks, against injected truths (issue 31): each case runs the 2-rank config,
its 1-worker run, its no-sync variant and its no-op-collectives variant, and the breakdown
(scalelab.analysis.breakdown) must put the injected time in the part that owns it. Each test prints n, the
attributed time and its interval beside the injected time (`pytest -s` shows them)."""
from __future__ import annotations

import textwrap

import pytest
import sense_scenarios as sense
from conftest import CONTROL_RATIO, run_cli

from scalelab.analysis import keys
from scalelab.analysis.breakdown import LEAVES, breakdown_of_runs, sum_of_parts
from scalelab.config import TrainConfig
from scalelab.lab.cells import with_fields
from scalelab.lab.explain import explain
from scalelab.store import Store

pytestmark = [pytest.mark.dist, pytest.mark.timeout(420)]

# a data path 2 ms per sample slower on the ranks of a multi-rank run than on one worker (a shared filesystem, say)
MULTI_RANK_SLOW_DATA = """
import os, time
import torch
from torch.utils.data import Dataset


class SlowWhenShared(Dataset):
    '''Every sample takes {sleep} s longer to load when WORLD_SIZE > 1.'''

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 1, 32, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.sleep = {sleep} if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0.0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        time.sleep(self.sleep)
        return self.x[i], self.y[i]


def make():
    return SlowWhenShared(256, 0), SlowWhenShared(16, 1), 4
"""


def _runs(cfg, scenario_runs, names=("real", "one", "nosync", "noop")) -> dict:
    """The real run and its variants, stored runs as {config, summary} (each config launched once a session)."""
    variants = {"real": cfg, "one": with_fields(cfg, ranks=1), "nosync": with_fields(cfg, sync="noop"),
                "noop": with_fields(cfg, noop_collectives=True)}
    return {name: scenario_runs(variants[name]) for name in names}


def _part(table, name) -> dict:
    return table.set_index("part").loc[name].to_dict()


def _say(case: str, n: int, part: dict, injected_ms: float) -> None:
    print(f"\n{case}: n={n} attributed {part['value(ms)']:.1f} ms "
          f"(interval {part['value_ci_low(ms)']:.1f}-{part['value_ci_high(ms)']:.1f}) vs injected {injected_ms:.1f} ms")


def test_a_straggler_is_waiting_for_peers(scenario_runs):
    """Rank 1's forward sleeps 40 ms more per step (allreduce, blocking): the breakdown puts >= 80 % of it in
    waiting for peers, not in compute slowdown. The control is the same config without the sleep (its 1-worker run
    is the straggler's: one rank never sleeps)."""
    folder = scenario_runs.folder
    runs = _runs(sense.straggler(folder), scenario_runs)
    table = breakdown_of_runs(runs["real"], one=runs["one"], nosync=runs["nosync"], noop=runs["noop"])
    control_runs = _runs(sense.straggler(folder, delay_s=0.0), scenario_runs, ("real", "nosync"))
    control = breakdown_of_runs(control_runs["real"], one=runs["one"], nosync=control_runs["nosync"])
    injected = 1e3 * sense.STRAGGLER_S
    waiting, compute = _part(table, "waiting"), _part(table, "compute")
    _say("straggler", runs["real"]["summary"]["steps/timed"], waiting, injected)
    print(table[["part", "value(ms)", "value_ci_low(ms)", "value_ci_high(ms)", "measured"]].to_string())
    shown = {"injected(ms)": injected, **{f"{part}(ms)": (round(_part(table, part)["value(ms)"], 2),
                                                          round(_part(control, part)["value(ms)"], 2))
                                          for part in ("waiting", "compute")}}  # (straggler, control)
    print(shown)
    assert table["measured"].all(), table
    # the sleep, on top of the ordinary imbalance of 2 ranks on shared cores (the control's: it scales with the
    # machine and its load)
    assert 0.8 * injected <= waiting["value(ms)"] <= _part(control, "waiting")["value(ms)"] + 1.3 * injected, shown
    # the straggler's time is not the fastest rank's compute: the compute slowdown is the control's (2 ranks on
    # shared cores against one, a figure of the machine and its load, either sign), within the noise of two runs
    # on busy cores (6 ms seen at load 7 on 2 cores), far below the 40 ms it would gain if it held the sleep
    assert compute["value(ms)"] <= _part(control, "compute")["value(ms)"] + 0.5 * injected, shown
    assert sum_of_parts(table) == pytest.approx(runs["real"]["summary"]["time/step_median(ms)"])


def test_a_data_delay_is_data_wait(tmp_path, scenario_runs):
    """Each sample takes 2 ms more to load on the 2-rank run than on one worker: 8 samples per rank, 16 ms a
    step beyond the 1-worker run's data wait. (Its compute part is not asserted: 2 ranks of a tiny MLP on 2 shared
    cores are slower per sample than one, 8 ms of a 5 ms ideal step in one run, with or without the delay.) The
    control is the same 2-rank config without the delay: test_sense_dist's (its dataset sleeps on any number of
    ranks, 0 s here, so it is this one's)."""
    dataset = tmp_path / "slow_shared.py"
    dataset.write_text(textwrap.dedent(MULTI_RANK_SLOW_DATA.format(sleep=sense.DATA_SLEEP_S)))
    cfg = with_fields(sense.data_wait(tmp_path), dataset=f"{dataset}:make")
    runs = _runs(cfg, scenario_runs)
    table = breakdown_of_runs(runs["real"], one=runs["one"], nosync=runs["nosync"], noop=runs["noop"])
    injected = 1e3 * sense.DATA_SLEEP_S * sense.PER_RANK_BATCH
    data = _part(table, "data")
    _say("data delay", runs["real"]["summary"]["steps/timed"], data, injected)
    print(table[["part", "value(ms)", "value_ci_low(ms)", "value_ci_high(ms)", "measured"]].to_string())
    # the data part is already a difference against a run without the delay (the 1-worker run's data wait); its
    # noise is that of the loader's own work, which the control's data stage measures on this machine (no constant)
    own = scenario_runs(sense.data_wait(scenario_runs.folder, sleep_s=0.0))["summary"][keys.stage_ms("data")]
    print(f"control's data stage {own:.2f} ms")
    assert 0.8 * injected <= data["value(ms)"] <= 1.5 * injected + own, (own, table)
    # both ranks wait for their own data alike: the delay is not a peer's wait. What ranks wait for each other is
    # the ordinary imbalance of 2 ranks on 2 shared cores, a figure of the machine and its load (1.5-3 ms on a quiet
    # machine, 2-17 ms at load 7 on 2 cores), which the control measures; the 16 ms would come on top of it if the
    # delay were counted as a peer's
    control = scenario_runs(sense.data_wait(scenario_runs.folder, sleep_s=0.0))["summary"][keys.COMM_PEERS_WAIT_MS]
    print({"injected(ms)": injected, "waiting(ms)": (_part(table, "waiting")["value(ms)"], control)})
    assert _part(table, "waiting")["value(ms)"] <= CONTROL_RATIO * control + 0.5 * injected, (control, table)


def test_a_smaller_batch_without_sync_is_compute_slowdown_only(scenario_runs, sleepy_model):
    """2 ranks with no sync at all, each on half the batch, of a model whose forward costs a fixed 40 ms a step
    whatever its batch: the ideal step halves that cost, the ranks cannot, so the compute slowdown is about 20 ms;
    every communication part is 0, measured. The control is the same model without the sleep."""
    fixed_s = 0.04
    cfg = TrainConfig(model=sleepy_model(fixed_s), dataset="synthetic", samples=512, eval_samples=16,
                      global_batch=64, steps=14, warmup_steps=2, ranks=2, sync="noop", sample_interval_s=0.5,
                      threads=1)  # one thread per rank on 1 and 2 ranks alike (2 threads of one rank stalled
    # behind a neighbour's tests: 42 ms of compute for a linear layer, against 2 ms on a rank of one thread)
    runs = _runs(cfg, scenario_runs, ("real", "one"))
    table = breakdown_of_runs(runs["real"], one=runs["one"])  # a run without sync is its own no-op variants
    control_runs = _runs(with_fields(cfg, model=sleepy_model(0.0)), scenario_runs, ("real", "one"))
    control = _part(breakdown_of_runs(control_runs["real"], one=control_runs["one"]), "compute")["value(ms)"]
    compute = _part(table, "compute")
    injected = 1e3 * fixed_s / 2
    _say("half batch, no sync (compute slowdown)", runs["real"]["summary"]["steps/timed"], compute, injected)
    print(table[["part", "value(ms)", "value_ci_low(ms)", "value_ci_high(ms)", "measured"]].to_string())
    print({"injected(ms)": injected, "compute(ms)": (compute["value(ms)"], control)})  # (run, control)
    assert table["measured"].all(), table
    # the fixed cost the ranks cannot halve, on top of the layer's own slowdown on 2 ranks of shared cores (the
    # control's: a figure of the machine and its load, either sign)
    assert 0.8 * injected <= compute["value(ms)"] <= control + 1.5 * injected, (control, table)
    # the whole gap is data and compute, exactly
    assert compute["value(ms)"] + _part(table, "data")["value(ms)"] == pytest.approx(table.attrs["gap(ms)"])
    for part in ("sync_work", "exposed", "waiting", "wire", "interference", "hidden"):
        assert _part(table, part)["value(ms)"] == 0, (part, table)
    assert set(LEAVES) <= set(table["part"])
    assert sum_of_parts(table) == pytest.approx(runs["real"]["summary"]["time/step_median(ms)"])


STRAGGLING_SCRIPT = '''
import argparse, time
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from scalelab import probe

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int)
a = p.parse_args()
distributed = int(__import__("os").environ.get("WORLD_SIZE", "1")) > 1
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
model = DDP(model) if distributed else model
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(a.batch, 32), torch.randint(0, 4, (a.batch,))
run = probe.open()
for i in range(14):
    with run.step(samples=a.batch):
        with run.stage("forward"):
            if distributed and dist.get_rank() == 1:
                time.sleep({delay})
            loss = F.cross_entropy(model(x), y)
        with run.stage("backward"):
            loss.backward()
        with run.stage("optimizer"):
            opt.step()
            opt.zero_grad()
if distributed:
    dist.destroy_process_group()
'''


def test_a_scripts_straggler_is_waiting_for_peers_in_explain(tmp_path):
    """The user's own script under `scalelab run` (the probe's view): rank 1 sleeps 40 ms in forward. `scalelab
    explain` on its 2-rank run, beside the same script on 1 worker, puts it in waiting for peers; the parts that
    need a variant without sync are not measured. The control is the same script without the sleep."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(STRAGGLING_SCRIPT.replace("{delay}", str(sense.STRAGGLER_S))))
    store = tmp_path / "store"
    ids = {}
    for ranks in (1, 2):
        done = run_cli(["run", "--store", str(store), "--ranks", str(ranks), "--global-batch", "16", "--",
                        "python", str(script), "--batch", "{per_worker_batch}"], timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        ids[ranks] = Store(store).list_runs()["run_id"].iloc[0]
    ex = explain(Store(store), ids[2])
    table = ex.table
    assert ex.named["one"]["run_id"] == ids[1]
    waiting = _part(table, "waiting")
    injected = 1e3 * sense.STRAGGLER_S
    _say("straggler in a user's script (probe)", ex.run["summary"]["steps/timed"], waiting, injected)
    print(table[["part", "value(ms)", "value_ci_low(ms)", "value_ci_high(ms)", "measured"]].to_string())
    # the control: the same script on 2 ranks without the sleep; what its ranks wait for each other is the ordinary
    # imbalance of 2 ranks on shared cores (a figure of the machine and its load) that the sleep comes on top of
    control_script = tmp_path / "control.py"
    control_script.write_text(textwrap.dedent(STRAGGLING_SCRIPT.replace("{delay}", "0.0")))
    control_store = tmp_path / "control"
    done = run_cli(["run", "--store", str(control_store), "--ranks", "2", "--global-batch", "16", "--", "python",
                    str(control_script), "--batch", "{per_worker_batch}"], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    control_id = Store(control_store).list_runs()["run_id"].iloc[0]
    control = Store(control_store).get(control_id)["summary"][keys.COMM_PEERS_WAIT_MS]
    print({"injected(ms)": injected, "waiting(ms)": (waiting["value(ms)"], control)})  # (run, control)
    assert 0.8 * injected <= waiting["value(ms)"] <= control + 1.3 * injected, (control, table)
    for part in ("compute", "sync_work", "exposed", "interference", "hidden"):
        assert not _part(table, part)["measured"], (part, table)
    assert _part(table, "ideal")["measured"] and _part(table, "wire")["measured"]
    shown = run_cli(["explain", ids[2], "--store", str(store)], timeout=60)
    assert shown.returncode == 0 and "waiting for peers" in shown.stdout, shown.stderr
