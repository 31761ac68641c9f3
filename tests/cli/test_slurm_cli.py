"""`scalelab slurm`: the script it writes carries --env into every node; a bad --env is one line, exit code 2."""
from __future__ import annotations

import os

import pytest

from scalelab.cli import main


def test_env_is_exported_in_the_script(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model: mlp\n")
    out = tmp_path / "job.sbatch"
    main(["slurm", "--config", str(config), "--env", "NCCL_SOCKET_IFNAME=ib0", "--env", "X=a=b", "-o", str(out)])
    text = out.read_text()
    assert "export NCCL_SOCKET_IFNAME=ib0\n" in text and "export X=a=b\n" in text


@pytest.mark.parametrize("item", ["NOEQUALS", "1X=2", "A B=c", "=v"])
def test_a_bad_env_is_one_line_with_exit_code_2(tmp_path, capsys, item):
    config = tmp_path / "run.yaml"
    config.write_text("model: mlp\n")
    with pytest.raises(SystemExit) as info:
        main(["slurm", "--config", str(config), "--env", item])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(lines) == 1 and lines[0].startswith(f"error: --env: {item!r}"), lines


def test_the_horovod_engine_runs_on_every_node_and_needs_the_shared_interface(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model: mlp\n")
    with pytest.raises(SystemExit) as info:
        main(["slurm", "--config", str(config), "--engine", "horovod"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "GLOO_SOCKET_IFNAME" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as info:
        main(["slurm", "--config", str(config), "--engine", "mpi"])
    assert info.value.code == 2 and "engine: 'mpi' is not allowed" in capsys.readouterr().err
    out = tmp_path / "job.sbatch"
    main(["slurm", "--config", str(config), "--engine", "horovod", "--env", "GLOO_SOCKET_IFNAME=eth0", "-o", str(out)])
    assert "--engine horovod" in out.read_text() and "--node-rank" in out.read_text()


# --launcher slurm: refused in one line, exit code 2, before any run is recorded


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", [["train", "--local-nodes", "2"], ["scale", "--nodes", "1,2", "--mode", "strong",
                                                                       "--batches", "4", "--launches", "1"]])
def test_launcher_slurm_outside_an_allocation_is_one_line_exit_2(tmp_path, capsys, monkeypatch, command):
    for name in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    store = tmp_path / "store"
    line = _refused(capsys, [*command, "--launcher", "slurm", "--model", "mlp", "--steps", "2",
                             "--store", str(store)])
    assert "not inside a Slurm allocation" in line
    assert not list(store.glob("runs/*"))


def test_more_nodes_than_the_allocation_is_one_line_exit_2_before_any_cell(tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho n0 n1\n")  # `scontrol show hostnames n[0-1]`
    (bin_dir / "scontrol").chmod(0o700)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[0-1]")
    store = tmp_path / "store"
    line = _refused(capsys, ["scale", "--nodes", "1,2,4", "--launcher", "slurm", "--mode", "strong", "--batches", "4",
                             "--launches", "1", "--model", "mlp", "--steps", "2", "--store", str(store)])
    assert line == "error: local_nodes 4: Slurm job 7 has 2 node(s) (n0,n1); allowed: 1..2"
    assert not list(store.glob("runs/*"))  # the 1- and 2-node cells did not run first
