"""Issue 60: the README tour prints no line wider than the terminal (COLUMNS 80 and 120): `explain`'s breakdown
keeps its figures on each part's line and breaks the rest, and a study's progress lines are broken to the width;
nothing is cut. Without a known width (a pipe, a log) each line stays whole."""
from __future__ import annotations

import io
import sys

import pytest

from scalelab.analysis.breakdown import breakdown
from scalelab.lab import progress
from scalelab.lab.explain import Explanation, lines
from scalelab.lab.terminal import terminal_width, wrapped

sys.path.insert(0, __file__.rsplit("/unit/", 1)[0] + "/unit/analysis")
from test_breakdown import NOOP, NOSYNC, ONE, summary  # noqa: E402

NEEDS = ("scalelab train --model cnn --dataset synthetic --ranks 2 --global-batch 64 --steps 40 --sync noop "
         "--bucket-mb 25 --set warmup_steps=2 (the no-sync variant of this config)")


def explanation(*, nosync=True) -> Explanation:
    real = summary(80.0, fastest=70.0, data=8.0, waiting=12.0, wire=6.0, collectives=3)
    table = breakdown(real, one=ONE, nosync=NOSYNC if nosync else None, noop=NOOP, k=0.5,
                      commands={"nosync": NEEDS})
    run = {"run_id": "run-20261129-043745-f770bf", "kind": "train", "summary": real,
           "config": {"ranks": 2, "sync": "ddp", "global_batch": 64}}
    return Explanation(run, {"one": None, "nosync": None, "noop": None}, table,
                       suggestions=["the largest cause is exposed communication, 18 ms of a 80 ms step (95 % interval "
                                    "16.5–19.5 ms): try `scalelab bucket-sweep --fractions 0.0625,0.25,1` and "
                                    "`scalelab compare strategies --ranks 2`"])


@pytest.mark.parametrize("width", [80, 120])
def test_explain_fits_the_terminal_with_each_parts_figures_on_its_line(width):
    for ex in (explanation(), explanation(nosync=False)):
        out = lines(ex, width)
        assert max(map(len, out)) <= width, [x for x in out if len(x) > width]
        header = next(x for x in out if x.startswith("part"))
        assert header.rstrip().endswith("of gap")
        exposed = next(x for x in out if "exposed communication:" in x)
        assert exposed.rstrip().endswith("%")  # its ms, interval and share of the gap beside it
        # nothing cut: every word of the unbounded layout is still there (a long label's end below its figures)
        assert sorted(" ".join(lines(ex)).split()) == sorted(" ".join(out).split())


def test_explain_without_a_width_keeps_its_lines_whole():
    assert max(map(len, lines(explanation()))) > 80


@pytest.mark.parametrize("width", [80, 120])
def test_progress_lines_are_broken_to_the_terminal_width(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    p = progress.progress_for_output()
    p.group("scale_strong/again", 6)
    p.cell_done("strong: 2 workers, batch 64, no-op collectives", "done", seconds=1.0)
    p.say("[scale_strong] measuring 3 cell(s) once more (noisy: 1.30 cores busy outside the run): strong: 1 workers, "
          "batch 64, strong: 2 workers, batch 64, strong: 2 workers, batch 64, no-op collectives " + "x" * 150)
    printed = out.getvalue().splitlines()
    assert max(map(len, printed)) <= width and len(printed) >= 3
    assert printed[-1].startswith("    ")  # a broken line goes on indented under itself
    assert "".join(printed).count("x") == 150  # nothing cut


def test_a_pipe_without_columns_keeps_each_line_whole(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert terminal_width() is None
    assert wrapped("a " * 100, None) == ["a " * 100]
    monkeypatch.setenv("COLUMNS", "100")
    assert terminal_width() == 100


def test_wrapped_keeps_alignment_and_indentation():
    line = "    · waiting for peers" + " " * 20 + "12  11.8–12.2   40 %  (within noise)"
    out = wrapped(line, 60)
    assert out[0].startswith("    · waiting for peers" + " " * 20) and out[1].startswith("        ")
    assert max(map(len, out)) <= 60


def test_a_parts_note_follows_the_end_of_its_label():
    ex = explanation()
    ex.table.loc[ex.table["part"] == "compute", "within_noise"] = True
    out = lines(ex, 80)
    end = next(x for x in out if "against the ideal" in x)
    assert end.strip() == "against the ideal  (within noise)" and max(map(len, out)) <= 80
    wide = lines(ex, 120)
    assert any("compute slowdown: N ranks with no sync against the ideal" in x and x.rstrip().endswith("%")
               for x in wide) and max(map(len, wide)) <= 120  # at 120 every label is whole beside its figures
