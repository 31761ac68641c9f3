"""`scalelab slurm`: the script it writes carries --env into every node; a bad --env is one line, exit code 2."""
from __future__ import annotations

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
