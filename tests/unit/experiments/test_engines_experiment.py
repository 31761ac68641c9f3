"""`compare engines` without starting Horovod: a missing install is a skipped row saying how to install it, the
table keeps the registry's order and a run without its baseline has no exposed communication (not made up), and
the default study (not the quick one) holds the experiment."""
from __future__ import annotations

import pandas as pd

from conftest import quiet_cells
from scalelab.analysis.compare import comparison_table
from scalelab.config import TrainConfig
from scalelab.engines import horovod
from scalelab.experiments import engines as engines_exp
from scalelab.lab.base import Context
from scalelab.lab.study import default_spec


def _run(run_id, step, engine="ddp", **config):
    cfg = {"sync": "ddp" if engine == "ddp" else "auto", "engine": engine, "global_batch": 16, "ranks": 2,
           "nnodes": 1, "backend": "gloo", **config}
    summary = {"time/step_median(ms)": step, "time/step_min(ms)": step - 1, "time/step_max(ms)": step + 1,
               "time/step_median_ci_low(ms)": step - 0.5, "time/step_median_ci_high(ms)": step + 0.5,
               "comm/time(ms)": 10.0, "comm/bytes_per_step": 1000.0}
    return {"run_id": run_id, "config": cfg, "summary": summary, "status": "completed"}


def test_a_missing_horovod_is_a_skipped_row_naming_the_setup_command(monkeypatch, store, tmp_path):
    monkeypatch.setattr(horovod.importlib.util, "find_spec", lambda name: None)
    said = []
    ctx = Context(cells=quiet_cells(store, "st"), out_dir=tmp_path, say=said.append)
    result = engines_exp.run_engines(ctx, TrainConfig(model="mlp", ranks=2, steps=3),
                                     {"engines": ["horovod"], "launches": 1, "baseline": True})
    table = result.tables["compare_engines"]
    assert list(table["engine"]) == ["horovod"] and list(table["status"]) == ["skipped"]
    assert table.at[0, "reason"] == "horovod is not installed (run `scalelab setup horovod`)"
    assert said == ["[engines] horovod: skipped: horovod is not installed (run `scalelab setup horovod`)"]
    assert len(store.list_runs()) == 0  # nothing ran


def test_engines_table_keeps_the_order_and_the_baseline():
    ddp, ddp_base = _run("d", 30.0), _run("dn", 25.0, noop_collectives=True)
    hvd = _run("h", 28.0, engine="horovod")
    table = comparison_table([(hvd, None), (ddp, ddp_base)], axis="engine",
                             label_of=lambda c: c.get("engine", "ddp"), order=("ddp", "horovod"))
    assert list(table["engine"]) == ["ddp", "horovod"]
    assert table.at[0, "exposed_comm(ms)"] == 5.0 and table.at[0, "baseline_run_id"] == "dn"
    assert pd.isna(table.at[1, "exposed_comm(ms)"])  # no baseline: not applicable, not made up


def test_the_default_study_compares_engines_and_the_quick_one_does_not():
    assert "engines" in default_spec().experiments
    assert "engines" not in default_spec(quick=True).experiments
    assert default_spec().options["engines"]["launches"] == 1


def test_the_sentences_say_which_figures_compare_and_what_the_baseline_cannot_keep():
    from scalelab.lab.base import Result

    ddp, ddp_base = _run("d", 30.0), _run("dn", 25.0, noop_collectives=True)
    hvd, hvd_base = _run("h", 34.0, engine="horovod"), _run("hn", 26.0, engine="horovod", noop_collectives=True)
    table = comparison_table([(ddp, ddp_base), (hvd, hvd_base)], axis="engine",
                             label_of=lambda c: c.get("engine", "ddp"), order=("ddp", "horovod"))
    table["fusion_copies(ms)"] = [None, 0.25]
    lines, _ = engines_exp.engines_result(Result("compare_engines", {"compare_engines": table}))
    text = " ".join(lines)
    assert "they are rank 0's, where DDP's time inside collectives is the mean over ranks" in text
    assert "not fully comparable" in text and "0.25 ms per step, measured from its timeline" in text
    assert "background negotiation cycle (not measured)" in text
    table.loc[1, "quality"] = "implausible: for the test"
    lines, _ = engines_exp.engines_result(Result("compare_engines", {"compare_engines": table}))
    assert "no figure: the row is set aside" in " ".join(lines) and "0.25 ms" not in " ".join(lines)
    table.loc[1, "quality"] = "ok"
    table["fusion_copies(ms)"] = [None, float("nan")]
    lines, _ = engines_exp.engines_result(Result("compare_engines", {"compare_engines": table}))
    assert "not measured: no timeline" in " ".join(lines)
    alone = comparison_table([(ddp, ddp_base)], axis="engine", label_of=lambda c: c.get("engine", "ddp"),
                             order=("ddp", "horovod"))
    assert engines_exp.comparability(alone) == []  # no Horovod row: nothing to qualify
