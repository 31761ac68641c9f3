"""The scaling experiment over nodes: which cells it makes (no process is started here)."""

from scalelab.config import TrainConfig
from scalelab.experiments.scale import mode_cells, node_counts


def base(**fields) -> TrainConfig:
    return TrainConfig(**{"model": "mlp", "ranks": 1, "global_batch": 48, **fields})


def test_node_counts_come_from_the_option_or_the_base_cluster():
    assert node_counts(base(), None) is None  # no cluster: worker counts as before
    assert node_counts(base(local_nodes=1), None) is None  # one node is nothing to sweep
    assert node_counts(base(local_nodes=3, link_gbps=1.0), None) == [1, 2, 3]
    assert node_counts(base(local_nodes=3), [1, 3]) == [1, 3]


def test_cells_over_nodes_keep_the_ranks_per_node_and_the_link():
    cfg = base(local_nodes=4, link_gbps=1.0, ranks=2, global_batch=64)
    cells, ablation = mode_cells(cfg, "strong", [1, 2], [64], nodes=[1, 2, 4])  # a base of 4 nodes, cells of fewer
    assert [(c.config.local_nodes, c.config.nnodes, c.config.ranks, c.config.world_size) for c in cells] == \
        [(1, 1, 2, 2), (2, 2, 2, 4), (4, 4, 2, 8)]
    assert all(c.config.link_gbps == 1.0 and c.config.global_batch == 64 for c in cells)
    assert [c.label for c in cells] == ["strong: 1 node x 2 ranks, batch 64", "strong: 2 nodes x 2 ranks, batch 64",
                                        "strong: 4 nodes x 2 ranks, batch 64"]
    assert len(ablation) == 3  # every cell has 2 or more workers: each gets its no-op-collectives baseline
    assert all(a.config.noop_collectives for a in ablation)


def test_weak_scaling_over_nodes_grows_the_global_batch_with_the_workers():
    cells, ablation = mode_cells(base(local_nodes=2), "weak", [9], [16], nodes=[1, 2])
    assert [(c.config.local_nodes, c.config.global_batch) for c in cells] == [(1, 16), (2, 32)]
    assert [a.config.local_nodes for a in ablation] == [2]  # one worker has no collectives to skip


def test_a_users_script_sweeps_nodes_too(tmp_path):
    from scalelab.run.script import ScriptConfig

    (tmp_path / "train.py").write_text("")
    script = ScriptConfig(command=("python", "train.py", "--batch", "{per_worker_batch}"), local_nodes=2,
                          link_gbps=0.5, cwd=str(tmp_path))
    assert node_counts(script, None) == [1, 2]
    cells, ablation = mode_cells(script, "strong", [1], [32], nodes=[1, 2])
    assert [(c.kind, c.config.local_nodes, c.config.nnodes, c.config.argv()[-1]) for c in cells] == \
        [("script", 1, 1, "32"), ("script", 2, 2, "16")]
    assert all(c.config.link_gbps == 0.5 for c in cells) and not ablation  # no no-op baseline for a script


def test_every_multi_rank_cell_of_the_loop_gets_a_no_sync_variant(tmp_path):
    from scalelab.experiments.scale import nosync_cells, variant_command
    from scalelab.run.script import ScriptConfig

    cells, _ = mode_cells(base(), "strong", [1, 2, 4], [64])
    apart = nosync_cells(cells, launches=3)
    assert [(a.config.ranks, a.config.sync, a.repeats) for a in apart] == [(2, "noop", 3), (4, "noop", 3)]
    assert [a.label for a in apart] == ["strong: 2 workers, batch 64, no sync", "strong: 4 workers, batch 64, no sync"]
    assert nosync_cells(mode_cells(base(sync="noop"), "strong", [2], [64])[0]) == []  # already without sync
    (tmp_path / "train.py").write_text("")
    script = ScriptConfig(command=("python", "train.py"), cwd=str(tmp_path))
    assert nosync_cells(mode_cells(script, "strong", [2], [32])[0]) == []  # scalelab cannot remove a script's sync
    assert variant_command("weak", 2, 128)["nosync"] == "scalelab scale --workers 1,2 --batches 64 --mode weak"
