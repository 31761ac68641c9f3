import pytest

from scalelab.train.sampler import ShardedBatchSampler


def epoch_batches(n, gb, world, epoch=0, drop_last=False, seed=0):
    out = []
    for r in range(world):
        s = ShardedBatchSampler(n, gb, rank=r, world=world, seed=seed, drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("n,gb,world", [(100, 20, 2), (101, 20, 2), (103, 20, 4), (7, 8, 4), (5, 4, 4), (64, 64, 1)])
def test_shards_cover_the_dataset_and_every_rank_gets_the_same_number_of_batches(n, gb, world):
    per_rank = epoch_batches(n, gb, world)
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1  # equal batch counts: no rank waits for a collective that never comes
    assert all(len(batch) >= 1 for batches in per_rank for batch in batches)
    seen = [i for batches in per_rank for batch in batches for i in batch]
    assert set(seen) == set(range(n))
    rest = n % gb
    if rest == 0 or rest >= world:
        assert sorted(seen) == list(range(n))  # exact partition, no duplicates
    else:
        assert len(seen) == n + world - rest  # padded only up to one sample per rank


def test_rank_slices_of_a_step_form_the_single_process_global_batch():
    single = epoch_batches(96, 32, 1)[0]
    ranks = epoch_batches(96, 32, 4)
    for step, batch in enumerate(single):
        assert sum((ranks[r][step] for r in range(4)), []) == batch


def test_order_changes_between_epochs_and_is_reproducible():
    a0, a1 = epoch_batches(50, 10, 2, epoch=0), epoch_batches(50, 10, 2, epoch=1)
    assert a0 != a1
    assert a0 == epoch_batches(50, 10, 2, epoch=0)


def test_drop_last_drops_the_incomplete_global_batch():
    per_rank = epoch_batches(105, 20, 2, drop_last=True)
    assert all(len(b) == 5 for b in per_rank)
    assert all(len(batch) == 10 for b in per_rank for batch in b)


def test_len_matches_iteration():
    for n, gb, world, dl in [(100, 20, 2, False), (101, 20, 2, False), (101, 20, 2, True)]:
        s = ShardedBatchSampler(n, gb, rank=1, world=world, drop_last=dl)
        assert len(s) == len(list(s))
