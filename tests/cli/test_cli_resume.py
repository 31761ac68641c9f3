"""`scalelab train --resume` errors: one line, exit code 2, the catalog unchanged."""
from __future__ import annotations

from conftest import run_cli
from scalelab.config import TrainConfig
from scalelab.run.execute import execute


def test_cli_resume_errors_are_one_line(tmp_path, store):
    done = execute(TrainConfig(model="mlp", samples=32, eval_samples=16, global_batch=16, epochs=1), store,
                   say=lambda s: None)
    for args, expected in [
        (["--resume", done.run_id], "only a failed or interrupted training run can be resumed"),
        (["--resume", "no-such-run"], "not found"),
        (["--resume", done.run_id, "--lr", "0.1"], "a resumed run keeps its stored config; drop --lr"),
    ]:
        res = run_cli(["train", *args, "--store", str(store.root)])
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2 and len(lines) == 1 and expected in lines[0], res.stderr
    assert list(store.list_runs()["status"]) == ["completed"]
