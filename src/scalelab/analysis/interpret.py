"""Interpretation sentences computed from result tables: numbers and comparisons, never boilerplate.

Each function takes the table its experiment produced and returns sentences (and, where it has one, a
recommendation). They change when the data changes; tests feed two fixed result sets that rank differently.
"""
from __future__ import annotations

import math

import pandas as pd

from scalelab.analysis import keys
from scalelab.analysis.compare import trusted
from scalelab.analysis.intervals import separated
from scalelab.analysis.model_grid import FALLS_BELOW


def _fmt(x: float, unit: str = "", digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}g}{unit}"


def batch_sweep(table: pd.DataFrame) -> tuple[list[str], str | None]:
    if not len(table):
        return [], None
    t = table.sort_values("global_batch")
    lo, hi = t.iloc[0], t.iloc[-1]
    best = t.loc[t[keys.THROUGHPUT].idxmax()]
    gain = hi[keys.THROUGHPUT] / lo[keys.THROUGHPUT]
    out = [f"Going from batch {int(lo.global_batch)} to {int(hi.global_batch)} changes throughput "
           f"{gain:.2f}x ({_fmt(lo[keys.THROUGHPUT])} to {_fmt(hi[keys.THROUGHPUT])} samples/s) "
           f"and the epoch from {_fmt(lo[keys.EPOCH_S])} s to {_fmt(hi[keys.EPOCH_S])} s.",
           f"The highest throughput is at batch {int(best.global_batch)}: "
           f"{_fmt(best[keys.THROUGHPUT])} samples/s."]
    share = 1 - t[keys.EPOCH_NO_DATA_S] / t[keys.EPOCH_S]
    out.append(f"Data loading is {100 * share.min():.1f}–{100 * share.max():.1f} % of the epoch time.")
    if not trusted(best.get("quality")):
        return out + [f"Batch {int(best.global_batch)} is flagged ({best['quality']}): no batch is recommended."], None
    # the smallest batch whose throughput interval meets the best's does as well within noise
    b = _interval(best, "ci_low", "ci_high")
    near = [r for r in t.to_dict("records") if b is not None and (iv := _interval(r, "ci_low", "ci_high"))
            and not separated(b, iv) and r["global_batch"] < best.global_batch and trusted(r.get("quality"))]
    if near:
        small = near[0]
        out.append(f"Batch {int(small['global_batch'])} is within noise of it ({_fmt(small[keys.THROUGHPUT])} "
                   f"samples/s, {_span(_interval(small, 'ci_low', 'ci_high'), ' samples/s')}).")
        return out, (f"Use batch {int(small['global_batch'])} or more for throughput: up to batch "
                     f"{int(best.global_batch)} the gain is within noise.")
    return out, f"Use batch {int(best.global_batch)} for throughput ({_fmt(best[keys.THROUGHPUT])} samples/s)."


def _interval(row, low: str = "step_ci_low(ms)", high: str = "step_ci_high(ms)") -> tuple[float, float] | None:
    lo, hi = row.get(low), row.get(high)
    return None if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else (float(lo), float(hi))


def _span(iv: tuple[float, float] | None, unit: str = " ms") -> str:
    return "no interval" if iv is None else f"95 % interval {_fmt(iv[0])}–{_fmt(iv[1], unit)}"


def _fastest(table: pd.DataFrame, label: str, value: str = "step(ms)", low: str = "step_ci_low(ms)",
             high: str = "step_ci_high(ms)") -> tuple[dict, list[dict], bool]:
    """(the row with the lowest `value`, the rows within noise of it, whether intervals could tell): a row is
    within noise of the best when its interval meets the best's or either has none (nothing is concluded from a
    figure without its interval)."""
    rows = table.sort_values(value).to_dict("records")
    best, others = rows[0], rows[1:]
    b = _interval(best, low, high)
    ties = [r for r in others if b is None or _interval(r, low, high) is None
            or not separated(b, _interval(r, low, high))]
    return best, ties, b is not None


def _flagged(table: pd.DataFrame, label: str) -> tuple[pd.DataFrame, list[str]]:
    """(the rows that may make a finding, one sentence per row left out and why: compare.trusted)."""
    if "quality" not in table:
        return table, []
    keep = table["quality"].map(trusted)
    out = [f"{row[label]} is left out of the ranking: {row['quality']}." for row in table[~keep].to_dict("records")]
    return table[keep], out


def ranking(table: pd.DataFrame, label: str, what: str) -> tuple[list[str], dict | None]:
    """Sentences ranking `table`'s rows by median step, only as far as the intervals separate them; the winner
    when it is faster than every other row beyond noise (else None). Flagged rows are left out, with why."""
    table, left_out = _flagged(table, label)
    if not len(table):
        return left_out + [f"Every {what} is flagged: no ranking is a finding."], None
    lines, best = _ranking_of(table, label, what)
    return left_out + lines, best


def _ranking_of(table: pd.DataFrame, label: str, what: str) -> tuple[list[str], dict | None]:
    best, ties, known = _fastest(table, label)
    line = f"{best[label]} has the shortest median step: {_fmt(best['step(ms)'], ' ms')} ({_span(_interval(best))})"
    if not known:
        return [line + "; without intervals no ranking is a finding."], None
    if ties:
        half = max((iv[1] - iv[0]) / 2 for iv in (_interval(r) for r in [best, *ties]) if iv is not None)
        names = ", ".join(str(r[label]) for r in ties)
        return [line + f", but {names} {'is' if len(ties) == 1 else 'are'} within noise of it (the intervals "
                f"meet; noise here is about ±{_fmt(half, ' ms')}): no {what} is faster than "
                f"{'it' if len(ties) == 1 else 'them'} beyond noise."], None
    rest = table[table[label] != best[label]].sort_values("step(ms)")
    nxt = rest.iloc[0] if len(rest) else None
    if nxt is not None:
        line += (f", faster than every other {what} beyond noise (next: {nxt[label]}, "
                 f"{_fmt(nxt['step(ms)'], ' ms')}, {_span(_interval(nxt))})")
    return [line + "."], best


def strategies(table: pd.DataFrame) -> tuple[list[str], str | None]:
    """`table`: one row per strategy with step(ms) and its interval, comm(ms), exposed_comm(ms), bytes/step."""
    real = table[table["sync"] != "noop"]
    if not len(real):
        return [], None
    out, best = ranking(real, "sync", "gradient sync")
    if "overlap" in real:
        hidden = real.dropna(subset=["overlap"])
        quality = hidden["quality"].fillna("ok") if "quality" in hidden else pd.Series("ok", index=hidden.index)
        flagged = hidden[quality != "ok"]
        hidden = hidden.drop(flagged.index)  # no conclusion from a figure flagged implausible
        if len(hidden):
            top = hidden.loc[hidden["overlap"].idxmax()]
            out.append(f"{top.sync} hides the largest share of its communication behind compute: overlap "
                       f"{100 * top['overlap']:.0f} % of {_fmt(top['comm(ms)'], ' ms')} inside collectives"
                       + (f" (interval {100 * top['overlap_ci_low']:.0f}–{100 * top['overlap_ci_high']:.0f} %)."
                          if "overlap_ci_low" in top and not pd.isna(top["overlap_ci_low"]) else "."))
        for sync, why in zip(flagged["sync"], quality[flagged.index]):
            out.append(f"{sync}'s overlap is not used: {why}.")
    rec = None if best is None else f"Use the {best['sync']} gradient sync: {_fmt(best['step(ms)'], ' ms')} per step."
    return out, rec


def precision(table: pd.DataFrame) -> tuple[list[str], str | None]:
    if not len(table) or "fp32" not in set(table["precision"]):
        return [], None
    base = table[table["precision"] == "fp32"].iloc[0]
    out = []
    for d in table[table["precision"] != "fp32"].to_dict("records"):
        speed = d[keys.THROUGHPUT] / base[keys.THROUGHPUT]
        out.append(f"{d['precision']} runs at {speed:.2f}x the fp32 throughput and ends at accuracy "
                   f"{100 * d[keys.EVAL_ACC]:.1f} % vs {100 * base[keys.EVAL_ACC]:.1f} % (fp32).")
    best = table.loc[table[keys.THROUGHPUT].idxmax()]
    if not trusted(best.get("quality")) or not trusted(base.get("quality")):
        flagged = best if not trusted(best.get("quality")) else base
        return out + [f"{flagged.precision} is flagged ({flagged.quality}): no precision is recommended."], None
    ok = best[keys.EVAL_ACC] >= base[keys.EVAL_ACC] - 0.01
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    b, f = _interval(best, low, high), _interval(base, low, high)
    faster = b is not None and f is not None and b[1] < f[0]  # best's step interval lies below fp32's
    if best.precision != "fp32" and not faster:
        out.append(f"{best.precision}'s step ({_span(b)}) is not faster than fp32's ({_span(f)}) beyond noise.")
    rec = (f"Train in {best.precision}: {best[keys.THROUGHPUT] / base[keys.THROUGHPUT]:.2f}x fp32 "
           f"with accuracy within 1 point." if ok and faster and best.precision != "fp32"
           else "Keep fp32: no lower precision was both faster beyond noise and as accurate here.")
    return out, rec


def profile(table: pd.DataFrame) -> tuple[list[str], str | None]:
    if not len(table):
        return [], None
    t = table[table["share(%)"].notna()].sort_values("time(ms)", ascending=False)  # the step's stages
    top = t.iloc[0]
    out = [f"{top.stage} takes the largest share of a step: {top['share(%)']:.1f} % ({_fmt(top['time(ms)'], ' ms')})."]
    fb = t.set_index("stage")
    if {"forward", "backward"} <= set(fb.index) and fb.at["forward", "time(ms)"] > 0:
        out.append(f"backward / forward = {fb.at['backward', 'time(ms)'] / fb.at['forward', 'time(ms)']:.2f}.")
    return out, None


def loader(table: pd.DataFrame, best: dict) -> tuple[list[str], str | None]:
    if not len(table) or not best:
        return [], None
    zero = table[table["num_workers"] == 0]
    out = []
    if len(zero):
        out.append(f"With no loader workers, steps wait for data {zero['data_wait(%)'].iloc[0]:.1f} % of the time.")
    out.append(f"num_workers={best['num_workers']} reaches {_fmt(best[keys.THROUGHPUT])} samples/s"
               + (f" ({best['speedup_vs_0_workers']:.2f}x no workers)." if best.get("speedup_vs_0_workers") else "."))
    prefetch = "" if best["prefetch_factor"] is None else f", prefetch_factor={best['prefetch_factor']}"
    if best["num_workers"] and len(zero):
        low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
        chosen = table[(table["num_workers"] == best["num_workers"]) & (table["pin_memory"] == best["pin_memory"])]
        flagged = [r for r in (chosen.iloc[0], zero.iloc[0]) if not trusted(r.get("quality"))]
        if flagged:
            out.append(f"num_workers={int(flagged[0]['num_workers'])} is flagged ({flagged[0]['quality']}): no "
                       "loader setting is recommended.")
            return out, None
        b, z = _interval(chosen.iloc[0], low, high), _interval(zero.iloc[0], low, high)
        if b is None or z is None or not b[1] < z[0]:
            out.append(f"num_workers={best['num_workers']}'s step ({_span(b)}) is not shorter than with no workers "
                       f"({_span(z)}) beyond noise.")
            return out, None
    return out, f"Use num_workers={best['num_workers']}, pin_memory={best['pin_memory']}{prefetch}."


def checkpointing(table: pd.DataFrame) -> tuple[list[str], str | None]:
    cuda = keys.MEMORY_CUDA_MAX_ALLOCATED_GIB
    mem = cuda if cuda in table else keys.MEMORY_PEAK_RSS_GIB
    if not len(table) or 0 not in set(table["checkpoint_segments"]):
        return [], None
    off = table[table["checkpoint_segments"] == 0].iloc[0]
    saved, peak = keys.MEMORY_ACTIVATIONS_BYTES, keys.MEMORY_ACTIVATIONS_PEAK_BYTES
    name = "CUDA max allocated" if mem == cuda else "peak RSS"
    out = []
    for d in table[table["checkpoint_segments"] > 0].to_dict("records"):
        parts = [f"saved activations {_mib(d[saved])} ({_ratio(d[saved], off[saved])} of no checkpointing)"
                 if saved in d else None,
                 f"backward peak {_mib(d[peak])} ({_ratio(d[peak], off[peak])})" if peak in d else None,
                 f"{name} {_ratio(d[mem], off[mem])}" if mem in d else None,
                 f"step time {_ratio(d[keys.STEP_MEDIAN_MS], off[keys.STEP_MEDIAN_MS])}" + _noise_note(d, off)]
        out.append(f"{d['checkpoint_segments']} segments: " + ", ".join(p for p in parts if p) + ".")
    on = table[table["checkpoint_segments"] > 0]
    if mem != cuda and saved in table and mem in table and len(on):
        rss, act = on[mem] / off[mem], on[saved] / off[saved]
        if rss.min() > act.min():  # the process fell less than its activations
            out.append(f"On CPU the process's peak RSS went to {rss.min():.2f}x..{rss.max():.2f}x of no "
                       f"checkpointing while the saved activations went to {act.min():.2f}x..{act.max():.2f}x: "
                       "the RSS includes the process's baseline (libraries, data, allocator caches) and hides the "
                       "activations; the saved bytes show the effect.")
    return out, None


def _noise_note(row: dict, reference) -> str:
    """" (within noise)" when the two median steps' intervals meet, " (no interval)" without them, else ""."""
    low, high = keys.STEP_MEDIAN_CI_LOW_MS, keys.STEP_MEDIAN_CI_HIGH_MS
    a, b = _interval(row, low, high), _interval(reference, low, high)
    if a is None or b is None:
        return " (no interval)"
    return "" if separated(a, b) else " (within noise)"


def _mib(nbytes: float) -> str:
    return _fmt(nbytes / 2**20, " MiB")


def _ratio(value: float, base: float) -> str:
    ratio = value / base if base else float("nan")
    return "n/a" if math.isnan(ratio) else f"{ratio:.2f}x"


def scale_result(result) -> tuple[list[str], str | None]:
    out, rec = [], None
    for mode in ("strong", "weak"):
        t = result.tables.get(f"scale_{mode}")
        if t is None or not len(t) or t["workers"].max() < 2:
            continue
        top = t[t["workers"] == t["workers"].max()]
        for d in top.to_dict("records"):
            batch = d["global_batch"] if mode == "strong" else d["per_worker_batch"]
            part = (f"{mode} scaling to {d['workers']} workers at {'global' if mode == 'strong' else 'per-worker'} "
                    f"batch {batch}: speedup {_fmt(d['speedup'])}x, efficiency {100 * d['efficiency']:.0f} %"
                    + (f" (95 % interval {100 * d['ci_low']:.0f}–{100 * d['ci_high']:.0f} %)"
                       if not pd.isna(d.get("ci_low", float("nan"))) else ""))
            if d.get("exposed_comm(ms)") is not None and d.get("step(ms)"):
                part += (f"; exposed communication {_fmt(d['exposed_comm(ms)'], ' ms')} of a "
                         f"{_fmt(d['step(ms)'], ' ms')} step ({100 * d['exposed_comm(ms)'] / d['step(ms)']:.0f} %)")
            out.append(part + ".")
        fair = top[top["quality"].map(trusted)] if "quality" in top else top
        for d in top.drop(fair.index).to_dict("records"):
            out.append(f"{d['workers']} workers at batch {d['global_batch']} are flagged ({d['quality']}): "
                       "their efficiency is not a finding.")
        if not len(fair) or fair["efficiency"].isna().all():
            continue
        best = fair.loc[fair["efficiency"].idxmax()]
        low, high = (best.get(c, float("nan")) for c in ("ci_low", "ci_high"))
        if mode == "strong" and not pd.isna(low) and low < 0.5 <= high:
            out.append(f"Whether {int(best.workers)} workers pay off at global batch {int(best.global_batch)} is "
                       f"within noise: efficiency {100 * low:.0f}–{100 * high:.0f} % (95 % interval) straddles "
                       "50 %.")
        elif mode == "strong" and best.efficiency >= 0.5:
            rec = (f"Use {int(best.workers)} workers at global batch {int(best.global_batch)}: strong-scaling "
                   f"efficiency {100 * best.efficiency:.0f} %.")
        elif mode == "strong":
            share = best.get("exposed_comm(ms)", float("nan")) / best["step(ms)"] if best["step(ms)"] else float("nan")
            rec = (f"{int(best.workers)} workers do not pay off here: at best {100 * best.efficiency:.0f} % "
                   f"strong-scaling efficiency (global batch {int(best.global_batch)}), exposed communication "
                   f"{100 * share:.0f} % of the step; use fewer workers or a larger batch per worker.")
    return out, rec


def max_batch_result(result) -> tuple[list[str], str | None]:
    t = result.tables["max_batch"]
    if not len(t):
        return [], None
    base = t.iloc[0]
    out = [f"As configured, the largest batch under the limit is {int(base.max_batch)} "
           f"(found in {int(base.trials)} trials)."]
    for row in t.iloc[1:].itertuples():
        gain = row.max_batch / base.max_batch if base.max_batch else float("nan")
        out.append(f"With {row.variant}: {int(row.max_batch)} ({_fmt(gain)}x).")
    best = t.loc[t["max_batch"].idxmax()]
    return out, f"For the largest batch, use {best.variant}: {int(best.max_batch)} samples fit."


def lr_scaling_result(result) -> tuple[list[str], str | None]:
    t = result.tables["lr_scaling"]
    if not len(t):
        return [], None
    base_batch = result.notes.get("base_batch", int(t["global_batch"].min()))
    out = []
    base = t[t["global_batch"] == base_batch]
    if len(base):
        out.append(f"At the base batch {base_batch} the model reaches {100 * base['final_acc'].max():.1f} % test "
                   f"accuracy.")
    rec = None
    for b in sorted(t["global_batch"].unique()):
        if b == base_batch:
            continue
        g = t[t["global_batch"] == b].sort_values("final_acc", ascending=False)
        best, worst = g.iloc[0], g.iloc[-1]
        out.append(f"At batch {b} ({b // base_batch}x): best {best.lr_rule} {100 * best.final_acc:.1f} %, worst "
                   f"{worst.lr_rule} {100 * worst.final_acc:.1f} %; "
                   + ", ".join(f"{r.lr_rule} {100 * r.final_acc:.1f} %" for r in g.itertuples()) + ".")
        runner = g.iloc[1] if len(g) > 1 else None
        ivs = [_interval(r, "ci_low", "ci_high") for r in (best, runner) if r is not None]
        if runner is None or any(iv is None for iv in ivs):
            rec = (f"For batch {b}, use the {best.lr_rule} rule ({100 * best.final_acc:.1f} % vs {worst.lr_rule} "
                   f"{100 * worst.final_acc:.1f} %; one seed each: --seeds 3 says whether this holds beyond seed "
                   "noise).")
        elif separated(*ivs):
            rec = (f"For batch {b}, use the {best.lr_rule} rule ({100 * best.final_acc:.1f} %, interval "
                   f"{100 * ivs[0][0]:.1f}–{100 * ivs[0][1]:.1f} % over {int(best.n)} seeds, vs {runner.lr_rule} "
                   f"{100 * ivs[1][0]:.1f}–{100 * ivs[1][1]:.1f} %).")
        else:
            out.append(f"At batch {b}, {best.lr_rule} and {runner.lr_rule} are within seed noise of each other "
                       f"({100 * ivs[0][0]:.1f}–{100 * ivs[0][1]:.1f} % vs {100 * ivs[1][0]:.1f}–"
                       f"{100 * ivs[1][1]:.1f} % over {int(best.n)} seeds).")
    return out, rec


def strategies_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_strategies", pd.DataFrame())
    ok = table[table["status"] == "completed"] if len(table) else table
    out, rec = strategies(ok) if len(ok) else ([], None)
    if len(ok) and "bytes_per_step" in ok:
        ref = ok[ok["sync"] == "ddp"]
        for row in ok[ok["sync"].isin(["ddp+fp16", "ddp+bf16", "ddp+powersgd"])].to_dict("records"):
            if len(ref) and ref["bytes_per_step"].iloc[0]:
                out.append(f"{row['sync']} moves {row['bytes_per_step'] / ref['bytes_per_step'].iloc[0]:.3g}x "
                           f"the bytes of plain ddp per step ({_fmt(row['bytes_per_step'])} B).")
    return out, rec


def backends_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_backends", pd.DataFrame())
    out = []
    for row in table.to_dict("records"):
        if row["status"] == "completed":
            out.append(f"{row['backend']}: step {_fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{_fmt(row['comm(ms)'], ' ms')}, busbw {_fmt(row['busbw(GB/s)'], ' GB/s')}.")
        else:
            out.append(f"{row['backend']}: {row['status']} ({row['reason']}).")
    done = table[table["status"] == "completed"] if len(table) else table
    rec = None
    if len(done) > 1:
        lines, best = ranking(done, "backend", "backend")
        out += lines
        if best is not None:
            rec = f"Use the {best['backend']} backend ({_fmt(best['step(ms)'], ' ms')} per step)."
    return out, rec


def engines_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("compare_engines", pd.DataFrame())
    out = []
    for row in table.to_dict("records"):
        if row["status"] == "completed":
            exposed = row.get("exposed_comm(ms)")
            out.append(f"{row['engine']}: step {_fmt(row['step(ms)'], ' ms')}, time inside collectives "
                       f"{_fmt(row['comm(ms)'], ' ms')}, blocking wait {_fmt(row['comm_wait(ms)'], ' ms')}, exposed "
                       + (f"{_fmt(exposed, ' ms')}." if exposed is not None and not pd.isna(exposed)
                          else "not measured (no baseline)."))
        else:
            out.append(f"{row['engine']}: {row['status']} ({row['reason']}).")
    done = table[table["status"] == "completed"] if len(table) else table
    rec = None
    if len(done) > 1:
        lines, best = ranking(done, "engine", "engine")
        out += lines
        if best is not None:
            rec = f"Use the {best['engine']} engine ({_fmt(best['step(ms)'], ' ms')} per step)."
    return out, rec


def comm_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("comm", pd.DataFrame())
    if not len(table):
        return [], None
    out = []
    ok = table[table["status"] == "ok"]
    for op, g in ok.groupby("op", sort=False):
        peak = g.loc[g["busbw(GB/s)"].idxmax()]
        small = g.loc[g["size(B)"].idxmin()]
        loop = small.get("time_loop(us)")
        per_call = (f"{_fmt(loop, ' µs')} per call in a back-to-back loop, median single call "
                    f"{_fmt(small['time_median(us)'], ' µs')}" if loop is not None and not pd.isna(loop)
                    else f"{_fmt(small['time_median(us)'], ' µs')} per call")
        out.append(f"{op}: peak busbw {_fmt(peak['busbw(GB/s)'], ' GB/s')} at {int(peak['size(B)']):,} B; at "
                   f"{int(small['size(B)']):,} B only {_fmt(small['busbw(GB/s)'], ' GB/s')} "
                   f"({per_call}: latency-bound).")
    wrong = int(table["wrong"].sum())
    out.append(f"Correctness check: {wrong} wrong element(s) over every op and size.")
    return out, None


def predict_result(result) -> tuple[list[str], str | None]:
    table = result.tables.get("prediction", pd.DataFrame())
    if not len(table):
        return [], None
    out = []
    hw_col = "hardware" if "hardware" in table else None
    groups = table.groupby(hw_col, sort=False) if hw_col else [("model", table)]
    for hw, g in groups:
        g = g.sort_values("workers")
        top = g.iloc[-1]
        below = g[g["efficiency"] < 0.5]
        first = f"falls below 50 % at {int(below['workers'].iloc[0])} workers" if len(below) else \
            f"stays above 50 % up to {int(top['workers'])} workers"
        out.append(f"{hw}: predicted efficiency {100 * top['efficiency']:.0f} % at {int(top['workers'])} workers "
                   f"({_fmt(top[keys.THROUGHPUT])} samples/s); efficiency {first}.")
    val = result.tables.get("validation")
    if val is not None and len(val):
        where = result.meta.get("compute_of", "this machine")
        out.append(f"Validated on {len(val)} measured runs of {where}: median |error| "
                   f"{val['error(%)'].abs().median():.1f} % (worst {val['error(%)'].abs().max():.1f} %).")
    rec = None
    keep = result.notes.get(next((k for k in result.notes if k.startswith("to keep")), ""), {})
    if isinstance(keep, dict) and keep:
        hw, advice = next(iter(keep.items()))
        rec = f"For larger clusters ({hw}): {advice}"
    return out, rec


def _size(row) -> str:
    return f"depth {int(row['depth'])} x width {int(row['width'])}"


def model_grid_result(result) -> tuple[list[str], str | None]:
    """What N workers changed in the model-size grid: which cells fit, which memory part fell, the step's cost.
    The seed's claim (two workers made a model fit) is checked against the cells, never assumed."""
    grid = result.tables.get("model_grid", pd.DataFrame())
    cmp = result.tables.get("model_grid_workers", pd.DataFrame())
    if not len(grid):
        return [], None
    out = []
    for n, g in grid.groupby("workers"):
        fit = g[g["fits"].eq(True)]
        part = f"On {n} worker{'s' if n > 1 else ''}, {len(fit)} of {len(g)} cells fit"
        if len(fit):
            top = fit.loc[fit["parameters"].idxmax()]
            part += f" (the largest: {_size(top)}, {int(top['parameters']):,} parameters)"
        out.append(part + ".")
    rec = None
    for n, c in cmp.groupby("workers") if len(cmp) else []:
        only_n, only_1 = c[c["fit"] == f"fits only on {n} workers"], c[c["fit"] == "fits only on 1 worker"]
        if len(only_n):
            out.append(f"Fits on {n} workers but not on 1: {', '.join(_size(r) for _, r in only_n.iterrows())}.")
            r = only_n.iloc[0]
            step = grid[(grid["workers"] == n) & (grid["depth"] == r["depth"]) & (grid["width"] == r["width"])]
            rec = (f"Under this memory limit, {_size(r)} needs {n} workers "
                   f"({_fmt(float(step['step(ms)'].iloc[0]), ' ms')} per step there).")
        else:
            out.append(f"No cell fits on {n} workers that does not fit on 1: the seed's claim is not seen in this "
                       "grid.")
        if len(only_1):
            out.append(f"Fits on 1 worker but not on {n}: {', '.join(_size(r) for _, r in only_1.iterrows())}.")
        both = c[c["fit"] == "fits on both"]
        kinds = [("activations_saved", "saved activations"), ("activations_backward_peak", "activation peak in "
                 "backward"), ("parameters", "parameters"), ("gradients", "gradients"),
                 ("optimizer_state", "optimizer state"), ("peak_added", "peak memory added by training")]
        ratios = [f"{label} {both[f'{kind}(ratio)'].median():.2f}x" for kind, label in kinds
                  if len(both) and both[f"{kind}(ratio)"].notna().any()]
        if not len(both):
            continue
        if ratios:
            cells = f"the {len(both)} cells" if len(both) > 1 else "the 1 cell"
            out.append(f"From 1 to {n} workers, per rank (median over {cells} that fit on both): "
                       + ", ".join(ratios) + ".")
        if all(both[f"{kind}(ratio)"].isna().all() for kind, _ in kinds[:5]):
            out.append("These runs did not record memory by kind, so which part fell is not measured here.")
        falls = sorted({k for text in both["falls"] for k in text.split(", ") if k})
        step = both["step(ratio)"]
        spread = f" ({step.min():.2f}x to {step.max():.2f}x)" if step.notna().sum() > 1 else ""
        out.append(f"What fell below {FALLS_BELOW:.1f}x: {', '.join(falls) if falls else 'nothing'}; step time "
                   f"{step.median():.2f}x{spread}.")
    return out, rec
