"""Each sync strategy's no-op variant (noop_collectives) on 2 real gloo ranks: same wrapper, no bytes, no
collective.
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
                sync = registry.build_sync(cfg, model, ctx, meter)
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
                        for p in model.parameters():
                            p.grad = None
                finally:
                    if noop:
                        for n, f in originals.items():
                            setattr(dist, n, f)
                    sync.close()
                results[f"{case}/{noop}"] = {"wrapper": type(net).__name__, "bytes": totals["comm_bytes"],
                                             "collectives": totals["collectives"], "calls": calls,
                                             "grad": torch.cat([g.flatten() for g in grad]).tolist()}
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
