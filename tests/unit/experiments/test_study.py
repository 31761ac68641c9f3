"""Study specs: interpretation of the data, bad study files, the default study's options and notes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from scalelab.experiments import strategies as interpret
from scalelab.errors import ConfigError
from scalelab.lab.registry import get, names
from scalelab.lab.study import StudySpec, load_spec

pytestmark = pytest.mark.timeout(600)


def strategy_table(steps: dict, noise: float = 1.0, launches: int = 3) -> pd.DataFrame:
    return pd.DataFrame([{"sync": s, "status": "completed", "launches": launches, "step(ms)": t,
                          "step_ci_low(ms)": t - noise,
                          "step_ci_high(ms)": t + noise, "comm(ms)": 10.0,
                          "exposed_comm(ms)": t - 50.0, "overlap": 1 - (t - 50.0) / 10.0 if s != "noop" else None,
                          "bytes_per_step": 100.0} for s, t in steps.items()])


def test_interpretation_follows_the_data():
    a, rec_a = interpret.strategies(strategy_table({"allreduce": 60.0, "ddp": 55.0, "noop": 50.0}))
    b, rec_b = interpret.strategies(strategy_table({"allreduce": 52.0, "ddp": 58.0, "noop": 50.0}))
    assert rec_a.recommends and rec_a.chosen.label == "ddp" and a[0] == rec_a.card()
    assert rec_b.recommends and rec_b.chosen.label == "allreduce" and b[0].startswith("Use the allreduce gradient sync")
    assert a != b
    # the same table from one launch each (the quick study): nothing recommended, and the card says why
    quick, rec = interpret.strategies(strategy_table({"allreduce": 60.0, "ddp": 55.0, "noop": 50.0}, launches=1))
    assert not rec.recommends and quick[0].startswith("Undecided after 1 launch each: a comparison between "
                                                      "configurations needs 2 or more launches each")
    assert "Keep ddp, the default meanwhile." in quick[0]


def test_no_ranking_and_no_recommendation_from_noise():
    """The same medians, but intervals of ±4 ms: 55 vs 60 ms is within noise; and without intervals, nothing."""
    noisy, rec = interpret.strategies(strategy_table({"allreduce": 60.0, "ddp": 55.0, "noop": 50.0}, noise=4.0))
    assert not rec.recommends
    assert noisy[0].startswith("Undecided after 3 launches each: the ") and "51–59 ms" in noisy[0]
    assert "Keep ddp, the default meanwhile." in noisy[0]
    bare = strategy_table({"allreduce": 60.0, "ddp": 55.0}).drop(columns=["step_ci_low(ms)", "step_ci_high(ms)"])
    words, rec = interpret.strategies(bare)
    assert not rec.recommends and words[0].startswith("Undecided after 3 launches each: a side has no interval. "
                                                      "Keep ddp, the default meanwhile.")


def test_bad_study_files_are_one_line_errors(tmp_path):
    path = tmp_path / "s.yaml"
    for text, field in [("experiments: [nosuch]\n", "study.experiments"), ("colour: red\n", "study"),
                        ("base: {global_batch: 0}\n", "global_batch")]:
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_spec(path)
        assert info.value.field == field and "\n" not in str(info.value)
    assert set(StudySpec().experiments) == set(names())


def test_default_study_validates_the_model_on_two_ranks_and_notes_read_as_prose():
    """The full default study calibrates and validates the performance model with 2 ranks (F14: validate on
    measured points); the quick one keeps to one rank. A note holding a mapping reads "key: value; key: value"."""
    from scalelab.lab.base import Result
    from scalelab.lab.study import default_spec
    from scalelab.report.build import section_for

    assert default_spec().options["predict"]["set"]["ranks"] == 2
    assert default_spec(quick=True).options["predict"]["set"]["ranks"] == 1
    assert default_spec().config("predict").ranks == 2 and default_spec(quick=True).config("predict").ranks == 1
    result = Result("predict", {}, notes={"from": {"10 GbE": "4 workers", "ib": "never"}, "why": "ok"})
    section, _ = section_for(get("predict"), result)
    assert section.notes == ["from: 10 GbE: 4 workers; ib: never", "why: ok"]


def test_a_gpu_study_file_does_not_inherit_the_cpu_memory_cap(tmp_path, monkeypatch):
    """The default spec caps max-batch trials' address space on a CPU machine; a study whose base runs on CUDA
    (examples/study-multigpu.yaml) must not inherit that cap, unless it asks for one itself."""
    from scalelab.lab.study import default_spec, load_spec

    examples = Path(__file__).resolve().parents[3] / "examples"
    if default_spec().options["max_batch"]["memory_limit"] is None:
        pytest.skip("this machine has a GPU: the default spec has no CPU cap to inherit")
    monkeypatch.setattr("scalelab.config.cuda_device_count", lambda: 8)  # the example's node, for validation only
    assert load_spec(examples / "study-multigpu.yaml").options["max_batch"]["memory_limit"] is None
    own = tmp_path / "own.yaml"
    own.write_text("base: {device: cuda}\noptions: {max_batch: {memory_limit: 1G}}\n")
    assert load_spec(own).options["max_batch"]["memory_limit"] == "1G"
