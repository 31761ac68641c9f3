"""An experiment's tables in the terminal (issue 60 item 10): no line wider than the terminal, the columns that
tell rows apart and answer first, what was left out named, `--wide` every column."""
from __future__ import annotations

import pandas as pd
import pytest

from scalelab.cli.tables import render


def wide_frame() -> pd.DataFrame:
    rows = [{"workers": w, "global_batch": 64, "mode": "strong", "step(ms)": 12.3456 * w, "step_ci_low(ms)": 11.0 * w,
             "step_ci_high(ms)": 14.0 * w, **{f"figure_{i}(ms)": 1000.0 + i for i in range(40)},
             "quality": "noisy: 1.85 cores busy outside the run (persisted when re-measured)"} for w in (1, 2)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("width", [80, 120])
def test_no_line_is_wider_than_the_terminal_and_the_rest_is_named(width):
    lines = render(wide_frame(), width)
    assert max(len(x) for x in "\n".join(lines).splitlines()) <= width
    header = lines[0].split()
    assert header[:2] == ["workers", "step(ms)"]  # what tells rows apart, then the answer with its interval
    assert "step_ci_low(ms)" in header and "step_ci_high(ms)" in header
    assert "not shown, to fit" in "\n".join(lines) and "figure_39(ms)" in "\n".join(lines)


def test_wide_shows_every_column():
    lines = render(wide_frame(), None)
    assert len(lines) == 3 and len(lines[0].split()) == len(wide_frame().columns)
    assert max(len(x) for x in lines) > 752 // 2
