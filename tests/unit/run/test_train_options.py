"""Each training option runs for real on a tiny config and leaves its trace in the records."""
from __future__ import annotations

import pytest
import torch

from scalelab.config import TrainConfig
from scalelab.run.execute import execute
from scalelab.store import read_json, read_jsonl

pytestmark = pytest.mark.timeout(180)
quiet = {"say": lambda s: None}


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", dataset="synthetic", samples=64, eval_samples=16, global_batch=16, steps=4,
                warmup_steps=1)
    return TrainConfig(**{**base, **kw})


def test_bf16_autocast_on_cpu_trains(store):
    out = execute(tiny(model="cnn", precision="bf16"), store, **quiet)
    assert store.get(out.run_id)["config"]["precision"] == "bf16"
    assert out.summary["train/loss"] == out.summary["train/loss"]  # not NaN


def test_activation_checkpointing_gives_the_same_first_loss(store):
    plain = execute(tiny(model="cnn", seed=3), store, **quiet)
    ckpt = execute(tiny(model="cnn", seed=3, checkpoint_segments=2), store, **quiet)
    first = [read_jsonl(o.run_dir / "steps.rank0.jsonl")[0]["loss"] for o in (plain, ckpt)]
    assert first[0] == pytest.approx(first[1], rel=1e-5)


def test_loader_workers_with_per_sample_decoding(store):
    out = execute(tiny(dataset="synthetic_jpeg", augment=True, num_workers=2, prefetch_factor=2, steps=6), store,
                  **quiet)
    steps = read_jsonl(out.run_dir / "steps.rank0.jsonl")
    assert len(steps) == 6 and all(r["data(s)"] >= 0 for r in steps)


def test_gpt_tiny_on_tokens_counts_token_accuracy(store):
    out = execute(tiny(model="gpt_tiny", dataset="synthetic_tokens", optimizer="adamw", lr=1e-3), store, **quiet)
    rec = read_jsonl(out.run_dir / "steps.rank0.jsonl")[0]
    assert rec["targets"] == rec["samples"] * 64  # next-token targets: one per position
    assert 0.0 <= out.summary["eval/acc"] <= 1.0


def test_eval_every_n_steps_and_epochs(store):
    out = execute(tiny(steps=None, epochs=2, eval_every=3), store, **quiet)  # 4 steps per epoch, 8 in all
    evals = read_json(out.run_dir / "result.rank0.json")["evals"]
    assert [e["step"] for e in evals] == [3, 6, 8]
    assert all(e["targets"] == 16 for e in evals)


def test_mnist1d_cnn_learns(store):
    out = execute(TrainConfig(model="cnn", dataset="mnist1d", global_batch=100, epochs=3, optimizer="adam",
                              lr=1e-2, warmup_steps=1), store, **quiet)
    assert out.summary["eval/acc"] > 0.5  # far above the 10 % of chance after 120 steps


USER_DATA = """
import torch
from torch.utils.data import TensorDataset

def make():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 40, generator=g)
    y = (x.mean(dim=(1, 2)) > 0).long()
    return TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:]), 2
"""


def test_user_dataset_from_a_file(store, tmp_path):
    path = tmp_path / "mydata.py"
    path.write_text(USER_DATA)
    out = execute(tiny(model="cnn", dataset=f"{path}:make", global_batch=8), store, **quiet)
    assert out.summary["steps/total"] == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: fp16 with GradScaler and CUDA timing")
def test_fp16_with_grad_scaler_on_cuda(store):
    out = execute(tiny(model="cnn", precision="fp16", device="cuda"), store, **quiet)
    assert out.summary["memory/cuda_max_allocated(GiB)"] > 0


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: DataParallel and NCCL")
def test_dataparallel_and_nccl_on_two_gpus(store):
    execute(tiny(wrapper="dp", device="cuda"), store, **quiet)
    execute(tiny(ranks=2, backend="nccl", device="cuda"), store, **quiet)
