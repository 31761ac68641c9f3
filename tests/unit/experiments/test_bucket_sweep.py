"""`bucket-sweep`: bucket sizes from shares of the gradient bytes, the collectives and bytes they give on real
2-rank gloo runs, and its sentences on fixed tables (a winner only beyond noise; overlap only where its interval
is above zero).

Known truth: the model below has (3072*256 + 6*256*256 + 256*10) * 4 = 4,728,832 bytes of gradients in 8
weights. DDP fills buckets with whole parameters in the order their gradients become ready (the reverse of the
layers) and closes a bucket once it has reached the cap (torch's compute_bucket_assignment_by_size). At 1/16 of
the gradients (295,552 bytes): output + two middle layers, two middle layers, two middle layers, the input layer:
4 all-reduces per step. At all of them (4.51 MiB) one bucket: 1. Every size moves the same 4,728,832 bytes.
(In these steady-state steps, after DDP rebuilt its buckets, no 1 MiB first bucket shows: it would split the
single bucket in two.)
"""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import run_experiment
from scalelab.analysis.repeats import LAUNCH_MEDIANS
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError
from scalelab.experiments import bucket_sweep
from scalelab.lab.base import Result, StudyPlan

GRAD_BYTES = (3072 * 256 + 6 * 256 * 256 + 256 * 10) * 4
LAYERED = """
from torch import nn

def make(spec):
    mids = [m for _ in range(6) for m in (nn.Linear(256, 256, bias=False), nn.ReLU())]
    return nn.Sequential(nn.Flatten(), nn.Linear(3072, 256, bias=False), nn.ReLU(), *mids,
                         nn.Linear(256, spec.num_classes, bias=False))
"""


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_sizes_are_shares_of_the_gradients_and_move_the_same_bytes(tmp_path):
    from scalelab.store import Store

    (tmp_path / "layered.py").write_text(LAYERED)
    base = TrainConfig(model=f"{tmp_path / 'layered.py'}:make", dataset="synthetic", samples=64, eval_samples=16,
                       global_batch=16, steps=4, warmup_steps=1, ranks=2, sample_interval_s=0.1)
    result = run_experiment("bucket_sweep", base, Store(tmp_path / "store"), "s", tmp_path / "out",
                            fractions=[1 / 16, 1.0], launches=2)
    table = result.tables["bucket_sweep"]
    assert (table["status"] == "completed").all(), table[["bucket", "reason"]]
    assert list(table["bucket_mb"]) == [round(GRAD_BYTES / 16 / 2**20, 3), round(GRAD_BYTES / 2**20, 3)]
    assert list(table["bytes_per_step"]) == [GRAD_BYTES, GRAD_BYTES]
    assert list(table["collectives_per_step"]) == [4, 1]
    assert table["baseline_run_id"].nunique() == 1  # one no-op-collectives baseline for every size
    # each size keeps its launches' own medians: the decision's noise model reads them (not the rows' intervals)
    assert [len(m) for m in table[LAUNCH_MEDIANS]] == [2, 2]
    assert (tmp_path / "out" / "bucket_sweep.png").exists()


@pytest.mark.parametrize("value", ["0,1", "5", "a,b", ""])
def test_bad_fractions_are_one_line(value):
    with pytest.raises(ConfigError) as info:
        bucket_sweep.fractions(value, "fractions")
    assert "allowed: comma-separated shares" in str(info.value) and "\n" not in str(info.value)


def row(mb, step, low, high, overlap=0.5, o_low=0.2, o_high=0.8, quality="ok", launches=3):
    return {"bucket": f"{mb:.3g} MiB", "bucket_mb": mb, "share_of_gradients": mb / 24, "status": "completed",
            "launches": launches,
            "step(ms)": step, "step_ci_low(ms)": low, "step_ci_high(ms)": high, "comm(ms)": 10.0,
            "exposed_comm(ms)": 5.0, "overlap": overlap, "overlap_ci_low": o_low, "overlap_ci_high": o_high,
            "collectives_per_step": 4, "quality": quality}


def sentences(rows):
    return bucket_sweep.interpret(Result("bucket_sweep", {"bucket_sweep": pd.DataFrame(rows)}))


def test_a_size_is_recommended_only_when_faster_beyond_noise():
    lines, rec = sentences([row(1.5, 50, 48, 52), row(24, 70, 66, 74)])
    assert rec == lines[0] and rec.startswith("Use bucket_cap_mb 1.5 MiB: 1.5 MiB beats 24 MiB: 1.40× faster than 24 MiB (")
    lines, rec = sentences([row(1.5, 50, 45, 60), row(24, 55, 50, 62)])
    assert rec.startswith("Undecided after 3 launches each: the ") and "No bucket size is recommended yet." in rec
    lines, rec = sentences([row(1.5, 50, 48, 52, launches=1), row(24, 70, 66, 74, launches=1)])
    assert rec.startswith("Undecided after 1 launch each: a comparison between configurations needs 2 or more")


def test_overlap_is_called_hidden_only_when_its_interval_is_above_zero():
    lines, _ = sentences([row(1.5, 50, 45, 60, overlap=0.3, o_low=-0.1, o_high=0.5),
                          row(24, 55, 50, 62, overlap=0.6, o_low=0.2, o_high=0.9)])
    assert "no communication is hidden beyond noise" in lines[1] and "hides 60 %" in lines[2]
    # the interval as measured, which contains its point (issue 60: clipped, "-1 % (interval 0 to 63 %)" did not),
    # against the communication the overlap is taken against (comm_critical where measured)
    assert "interval -10 to 50 %" in lines[1]
    assert not any("hides -" in line for line in lines)


def test_in_the_default_study_only():
    from scalelab.lab.study import default_spec

    assert "bucket_sweep" in default_spec().experiments and "bucket_sweep" not in default_spec(quick=True).experiments
    plan = StudyPlan(quick=False, gpus=0, comm_model={"model": "mlp", "steps": 8})
    assert bucket_sweep.study_options(plan)["set"]["bucket_mb"] == 4.0  # the strategies' DDP cell, reused


def test_a_re_measured_size_says_what_was_re_measured_and_uses_its_figures():
    """A row whose second measurement was ok is "re-measured": its overlap is a figure, said with why it was
    measured twice (the report once said "the overlap is not used: re-measured", which tells a reader nothing)."""
    lines, _ = sentences([row(1.5, 50, 45, 60, quality="re-measured"), row(24, 55, 50, 62)])
    said = next(line for line in lines if line.startswith("At 1.5 MiB"))
    assert "re-measured: the first measurement looked doubtful, the second is used" in said
    assert "backward hides 50 %" in said and "not used" not in said
