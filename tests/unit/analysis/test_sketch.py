"""The quantile sketch against exact quantiles; running sums exact; merge and round trip."""
from __future__ import annotations

import numpy as np
import pytest

from scalelab.analysis.sketch import QuantileSketch, Running


def rank_error(values: np.ndarray, estimate: float, q: float) -> float:
    """|rank of the estimate - q| as a fraction of the values (the sketch's error measure)."""
    ranks = np.searchsorted(np.sort(values), estimate, side="right") / len(values)
    return abs(ranks - q)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_p50_and_p95_within_one_percent_rank_of_the_exact_quantiles(seed):
    values = np.random.default_rng(seed).lognormal(mean=-3, sigma=0.5, size=200_000)
    sketch = QuantileSketch(seed=seed)
    for v in values.tolist():
        sketch.add(v)
    for q in (0.5, 0.95):
        assert rank_error(values, sketch.quantile(q), q) < 0.01
    assert len(sketch.to_dict()["levels"]) < 20 and sum(len(lv) for lv in sketch.levels) < 2000  # O(k) kept


def test_merged_sketches_of_two_ranks_answer_for_both():
    rng = np.random.default_rng(5)
    a, b = rng.normal(1.0, 0.1, 50_000), rng.normal(2.0, 0.1, 50_000)
    sa, sb = QuantileSketch(seed=1), QuantileSketch(seed=2)
    for v in a.tolist():
        sa.add(v)
    for v in b.tolist():
        sb.add(v)
    merged = QuantileSketch.from_dict(sa.to_dict()).merge(sb)
    both = np.concatenate([a, b])
    assert merged.n == 100_000
    assert rank_error(both, merged.quantile(0.5), 0.5) < 0.01 and rank_error(both, merged.quantile(0.95), 0.95) < 0.01


def test_small_counts_are_exact_and_running_sums_exact():
    sketch = QuantileSketch()
    for v in [5.0, 1.0, 3.0]:
        sketch.add(v)
    assert sketch.quantile(0.5) == 3.0 and sketch.quantile(1.0) == 5.0
    assert np.isnan(QuantileSketch().quantile(0.5))
    run = Running()
    for v in [0.25, 0.5, 0.75]:
        run.add(v)
    back = Running.from_dict(run.to_dict())
    assert (back.count, back.total, back.low, back.high, back.mean) == (3, 1.5, 0.25, 0.75, 0.5)
    assert Running.from_dict(Running().to_dict()).count == 0
    with pytest.raises(ValueError, match="k: 2"):
        QuantileSketch(k=2)


@pytest.mark.parametrize("chunk", [1, 300, 4096, 50_000])
def test_chunks_added_at_once_keep_the_rank_error_and_the_size_bound(chunk):
    values = np.random.default_rng(7).lognormal(mean=-3, sigma=0.5, size=200_000)
    sketch, run = QuantileSketch(seed=3), Running()
    for i in range(0, len(values), chunk):
        sketch.extend(values[i:i + chunk].tolist())
        run.extend(values[i:i + chunk])
    assert sketch.n == run.sketch.n == len(values)
    for q in (0.5, 0.95):
        assert rank_error(values, sketch.quantile(q), q) < 0.01
        assert rank_error(values, run.sketch.quantile(q), q) < 0.01
    assert sum(len(lv) for lv in sketch.levels) < 2000
    assert sum(w for _, w in sketch.weighted()) == pytest.approx(len(values), rel=0.01)
    assert (run.count, run.low, run.high) == (len(values), values.min(), values.max())
    assert run.total == pytest.approx(values.sum(), rel=1e-12)
    run.extend(np.array([]))
    assert run.count == len(values)
