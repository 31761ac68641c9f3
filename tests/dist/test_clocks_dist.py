"""The clock-offset estimator over a real 2-rank gloo group: on one host the offset is 0 by construction, so a
known offset is injected into rank 1's estimator clock (SKEW_ENV) and must come back within 1 ms."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import leave_group, spawn_ranks

from scalelab.measure import clocks

pytestmark = pytest.mark.timeout(180)


def _rank_main(rank: int, root: str, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    found = clocks.estimate_in_run(rank, 2)
    if rank == 0:
        Path(root, "clocks.json").write_text(json.dumps(found))
    leave_group(root, rank)


@pytest.mark.parametrize("skew_s", [0.0, 0.05])
def test_the_estimator_recovers_an_injected_offset_within_1_ms(tmp_path, monkeypatch, skew_s):
    from scalelab.run.launch import free_port

    monkeypatch.setenv(clocks.SKEW_ENV, f"1:{skew_s}")  # the spawned ranks inherit it; rank 1 applies it
    spawn_ranks(_rank_main, (str(tmp_path), free_port()))
    found = json.loads((tmp_path / "clocks.json").read_text())
    assert found["offsets(s)"][0] == 0.0
    error = abs(found["offsets(s)"][1] - skew_s)
    assert error < 1e-3, found
    assert error <= found["bounds(s)"][1] + 1e-9, found  # the bound holds: the true offset lies within it
    print(f"injected {skew_s * 1e3:.1f} ms: estimated {found['offsets(s)'][1] * 1e3:.4f} ms, error "
          f"{error * 1e6:.1f} µs, bound {found['bounds(s)'][1] * 1e6:.1f} µs")
