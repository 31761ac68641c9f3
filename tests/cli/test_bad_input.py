"""Bad input, table-driven: flags, config files, data files and user model files each give one line naming the
problem, exit code 2 and leave the store as it was; the config and study parsers, fuzzed, raise nothing but
ConfigError."""
from __future__ import annotations

import dataclasses
import gzip
import math
import os
import pickle
import struct
import typing

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalelab.cli import main
from scalelab.config import TrainConfig, load_yaml
from scalelab.errors import ConfigError
from scalelab.lab.registry import names as experiment_registry_names
from scalelab.lab.study import StudySpec, load_spec

EXPERIMENTS = experiment_registry_names()

pytestmark = pytest.mark.timeout(240)


class _MakesDir:
    """Unpickling this calls os.mkdir: a CIFAR batch holding it must be refused, never executed."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _idx(magic: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return struct.pack(f">I{len(dims)}I", magic, *dims) + payload


def _write_files(d) -> None:
    """Every bad file of the table, under d."""
    text = {
        # config files
        "list.yaml": "- model\n- cnn\n",
        "unknown.yaml": "modle: mlp\n",
        "wrong_type.yaml": "epochs: two\n",
        "float_for_int.yaml": "global_batch: 64.0\n",
        "syntax.yaml": "model: cnn\nlr: [0.1\n",
        "pyobject.yaml": f"model: !!python/object/apply:os.mkdir ['{d / 'pwned'}']\n",
        "huge_int.yaml": "seed: " + "9" * 5000 + "\n",
        "nan_lr.yaml": "lr: .nan\n",
        # study files
        "study_unknown_exp.yaml": "experiments: [profile, warp_drive]\n",
        "study_base_list.yaml": "base: [model, cnn]\n",
        "study_options_int.yaml": "options:\n  profile: 5\n",
        "study_unknown_key.yaml": "experimnets: [profile]\n",
        "study_bad_base_field.yaml": "base:\n  global_batch: -4\n",
        # user model / dataset files
        "syntax_model.py": "import torch\n\ndef make(spec)\n    return torch.nn.Linear(1, 1)\n",
        "no_func.py": "from torch import nn\n\ndef build(spec):\n    return nn.Linear(1, 1)\n",
        "returns_int.py": "def make(spec):\n    return 42\n",
        "raises_on_import.py": "raise RuntimeError('boom\\nsecond line')\n",
        "exits_on_import.py": "import sys\nsys.exit(3)\n",
        "not_callable.py": "make = 3\n",
        "two_args.py": "def make(spec, width):\n    return None\n",
        "factory_raises.py": "def make(spec):\n    raise ValueError('width must be even')\n",
        "empty_data.py": "import torch\nfrom torch.utils.data import TensorDataset\n\n"
                         "def data():\n    empty = TensorDataset(torch.zeros(0, 4), torch.zeros(0))\n"
                         "    return empty, empty, 2\n",
        "data_wrong_type.py": "def data():\n    return [1, 2, 3]\n",
    }
    for name, body in text.items():
        (d / name).write_text(body)
    (d / "latin1.yaml").write_bytes(b"model: caf\xe9\n")

    # MNIST: a truncated image file; a label file with a label of 12; a .gz that is not gzip
    for name in ("mnist_truncated", "mnist_label", "mnist_badgz"):
        (d / name).mkdir()
    (d / "mnist_truncated" / "train-images-idx3-ubyte").write_bytes(_idx(0x803, (100, 28, 28), bytes(500)))
    (d / "mnist_label" / "train-images-idx3-ubyte").write_bytes(_idx(0x803, (2, 2, 2), bytes(8)))
    (d / "mnist_label" / "train-labels-idx1-ubyte").write_bytes(_idx(0x801, (2,), bytes([3, 12])))
    (d / "mnist_badgz" / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(bytes(64))[:20])
    (d / "not_a_dir").write_text("a file, not a folder\n")

    # CIFAR-10: garbage bytes; a pickle calling os.system; a pickle of a list; only a batch named with a
    # superscript digit (not a data_batch_<k>)
    for name in ("cifar_garbage", "cifar_evil", "cifar_list", "cifar_superscript"):
        (d / name).mkdir()
    garbage = bytes(range(7, 256)) * 3
    for name in ("data_batch_1", "test_batch"):
        (d / "cifar_garbage" / name).write_bytes(garbage)
        (d / "cifar_evil" / name).write_bytes(pickle.dumps({b"data": _MakesDir(d / "pwned")}, protocol=2))
        (d / "cifar_list" / name).write_bytes(pickle.dumps([1, 2, 3], protocol=2))
    (d / "cifar_superscript" / "data_batch_\u00b9").write_bytes(garbage)
    (d / "cifar_superscript" / "test_batch").write_bytes(garbage)

    # image folders: empty; a class folder without images
    (d / "images_empty").mkdir()
    (d / "images_no_pics" / "cat").mkdir(parents=True)
    (d / "images_no_pics" / "cat" / "notes.txt").write_text("no images here\n")


# (id, argv with {d} = the folder of bad files, fragments the one line must contain)
CASES = [
    # ---- flags
    ("wrapper-unknown", ["train", "--wrapper", "zero3"], ["wrapper: 'zero3'", "'auto', 'single', 'dp', 'ddp'"]),
    ("strategy-renamed", ["train", "--strategy", "ddp"], ["--strategy was renamed: use --wrapper"]),
    ("lr-negative", ["train", "--lr", "-0.1"], ["lr: -0.1", "a number > 0"]),
    ("lr-nan", ["train", "--lr", "nan"], ["lr: nan", "a finite number"]),
    ("momentum-1.5", ["train", "--momentum", "1.5"], ["momentum: 1.5", "0 <= momentum < 1"]),
    ("batch-not-divisible-by-accumulate", ["train", "--global-batch", "64", "--ranks", "2", "--accumulate", "3"],
     ["global_batch: 64", "ranks x accumulate (6)"]),
    ("batch-larger-than-dataset", ["train", "--global-batch", "64", "--drop-last"],
     ["global_batch: 64", "16 training samples", "at most 16"]),
    ("seed-too-big", ["train", "--seed", "1" + "0" * 25], ["seed: 1000", "64 bits"]),
    ("seed-too-big-for-mnist1d", ["train", "--dataset", "mnist1d", "--model", "mlp", "--seed", "5000000000"],
     ["seed: 5000000000", "allowed: 0..4294967253"]),
    ("memory-limit-nan", ["train", "--memory-limit", "nan"], ["memory_limit: 'nan'", "a size > 0"]),
    ("endpoint-port", ["train", "--nnodes", "2", "--rdzv-endpoint", "node0:99999"],
     ["rdzv_endpoint: 'node0:99999'", "port 1..65535"]),
    ("study-only-unknown", ["study", "--only", "profile,warp_drive"], ["only: 'warp_drive'", "allowed: profile"]),
    ("study-budget-word", ["study", "--budget", "ten"], ["budget: 'ten'", "allowed: a duration > 0"]),
    ("study-budget-zero", ["study", "--quick", "--budget", "0m"], ["budget: '0m'", "allowed: a duration > 0"]),
    ("comm-size-suffix", ["bench", "comm", "--begin", "12Q"], ["begin: '12Q'", "optional K, M or G suffix"]),
    ("comm-end-below-begin", ["bench", "comm", "--begin", "4K", "--end", "1K"], ["end: '1K'", ">= begin (4K)"]),
    ("comm-unknown-op", ["bench", "comm", "--ops", "allreduce,alltoall"], ["ops: 'alltoall'", "allgather"]),
    ("sweep-batches-not-ints", ["batch-sweep", "--batches", "32,x"], ["batches: '32,x'", "comma-separated integers"]),
    ("set-unknown-field", ["batch-sweep", "--set", "modle=mlp"], ["config: 'modle'", "unknown field"]),
    ("set-value-not-yaml", ["batch-sweep", "--set", "lr=[0.1"], ["--set: 'lr=[0.1'", "not valid YAML"]),
    # ---- config files
    ("yaml-not-mapping", ["train", "--config", "{d}/list.yaml"], ["list.yaml", "must hold a mapping"]),
    ("yaml-unknown-key", ["train", "--config", "{d}/unknown.yaml"], ["config: 'modle'", "unknown field; allowed"]),
    ("yaml-wrong-type", ["train", "--config", "{d}/wrong_type.yaml"], ["epochs: 'two'", "allowed: int"]),
    ("yaml-float-for-int", ["train", "--config", "{d}/float_for_int.yaml"], ["global_batch: 64.0", "allowed: int"]),
    ("yaml-nan", ["train", "--config", "{d}/nan_lr.yaml"], ["lr: nan", "a finite number"]),
    ("yaml-missing", ["batch-sweep", "--config", "{d}/nowhere.yaml"], ["nowhere.yaml", "file not found"]),
    ("yaml-syntax", ["train", "--config", "{d}/syntax.yaml"], ["syntax.yaml", "not valid YAML at line"]),
    ("yaml-python-tag", ["train", "--config", "{d}/pyobject.yaml"],
     ["pyobject.yaml", "not valid YAML", "python/object/apply:os.mkdir"]),
    ("yaml-huge-int", ["train", "--config", "{d}/huge_int.yaml"], ["huge_int.yaml", "not valid YAML"]),
    ("yaml-not-utf8", ["train", "--config", "{d}/latin1.yaml"], ["latin1.yaml", "not valid YAML", "utf-8"]),
    ("study-unknown-experiment", ["study", "--config", "{d}/study_unknown_exp.yaml"],
     ["study.experiments: 'warp_drive'", "allowed: profile"]),
    ("study-base-not-mapping", ["study", "--config", "{d}/study_base_list.yaml"],
     ["study.base: ['model', 'cnn']", "a mapping"]),
    ("study-options-not-mapping", ["study", "--config", "{d}/study_options_int.yaml"],
     ["study.options: {'profile': 5}", "a mapping of option: value"]),
    ("study-unknown-key", ["study", "--config", "{d}/study_unknown_key.yaml"], ["study: 'experimnets'", "unknown key"]),
    ("study-bad-base-field", ["study", "--config", "{d}/study_bad_base_field.yaml"],
     ["global_batch: -4", "an integer >= 1"]),
    # ---- data files
    ("mnist-truncated", ["train", "--dataset", "mnist", "--data-path", "{d}/mnist_truncated"],
     ["train-images-idx3-ubyte is truncated", "needs 78416"]),
    ("mnist-label-range", ["train", "--dataset", "mnist", "--data-path", "{d}/mnist_label"],
     ["train-labels-idx1-ubyte", "label 12 out of range 0..9"]),
    ("mnist-bad-gzip", ["train", "--dataset", "mnist", "--data-path", "{d}/mnist_badgz"],
     ["mnist: cannot read", "train-images-idx3-ubyte.gz"]),
    ("mnist-path-is-file", ["train", "--dataset", "mnist", "--data-path", "{d}/not_a_dir"],
     ["not_a_dir is not a directory"]),
    ("cifar-garbage", ["train", "--dataset", "cifar10", "--data-path", "{d}/cifar_garbage"],
     ["cifar10: cannot read", "data_batch_1"]),
    ("cifar-pickle-global", ["train", "--dataset", "cifar10", "--data-path", "{d}/cifar_evil"],
     ["refusing to unpickle", "mkdir", "data_batch_1"]),
    ("cifar-not-a-dict", ["train", "--dataset", "cifar10", "--data-path", "{d}/cifar_list"],
     ["data_batch_1 holds a list", "expected a dict"]),
    ("cifar-odd-batch-name", ["train", "--dataset", "cifar10", "--data-path", "{d}/cifar_superscript"],
     ["missing file", "data_batch_1"]),
    ("imagefolder-empty", ["train", "--dataset", "imagefolder", "--data-path", "{d}/images_empty"],
     ["images_empty has no class folders"]),
    ("imagefolder-no-images", ["train", "--dataset", "imagefolder", "--data-path", "{d}/images_no_pics"],
     ["class folder 'cat'", "has no images"]),
    ("imagefolder-missing", ["train", "--dataset", "imagefolder", "--data-path", "{d}/no_such_folder"],
     ["no_such_folder does not exist"]),
    ("user-data-empty", ["train", "--dataset", "{d}/empty_data.py:data", "--model", "mlp"],
     ["empty_data.py:data", "empty train dataset"]),
    ("user-data-wrong-type", ["train", "--dataset", "{d}/data_wrong_type.py:data", "--model", "mlp"],
     ["data_wrong_type.py:data", "returned list", "expected a DataBundle"]),
    # ---- user model files
    ("model-file-missing", ["train", "--model", "{d}/nowhere.py:make"], ["nowhere.py", "file not found"]),
    ("model-syntax-error", ["train", "--model", "{d}/syntax_model.py:make"],
     ["syntax_model.py:make", "SyntaxError at line 3"]),
    ("model-no-function", ["train", "--model", "{d}/no_func.py:make"], ["no function 'make' in no_func.py"]),
    ("model-returns-int", ["train", "--model", "{d}/returns_int.py:make"],
     ["returns_int.py:make", "returned int, not a torch.nn.Module"]),
    ("model-raises-on-import", ["train", "--model", "{d}/raises_on_import.py:make"],
     ["raises_on_import.py:make", "RuntimeError: boom second line"]),
    ("model-exits-on-import", ["train", "--model", "{d}/exits_on_import.py:make"],
     ["exits_on_import.py:make", "SystemExit"]),
    ("model-not-callable", ["train", "--model", "{d}/not_callable.py:make"], ["'make' in not_callable.py is not callable"]),
    ("model-two-args", ["train", "--model", "{d}/two_args.py:make"], ["must take no arguments or one"]),
    ("model-factory-raises", ["train", "--model", "{d}/factory_raises.py:make"],
     ["factory_raises.py:make", "raised ValueError: width must be even"]),
    ("model-ref-without-function", ["train", "--model", "{d}/returns_int.py"], ["returns_int.py", "module:function"]),
]


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    _write_files(d)
    return d


@pytest.fixture
def seeded_store(store):
    """A store that already holds one completed run, which no bad input may disturb."""
    run_id = store.create_run({"model": "mlp"}, {}, kind="train")
    store.finish_run(run_id, "completed", summary={"throughput(samples/s)": 1.0})
    return store


def test_table_is_big_and_distinct():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) >= 20


@pytest.mark.parametrize("args,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_exit_code_2(args, fragments, bad_dir, seeded_store, capsys):
    before = seeded_store.list_runs()[["run_id", "status"]].to_dict("records")
    argv = [a.format(d=bad_dir) for a in args]
    if argv[0] == "train":
        argv += ["--samples", "16"]
    argv += ["--store", str(seeded_store.root)]
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert info.value.code == 2, (argv, captured.err)
    assert len(lines) == 1 and "Traceback" not in captured.err, (argv, captured.err)
    assert lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not (bad_dir / "pwned").exists()  # nothing in a data or config file was ever executed
    assert seeded_store.list_runs()[["run_id", "status"]].to_dict("records") == before


# ---------------------------------------------------------------- fuzzing the parsers

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
HINTS = typing.get_type_hints(TrainConfig)

scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from([0, -1, 1, 2**63, -2**63, 2**64, 10**400, float("nan"), float("inf"), "", "auto", "1e3"]))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def _typed(hint) -> st.SearchStrategy:
    """Values of (mostly) the right type for a field, so the fuzz reaches the checks after the type check."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return st.sampled_from(args)
    if args:
        return st.one_of([_typed(a) for a in args])
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-3, 300) | st.integers() | st.sampled_from([2**63 - 1, 2**63, -2**63 - 1, 10**30])
    if hint is float:
        return (st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 3)
                | st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, 2**63, 10**400]))
    if hint is str:
        return st.text(max_size=12) | st.sampled_from(["mlp", "cnn", "synthetic", "h:29500", "h:x", "h:\u00b9"])
    return st.none()


field_item = st.sampled_from(sorted(FIELDS)).flatmap(lambda n: st.tuples(st.just(n), _typed(HINTS[n]) | anything))
config_dicts = (field_item.map(lambda item: dict([item]))  # one field: often valid, so every check is reached
                | st.builds(lambda typed, extra: {**dict(typed), **extra}, st.lists(field_item, max_size=10),
                            st.dictionaries(st.text(max_size=8) | st.integers(), anything, max_size=1)))
FUZZ = settings(max_examples=250, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _config_or_error(data) -> None:
    try:
        cfg = TrainConfig.from_dict(data)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)
    else:  # what is accepted can be used: no NaN or inf, no int a C long cannot hold
        assert isinstance(cfg, TrainConfig)
        for name, value in cfg.to_dict().items():
            if isinstance(value, float):
                assert math.isfinite(value), (name, value)
            if isinstance(value, int):
                assert -2**63 <= value < 2**63, (name, value)


@FUZZ
@given(config_dicts)
def test_from_dict_raises_only_config_error(data):
    _config_or_error(data)


@FUZZ
@given(anything)
def test_from_dict_of_anything(data):
    _config_or_error(data)


def _load(path):
    try:
        return load_yaml(path)
    except ConfigError as err:
        assert "\n" not in str(err)
        return None


yaml_values = st.text(alphabet="0123456789abcxyz.-+_:[]{},'\"!&*#|>%@` \t\\e", max_size=12) | st.sampled_from(
    ["!!int x", "!!float x", "!!timestamp 2020-13-45", "2020-01-01", "!!binary x", "!!set {a}", ".nan", "-.inf",
     "!!python/object/apply:os.getcwd []", "!!python/name:os.system", "&a [*a]", "*nowhere", "0x" + "f" * 4000,
     "1" * 4400, "[" * 2000, "{a: {b: [1, {c: 2}]}}", "? [a]", "|\n  text", "'unterminated"])
yaml_lines = st.lists(st.tuples(st.sampled_from(sorted(FIELDS)) | st.text(max_size=5), yaml_values),
                      max_size=6).map(lambda items: "".join(f"{k}: {v}\n" for k, v in items))


@FUZZ
@given(st.text(max_size=80) | yaml_lines | st.binary(max_size=40))
def test_load_yaml_of_random_text(tmp_path, text):
    path = tmp_path / "fuzz.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    data = _load(path)
    if data is not None:
        assert isinstance(data, dict)
        _config_or_error(data)


@FUZZ
@given(config_dicts)
def test_load_yaml_of_dumped_configs(tmp_path, data):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    loaded = _load(path)
    assert loaded is not None  # what safe_dump wrote, safe_load reads
    _config_or_error(loaded)


experiment_names = st.sampled_from(EXPERIMENTS) | st.text(max_size=6)
study_dicts = st.dictionaries(
    st.sampled_from(["name", "experiments", "quick", "base", "options"]) | st.text(max_size=6),
    st.one_of(anything, st.lists(experiment_names, max_size=3), config_dicts,
              st.dictionaries(experiment_names, anything | st.fixed_dictionaries({"set": anything | config_dicts}),
                              max_size=2)),
    max_size=4)


@FUZZ
@given(study_dicts)
def test_study_spec_raises_only_config_error(data):
    try:
        spec = StudySpec.from_dict(data)
    except ConfigError as err:
        assert "\n" not in str(err)
    else:
        assert isinstance(spec, StudySpec)


@FUZZ
@given(study_dicts)
def test_load_spec_raises_only_config_error(tmp_path, data):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    try:
        spec = load_spec(path, quick=True)
    except ConfigError as err:
        assert "\n" not in str(err)
    else:
        assert isinstance(spec, StudySpec)


def test_a_dataset_too_big_for_memory_is_one_line(seeded_store, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--samples", "100000000000000", "--store", str(seeded_store.root)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert info.value.code == 2 and len(lines) == 1
    assert "samples: 100000000000000" in lines[0] and "does not fit in this machine's memory" in lines[0]
