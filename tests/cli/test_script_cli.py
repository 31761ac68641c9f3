"""`scalelab run`: bad input is one line and exit code 2, before anything is recorded; the torchrun argv."""
from __future__ import annotations

import pytest

from scalelab.cli.main import main
from scalelab.run.launch import torchrun_args
from scalelab.run.script import SCRIPT, ScriptConfig, fill


def run_main(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize("command,needle", [
    ([], "command: '' is not allowed"),
    (["python"], "allowed: python SCRIPT.py ARGS"),
    (["python", "missing.py"], "'missing.py' is not allowed; no such script"),
    (["bash", "train.sh"], "'bash' is not allowed"),
    (["python", "train.py", "--batch", "{batch}"], "'{batch}' is not allowed; is not a placeholder"),
    (["python", "train.py", "--batch", "{global_batch}"], "'{global_batch}' is not allowed; has no value"),
    (["--link-gbps", "1", "--", "python", "train.py"], "link_gbps: 1.0 is not allowed; allowed only with local_nodes"),
    (["--local-nodes", "2", "--nnodes", "3", "--", "python", "train.py"], "nnodes: 3 is not allowed; set by local"),
    (["--local-nodes", "-1", "--", "python", "train.py"], "local_nodes: -1 is not allowed"),
])
def test_bad_run_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, command, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    options = command[:command.index("--")] if "--" in command else []
    command = command[command.index("--") + 1:] if "--" in command else command
    code, err = run_main(["run", "--store", str(tmp_path / "store"), *options, "--", *command], capsys)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "store" / "runs").exists() or not any((tmp_path / "store" / "runs").iterdir())


def test_a_global_batch_not_shared_evenly_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    code, err = run_main(["run", "--ranks", "2", "--global-batch", "5", "--", "python", "train.py"], capsys)
    assert code == 2 and "global_batch: 5 is not allowed" in err


def test_placeholders_are_filled_and_the_ranks_run_the_script_rank_module(tmp_path):
    (tmp_path / "train.py").write_text("")
    cfg = ScriptConfig(command=("python3", "train.py", "--batch={per_worker_batch}", "-w", "{workers}"), ranks=2,
                       global_batch=64, cwd=str(tmp_path))
    assert cfg.argv() == ["train.py", "--batch=32", "-w", "2"] and cfg.model == "script:train.py"
    spec = SCRIPT.launch_spec(cfg, tmp_path / "run", isolate=False, resume=False)
    argv = torchrun_args(spec, port=1234)
    assert argv[argv.index("--module"):] == ["--module", "scalelab.run.script_rank", "--run-dir",
                                              str(tmp_path / "run"), "--", "train.py", "--batch=32", "-w", "2"]
    assert spec.env["GLOO_SOCKET_IFNAME"] == "lo" and argv[argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:1234"
    assert ScriptConfig.from_dict(cfg.to_dict()) == cfg


def test_fill_leaves_text_without_placeholders_alone():
    assert fill("plain", {}) == "plain" and fill("a{", {}) == "a{"


def test_local_nodes_set_the_node_count_and_leave_the_endpoint_to_the_cluster(tmp_path):
    (tmp_path / "train.py").write_text("")
    cfg = ScriptConfig(command=("python", "train.py", "-w", "{workers}"), ranks=2, local_nodes=3, link_gbps=0.5,
                       cwd=str(tmp_path))
    assert (cfg.nnodes, cfg.workers, cfg.argv()) == (3, 6, ["train.py", "-w", "6"])
    spec = SCRIPT.launch_spec(cfg, tmp_path / "run", isolate=False, resume=False)
    assert (spec.nnodes, spec.endpoint) == (3, None)  # node 0's private address, chosen when the cluster exists
    assert SCRIPT.watched(cfg)[0] == list(range(6))  # every node's ranks heartbeat into this run directory
    assert ScriptConfig.from_dict(cfg.to_dict()) == cfg
