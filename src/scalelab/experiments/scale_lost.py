"""The scale experiment's lost-speedup part (scalelab.analysis.breakdown): the waterfall of each multi-rank cell
and the sentences that name its largest cause. Both only read the `scale_<mode>_lost_speedup` tables."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalelab.analysis.breakdown import (ADDITIVE, LEAVES, PARTS, REST_LIMIT, SUBPARTS, largest_cause, largest_split,
                                         exposed_sum)
from scalelab.analysis.stragglers import MATERIAL
from scalelab.analysis.interpret import fmt
from scalelab.report.figures import Series, plt, save

MODES = ("strong", "weak")


def waterfall(table: pd.DataFrame, path: Path, *, name: str | None = None) -> Path:
    """Per multi-rank cell (a lost-speedup table: scalelab.analysis.breakdown), a waterfall from the ideal step to
    the measured one through the additive parts (data, compute, sync work, exposed communication): each a floating
    bar from where the previous ended, with its 95 % interval; a part not measured is a hatched gap at 0 labelled
    so; the rest last, then the measured step. Beside it, apart, the split of exposed communication (waiting,
    wire, interference, hidden), each bar from 0: parts of the exposed bar, not steps of the waterfall."""
    source = name  # the table's key in its result (report.drawn); `name` names a part below
    cells = list(table.groupby(["workers", "global_batch"], sort=True))
    fig, axes = plt.subplots(1, len(cells), figsize=(max(8, 7.5 * len(cells)), 4.2), squeeze=False)
    order = ["ideal", *ADDITIVE, "rest", "measured"]
    for ax, ((workers, batch), group) in zip(axes[0], cells):
        part = group.set_index("part")
        level, names = 0.0, []
        for i, name in enumerate(order):
            row = part.loc[name]
            value = float(row["value(ms)"])
            names.append(name.replace("_", " ") + ("" if row["measured"] else "\n(not measured)"))
            if name in ("ideal", "measured"):
                ax.bar(i, value, color="tab:gray" if name == "ideal" else "black", alpha=0.8)
                level = value if name == "ideal" else level
            elif pd.isna(value):
                ax.bar(i, 0.0, bottom=level, color="none", edgecolor="tab:gray", hatch="//")
                continue
            else:
                ax.bar(i, value, bottom=level, color="tab:red" if value > 0 else "tab:green",
                       edgecolor="black" if row["measured"] else "tab:gray", hatch="" if row["measured"] else "//")
                level += value
            low, high = row["value_ci_low(ms)"], row["value_ci_high(ms)"]
            if pd.notna(low) and pd.notna(high):
                top = level if name not in ("ideal", "measured") else value
                ax.errorbar(i, top, yerr=[[max(value - low, 0)], [max(high - value, 0)]], fmt="none",
                            ecolor="black", capsize=2)
        names += _split_bars(ax, part, start=len(order) + 1)
        ax.set_xticks([*range(len(order)), *range(len(order) + 1, len(order) + 1 + len(SUBPARTS))], names,
                      rotation=60, ha="right", fontsize=8)
        ax.set(ylabel="time per step (ms)", title=f"{int(workers)} workers, global batch {int(batch)}")
    fig.suptitle("Ideal step -> measured step (red: lost, green: gained; bars: 95 % intervals); right of the "
                 "dotted line: exposed communication split", fontsize=9)
    fig.tight_layout()
    return save(fig, path, [Series("", source, "value(ms)", axis=i) for i in range(len(cells))])

def _split_bars(ax, part: pd.DataFrame, *, start: int) -> list[str]:
    """The split of exposed communication beside the waterfall, from 0, after a dotted line; its tick labels."""
    ax.axvline(start - 1, color="tab:gray", linestyle=":")
    names = []
    for i, name in enumerate(SUBPARTS, start):
        row = part.loc[name]
        value, low, high = (float(row[c]) for c in ("value(ms)", "value_ci_low(ms)", "value_ci_high(ms)"))
        names.append(f"exposed: {name}" + ("" if row["measured"] else "\n(not measured)"))
        if pd.isna(value):
            continue
        ax.bar(i, value, color="tab:orange" if value >= 0 else "tab:green", alpha=0.7, edgecolor="black")
        if pd.notna(low) and pd.notna(high):
            ax.errorbar(i, value, yerr=[[max(value - low, 0)], [max(high - value, 0)]], fmt="none", ecolor="black",
                        capsize=2)
    return names


def lost_speedup_sentences(result) -> list[str]:
    """Per multi-rank cell of the largest worker count: the gap, its largest measured cause, the rest."""
    out = []
    for mode in MODES:
        t = result.tables.get(f"scale_{mode}_lost_speedup")
        if t is None or not len(t):
            continue
        top = t[t["workers"] == t["workers"].max()]
        for (workers, batch), group in top.groupby(["workers", "global_batch"], sort=True):
            part = group.set_index("part")
            ideal, measured = part.loc["ideal"], part.loc["measured"]
            if not ideal["measured"]:
                continue
            line = (f"{mode} scaling, {int(workers)} workers at global batch {int(batch)}: ideal step "
                    f"{fmt(ideal['value(ms)'], ' ms')}, measured {fmt(measured['value(ms)'], ' ms')}")
            cause = largest_cause(group)
            if cause is not None:
                line += (f"; the largest cause is {PARTS[cause['part']]}, {fmt(cause['value(ms)'], ' ms')} "
                         f"(95 % interval {fmt(cause['value_ci_low(ms)'])}–{fmt(cause['value_ci_high(ms)'], ' ms')})")
                within = largest_split(group) if cause["part"] == "exposed" else None
                if within is not None:
                    line += (f", mostly {PARTS[within['part']]} ({fmt(within['value(ms)'], ' ms')} of the time "
                             "inside collectives)")
            else:
                line += (f"; no part of the gap is beyond noise and {100 * MATERIAL:g} % of the step (the least "
                         "that is named as a cause)")
            rest = part.loc["rest"]
            if rest["measured"] and pd.notna(rest["share_of_gap"]):
                line += (f"; the rest {fmt(rest['value(ms)'], ' ms')} ({100 * rest['share_of_gap']:.0f} % of the gap"
                         + (f", above {100 * REST_LIMIT:.0f} %: a cause is not accounted for" if
                            abs(rest["share_of_gap"]) > REST_LIMIT else "") + ")")
            missing = [p for p in LEAVES if not part.loc[p, "measured"]]
            if missing:
                line += f"; not measured: {', '.join(missing)} (needs {part.loc[missing[0], 'needs']})"
            out.append(line + ".")
            hidden = exposed_sum(group)
            if hidden is not None:
                out.append(hidden[0].upper() + hidden[1:] + ".")
    return out
