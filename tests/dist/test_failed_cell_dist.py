"""A rank of a study's cell killed (SIGKILL, a real fault; issue 60 item 9): the study writes its report, the
section names the cell, why it failed and how to re-measure it, the last lines count the failed cells, the exit
code is EXIT_FAILED_CELLS; run again, the study re-measures the cell and exits 0."""
from __future__ import annotations

import pytest

from conftest import faulty_model, run_cli
from scalelab.cli.study import EXIT_FAILED_CELLS

pytestmark = pytest.mark.timeout(400)


def test_a_killed_rank_fails_its_cell_visibly_and_a_rerun_re_measures_it(tmp_path):
    marker = tmp_path / "killed-once"
    # rank 1 kills itself in its 3rd training forward, once: the second study finds the marker and trains
    fault = (f"if not os.path.exists({str(marker)!r}): open({str(marker)!r}, 'w').close(); "
             "os.kill(os.getpid(), 9)")
    model = faulty_model(tmp_path, "killed", call=3, fault=fault, rank=1)
    spec = tmp_path / "study.yaml"
    spec.write_text(f"""
name: killed
experiments: [profile]
base: {{model: "{model}", dataset: synthetic, samples: 64, eval_samples: 16, global_batch: 16, steps: 4,
        warmup_steps: 1, ranks: 2}}
""")
    args = ["study", "--config", str(spec), "--store", str(tmp_path / "store"), "--out", str(tmp_path / "out")]
    first = run_cli(args, timeout=300)
    out = first.stdout + first.stderr
    assert first.returncode == EXIT_FAILED_CELLS, out[-3000:]
    assert "1 failed cell(s)" in out and "failed: profile: profile" in out and "run the same command again" in out
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    section = md.split("## Where a step's time goes")[1].split("\n## ")[0]
    assert "failed cells: profile:" in section and "SIGKILL" in section, section[:2000]
    assert "running the same study again re-measures it" in section
    second = run_cli(args, timeout=300)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    md = (tmp_path / "out" / "report" / "report.md").read_text()
    section = md.split("## Where a step's time goes")[1].split("\n## ")[0]
    assert "failed cells" not in section and "backward" in section
