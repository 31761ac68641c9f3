"""`scalelab runs list` at 80 and 120 columns: every run id printed whole (every other command takes one), the
columns that do not fit dropped and named, `--wide` for all of them; `--json` as before."""
from __future__ import annotations

import json

import pytest
from conftest import run_cli

from scalelab.config import TrainConfig
from scalelab.store import Store


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "store")
    ids = []
    for ranks, status in ((1, "completed"), (2, "failed"), (4, "completed")):
        cfg = TrainConfig(model="mlp", dataset="synthetic", global_batch=64, steps=4, ranks=ranks, device="cpu")
        rid = store.create_run(cfg.resolved().to_dict(), {}, kind="train")
        store.finish_run(rid, status, summary={}, reason="rank 1 raised ValueError: an error with a long message "
                         "that no terminal of 120 columns can hold beside the rest" if status == "failed" else None)
        ids.append(rid)
    return store, ids


# kept in WANTED's order while they fit: at 80 the 3-character "mlp" column would make the table 81 wide
@pytest.mark.parametrize("width, dropped", [(80, "model, created, wrapper, precision, dataset, reason"),
                                            (120, "precision, dataset, reason")])
def test_each_run_id_is_whole_and_the_dropped_columns_are_named(store, width, dropped):
    st, ids = store
    done = run_cli(["runs", "list", "--store", str(st.root)], env={"COLUMNS": str(width)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    print(done.stdout)
    assert all(len(line) <= width for line in lines), max(map(len, lines))
    for rid in ids:
        assert sum(rid in line for line in lines) == 1, rid
    below = lines[next(i for i, line in enumerate(lines) if line.startswith("└")) + 1:]  # wrapped at the width
    note = " ".join(line.strip() for line in below)
    assert note == f"not shown, to fit {width} columns: {dropped} (--wide shows every column)"


def test_wide_shows_every_column_and_json_is_unchanged(store):
    st, ids = store
    done = run_cli(["runs", "list", "--wide", "--store", str(st.root)], env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert "no terminal of 120 columns can hold beside the rest" in done.stdout and "not shown" not in done.stdout
    header = done.stdout.splitlines()[1]
    assert [h.strip() for h in header.strip("┃").split("┃")] == [
        "run_id", "created", "kind", "status", "model", "dataset", "ranks", "global_batch", "wrapper", "sync",
        "precision", "reason"]
    rows = json.loads(run_cli(["runs", "list", "--json", "--store", str(st.root)]).stdout)
    assert [r["run_id"] for r in rows] == ids[::-1]
