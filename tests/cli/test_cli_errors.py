"""Bad input: one line naming the problem, exit code 2, nothing in the catalog lost, no run left unmarked."""
from __future__ import annotations

import pytest

from scalelab.cli import main

BAD_PY = "def make(:\n"


@pytest.fixture
def seeded_store(store):
    """A store that already holds one completed run, which no bad input may disturb."""
    run_id = store.create_run({"model": "mlp"}, {}, kind="train")
    store.finish_run(run_id, "completed", summary={"throughput(samples/s)": 1.0})
    return store


def cases(tmp):
    (tmp / "corrupt").mkdir()
    (tmp / "corrupt" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x04garbage")
    (tmp / "bad_model.py").write_text(BAD_PY)
    return [
        (["--model", "nosuchnet"], "model"),
        (["--dataset", "nosuchdata"], "dataset"),
        (["--global-batch", "33", "--ranks", "2"], "global_batch"),
        (["--ranks", "0"], "ranks"),
        (["--dataset", "cifar10", "--data-path", str(tmp / "missing")], "cifar10"),
        (["--dataset", "mnist", "--data-path", str(tmp / "corrupt")], "mnist"),
        (["--dataset", "cifar10"], "data_path"),
        (["--model", f"{tmp / 'bad_model.py'}:make"], "bad_model.py"),
        (["--model", "no_such_module_xyz:make"], "no_such_module_xyz"),
        (["--wrapper", "dp"], "wrapper"),
        (["--strategy", "dp"], "use --wrapper"),
        (["--backend", "nccl"], "backend"),
        (["--precision", "fp16"], "precision"),
        (["--nosuchflag", "1"], "nosuchflag"),
        (["--epochs", "many"], "epochs"),
        (["--config", str(tmp / "missing.yaml")], "config"),
    ]


def test_each_bad_input_is_one_line_with_exit_code_2(seeded_store, tmp_path, capsys):
    for args, fragment in cases(tmp_path):
        with pytest.raises(SystemExit) as info:
            main(["train", *args, "--samples", "16", "--store", str(seeded_store.root)])
        err = capsys.readouterr().err.strip()
        assert info.value.code == 2, (args, err)
        assert len(err.splitlines()) == 1, (args, err)
        assert err.startswith("error: ") and fragment in err, (args, err)
    runs = seeded_store.list_runs()
    assert list(runs["status"]) == ["completed"]  # nothing lost, nothing half-made


def test_unknown_run_in_runs_show(seeded_store, capsys):
    with pytest.raises(SystemExit) as info:
        main(["runs", "show", "nope", "--store", str(seeded_store.root)])
    assert info.value.code == 2
    assert "not found" in capsys.readouterr().err


def test_runs_list_show_compare(seeded_store, capsys):
    run_id = seeded_store.list_runs()["run_id"][0]
    main(["runs", "list", "--json", "--store", str(seeded_store.root)])
    assert run_id in capsys.readouterr().out
    main(["runs", "show", run_id[:12], "--store", str(seeded_store.root)])
    assert '"completed"' in capsys.readouterr().out
    main(["runs", "compare", run_id, "--store", str(seeded_store.root)])
    assert "throughput(samples/s)" in capsys.readouterr().out
