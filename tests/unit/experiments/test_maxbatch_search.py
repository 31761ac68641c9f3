"""The search logic on known memory curves (no processes): exact answers, bounded trial counts."""
import math

import pytest

from scalelab.errors import ConfigError
from scalelab.analysis import keys
from scalelab.experiments.max_batch import (GUESS_JUMP, GUESS_SHARE, Trial, activation_guess, is_oom,
                                           memory_by_kind, search)

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


def kinded_trial(per_sample, fixed, cap, *, step=1, temporaries=1.0, reported=1.0):
    """A rank holds `fixed` bytes plus `per_sample` activation bytes per sample of its batch, times `temporaries`
    (what the step needs beyond its saved activations); the trial reports `reported` times the true activations."""
    def trial(b):
        act = per_sample * b / step
        used = fixed + temporaries * act
        fits = used <= cap
        return Trial(b, fits, used if fits else None, activation_bytes=reported * act if fits else None,
                     fixed_bytes=fixed if fits else None)
    return trial


def test_activation_guess_is_the_largest_batch_under_the_limit():
    trial = Trial(8, True, activation_bytes=4 * 3 * MiB, fixed_bytes=10 * MiB)  # 2 ranks of 4 samples, 3 MiB each
    assert activation_guess(trial, 10 * MiB + 3 * MiB * 25.5, step=2) == 50  # 25 per rank fit, 26 do not
    assert activation_guess(Trial(8, True, 5e6), 1e9, step=2) is None  # no memory by kind: no guess


@pytest.mark.parametrize("limit", [1, 2, 7, 100, 4097])
def test_the_first_guess_aims_at_a_quarter_of_what_the_activations_predict_at_most_16x_past(limit):
    per, fixed = 8 * MiB, 300 * MiB
    cap = fixed + per * limit + per // 2
    res = search(kinded_trial(per, fixed, cap), limit_bytes=cap, say=lambda s: None)
    assert res.max_batch == limit
    assert [t.batch for t in res.trials][:2] == [1, max(min(limit // GUESS_SHARE, GUESS_JUMP), 2)]
    assert res.n_trials <= 4  # start, the guess, the line's b* (fits), b* + 1 (does not)


@pytest.mark.parametrize("temporaries,reported", [(1.6, 1.0), (2.8, 1.0), (1.0, 3.0), (2.5, 0.5)])
def test_activations_that_miss_still_give_the_exact_limit(temporaries, reported):
    per, fixed, limit, step = 2 * MiB, 50 * MiB, 333, 3
    cap = fixed + temporaries * per * limit + MiB // 4  # a rank's batch of `limit` fits, one more does not
    res = search(kinded_trial(per, fixed, cap, step=step, temporaries=temporaries, reported=reported), start=step,
                 step=step, limit_bytes=cap, say=lambda s: None)
    assert res.max_batch == limit * step
    assert all(t.batch % step == 0 for t in res.trials)
    bound = 4 if temporaries / reported < GUESS_SHARE else math.ceil(math.log2(limit)) + 3
    assert res.n_trials <= bound  # within 4x of the truth the guess fits and the line lands on b*


@pytest.mark.parametrize("limit", [50, 300, 3000])
def test_a_noisy_first_measurement_does_not_mislead_the_search(limit):
    """Memory is fixed + 1 MiB per sample, but the first trial (batch 1) reads 1 MiB high (page-sized RSS noise):
    the line through batches 1 and 2 is flat. The activations give the second point far out, and the search stays
    exact and logarithmic."""
    per, fixed = MiB, 50 * MiB
    cap = fixed + per * limit + per // 2

    def trial(b):
        used = fixed + per * b
        fits = used <= cap
        return Trial(b, fits, used + (MiB if b == 1 else 0) if fits else None,
                     activation_bytes=per * b if fits else None, fixed_bytes=fixed if fits else None)

    res = search(trial, limit_bytes=cap, say=lambda s: None)
    assert res.max_batch == limit
    assert res.n_trials <= math.ceil(math.log2(limit)) + 3


def test_memory_by_kind_of_a_summary():
    summary = {keys.MEMORY_ACTIVATIONS_BYTES: 5.0, keys.MEMORY_ACTIVATIONS_PEAK_BYTES: 7.0,
               keys.MEMORY_PARAMETERS_BYTES: 1.0, keys.MEMORY_GRADIENTS_BYTES: 1.0, keys.MEMORY_OPTIMIZER_BYTES: 2.0}
    assert memory_by_kind(summary) == {"activation_bytes": 7.0, "fixed_bytes": 4.0}
    assert memory_by_kind({keys.MEMORY_TRAIN_ADDED_BYTES: 9.0}) == {"activation_bytes": None, "fixed_bytes": None}


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

    def fake_trial(cells, cfg, group, *, after_fit=False, here=False):
        seen.append((cfg.global_batch, after_fit))
        assert here  # one rank on CUDA: every trial in this process
        return Trial(cfg.global_batch, cfg.global_batch <= 4)

    monkeypatch.setattr(mb, "run_trial", fake_trial)
    result = mb.max_batch(TrainConfig(device="cuda", model="mlp"), cells=None, group="g", say=lambda s: None)
    assert result.max_batch == 4
    assert seen[0] == (1, False)  # nothing fitted yet: an error is an error
    assert all(after_fit for batch, after_fit in seen[1:])


def test_only_an_allocation_failure_means_does_not_fit():
    from scalelab.config import TrainConfig
    from scalelab.experiments.max_batch import allocation_failure

    capped = TrainConfig(model="mlp", memory_limit=2**30)
    after, before = allocation_failure(capped, after_fit=True), allocation_failure(capped, after_fit=False)
    assert after("rank 0: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert after("rank 0 killed by signal SIGSEGV")  # native code crashing on a failed allocation under the cap
    assert after("rank 0: RuntimeError: could not create a primitive") and not before("could not create a primitive")
    assert not after("rank 1 made no progress for 120 s (hang timeout): the watchdog ended the run")
    assert not after("timed out after 600 s")
    assert not after("rank 0: ValueError: a deliberate failure that is not memory")
    assert not allocation_failure(TrainConfig(model="mlp", device="cpu", memory_limit=None), True)(
        "rank 0 killed by signal SIGSEGV")  # without a cap a crash is a crash


def test_a_failure_that_is_not_memory_stops_the_search_with_its_reason():
    """Batches up to 4 fit, 8 runs out of memory, 6 fails for another reason: the search stops at 6 and says
    4 is a lower bound."""
    def trial(b):
        if b == 6:
            return Trial(b, False, reason="rank 0: ValueError: boom", memory=False)
        return Trial(b, b <= 4, reason=None if b <= 4 else "out of memory")

    said = []
    result = search(trial, start=1, say=said.append)
    assert result.max_batch == 4 and result.stopped.batch == 6 and result.stopped.reason == "rank 0: ValueError: boom"
    assert [t.batch for t in result.trials] == [1, 2, 4, 8, 6]
    assert said[-1] == ("trial 5: batch 6 failed for a reason other than memory (rank 0: ValueError: boom); "
                        "the search stops here")


def test_the_table_and_sentence_name_a_failure_that_is_not_memory():
    import pandas as pd

    from scalelab.experiments.max_batch import max_batch_result

    class Result:
        notes = {"limit": "the limit you set, 64 MiB (--memory-limit)"}
        tables = {"max_batch": pd.DataFrame([
            {"variant": "as configured", "max_batch": 4, "trials": 5, "limit": "user", "stopped_at": 6.0,
             "failure": "rank 0: ValueError: boom"},
            {"variant": "bf16", "max_batch": 3, "trials": 4, "limit": "user", "stopped_at": None, "failure": None}])}
    words, rec = max_batch_result(Result())
    assert ("The search (as configured) stopped at batch 6, which failed for a reason other than memory (rank 0: "
            "ValueError: boom); 4 is a lower bound, not the largest batch that fits.") in words
    assert rec is None and words[-1].startswith("No batch is recommended: as configured's search ended")
