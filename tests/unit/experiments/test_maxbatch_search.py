"""The search logic on known memory curves (no processes): exact answers, bounded trial counts."""
import math

import pytest

from scalelab.errors import ConfigError
from scalelab.experiments.max_batch import Trial, is_oom, search

MiB = 2**20


def linear_trial(per_sample, overhead, cap):
    def trial(b):
        used = overhead + per_sample * b
        return Trial(b, used <= cap, used if used <= cap else None)
    return trial


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 12, 100, 1000, 4097])
def test_linear_memory_finds_the_exact_limit_within_log2_plus_3_trials(limit):
    per, over = 8 * MiB, 3 * MiB
    cap = over + per * limit + per // 2  # limit fits, limit + 1 does not
    res = search(linear_trial(per, over, cap), limit_bytes=cap, say=lambda s: None)
    assert res.max_batch == limit
    assert res.n_trials <= math.ceil(math.log2(limit)) + 3 if limit > 1 else res.n_trials <= 3


@pytest.mark.parametrize("limit", [5, 37, 300])
def test_without_memory_measurements_doubling_and_bisection_are_exact(limit):
    res = search(lambda b: Trial(b, b <= limit), say=lambda s: None)
    assert res.max_batch == limit
    assert res.n_trials <= 2 * math.ceil(math.log2(limit)) + 2


def test_nonlinear_memory_still_converges_exactly():
    def trial(b):
        used = 1e6 * b ** 1.5
        return Trial(b, used <= 5e8, used)
    res = search(trial, limit_bytes=5e8, say=lambda s: None)
    assert res.max_batch == max(b for b in range(1, 200) if 1e6 * b ** 1.5 <= 5e8)


def test_multiples_of_the_rank_count():
    res = search(lambda b: Trial(b, b <= 22), start=4, step=4, say=lambda s: None)
    assert res.max_batch == 20 and all(t.batch % 4 == 0 for t in res.trials)


def test_nothing_fits():
    res = search(lambda b: Trial(b, False, reason="out of memory"), say=lambda s: None)
    assert res.max_batch == 0 and res.n_trials == 1


def test_bad_start():
    with pytest.raises(ConfigError):
        search(lambda b: Trial(b, True), start=3, step=2)


def test_oom_reasons():
    assert is_oom("rank 0 exited with code 1: RuntimeError: DefaultCPUAllocator: not enough memory: you tried")
    assert is_oom("rank 1 killed by signal SIGKILL")
    assert is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 314.00 MiB")
    assert not is_oom("ValueError: bad shape")


def test_cuda_libraries_wording_of_a_failed_allocation_is_out_of_memory():
    # as an H100 reported them at the edge of its memory (resnet18, batch 17664)
    assert is_oom("rank 0 exited with code 1: RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                  "`cublasCreate(handle)`")
    assert is_oom("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")


def test_on_cuda_a_failure_above_a_fitting_batch_counts_as_not_fitting(monkeypatch):
    """cuDNN words a failed workspace allocation as CUDNN_STATUS_INTERNAL_ERROR: once a smaller batch fitted on
    CUDA, any failure above it is memory (as under a CPU cap); before any fit, it stays an error."""
    from scalelab import config as config_module
    from scalelab.config import TrainConfig
    from scalelab.experiments import max_batch as mb

    monkeypatch.setattr(config_module, "cuda_device_count", lambda: 1)
    seen = []

    def fake_trial(cells, cfg, group, *, lenient=False):
        seen.append((cfg.global_batch, lenient))
        return Trial(cfg.global_batch, cfg.global_batch <= 4)

    monkeypatch.setattr(mb, "run_trial", fake_trial)
    result = mb.max_batch(TrainConfig(device="cuda", model="mlp"), cells=None, group="g", say=lambda s: None)
    assert result.max_batch == 4
    assert seen[0] == (1, False)  # nothing fitted yet: an error is an error
    assert all(lenient for batch, lenient in seen[1:])
