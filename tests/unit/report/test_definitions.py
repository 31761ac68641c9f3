"""The measurement definitions are written once, in docs/definitions.md; the report renders that page's bullets
(the package carries it as scalelab/report/definitions.md, a link), and the numbers it states are the code's."""
from __future__ import annotations

from pathlib import Path

from scalelab.analysis.noise import OUTSIDE_CPU_THRESHOLD, STEAL_THRESHOLD
from scalelab.report.build import DEFINITIONS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "definitions.md"


def test_the_report_renders_every_bullet_of_the_docs_page():
    bullets = [line for line in DOCS.read_text().splitlines() if line.startswith("- ")]
    assert len(DEFINITIONS) == len(bullets) >= 10
    assert [d[:40] for d in DEFINITIONS] == [b[2:42] for b in bullets]
    assert all("\n" not in d and "  " not in d for d in DEFINITIONS)  # continuation lines joined


def test_the_noise_thresholds_it_states_are_the_codes():
    [noise] = [d for d in DEFINITIONS if d.startswith("Noise:")]
    assert f"above {OUTSIDE_CPU_THRESHOLD:g} cores outside the run or {STEAL_THRESHOLD:g} % steal" in noise
