"""The step log's bookkeeping does not grow with the run: each flush appends its own records and holds no others."""
from __future__ import annotations

import json

import pytest
import torch

from scalelab.errors import StoreError
from scalelab.store.files import append_jsonl, read_jsonl
from scalelab.train.loop import StepLog

FLUSH_EVERY = 100


def record(step: int) -> dict:
    return {"step": step, "epoch": 0, "rank": 0, "warmup": False, "lr": 0.1, "samples": 64, "targets": 64,
            "wall(s)": 0.125, "forward(s)": 0.03125}


def test_bytes_written_and_records_held_per_flush_do_not_grow(tmp_path):
    log = StepLog(tmp_path / "steps.rank0.jsonl")
    per_flush = {}  # last step of a flush -> (records held at the flush, bytes it wrote)
    for step in range(1, 10_001):
        log.add(record(step), torch.tensor(2.0), torch.tensor(32))
        if step % FLUSH_EVERY == 0:
            held = len(log.pending)
            log.flush()
            per_flush[step] = (held, log.flushed_bytes)
            assert not log.pending
    (held_100, bytes_100), (held_10k, bytes_10k) = per_flush[100], per_flush[10_000]
    assert held_100 == held_10k == FLUSH_EVERY
    # the same records but for the step numbers' digits (steps 1-100 against 9901-10000); had the flush rewritten
    # the file, the one at step 10,000 would write ~100x the bytes of the one at step 100
    digits = sum(len(str(s)) for s in range(9_901, 10_001)) - sum(len(str(s)) for s in range(1, 101))
    assert bytes_10k - bytes_100 == digits
    lines = (tmp_path / "steps.rank0.jsonl").read_text().splitlines()
    assert len(lines) == 10_000 and json.loads(lines[-1])["step"] == 10_000
    assert sum(b for _, b in per_flush.values()) == (tmp_path / "steps.rank0.jsonl").stat().st_size
    assert json.loads(lines[0])["loss"] == 2.0 and json.loads(lines[0])["acc"] == 0.5


def test_restart_keeps_records_up_to_the_checkpoint_and_a_fresh_run_none(tmp_path):
    path = tmp_path / "steps.rank0.jsonl"
    append_jsonl(path, [record(s) for s in range(1, 11)])
    log = StepLog(path)
    log.restart_at(6)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5, 6]
    log.add(record(7), torch.tensor(1.0), torch.tensor(1))
    log.flush()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3, 4, 5, 6, 7]
    StepLog(path).restart_at(0)
    assert read_jsonl(path) == []


def test_a_torn_last_line_is_skipped_and_a_corrupt_middle_line_is_not(tmp_path):
    path = tmp_path / "steps.rank0.jsonl"
    append_jsonl(path, [record(1), record(2)])
    with open(path, "a") as f:
        f.write('{"step": 3, "ep')  # an append cut short by a kill
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
    with pytest.raises(StoreError, match=":2: corrupt JSON line"):
        read_jsonl(path)


def test_a_flush_reads_every_pending_loss_and_count_in_one_copy_exactly(tmp_path):
    """One read per flush, whatever the records held (on CUDA each read is a device-to-host copy); a float32 loss
    and a count come back exactly as `.item()` gives them."""
    from scalelab.train.loop import scalar_reader

    reads = []
    plain = scalar_reader(torch.device("cpu"))

    def spy(tensors):
        reads.append(len(tensors))
        return plain(tensors)

    log = StepLog(tmp_path / "steps.rank0.jsonl")
    losses = [torch.tensor(v, dtype=torch.float32) for v in (2.302585, 0.1, 1e-7)]
    for step, loss in enumerate(losses, 1):
        log.add(record(step), loss, torch.tensor(17 * step))
    log.flush(spy)
    assert reads == [6]
    rows = read_jsonl(tmp_path / "steps.rank0.jsonl")
    assert [r["loss"] for r in rows] == [loss.item() for loss in losses]
    assert [r["acc"] for r in rows] == [17 * s / 64 for s in (1, 2, 3)]
    log.flush(spy)  # nothing pending: nothing read
    assert reads == [6, 0]
