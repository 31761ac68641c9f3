"""Issue 60: a figure's caption and its legend name compute alike, as docs/definitions.md defines it (the
no-op-collectives baseline at its fastest rank): one wording (report.figures.COMPUTE_LABEL) in every legend and
caption that splits a step into compute and exposed communication."""
import pandas as pd

from scalelab.experiments import comparison, scale
from scalelab.experiments.bucket_sweep import EXPERIMENT as BUCKETS
from scalelab.report import figures
from scalelab.report.figures import COMPUTE_LABEL


def legend_of(draw, monkeypatch, module, *args, **kwargs) -> list[str]:
    """The legend labels of the figure `draw` saves (its save is caught before the file is written)."""
    caught = []
    monkeypatch.setattr(module, "save", lambda fig, path, series=None: caught.append(fig) or path)
    draw(*args, **kwargs)
    labels = [t.get_text() for fig in caught for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]
    for fig in caught:
        figures.plt.close(fig)
    return labels


def test_the_scaling_breakdown_caption_and_legend_name_compute_alike(monkeypatch, tmp_path):
    table = pd.DataFrame({"workers": [1, 2], "global_batch": [64, 64], "compute(ms)": [20.0, 22.0],
                          "step(ms)": [20.0, 30.0], "exposed_comm(ms)": [0.0, 8.0], "exposed_ci_low(ms)": [0.0, 6.0],
                          "exposed_ci_high(ms)": [0.0, 10.0]})
    legend = legend_of(scale.compute_comm_bars, monkeypatch, scale, table, tmp_path / "b.png")
    assert COMPUTE_LABEL in legend
    for mode in ("strong", "weak"):
        assert COMPUTE_LABEL in scale.EXPERIMENT.captions[f"scale_{mode}_breakdown.png"]
    assert "fastest rank" in COMPUTE_LABEL and "no-op collectives" in COMPUTE_LABEL  # docs/definitions.md's words


def test_the_comparison_and_bucket_captions_and_legends_name_compute_alike(monkeypatch, tmp_path):
    table = pd.DataFrame({"sync": ["ddp"], "status": ["completed"], "step(ms)": [30.0], "step_ci_low(ms)": [29.0],
                          "step_ci_high(ms)": [31.0], "compute(ms)": [22.0], "exposed_comm(ms)": [8.0],
                          "comm(ms)": [9.0]})
    assert COMPUTE_LABEL in legend_of(figures.comm_breakdown_bars, monkeypatch, figures, table, tmp_path / "c.png",
                                      label="sync")
    captions = comparison.comm_captions("compare_strategies", "strategy")
    assert COMPUTE_LABEL in captions["compare_strategies"] and COMPUTE_LABEL in captions["compare_strategies.png"]
    assert COMPUTE_LABEL in BUCKETS.captions["bucket_sweep"]
