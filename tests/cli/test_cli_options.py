"""The command line generated from the config: one flag per field, help and choices from the field's metadata,
one precedence rule (defaults < YAML < --set < flags), renamed and typo'd flags as one line with exit code 2."""
from __future__ import annotations

import inspect
from dataclasses import fields
from types import SimpleNamespace

import pytest

from scalelab.cli import main
from scalelab.cli.experiments import command_for
from scalelab.cli.options import config_flags, config_params, merge, sync_choices
from scalelab.config import TrainConfig
from scalelab.lab.registry import experiments

SPELLINGS = {  # fields whose flag is not --name-with-dashes (README's spellings)
    "global_batch": ("--global-batch", "-b"),
    "ranks": ("--ranks", "-n"),
    "hang_timeout_s": ("--hang-timeout",),
    "sample_interval_s": ("--sample-interval",),
    "time_budget_s": ("--time-budget",),
    "bucket_mb": ("--bucket-mb",),
    "net_latency_ms": ("--net-latency-ms",),
    "checkpoint_every": ("--checkpoint-every",),
    "pin_memory": ("--pin-memory/--no-pin-memory",),
    "drop_last": ("--drop-last/--keep-last",),
    "augment": ("--augment/--no-augment",),
    "noop_collectives": ("--noop-collectives/--real-collectives",),
    "nodes_launcher": ("--launcher",),
}


def test_every_field_is_exactly_one_flag_with_its_spelling():
    flags = config_flags()
    assert [f.field for f in flags] == [f.name for f in fields(TrainConfig)]
    for flag in flags:
        expected = SPELLINGS.get(flag.field) or (
            (f"--{flag.field.replace('_', '-')}/--no-{flag.field.replace('_', '-')}",) if flag.kind is bool
            else (f"--{flag.field.replace('_', '-')}",))
        assert flag.decls == expected, flag.field
    every = [d for f in flags for decl in f.decls for d in decl.split("/")]
    assert len(every) == len(set(every)), "two fields share a spelling"


def test_help_is_the_fields_and_literal_choices_are_listed():
    by_name = {f.field: f for f in config_flags()}
    for flag in config_flags():
        assert flag.help.strip() and flag.help.startswith(fields_help(flag.field))
    assert by_name["backend"].choices == ("auto", "gloo", "nccl", "mpi")
    assert "Choices: auto, gloo, nccl, mpi." in by_name["backend"].help
    assert by_name["lr_rule"].choices == ("none", "linear", "sqrt", "linear_warmup", "lars")
    assert by_name["sync"].choices == sync_choices() and "ddp" in sync_choices()
    for name in ("optimizer", "wrapper", "device", "precision", "ddp_hook"):
        assert by_name[name].choices and all(c in by_name[name].help for c in by_name[name].choices)
    assert by_name["model"].choices == ()


def fields_help(name: str) -> str:
    return next(f.metadata["help"] for f in fields(TrainConfig) if f.name == name)


def exit_code(argv) -> int:
    try:
        main(argv)
    except SystemExit as exit_:
        return exit_.code
    return 0


def test_help_of_every_command_shows_the_texts(capsys):
    for argv in (["--help"], ["train", "--help"], ["profile", "--help"], ["predict", "--help"]):
        assert exit_code(argv) == 0
        out = capsys.readouterr().out
        assert "Usage" in out and "Show this message" in out
    assert exit_code(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Samples per optimizer step summed over all ranks." in text and "--hang-timeout" in text


def test_precedence_defaults_then_yaml_then_set_then_flag(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.2\nepochs: 3\n")
    defaults = {"lr": 0.1, "epochs": 2, "seed": 7}
    assert merge(defaults, path, ["lr=0.3"], {"lr": 0.4}).lr == 0.4  # the flag wins
    assert merge(defaults, path, ["lr=0.3"], {"lr": None}).lr == 0.3  # then --set over YAML
    cfg = merge(defaults, path, [], {})
    assert (cfg.lr, cfg.epochs, cfg.seed) == (0.2, 3, 7)  # then YAML over defaults, defaults over the dataclass
    assert merge(None, None, None, None) == TrainConfig()


def test_sizes_are_parsed_from_any_layer(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("memory_limit: 1GiB\n")
    assert merge({}, path, [], {}).memory_limit == 2**30
    assert merge({}, path, ["memory_limit=2GiB"], {"memory_limit": "512MiB"}).memory_limit == 512 * 2**20


def test_train_flags_reach_the_config_by_the_same_rule(tmp_path, monkeypatch, capsys):
    import scalelab.cli.train as execute_module  # the command's own name for run.execute.execute

    seen = {}

    def fake_execute(cfg, store, **kw):
        seen["cfg"] = cfg
        return SimpleNamespace(run_id="r0", summary={})

    monkeypatch.setattr(execute_module, "execute", fake_execute)
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.2\nseed: 5\nepochs: 4\n")
    main(["train", "--config", str(path), "--set", "lr=0.3", "--set", "seed=6", "--lr", "0.4", "-b", "32",
          "--memory-limit", "4GiB", "--hang-timeout", "10", "--sample-interval", "0.25", "--drop-last",
          "--store", str(tmp_path / "store")])
    cfg = seen["cfg"]
    assert (cfg.lr, cfg.seed, cfg.epochs, cfg.global_batch) == (0.4, 6, 4, 32)
    assert (cfg.memory_limit, cfg.hang_timeout_s, cfg.sample_interval_s, cfg.drop_last) == (4 * 2**30, 10.0, 0.25,
                                                                                            True)


def test_every_base_experiment_command_takes_every_field():
    names = {f.field for f in config_flags()}
    for experiment in experiments().values():
        if experiment.command is None:
            continue
        params = set(inspect.signature(command_for(experiment)).parameters)
        own = {o.name for o in experiment.options}
        assert own <= params and {"study", "out", "store"} <= params
        if experiment.base:
            assert names - own <= params and {"config", "set_"} <= params, experiment.name


def test_config_params_skip_only_the_shadowed_fields():
    params = {p.name for p in config_params(skip={"threads"})}
    assert "threads" not in params and "ranks" in params and "old_strategy" in params


@pytest.mark.parametrize("argv, new", [
    (["train", "--strategy", "x"], "--wrapper"),
    (["profile", "--strategy", "ddp"], "--wrapper"),
    (["predict", "--strategy", "ddp"], "--sync"),
])
def test_renamed_flags_name_the_new_spelling_in_one_line(argv, new, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--strategy was renamed: use {new}" in err


@pytest.mark.parametrize("argv", [["train", "--rnaks", "2"], ["profile", "--globl-batch", "8"]])
def test_a_typo_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "No such option" in err


def test_bad_set_item_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--set", "lr"])
    assert exit_.value.code == 2
    assert "FIELD=VALUE" in capsys.readouterr().err


def test_steps_takes_a_number_or_auto_and_its_help_says_so():
    steps = next(f for f in config_flags() if f.field == "steps")
    assert steps.kind is str and "auto" in steps.help and "time_budget_s" in steps.help
    assert merge({"steps": 20}, None, None, {"steps": "auto"}).steps == "auto"
    assert merge(None, None, None, {"steps": "20"}).steps == 20


def test_an_experiment_commands_cells_share_one_warm_block(tmp_path, monkeypatch):
    """Every Cells.run of one experiment command runs inside the same `warm.ranks()` block (a block per call would
    start a zygote for each, e.g. each trial of a max-batch search), and the block is closed when it ends."""
    from types import SimpleNamespace

    from scalelab.lab.base import Result
    from scalelab.run import warm

    seen = []

    def execute(ctx, base, opts):
        for _ in range(2):
            with warm.ranks() as pools:  # what each Cells.run opens
                seen.append(pools)
        return Result(name="fake", tables={})

    experiment = SimpleNamespace(name="fake", help="", options=[], base=False, takes_command=False,
                                 option_values=lambda given: {}, execute=execute)
    command_for(experiment)(store=tmp_path / "store", study="s", out=tmp_path / "out")
    assert len(seen) == 2 and seen[0] is seen[1]
    assert warm._ACTIVE is None
