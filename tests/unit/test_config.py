import pytest

from scalelab import config as config_mod
from scalelab.config import TrainConfig
from scalelab.errors import ConfigError


@pytest.mark.parametrize("kwargs,field,fragment", [
    ({"global_batch": 63, "ranks": 2}, "global_batch", "divisible by the number of ranks (2)"),
    ({"ranks": 0}, "ranks", ">= 1"),
    ({"epochs": 0}, "epochs", ">= 1"),
    ({"lr": -1.0}, "lr", "> 0"),
    ({"precision": "fp8"}, "precision", "'fp32'"),
    ({"backend": "nccl"}, "backend", "nccl needs CUDA"),
    ({"precision": "fp16"}, "precision", "needs CUDA"),
    ({"wrapper": "dp"}, "wrapper", "at least 2 GPUs"),
    ({"wrapper": "single", "ranks": 2}, "wrapper", "use ddp"),
    ({"device": "cuda"}, "device", "no CUDA device"),
    ({"nnodes": 2}, "rdzv_endpoint", "required"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank", "0..1"),
    ({"nnodes": 2, "rdzv_endpoint": "nohost"}, "rdzv_endpoint", "host:port"),
    ({"prefetch_factor": 2}, "prefetch_factor", "num_workers > 0"),
    ({"global_batch": "64"}, "global_batch", "int"),
    ({"augment": 1}, "augment", "bool"),
    ({"steps": 0}, "steps", "auto"),
    ({"steps": "forever"}, "steps", "'auto'"),
    ({"target_precision": 0.0}, "target_precision", "0 < target_precision < 1"),
    ({"target_precision": -0.1}, "target_precision", "0 < target_precision < 1"),
    ({"time_budget_s": 0.0}, "time_budget_s", "seconds > 0"),
    ({"time_budget_s": -5}, "time_budget_s", "seconds > 0"),
    ({"min_timed_steps": 0}, "min_timed_steps", ">= 1"),
    ({"num_workers": -1}, "num_workers", "an integer >= 0 (or leave unset)"),
])
def test_bad_values_name_the_field_the_value_and_what_is_allowed(kwargs, field, fragment, monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    assert info.value.field == field
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_defaults_resolve_for_cpu(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    cfg = TrainConfig(ranks=2, global_batch=64)
    assert (cfg.resolved_device, cfg.resolved_backend, cfg.resolved_wrapper) == ("cpu", "gloo", "ddp")
    assert cfg.per_rank_batch == 32 and cfg.distributed
    one = TrainConfig()
    assert one.resolved_wrapper == "single" and not one.distributed


def test_cuda_resolution_when_gpus_are_visible(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 2)
    cfg = TrainConfig(ranks=2, precision="fp16")
    assert (cfg.resolved_device, cfg.resolved_backend) == ("cuda", "nccl")
    with pytest.raises(ConfigError, match="at most 2 per node"):
        TrainConfig(ranks=4, global_batch=64)


def test_loader_defaults_on_the_cpu_are_the_old_fixed_ones_and_add_nothing_to_the_resolved_config(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 0)
    resolved = TrainConfig().resolved()
    assert (resolved.num_workers, resolved.pin_memory, resolved.auto_note) == (0, False, None)
    # the resolved CPU config is the one earlier versions stored (num_workers 0, pin_memory False, no note), so a
    # stored CPU run and a new cell of the same settings are the same cell
    old = {**resolved.to_dict(), "num_workers": 0, "pin_memory": False}
    old.pop("auto_note")
    assert TrainConfig.from_dict(old).resolved().to_dict() == resolved.to_dict()


def test_on_cuda_unset_loader_fields_resolve_to_workers_and_pinned_memory_and_say_why(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 1)
    resolved = TrainConfig().resolved()
    assert (resolved.num_workers, resolved.pin_memory) == (config_mod.CUDA_LOADER_WORKERS, True) == (2, True)
    assert resolved.auto_note == (
        "num_workers=2: unset, the CUDA default (the loader's host work overlaps the GPU's instead of leaving it "
        "idle); pin_memory=True: unset, the CUDA default (host-to-device copies from pinned memory run "
        "asynchronously)")
    assert resolved.resolved() == resolved  # resolving a stored config again keeps its values and its note
    assert TrainConfig.from_dict(resolved.to_dict()).resolved() == resolved


@pytest.mark.parametrize("given,workers,pinned,note", [
    ({"num_workers": 0}, 0, True, "pin_memory=True"),
    ({"pin_memory": False}, 2, False, "num_workers=2"),
    ({"num_workers": 4, "pin_memory": False}, 4, False, None),
    ({"device": "cpu"}, 0, False, None),  # a CPU run on a GPU machine keeps the CPU defaults
])
def test_a_value_the_user_set_is_kept_and_only_unset_fields_are_noted(monkeypatch, given, workers, pinned, note):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 1)
    resolved = TrainConfig(**given).resolved()
    assert (resolved.num_workers, resolved.pin_memory) == (workers, pinned)
    if note is None:
        assert resolved.auto_note is None
    else:
        assert resolved.auto_note.startswith(note) and ";" not in resolved.auto_note


def test_prefetch_factor_needs_workers_which_cuda_gives_by_default(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 1)
    assert TrainConfig(prefetch_factor=4).resolved().num_workers == 2
    with pytest.raises(ConfigError, match="num_workers > 0"):
        TrainConfig(prefetch_factor=4, num_workers=0)


def test_yaml_round_trip_flags_override_and_unknown_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: mlp\nglobal_batch: 32\nepochs: 2\n")
    cfg = TrainConfig.from_yaml(path, {"epochs": 3, "lr": None})
    assert (cfg.model, cfg.global_batch, cfg.epochs) == ("mlp", 32, 3)
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    path.write_text("modle: mlp\n")
    with pytest.raises(ConfigError, match="unknown field"):
        TrainConfig.from_yaml(path)


@pytest.mark.parametrize("text,fragment", [("model: [unclosed\n", "not valid YAML at line"), ("- a\n- b\n", "mapping"),
                                           ("!!python/object/apply:os.system ['true']\n", "not valid YAML")])
def test_bad_yaml_is_one_line(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_yaml(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_missing_yaml_file():
    with pytest.raises(ConfigError, match="file not found"):
        TrainConfig.from_yaml("/nonexistent/run.yaml")


def test_a_stored_config_of_the_previous_version_reads_strategy_as_wrapper():
    cfg = TrainConfig.from_dict({"strategy": "single", "ranks": 1})
    assert cfg.wrapper == "single" and "strategy" not in cfg.to_dict()


def test_model_options_have_one_spelling_and_reach_the_builder():
    from scalelab.lab.cells import cell_key
    from scalelab.train.setup import build_inputs
    from scalelab.zoo.models import count_parameters

    a = TrainConfig(model="mlp", samples=8, eval_samples=8, model_options=" width=8, depth=2")
    b = TrainConfig(model="mlp", samples=8, eval_samples=8, model_options="depth=2.0,width=8")
    assert a.model_options == b.model_options == "depth=2,width=8" and cell_key(a) == cell_key(b)
    assert a.model_overrides == {"depth": 2, "width": 8} and TrainConfig().model_overrides == {}
    _, model = build_inputs(a)  # 3x32x32 synthetic images, 10 classes: 3072*8+8 + 8*8+8 + 8*10+10 parameters
    assert count_parameters(model) == 3072 * 8 + 8 + 8 * 8 + 8 + 8 * 10 + 10
    assert TrainConfig.from_dict(a.to_dict()).model_options == "depth=2,width=8"


@pytest.mark.parametrize("kwargs,value,fragment", [
    (dict(model="mlp", model_options="depth"), "'depth'", "NAME=NUMBER pairs"),
    (dict(model="mlp", model_options="depth=-1"), "'depth=-1'", "numbers >= 0"),
    (dict(model="mlp", model_options="depth=two"), "'depth=two'", "NAME=NUMBER pairs"),
    (dict(model="mlp", model_options="depth=nan"), "'depth=nan'", "NAME=NUMBER pairs"),
    (dict(model="mlp", model_options="depth=1,depth=2"), "'depth=1,depth=2'", "NAME=NUMBER pairs"),
    (dict(model="mlp", model_options="colour=3"), "'colour'", "mlp accepts: width, depth, embed"),
    (dict(model="m.py:make", model_options="depth=2"), "'depth=2'", "user models take no options"),
])
def test_bad_model_options_are_one_line(kwargs, value, fragment):
    with pytest.raises(ConfigError) as info:
        TrainConfig(**kwargs)
    assert info.value.field == "model_options" and value in str(info.value) and fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_steps_auto_from_every_layer_and_a_number_still_fixes_the_length():
    from scalelab.cli.options import merge

    assert merge({"steps": 20}, None, [], {"steps": "auto"}).auto_length  # a flag overrides an experiment's steps
    assert merge({}, None, ["steps=auto"], {}).steps == "auto"
    fixed = merge({}, None, [], {"steps": "12"})
    assert fixed.steps == 12 and not fixed.auto_length
    with pytest.raises(ConfigError) as info:
        merge({}, None, [], {"steps": "lots"})
    assert info.value.field == "steps" and "auto" in str(info.value)


def test_a_caller_side_network_delay_is_refused_on_nccl_which_returns_at_launch(monkeypatch):
    monkeypatch.setattr(config_mod, "cuda_device_count", lambda: 1)
    for emulation in ({"net_latency_ms": 1.0}, {"net_bandwidth_gbps": 1.0}):
        with pytest.raises(ConfigError) as info:
            TrainConfig(device="cuda", sync="allreduce", **emulation)
        assert info.value.field in emulation and "gloo" in str(info.value) and "\n" not in str(info.value)
        assert TrainConfig(device="cuda", sync="allreduce", backend="gloo", **emulation).resolved_backend == "gloo"
