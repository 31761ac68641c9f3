import pytest

from scalelab.config import TrainConfig
from scalelab.run.execute import execute


def test_scalars_are_written_from_the_records(store):
    pytest.importorskip("tensorboard", reason="tensorboard is optional: pip install 'scalelab[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = execute(TrainConfig(model="mlp", samples=64, eval_samples=16, global_batch=16, steps=4, warmup_steps=1),
                  store, say=lambda s: None)
    acc = EventAccumulator(str(out.run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "time/step(ms)", "stage/forward(ms)", "eval/acc"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]


def test_every_steps_scalars_read_back_as_the_records_hold_them(store):
    """One event per step carries all of its scalars: TensorBoard reads each tag's value at each step as the step
    records hold it (float32, as TensorBoard stores scalars), and the evaluations at their steps."""
    pytest.importorskip("tensorboard", reason="tensorboard is optional: pip install 'scalelab[tensorboard]'")
    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scalelab.run.exports import step_scalars
    from scalelab.store.rundir import RunDir

    out = execute(TrainConfig(model="mlp", samples=64, eval_samples=16, global_batch=16, steps=6, warmup_steps=1,
                              eval_every=3), store, say=lambda s: None)
    acc = EventAccumulator(str(out.run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    rundir = RunDir(out.run_dir)
    want: dict[str, dict[int, float]] = {}
    for rec in rundir.read_steps(0):
        for tag, value in step_scalars(rec).items():
            want.setdefault(tag, {})[rec["step"]] = value
    for ev in rundir.read_result(0)["evals"]:
        want.setdefault("eval/acc", {})[ev["step"]] = ev["acc"]
    assert len(want["time/step(ms)"]) == 6 and len(want["eval/acc"]) >= 2
    assert set(acc.Tags()["scalars"]) >= set(want)
    for tag, by_step in want.items():
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == sorted(by_step), tag
        np.testing.assert_array_equal([got[s] for s in sorted(got)],
                                      np.float32([by_step[s] for s in sorted(by_step)]), err_msg=tag)
