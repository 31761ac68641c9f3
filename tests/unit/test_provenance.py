"""Tests for scalelab.provenance."""
import json
import shutil
import socket
import subprocess
import sys

import pytest

from scalelab.provenance import collect_provenance, git_state


# ---------------------------------------------------------------- provenance

def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                    *args], cwd=cwd, check=True, capture_output=True)


def test_provenance_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a repository (tmp dirs are outside any checkout)
    prov = collect_provenance(["scalelab", "train", "--seed", "3"], seed=3)
    for key in ("time", "argv", "seed", "git_sha", "git_dirty", "scalelab_git_sha", "versions",
                "host", "platform", "cpu_count", "memory_total_bytes", "cuda_devices"):
        assert key in prov
    assert prov["argv"] == ["scalelab", "train", "--seed", "3"] and prov["seed"] == 3
    assert set(prov["versions"]) == {"python", "torch", "numpy", "scalelab"}
    assert prov["versions"]["python"].count(".") == 2 and prov["versions"]["scalelab"]
    assert prov["cpu_count"] >= 1 and prov["host"] == socket.gethostname()
    assert isinstance(prov["cuda_devices"], list)
    json.dumps(prov)  # must be storable as provenance.json
    assert collect_provenance()["argv"] == sys.argv


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_provenance_git_fields(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    if git_state(tmp_path) != (None, None):
        pytest.skip("tmp_path is inside a git repository")
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("print(1)\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "init")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    monkeypatch.chdir(repo)
    prov = collect_provenance([])
    assert prov["git_sha"] == sha and len(sha) == 40 and prov["git_dirty"] is False
    (repo / "untracked.txt").write_text("x")  # untracked output files do not count as dirty
    assert collect_provenance([])["git_dirty"] is False
    (repo / "train.py").write_text("print(2)\n")
    prov = collect_provenance([])
    assert prov["git_sha"] == sha and prov["git_dirty"] is True

    monkeypatch.chdir(tmp_path)
    prov = collect_provenance([])
    assert prov["git_sha"] is None and prov["git_dirty"] is None


def test_provenance_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable to be found
    monkeypatch.chdir(tmp_path)
    prov = collect_provenance([])
    assert prov["git_sha"] is None and prov["scalelab_git_sha"] is None
