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
