"""Plots. Each function reads a DataFrame that an analysis produced and writes one image; nothing is computed here
beyond choosing what to draw. Every figure carries its units, the repetitions and the spread (DESIGN).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed, and none is touched when one exists
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

_BUSBW_COLUMNS = ("op", "size(B)", "busbw(GB/s)", "busbw_min(GB/s)", "busbw_max(GB/s)", "status")


def _bytes_label(x: float) -> str:
    """1K, 64M, 1G for powers of 1024 (the units of the size sweep), the plain number otherwise."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if x >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def plot_busbw(table: pd.DataFrame, path: Path, *, title: str | None = None) -> Path:
    """busbw (median over iterations) against message size, log-x, one line per op, a band from min to max.

    `table` has the columns of commbench's results; ops whose rows are all skipped appear in the legend as such.
    """
    missing = [c for c in _BUSBW_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"table: missing column {missing[0]!r}; needs {', '.join(_BUSBW_COLUMNS)}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for op, rows in table.groupby("op", sort=False):
            ok = rows[rows["status"] == "ok"].sort_values("size(B)")
            if ok.empty:
                ax.plot([], [], linestyle="none", label=f"{op} (skipped)")
                continue
            sizes = ok["size(B)"].astype(float)
            line, = ax.plot(sizes, ok["busbw(GB/s)"].astype(float), marker="o", markersize=3, label=op)
            ax.fill_between(sizes, ok["busbw_min(GB/s)"].astype(float), ok["busbw_max(GB/s)"].astype(float),
                            color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: _bytes_label(x)))
        ax.set_xlabel("message size S (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
        ax.set_title((title + "\n" if title else "") + "line: median over iterations; band: min..max", fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
