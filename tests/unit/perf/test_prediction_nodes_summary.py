"""The frozen protocol's summary (benchmarks/prediction_nodes.py `summary_lines`) on a table of known figures: the
coverage of both intervals, the breakdown by node count, link and strategy, the unshaped link refused in one line
and left out of the goals, and the preset path's own coverage."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "prediction_nodes.py"


def bench():
    spec = importlib.util.spec_from_file_location("prediction_nodes", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def point(nodes, link, sync, error, inside, inside50, refused=None, extrapolation=False):
    return {"nodes": nodes, "link": link, "sync": sync, "error(%)": error, "inside": inside, "inside50": inside50,
            "half_width(%)": 10.0, "refused": refused, "extrapolation": extrapolation,
            "preset_error(%)": None if link == "unshaped" else 2 * error, "preset_inside": True,
            "preset_inside50": False, "preset_half_width(%)": 5.0}


def test_the_summary_counts_coverage_and_refuses_the_unshaped_link_in_one_line():
    rows = [point(3, "0.5", "allreduce", 5.0, True, True), point(3, "0.2", "allreduce", -8.0, True, False),
            point(4, "0.5", "bucketed", 12.0, True, False, extrapolation=True),
            point(4, "0.2", "bucketed", 3.0, False, False),
            point(3, "unshaped", "allreduce", -50.0, None, None, refused="refused over an unshaped link: x"),
            point(4, "unshaped", "bucketed", -45.0, None, None, refused="refused over an unshaped link: x")]
    lines, goals = bench().summary_lines(pd.DataFrame(rows))
    text = "\n".join(lines)
    assert lines[0].startswith("held out (nodes, link, batch): 4 points, median |error| 6.5 %, max 12.0 %")
    assert "95 % interval holds the measured median in 75 % (3/4), the 50 % in 25 % (1/4)" in lines[0]
    assert "  strategy allreduce: 2 points" in text and "  nodes 4: 2 points" in text and "  link 0.2: 2" in text
    assert "marked extrapolation" in text and "unshaped link: 2 points not predicted, refused over" in text
    assert goals == {"median_error": True, "max_error": True, "coverage95": False, "coverage50": False,
                     "half_width": True}
    assert "the same goals on the unshaped link" not in text  # refused: not judged
    assert "preset path" in text and "max 24.0 %" in text and "in 100 % (4/4), the 50 % in 0 % (0/4)" in text
