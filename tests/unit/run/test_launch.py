import socket
import subprocess
import sys

from scalelab.config import TrainConfig
from scalelab.run.launch import free_port, slurm_script, torchrun_argv, worker_env


def test_one_node_argv_is_a_static_loopback_rendezvous(tmp_path):
    cfg = TrainConfig(ranks=2, global_batch=8)
    argv = torchrun_argv(cfg, tmp_path, port=29999)
    assert argv == ["--nnodes", "1", "--nproc-per-node", "2", "--node-rank", "0", "--rdzv-backend", "static",
                    "--rdzv-endpoint", "127.0.0.1:29999", "--max-restarts", "0", "--monitor-interval", "0.2",
                    "--log-dir", str(tmp_path / "logs"), "--module", "scalelab.run.worker", "--run-dir", str(tmp_path)]


def test_multi_node_argv_passes_the_endpoint_and_node_rank_through(tmp_path):
    cfg = TrainConfig(ranks=4, nnodes=3, node_rank=2, rdzv_endpoint="head:1234", global_batch=48)
    argv = torchrun_argv(cfg, tmp_path)
    assert argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--node-rank") + 1] == "2"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "head:1234"
    assert "GLOO_SOCKET_IFNAME" not in worker_env(cfg)


def test_worker_env_keeps_one_node_on_loopback_and_splits_threads():
    env = worker_env(TrainConfig(ranks=2, global_batch=8, threads=3))
    assert env == {"OMP_NUM_THREADS": "3", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_namespace_nodes_split_this_machines_cores_among_all_their_ranks(monkeypatch):
    """Local nodes are namespaces of one machine: 2 nodes of 2 ranks on 8 cores get 2 threads a rank, not 4 (each
    rank sees only its own node's ranks as local, so splitting by those would oversubscribe the cores 2x)."""
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert worker_env(TrainConfig(ranks=2, local_nodes=2, global_batch=8))["OMP_NUM_THREADS"] == "2"
    assert worker_env(TrainConfig(ranks=2, global_batch=8))["OMP_NUM_THREADS"] == "4"
    assert worker_env(TrainConfig(ranks=1, nnodes=3, node_rank=1, rdzv_endpoint="head:1234",
                                  global_batch=6))["OMP_NUM_THREADS"] == "8"  # real nodes: cores of its own


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_slurm_script_runs_torchrun_per_node_with_the_job_id_as_run_id():
    text = slurm_script("/abs/run.yaml", nodes=4, gpus_per_node=8, partition="gpu", account="lab")
    assert text.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu", "#SBATCH --account=lab"):
        assert line in text
    assert "--nnodes 4 --ranks 8" in text and '--node-rank "$SLURM_NODEID"' in text
    assert "--run-id scalelab-$SLURM_JOB_ID" in text and "/abs/run.yaml" in text


def test_slurm_script_exports_the_env_and_survives_a_path_with_quotes(tmp_path, monkeypatch):
    """Known truth: the script's srun line, run by bash with srun a pass-through and the python a printer of its
    arguments, hands scalelab the exact argv."""
    printer = tmp_path / "python"
    printer.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    printer.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(printer))
    text = slurm_script("/a b/it's.yaml", nodes=2, gpus_per_node=0, env={"GLOO_SOCKET_IFNAME": "eth0", "X": "a b"})
    assert "export GLOO_SOCKET_IFNAME=eth0\n" in text and "export X='a b'\n" in text
    assert "#SBATCH --gpus-per-node" not in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    step = f'srun() {{ shift; "$@"; }}\nhead_addr=10.0.0.1 port=29511\n{srun}'
    out = subprocess.run(["bash", "-c", step], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": "1", "SLURM_JOB_ID": "42"}).stdout
    assert out.splitlines() == ["-m", "scalelab", "train", "--config", "/a b/it's.yaml", "--nnodes", "2",
                                "--ranks", "1", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29511",
                                "--run-id", "scalelab-42"]
