"""--local-nodes without running a cluster: config fields, the privilege refusal, owner-tagged names, root cause."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scalelab.config import TrainConfig
from scalelab.errors import ConfigError, ScalelabError
from scalelab.measure.commbench import CommBenchConfig
from scalelab.run import netns, nodes
from scalelab.run.launch import LaunchSpec


def test_local_nodes_sets_nnodes_and_the_world():
    cfg = TrainConfig(ranks=2, local_nodes=3, global_batch=12)
    assert (cfg.nnodes, cfg.world_size, cfg.per_rank_batch) == (3, 6, 2)
    assert TrainConfig.from_dict(cfg.to_dict()).world_size == 6  # a stored run reads back the same world
    assert CommBenchConfig(ranks=1, local_nodes=2).world == 2


@pytest.mark.parametrize("fields, field", [
    ({"local_nodes": -1}, "local_nodes"),
    ({"link_gbps": 1.0}, "link_gbps"),  # no cluster to shape
    ({"local_nodes": 2, "link_gbps": 0.0}, "link_gbps"),
    ({"local_nodes": 2, "link_delay_ms": -1.0}, "link_delay_ms"),
    ({"local_nodes": 2, "nnodes": 3}, "nnodes"),
    ({"local_nodes": 2, "rdzv_endpoint": "h:1"}, "rdzv_endpoint"),
])
def test_bad_local_nodes_fields_are_refused_naming_the_field(fields, field):
    with pytest.raises(ConfigError) as err:
        TrainConfig(global_batch=12, **fields)
    assert err.value.field == field and "\n" not in str(err.value)


def test_bench_takes_one_rank_per_node_only_across_nodes():
    with pytest.raises(ConfigError, match="ranks"):
        CommBenchConfig(ranks=1)
    with pytest.raises(ConfigError, match="link_gbps"):
        CommBenchConfig(link_gbps=1.0)


def test_without_privilege_one_line_says_what_is_needed(monkeypatch):
    monkeypatch.setattr(netns, "has_net_admin", lambda: False)
    with pytest.raises(netns.NamespacesUnavailable) as err:
        netns.check_usable()
    assert isinstance(err.value, ScalelabError)  # the CLI: one line, exit 2
    assert "root or CAP_NET_ADMIN" in str(err.value) and "\n" not in str(err.value)


def test_without_privilege_nothing_is_recorded(monkeypatch, store, tmp_path):
    from scalelab.run.execute import run_commbench

    monkeypatch.setattr(netns, "has_net_admin", lambda: False)
    with pytest.raises(netns.NamespacesUnavailable):
        run_commbench(CommBenchConfig(ranks=1, local_nodes=2, begin="4K", end="4K", iters=1), store,
                      say=lambda s: None)
    assert store.list_runs().empty


def test_leftovers_are_namespaces_whose_owner_is_gone():
    assert not netns.is_leftover(f"{netns.owner_tag()}-0")  # this process is alive
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert netns.is_leftover(f"{netns.PREFIX}{dead.pid}-123-sw")
    pid, start = netns.owner_tag().removeprefix(netns.PREFIX).split("-")
    assert netns.is_leftover(f"{netns.PREFIX}{pid}-{int(start) + 1}-1")  # same pid, another process
    assert not netns.is_leftover(f"{netns.PREFIX}{dead.pid}-123-x")  # not a name we make
    assert not netns.is_leftover("someone-else")
    assert netns.owner(f"{netns.PREFIX}{dead.pid}-123-sw") == (dead.pid, "123")
    assert netns.owner(f"{netns.PREFIX}{dead.pid}-123-x") is None and netns.owner("someone-else") is None


def test_a_prefix_of_its_own_keeps_a_family_of_namespaces_apart():
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert netns.owner_tag(prefix="other-").startswith(f"other-{os.getpid()}-")
    assert netns.is_leftover(f"other-{dead.pid}-123-0", "other-")
    assert not netns.is_leftover(f"other-{dead.pid}-123-0")  # scalelab's own sweep leaves it alone
    assert not netns.is_leftover(f"{netns.PREFIX}{dead.pid}-123-0", "other-")


def test_the_switch_address_is_the_last_host_of_the_subnet():
    cluster = netns.Cluster("sw", "10.213.7.0/24", (netns.Node(0, "n", "10.213.7.1"),))
    assert cluster.switch_address == "10.213.7.254"


def test_tbf_bucket_is_the_one_the_analysis_knows():
    args = netns.tbf_args(1.0)
    assert args[:3] == ["tbf", "rate", "1000000kbit"] and int(args[args.index("burst") + 1]) == 128 * 1024
    assert int(netns.tbf_args(0.2)[4]) == 64 * 1024  # never below one GSO segment
    assert int(netns.tbf_args(0.5, 96 * 1024)[4]) == 96 * 1024  # another bucket, as benchmarks/tbf_link.py tries


class _Agent:
    def __init__(self, returncode):
        self.returncode = returncode


def test_root_cause_is_the_first_failure_not_caused_by_another(tmp_path):
    from scalelab.store.rundir import RunDir

    spec = LaunchSpec(module="m", run_dir=tmp_path, nproc_per_node=2, env={}, nnodes=2)
    RunDir(tmp_path).write_node_failure(0, {"reason": "rank 0 exited with code 1: Connection reset by peer",
                                            "consequence": True, "time": 1.0})
    # node 1's processes were all killed: no record, its agent ended by SIGKILL, later than node 0's record
    reason = nodes.root_cause(spec, [_Agent(1), _Agent(-9)], {0: 1.0, 1: 2.0}, stopped=set())
    assert reason == "node 1 (ranks 2-3): its processes were killed by signal SIGKILL"


def test_node_spec_points_every_node_at_node_0():
    cluster = netns.Cluster("s", "10.213.0.0/24", (netns.Node(0, "a", "10.213.0.1"), netns.Node(1, "b", "10.213.0.2")))
    spec = LaunchSpec(module="m", run_dir=Path("/r"), nproc_per_node=1, env={"OMP_NUM_THREADS": "1"}, nnodes=2)
    one = nodes.node_spec(spec, cluster, 1)
    assert (one.node_rank, one.endpoint, one.env["GLOO_SOCKET_IFNAME"]) == (1, "10.213.0.1:29500", "eth0")
    assert nodes.agent_argv(one, cluster.nodes[1])[:4] == ["ip", "netns", "exec", "b"]


def test_a_bench_across_nodes_counts_every_node_s_ranks_in_the_catalog(store):
    cfg = CommBenchConfig(ranks=1, local_nodes=2, begin="4K", end="4K", iters=1)
    assert CommBenchConfig.from_dict(cfg.to_dict()).world == 2
    store.create_run(cfg.to_dict(), {}, kind="bench")
    assert list(store.list_runs()["ranks"]) == [2]
