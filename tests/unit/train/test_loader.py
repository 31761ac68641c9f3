"""The training loop's DataLoader."""
import os
import warnings

import torch

from scalelab.config import TrainConfig
from scalelab.distenv import DistContext
from scalelab.train.loop import make_loader


def test_more_loader_workers_than_cores_prints_no_torch_warning():
    """The loader sweep asks for more workers than cores on purpose; torch's two 300-character warning lines per
    epoch and rank filled a study's terminal. They are filtered where the loader is made, and nothing else is."""
    workers = len(os.sched_getaffinity(0)) + 1  # what torch compares with
    data = torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, dtype=torch.long))
    cfg = TrainConfig.from_dict(dict(model="mlp", dataset="synthetic", global_batch=4, num_workers=workers))
    ctx = DistContext(rank=0, world=1, local_rank=0, local_world=1, device=torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader, _ = make_loader(data, cfg, ctx)
        x, _ = next(iter(loader))
        warnings.warn("another warning", UserWarning)
    assert x.shape == (4, 2)
    messages = [str(w.message) for w in caught]
    assert "another warning" in messages
    assert not [m for m in messages if "This DataLoader will create" in m]
