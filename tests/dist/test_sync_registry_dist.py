"""Each sync strategy's no-op variant (noop_collectives) on 2 real gloo ranks: same wrapper, no bytes, no
collective, and everything else the strategy does still done: DDP's comm hook fires for every bucket and divides
the gradients, the bucketed strategy packs its buckets and divides, rank 0 still averages in gather/scatter.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import leave_group, spawn_ranks
from scalelab.config import TrainConfig
from scalelab.sync import registry


# ---------------------------------------------------------------- no-op variants on 2 gloo ranks

NOOP_CASES = {"allreduce": {}, "gather_scatter": {}, "bucketed": {"bucket_mb": 1e-3}, "ddp": {"bucket_mb": 1e-3},
              "ddp_fp16": {"ddp_hook": "fp16"}}


def _rank_main(rank: int, out: str, port: int) -> None:
    import torch.distributed as dist
    from torch import nn

    from scalelab.distenv import DistContext
    from scalelab.sync.meter import CommMeter

    from scalelab.sync import bucketed, ddp, gather_scatter

    work = {"hook": 0, "average": 0, "pack": 0}  # the strategies' own work, counted where it happens
    make_hook, average, launch = ddp.local_hook, gather_scatter.GatherScatterSync.average, bucketed.BucketedSync._launch

    def counting_hook(dtype):
        inner = make_hook(dtype)

        def hook(state, bucket):
            work["hook"] += 1
            return inner(state, bucket)
        return hook

    def counting_average(parts):
        work["average"] += 1
        return average(parts)

    def counting_launch(self, b):
        work["pack"] += 1
        return launch(self, b)

    ddp.local_hook = counting_hook
    gather_scatter.GatherScatterSync.average = staticmethod(counting_average)
    bucketed.BucketedSync._launch = counting_launch
    os.environ.update(GLOO_SOCKET_IFNAME="lo", RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ctx = DistContext(rank, 2, rank, 2, torch.device("cpu"))
    results = {}
    try:
        for case, kw in NOOP_CASES.items():
            sync_name = case.split("_fp16")[0]
            for noop in (True, False):
                torch.manual_seed(0)
                model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
                cfg = TrainConfig(ranks=2, global_batch=4, sync=sync_name, noop_collectives=noop, **kw)
                meter = CommMeter(2)
                plain = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
                plain.load_state_dict(model.state_dict())  # the rank's own gradient, for comparison
                sync = registry.build_sync(cfg, model, ctx, meter)
                work.update(hook=0, average=0, pack=0)
                calls = []
                if noop:  # a Python-level collective issued after construction is counted
                    originals = {n: getattr(dist, n) for n in ("all_reduce", "gather", "scatter", "broadcast")}
                    for n, f in originals.items():
                        setattr(dist, n, lambda *a, _n=n, _f=f, **k: (calls.append(_n), _f(*a, **k))[1])
                try:
                    net = sync.wrap()
                    for step in range(3):  # DDP rebuilds its buckets after the first step
                        x = torch.full((2, 8), float(rank + 1 + step))  # different data on each rank
                        with sync.micro_step(last=True):
                            net(x).pow(2).sum().backward()
                        sync.after_backward()
                        totals = meter.take_step()
                        grad = [p.grad.clone() for p in model.parameters()]
                        plain(x).pow(2).sum().backward()
                        local = [p.grad.clone() for p in plain.parameters()]
                        for p in [*model.parameters(), *plain.parameters()]:
                            p.grad = None
                finally:
                    if noop:
                        for n, f in originals.items():
                            setattr(dist, n, f)
                    sync.close()
                results[f"{case}/{noop}"] = {"wrapper": type(net).__name__, "bytes": totals["comm_bytes"],
                                             "collectives": totals["collectives"], "calls": calls,
                                             "grad": torch.cat([g.flatten() for g in grad]).tolist(),
                                             "local": torch.cat([g.flatten() for g in local]).tolist(),
                                             "work": dict(work)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_group(out, rank)


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_noop_collectives_keep_the_wrapper_but_issue_and_meter_no_collective(tmp_path):
    from scalelab.run.launch import free_port

    spawn_ranks(_rank_main, (str(tmp_path), free_port()))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for case in NOOP_CASES:
        real, noop = r0[f"{case}/False"], r0[f"{case}/True"]
        assert noop["wrapper"] == real["wrapper"] == ("DistributedDataParallel" if case.startswith("ddp")
                                                      else "Sequential"), case
        assert real["bytes"] > 0 and real["collectives"] > 0, case
        assert noop["bytes"] == 0 and noop["collectives"] == 0 and noop["calls"] == [], case
        assert noop["calls"] == r1[f"{case}/True"]["calls"] == []
        # really synced: the ranks hold the same gradients; no-op: each keeps its own (different data)
        assert real["grad"] == pytest.approx(r1[f"{case}/False"]["grad"]), case
        assert noop["grad"] != pytest.approx(r1[f"{case}/True"]["grad"]), case


@pytest.mark.dist
@pytest.mark.timeout(150)
def test_noop_collectives_keep_the_strategies_own_work(tmp_path):
    from scalelab.run.launch import free_port

    spawn_ranks(_rank_main, (str(tmp_path), free_port()))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    steps, params = 3, 4  # two Linear layers with biases
    for rank, r in ((0, r0), (1, r1)):
        for case in ("allreduce", "bucketed", "ddp", "ddp_fp16"):
            noop = r[f"{case}/True"]
            # divided by the world size, as the real sync does before or after its collective; fp16 rounds
            tol = 2e-3 if case == "ddp_fp16" else 1e-6
            assert noop["grad"] == pytest.approx([g / 2 for g in noop["local"]], rel=tol, abs=1e-6), (case, rank)
        # DDP's comm hook fires for every bucket of every step (bucket_mb 1e-3: a bucket per parameter after the
        # first step's single bucket), also in the fp16 variant
        assert r["ddp/True"]["work"]["hook"] >= steps, rank
        assert r["ddp_fp16/True"]["work"]["hook"] >= steps, rank
        # the bucketed strategy packs (and unpacks) its bucket every step (the 184 gradient bytes fit one bucket)
        assert r["bucketed/True"]["work"]["pack"] == r["bucketed/False"]["work"]["pack"] == steps, rank
        # gather/scatter: the gradients stay the rank's own (undivided), and rank 0 still averages every parameter
        gs = r["gather_scatter/True"]
        assert gs["grad"] == pytest.approx(gs["local"]), rank
        assert gs["work"]["average"] == r["gather_scatter/False"]["work"]["average"] == \
            (steps * params if rank == 0 else 0), rank
