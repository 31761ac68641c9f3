"""The frozen validation protocol (perf/protocol.py): the committed protocol holds out what it says, a design that
shares a node count, link or batch with the calibration is caught, and a changed tree or model code is refused."""
from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from scalelab.errors import ConfigError
from scalelab.perf.protocol import MODEL_CODE, Protocol, check_frozen, model_code, violations

COMMITTED = Path(__file__).resolve().parents[3] / "benchmarks" / "protocols" / "prediction_nodes.json"


def test_the_committed_protocol_holds_every_point_out():
    protocol = Protocol.load(COMMITTED)
    assert violations(protocol) == []
    points = protocol.held_out_points()
    assert points and protocol.calibration["nodes"] <= 2
    calibration = protocol.calibration_points()
    for p in points:  # differs from every network calibration run in node count and batch, and link when shaped
        assert all(p.nodes != c.nodes and p.batch != c.batch for c in calibration)
        assert p.link is None or all(p.link != c.link for c in calibration)
    assert set(protocol.model_code) == set(MODEL_CODE)


def test_a_point_sharing_the_calibrations_batch_or_link_is_not_held_out():
    protocol = Protocol.load(COMMITTED)
    shared = dataclasses.replace(protocol, held_out={**protocol.held_out, "batch": protocol.calibration["batches"][0]})
    assert any("batch" in v for v in violations(shared))
    linked = dataclasses.replace(protocol, held_out={**protocol.held_out, "links": [protocol.calibration["link_gbps"]]})
    assert any("link" in v for v in violations(linked))
    two = dataclasses.replace(protocol, held_out={**protocol.held_out, "nodes": [protocol.calibration["nodes"]]})
    assert any("nodes" in v for v in violations(two))


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


def test_a_changed_tree_or_model_code_is_refused(tmp_path):
    repo = tmp_path / "repo"
    for path in MODEL_CODE:
        target = repo / path / "m.py" if not path.endswith(".py") else repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "model")
    protocol = Protocol(frozen="today", model_code=model_code(repo), train={}, calibration={}, compute_in_sample={},
                        held_out={})
    check_frozen(protocol, repo)  # clean, same code: accepted
    (repo / MODEL_CODE[1]).write_text("x = 2\n")
    with pytest.raises(ConfigError, match="clean checkout"):
        check_frozen(protocol, repo)
    _git(repo, "commit", "-qam", "a model change")
    with pytest.raises(ConfigError, match="development"):
        check_frozen(protocol, repo)


def test_a_missing_or_corrupt_protocol_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="protocol"):
        Protocol.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text(json.dumps({"frozen": "x"}))
    with pytest.raises(ConfigError, match="protocol"):
        Protocol.load(tmp_path / "bad.json")
