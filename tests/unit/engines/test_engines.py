"""The engine registry, the Horovod engine's config checks, horovodrun's argv and its failure parsing, and the
rank layout horovodrun hands to a rank; nothing here starts Horovod."""
from __future__ import annotations


import pytest

from scalelab.config import TrainConfig
from scalelab.distenv import dist_context
from scalelab.engines import horovod, registry
from scalelab.errors import ConfigError
from scalelab.run.horovodrun import horovodrun_args, rank_exits, root_cause
from scalelab.run.kinds import TRAIN
from scalelab.run.launch import LaunchSpec, torchrun_launch, train_launch_spec


def test_the_registry_lists_ddp_then_horovod():
    assert registry.names() == ("ddp", "horovod")
    assert registry.get("horovod").launcher == "horovodrun"
    with pytest.raises(ConfigError, match="engine: 'mpi' is not allowed; allowed: ddp, horovod"):
        registry.get("mpi", "engine")


@pytest.mark.parametrize("kwargs,field,fragment", [
    ({"engine": "tf"}, "engine", "allowed: ddp, horovod"),
    ({"hvd_fp16": True}, "hvd_fp16", "only with engine horovod"),
    ({"hvd_cycle_time_ms": 5.0}, "hvd_cycle_time_ms", "only with engine horovod"),
    ({"hvd_fusion_threshold": 1024}, "hvd_fusion_threshold", "only with engine horovod"),
    ({"engine": "horovod", "hvd_fusion_threshold": -1}, "hvd_fusion_threshold", "bytes >= 0"),
    ({"engine": "horovod", "hvd_cycle_time_ms": 0.0}, "hvd_cycle_time_ms", "ms > 0"),
    ({"engine": "horovod", "sync": "bucketed"}, "sync", "allowed: auto"),
    ({"engine": "horovod", "lr_rule": "lars"}, "lr_rule", "LARS"),
    ({"engine": "horovod", "net_bandwidth_gbps": 1.0}, "net_bandwidth_gbps", "Horovod fuses tensors"),
    ({"engine": "horovod", "wrapper": "single"}, "wrapper", "allowed: auto"),
])
def test_engine_fields_are_validated(kwargs, field, fragment):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs)
    assert err.value.field == field and fragment in str(err.value), str(err.value)


def test_horovod_takes_an_emulated_latency():
    """--net-latency-ms with Horovod: a caller-side sleep after synchronize() (engines/horovod.py)."""
    assert TrainConfig(engine="horovod", net_latency_ms=5.0).net_latency_ms == 5.0


def test_the_baseline_enqueue_compresses_and_hands_back_a_completed_handle():
    """The baseline's allreduce: Horovod's local work (a missing gradient zeroed, compression) and a callable
    handle, which synchronize() calls instead of waiting on Horovod; no collective."""
    import torch

    class Half:  # Horovod's Compression.fp16 shape: compress -> (tensor, ctx), decompress(tensor, ctx)
        @staticmethod
        def compress(t):
            return t.half(), t.dtype

    class Opt:
        _compression = Half()

    p = torch.nn.Parameter(torch.ones(3))
    handle, ctx = horovod.noop_enqueue(Opt(), p)
    assert callable(handle) and ctx == torch.float32
    assert torch.equal(handle(), torch.zeros(3, dtype=torch.half))  # no gradient yet: zeroed, as Horovod does
    p.grad = torch.full((3,), 2.0)
    handle, _ = horovod.noop_enqueue(Opt(), p)
    assert torch.equal(handle(), torch.full((3,), 2.0, dtype=torch.half))


def test_a_horovod_config_is_distributed_and_stores_sync_auto():
    cfg = TrainConfig(engine="horovod", hvd_fusion_threshold=1 << 20, hvd_cycle_time_ms=2.5, hvd_fp16=True)
    assert cfg.distributed and cfg.resolved_sync == "horovod"
    stored = cfg.resolved()
    assert stored.sync == "auto" and stored.wrapper == "ddp"
    assert TrainConfig.from_dict(stored.to_dict()) == stored  # a stored horovod run loads again


def test_horovod_env_names_fusion_cycle_and_the_timeline(tmp_path):
    cfg = TrainConfig(engine="horovod", hvd_fusion_threshold=4096, hvd_cycle_time_ms=2.5)
    spec = train_launch_spec(cfg, tmp_path)
    assert spec.env["HOROVOD_FUSION_THRESHOLD"] == "4096"
    assert spec.env["HOROVOD_CYCLE_TIME"] == "2.5"
    assert spec.env["HOROVOD_TIMELINE"] == str(tmp_path / "horovod_timeline.json")
    assert "HOROVOD_TIMELINE" not in train_launch_spec(TrainConfig(ranks=2), tmp_path).env


def test_the_train_kind_picks_the_engines_launcher_unless_one_is_given():
    from scalelab.run.hvdnode import horovod_launch

    assert TRAIN.launcher(TrainConfig(engine="horovod"), torchrun_launch) is horovod_launch
    assert TRAIN.launcher(TrainConfig(ranks=2), torchrun_launch) is torchrun_launch
    mine = lambda spec: None  # noqa: E731
    assert TRAIN.launcher(TrainConfig(engine="horovod"), mine) is mine


def test_horovodrun_argv_is_gloo_on_loopback(tmp_path):
    spec = LaunchSpec(module="scalelab.run.worker", run_dir=tmp_path, nproc_per_node=2, env={}, args=("--resume",))
    assert horovodrun_args(spec, python="py") == [
        "py", "-m", "scalelab.run.hvdrun", "--gloo", "-np", "2", "-H", "127.0.0.1:2", "--network-interfaces", "lo",
        "py", "-m", "scalelab.run.worker", "--run-dir", str(tmp_path), "--resume"]



def test_the_horovodrun_entry_imports_no_torch():
    """horovodrun imports its entry module again in a spawned helper per rank: torch there would be paid 1 + N
    times a launch (run/hvdrun.py). Its loopback address is the launcher's."""
    import subprocess
    import sys

    from scalelab.run import hvdrun, launch

    probe = "import sys, scalelab.run.hvdrun; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    assert hvdrun.LOOPBACK == launch.LOOPBACK

KILLED = """[0]<stdout>:epoch 1/3 step 4/100
Process 1 exit with status code 137.
Terminating remaining workers after failure of Process 1.
[0]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception on one of the ranks
Process 0 exit with status code 1.
"""

RAISED = """[1]<stderr>:[rank1]: Traceback (most recent call last):
[1]<stderr>:[rank1]: ValueError: bad batch
[0]<stderr>:gloo: Connection closed by peer [127.0.0.1]:1234
Process 0 exit with status code 1.
Process 1 exit with status code 1.
"""


def test_root_cause_is_the_killed_rank():
    assert [(e.rank, e.code) for e in rank_exits(KILLED)] == [(1, 137), (0, 1)]
    assert root_cause(KILLED, 1) == "rank 1 killed by signal SIGKILL"


def test_root_cause_skips_a_rank_whose_peer_went_away():
    assert root_cause(RAISED, 1) == "rank 1 exited with code 1: ValueError: bad batch"


def test_root_cause_without_rank_lines_is_horovodrun_itself():
    assert root_cause("usage: horovodrun ...\nerror: bad flag\n", 2) == "horovodrun exited with code 2: error: bad flag"


def test_a_rank_reads_its_place_from_horovodrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    ctx = dist_context("cpu")
    assert (ctx.rank, ctx.world, ctx.local_rank, ctx.local_world) == (1, 2, 1, 2)


def test_a_missing_horovod_is_one_line_naming_the_setup_command(monkeypatch):
    monkeypatch.setattr(horovod.importlib.util, "find_spec", lambda name: None)
    reason = horovod.unavailable()
    assert reason == "horovod is not installed (run `scalelab setup horovod`)"


def test_wire_bytes_halve_with_fp16():
    import torch

    g = torch.zeros(10, 3)
    assert horovod.wire_bytes(g, fp16=False) == 120
    assert horovod.wire_bytes(g, fp16=True) == 60
    assert horovod.wire_bytes(torch.zeros(4, dtype=torch.int64), fp16=True) == 32


def test_a_run_of_a_missing_engine_is_refused_before_it_is_recorded(monkeypatch, store):
    from scalelab.run.execute import execute

    monkeypatch.setattr(horovod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"engine: 'horovod' is not allowed; horovod is not installed \(run "):
        execute(TrainConfig(engine="horovod", ranks=2, model="mlp", steps=2), store, say=lambda s: None)
    assert len(store.list_runs()) == 0


def test_a_broken_install_is_one_line_too(monkeypatch):
    monkeypatch.setattr(horovod.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(horovod, "_loadable", lambda: None)
    assert horovod.unavailable() == ("horovod is installed but `import horovod.torch` with gloo fails "
                                     "(run `scalelab setup horovod` --rebuild)")


def test_the_cli_refuses_a_missing_engine_in_one_line(monkeypatch, capsys, tmp_path):
    from scalelab.cli.main import main

    monkeypatch.setattr(horovod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--engine", "horovod", "--ranks", "2", "--model", "mlp", "--steps", "2",
              "--store", str(tmp_path / "st")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: engine: 'horovod' is not allowed; horovod is not installed (run `scalelab setup "
                   "horovod`)"), err
