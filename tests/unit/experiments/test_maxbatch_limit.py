"""Max batch: a batch is recommended only under a real limit (the CUDA device's memory, or a limit the user set),
and the recommendation names it; under the built-in study's demonstration cap a sentence says why not."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from scalelab.errors import ConfigError
from scalelab.experiments.max_batch import DEMONSTRATION, DEVICE, USER, limit_of, max_batch_result, study_options
from scalelab.lab.base import Result, StudyPlan

MIB = 2**20


def base(device: str = "cpu", memory_limit: int | None = None):
    return SimpleNamespace(resolved_device=device, memory_limit=memory_limit)


def opts(memory_limit=None, demo=None) -> dict:
    return {"memory_limit": memory_limit, "demonstration_cap": demo}


def test_which_limit_a_search_runs_under():
    assert limit_of(base(), opts(128 * MIB, 128 * MIB)) == (
        128 * MIB, DEMONSTRATION, "the study's demonstration cap of 128 MiB of address space (RLIMIT_AS, virtual "
                                  "memory)")
    # the user's own cap in a study file (it replaces the study's): theirs, not the demonstration
    assert limit_of(base(), opts(2048 * MIB, 128 * MIB)) == (2048 * MIB, USER,
                                                             "the limit you set, 2048 MiB (--memory-limit)")
    assert limit_of(base(memory_limit=64 * MIB), opts()) == (64 * MIB, USER, "the limit you set, 64 MiB (the "
                                                                            "config's memory_limit field)")
    assert limit_of(base("cuda"), opts(), "NVIDIA H100 80GB HBM3") == (
        None, DEVICE, "the CUDA memory of NVIDIA H100 80GB HBM3")
    # a study's demonstration cap means nothing on a GPU, whose own memory is the limit
    assert limit_of(base("cuda"), opts(128 * MIB, 128 * MIB))[:2] == (None, DEVICE)
    with pytest.raises(ConfigError, match="memory_limit"):
        limit_of(base(), opts())


def result(kind: str, words: str) -> Result:
    table = pd.DataFrame([{"variant": "as configured", "max_batch": 5, "trials": 6, "limit": kind},
                          {"variant": "bf16", "max_batch": 10, "trials": 5, "limit": kind}])
    return Result("max_batch", {"max_batch": table}, notes={"limit": words})


def test_the_demonstration_cap_recommends_nothing():
    lines, rec = max_batch_result(result(DEMONSTRATION, "the study's demonstration cap of 128 MiB of address space"))
    assert rec is None
    assert lines[0] == ("As configured, the largest batch under the study's demonstration cap of 128 MiB of address "
                        "space is 5 (found in 6 trials).")
    assert lines[-1].startswith("No batch is recommended: the study's cap is a demonstration, an arbitrary amount "
                                "of virtual memory")


@pytest.mark.parametrize("kind, words", [(USER, "the limit you set, 2048 MiB (--memory-limit)"),
                                         (DEVICE, "the CUDA memory of NVIDIA H100 80GB HBM3")])
def test_a_real_limit_gives_a_recommendation_that_names_it(kind, words):
    _, rec = max_batch_result(result(kind, words))
    assert rec == f"For the largest batch under {words}, use bf16: 10 samples fit."


def test_the_study_marks_its_cpu_cap_as_a_demonstration():
    cpu = study_options(StudyPlan(quick=False, gpus=0, comm_model={}))
    assert cpu["memory_limit"] == cpu["demonstration_cap"] == 128 * MIB
    gpu = study_options(StudyPlan(quick=False, gpus=1, comm_model={}))
    assert gpu["memory_limit"] is None and gpu["demonstration_cap"] is None


def test_one_cuda_rank_tries_batches_in_this_process_everything_else_in_processes_of_its_own(monkeypatch, tmp_path):
    """Where a trial runs: one plain rank on CUDA here (its cap is the allocator's fraction, undone after the run);
    on a CPU (RLIMIT_AS cannot be raised again) and with several ranks, torchrun starts it."""
    from scalelab import config
    from scalelab.config import TrainConfig
    from scalelab.experiments.max_batch import trials_here
    from scalelab.run.kinds import TRAIN

    monkeypatch.setattr(config, "cuda_device_count", lambda: 2)

    def spec(cfg, isolate=False):
        return TRAIN.launch_spec(cfg, tmp_path, isolate=isolate, resume=False)

    gpu = TrainConfig(model="mlp", dataset="synthetic", device="cuda", memory_limit=64 * MIB)
    cpu = TrainConfig(model="mlp", dataset="synthetic", device="cpu", memory_limit=64 * MIB)
    two = TrainConfig(model="mlp", dataset="synthetic", device="cuda", ranks=2, memory_limit=64 * MIB)
    assert trials_here(gpu) and not trials_here(cpu) and not trials_here(two)
    assert spec(gpu) is None  # a CUDA cap runs here
    assert spec(cpu) is not None and spec(two) is not None  # a CPU cap, two ranks: processes of their own
    assert spec(gpu, isolate=True) is not None  # asked to isolate, it still can
