"""The system-metrics section (issue 60 item 8): the run with the most samples, the network (loopback) as a
column, and a sentence when its figures rest on too few samples."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from scalelab.lab.base import Result
from scalelab.report.build import system_section


class Store:
    def __init__(self, root: Path):
        self.root = root

    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id


def write_run(root: Path, run_id: str, samples: int) -> None:
    (root / run_id).mkdir(parents=True)
    for rank in (0, 1):
        lines = [{"t(s)": 0.5 * i, "rank": rank, "cpu_process(%)": 50.0 + rank, "rss(bytes)": 2**28,
                  "lo_sent(bytes)": 1_000_000 * i} for i in range(samples)]
        (root / run_id / f"system.rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_run_with_most_samples_its_network_and_how_many_samples_stand_behind_it(tmp_path):
    write_run(tmp_path, "short", 2)
    write_run(tmp_path, "long", 4)
    results = {"x": Result("x", {"t": pd.DataFrame({"run_id": ["short", "long"]})})}
    section = system_section(Store(tmp_path), results, tmp_path / "out")
    table = section.tables[0].frame
    assert section.sentences[0].startswith("Run long:") and list(table["samples"]) == [4, 4]
    assert list(table["loopback_sent_mean(MB/s)"]) == [2.0, 2.0]  # 1 MB every 0.5 s
    assert "sent 2 MB/s on average" in section.sentences[1]
    assert section.sentences[2].startswith("Each rank's figures rest on 4 samples")
