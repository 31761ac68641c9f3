"""The performance-model experiment on real runs: calibration from a tiny real study, validation against real
2-rank runs with an injected (emulated) latency, and `scalelab predict`.

One module-scoped study (2 gloo ranks on 127.0.0.1) is shared: the calibration (per batch a compute run without
sync, an in-situ allreduce run and an in-situ bucketed run; one `bench comm` sweep), and two runs with
per-parameter allreduce under 20 ms of emulated latency. The model has 3 parameter
tensors (no biases), so the emulated part of a step is at least 3 × 20 ms: the known truth.
"""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import TINY_MLP, quiet_cells
from scalelab.cli import main
from scalelab.config import TrainConfig
from scalelab.lab.cells import Cell, with_fields
from scalelab.perf.calibrate import calibrate
from scalelab.perf.calibration import Calibration, calibration_path
from scalelab.perf.prediction import predict_table
from scalelab.perf.validation import validate_measured
from scalelab.store import Store

PARAM_BYTES = [16 * 3072 * 4, 16 * 16 * 4, 10 * 16 * 4]
LATENCY_MS = 20.0
BATCHES = [4, 16]


def base_config(model: str) -> TrainConfig:
    return TrainConfig(model=model, dataset="synthetic", samples=256, eval_samples=32, ranks=2, global_batch=16,
                       steps=6)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("prediction")
    (root / "tiny.py").write_text(TINY_MLP)
    model = f"{root / 'tiny.py'}:make"
    store, base, said = Store(root / "store"), base_config(model), []
    engine = quiet_cells(store, "t")
    cal = calibrate(base, engine, batches=BATCHES, say=said.append)
    cells = [Cell(f"latency, batch {b}", with_fields(base, global_batch=2 * b, sync="allreduce",
                                                     net_latency_ms=LATENCY_MS)) for b in BATCHES]
    check = validate_measured(cal, engine.runs(engine.run(cells, group="validation")), say=said.append)
    return SimpleNamespace(root=root, model=model, store=store, base=base, cal=cal, check=check, said=said)


def completed_train_runs(store: Store, study: str) -> list[dict]:
    ids = store.list_runs(study=study, status="completed", kind="train")["run_id"]
    return [store.get(i) for i in ids]


# ---------------------------------------------------------------- calibration (real runs)

@pytest.mark.dist
@pytest.mark.timeout(240)
def test_calibration_from_a_tiny_study_is_a_usable_model(study):
    cal = study.cal
    assert cal.param_bytes == PARAM_BYTES and cal.parameters == sum(PARAM_BYTES) // 4
    assert [p["per_rank_batch"] for p in cal.points] == BATCHES and len(cal.compute_runs) == 2
    assert cal.ranks == 2 and cal.backend == "gloo" and cal.alpha_s >= 0 and cal.beta_s_per_byte > 0
    model = cal.compute_model()
    assert 0 < model.step_ms(4) <= model.step_ms(16) <= model.step_ms(64)
    saved = Calibration.load(calibration_path(study.store, "t"))
    assert saved == cal
    # per batch: the compute run, an allreduce run and a bucketed run (the overlap), all completed
    runs = completed_train_runs(study.store, "t/calibration")  # the bench run of α and β is there too
    alone = [r for r in runs if r["config"]["ranks"] == 1]
    assert sorted((r["config"]["sync"], r["config"]["global_batch"] // 2) for r in runs if r not in alone) == sorted(
        (sync, b) for sync in ("noop", "allreduce", "bucketed") for b in BATCHES)
    # and one rank alone per batch at its default threads: the baseline of one rank per node (docs/model.md)
    assert sorted(r["config"]["global_batch"] for r in alone) == BATCHES
    assert all(r["config"]["threads"] is None for r in alone)
    assert [p["per_rank_batch"] for p in cal.lone_points] == BATCHES and cal.host_slowdown > 0
    # the calibration line prints the baseline and the slowdown that shared-host rows get
    assert any(f"2 ranks sharing this host ×{cal.host_slowdown:.2f}" in line for line in study.said)
    assert 0 <= cal.overlap <= 1 and cal.hardware().overlap == cal.overlap
    # a batch's row is left out only when its runs had under a µs of hideable communication
    assert {r["per_rank_batch"] for r in cal.insitu if "overlap" in r} <= set(BATCHES)
    table = predict_table(cal, cal.hardware(), [1, 2, 8], batch=8, strategy="allreduce")
    # one worker is one rank alone (its own threads), the others ranks sharing the host: monotone from 2 workers on
    assert table["step(ms)"].iloc[1:].is_monotonic_increasing and table["efficiency"].iloc[0] == 1
    # the model-error term: each in-situ launch predicted by the fit without its batch (perf/modelerror.py)
    assert sorted((r["check"], r["sync"], r["per_rank_batch"]) for r in cal.residuals) == sorted(
        ("leave batch out", sync, b) for sync in ("allreduce", "bucketed") for b in BATCHES)
    assert (table["step_ci_low(ms)"] < table["step_ci50_low(ms)"]).all()
    assert (table["step_ci50_high(ms)"] < table["step_ci_high(ms)"]).all()
    assert (table["model_half_width(%)"] > 0).all() and any("model error from 4" in line for line in study.said)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_calibration_is_reused_without_new_runs(study):
    before, said = len(study.store.list_runs()), []
    again = calibrate(study.base, quiet_cells(study.store, "t"), batches=BATCHES, say=said.append)
    assert again == study.cal and len(study.store.list_runs()) == before
    assert any("reused" in line for line in said)


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_validation_recovers_the_emulated_latency(study):
    check = study.check
    assert len(check) == 2 and set(check["sync"]) == {"allreduce"}
    assert (check["net_latency_ms"] == LATENCY_MS).all()
    # 3 parameters, one blocking allreduce each, every one padded to >= 20 ms: the known truth
    assert (check["comm(ms)"] >= 3 * LATENCY_MS).all() and (check["exposed_comm(ms)"] == check["comm(ms)"]).all()
    assert (check["measured_comm(ms)"] >= 3 * LATENCY_MS * 0.99).all()
    assert (check["error(%)"].abs() < 25).all(), check[["predicted", "measured", "error(%)"]]
    assert check.attrs["median_abs_error(%)"] == pytest.approx(check["error(%)"].abs().median())
    assert check["inside"].notna().all() and check["inside50"].notna().all() and check["refused"].isna().all()


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_predict_cli_with_the_stored_calibration_writes_its_files(study, capsys):
    out = study.root / "out"
    hw = study.root / "hw.yaml"
    hw.write_text("preset: 100gbe\nname: my cluster\ngpus_per_node: 4\n")
    before = len(study.store.list_runs())
    main(["predict", "--model", study.model, "--dataset", "synthetic", "--set", "samples=256", "--set",
          "eval_samples=32", "--steps", "6", "--calibration-batches", ",".join(map(str, BATCHES)), "--no-validate",
          "--workers", "1,2,4,64", "--hardware", "measured", "--hardware", "10gbe", "--hardware-file", str(hw),
          "--per-rank-batch", "8", "--study", "t", "--store", str(study.store.root), "--out", str(out)])
    text = capsys.readouterr().out
    assert "reused" in text and "efficiency < 50 % (" in text
    assert len(study.store.list_runs()) == before  # the stored calibration, no new runs
    for name in ("prediction.csv", "prediction.json", "options.csv", "options.json", "prediction.png"):
        assert (out / name).stat().st_size > 0, name
    table = pd.read_csv(out / "prediction.csv")
    assert sorted(table["workers"].unique()) == [1, 2, 4, 64] and table["hardware"].nunique() == 3
    assert "compute of this machine on my cluster" in set(table["hardware"])  # a file pairs with compute here
    # presets and the file carry the same intervals (only compute varies in their sampling part)
    assert table["step_ci_low(ms)"].notna().all() and (table["model_half_width(%)"] > 0).all()
