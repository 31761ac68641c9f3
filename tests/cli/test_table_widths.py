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


@pytest.mark.parametrize("width", [80, 120])
def test_the_boxed_table_fits_by_the_same_rule_and_keeps_what_it_must(width):
    """`runs list` and `predict` print boxed tables through the same fitting rule (cli.tables.fitting_columns,
    boxed: 3 characters a column and a closing rule): no line wider than the terminal, `keep` whatever the width,
    shown in their own order, the rest named."""
    import io

    from rich.console import Console

    from scalelab.cli.tables import fitting_columns, print_fitted

    frame = wide_frame().assign(run_id=["run-20261123-044511-b8b1bf" * 4] * 2)
    order = ["run_id", "workers", "step(ms)", *(f"figure_{i}(ms)" for i in range(40))]
    wanted = ["run_id", "step(ms)", "workers", *(f"figure_{i}(ms)" for i in range(40))]
    out = io.StringIO()
    print_fitted(Console(file=out, width=width), frame, order=order, wanted=wanted, wide=False, keep=("run_id",))
    lines = out.getvalue().splitlines()
    assert "run_id" in lines[1] and "not shown, to fit" in out.getvalue()
    assert "run-20261123-044511-b8b1bf" in lines[3]  # kept although alone it is wider than 80 with its borders
    shown, left = fitting_columns(frame, width, wanted=wanted, order=order, keep=("run_id",), boxed=True)
    assert shown[0] == "run_id" and left[-1] == "figure_39(ms)"
    plain, _ = fitting_columns(frame, width, wanted=wanted, order=order)
    assert len(plain) >= len(shown)  # plain columns cost 2 characters each, boxed ones 3
    # an interval goes with its figure only where both ends are wanted: none is added that was not asked for
    assert "step_ci_low(ms)" not in fitting_columns(frame, None, wanted=wanted, order=order)[0]
