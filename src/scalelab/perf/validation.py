"""The model against measured runs of the calibrated machine (docs/model.md, "Validation"): per run the prediction,
whether the run is in the calibration's sample, both intervals and whether the measured median step is inside
them, and the validation in words."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd

from scalelab.analysis import keys
from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import Calibration
from scalelab.perf.horizon import faster_link, unseen_share
from scalelab.perf.intervals import intervals, step_quantiles
from scalelab.perf.links import NodeLink, network_label
from scalelab.perf.modelerror import concurrent, refusal, seen_shares
from scalelab.perf.runmodel import predict_run
from scalelab.perf.sharedhost import applies

# predicted: the model's step (model(ms)) with its strategy's calibration bias (bias(%), perf/modelerror.py)
VALIDATION_COLUMNS = ["run_id", "sync", "per_rank_batch", "accumulate", "bucket_mb", "ddp_hook", "network",
                      "net_latency_ms", "net_bandwidth_gbps", "sample", "compute(ms)", "comm(ms)",
                      "exposed_comm(ms)", "model(ms)", "bias(%)", "predicted", "predicted_ci_low", "predicted_ci_high",
                      "predicted_ci50_low", "predicted_ci50_high", "measured", "measured_comm(ms)", "error(%)",
                      "inside", "inside50",
                      "half_width(%)", "sampling_half_width(%)", "model_half_width(%)", "refused", "extrapolation",
                      "measured_speedup",
                      "measured_efficiency"]


def link_measured(cal: Calibration, link: NodeLink) -> bool:
    """Whether the calibration measured `link`: its own, or an unshaped namespace link its unshaped bench ran over."""
    return link == cal.calibrated_link or (link.namespaced and link.gbps is None and cal.veth_alpha_s is not None)


def sample_of(cal: Calibration, config: dict) -> str:
    """Whether a run is in the calibration's sample: "in-sample" when the calibration measured its node count, link
    and per-rank batch, else "held out: " and what differs (nodes, link, batch), with "; compute in-sample" when
    its compute was measured at its node count (`calibrate_compute`)."""
    n = config["ranks"] * config.get("nnodes", 1)
    nodes = max(1, int(config.get("local_nodes") or 0))
    batches = cal.batches or [p["per_rank_batch"] for p in cal.points]
    differs = [what for what, same in (("nodes", (nodes, n) == (cal.nodes, cal.ranks)),
                                       ("link", link_measured(cal, NodeLink.of(config))),
                                       ("batch", any(abs(config["global_batch"] / n - b) < 1e-9 for b in batches)))
               if not same]
    if not differs:
        return "in-sample"
    return "held out: " + ", ".join(differs) + ("; compute in-sample" if cal.compute_nodes == nodes > 1 else "")


def unpadded(config: dict) -> dict:
    """`config` without scalelab's network emulation (`net_latency_ms`, `net_bandwidth_gbps`): the step the
    calibration's runs measured; `config` itself when it has none."""
    if not config.get("net_latency_ms") and config.get("net_bandwidth_gbps") is None:
        return config
    return {**config, "net_latency_ms": 0.0, "net_bandwidth_gbps": None}


def validate_measured(cal: Calibration, runs: Sequence[dict], *,
                      say: Callable[[str], None] = print) -> pd.DataFrame:
    """Predicted vs measured median step time for every completed run in `runs` of the calibrated model and
    dataset. error(%) = 100·(predicted − measured)/measured; attrs["median_abs_error(%)"]. measured_efficiency =
    X(n) / (n·X(1)) with X(1) one rank alone at the run's per-rank batch (docs/definitions.md: the lone run the
    calibration measured there, else its fit, `Calibration.lone_step_ms`), i.e. that step / the measured step;
    measured_speedup = workers × that."""
    pred, meas = [], []
    for run in runs:
        cfg, summary = run["config"], run["summary"] or {}
        if run.get("status", "completed") != "completed":
            continue
        if (cfg["model"], cfg["dataset"]) != (cal.model, cal.dataset) or keys.STEP_MEDIAN_MS not in summary:
            continue
        p = predict_run(cal, cfg)
        if p is None:
            say(f"[validation] {run['run_id']}: ddp_hook {cfg['ddp_hook']} is not modelled, left out")
            continue
        n = cfg["ranks"] * cfg.get("nnodes", 1)
        one = cal.lone_step_ms(cfg["global_batch"] / n, cfg.get("accumulate", 1))
        step = summary[keys.STEP_MEDIAN_MS]
        refused = refusal(cal, NodeLink.of(cfg))
        # the bias and both parts of the interval belong to the step the calibration ran (it never pads): they go
        # on the run's step without its padding, and what the padding adds to the point is added as it is
        plain = unpadded(cfg)
        padding = p["step(ms)"] - predict_run(cal, plain)["step(ms)"] if plain is not cfg else 0.0
        q = step_quantiles(cal, lambda c, cfg=plain: [predict_run(c, cfg)["step(ms)"]], 1)
        strategy = "ddp" if cfg.get("sync", "auto") == "auto" else cfg["sync"]
        c = {k: v[0] for k, v in intervals(cal, [p["step(ms)"] - padding], q, strategy=strategy,
                                           link=NodeLink.of(cfg), launches=int(run.get("launches", 1)),
                                           in_flight=concurrent(cal, cfg),
                                           step=[applies(cal, n, cfg.get("nnodes", 1))]).items()}
        share = c["point"] / (c["point"] + padding) if padding else 1.0  # the half-widths in % of the padded point
        c.update({k: c[k] + padding for k in ("point", "low", "high", "low50", "high50")})
        c.update({k: c[k] * share for k in ("sampling_half_width(%)", "model_half_width(%)")})
        if refused:  # a refused link has no interval: the model was checked there and missed
            c = {**{k: math.nan for k in c}, "point": p["step(ms)"], "bias(%)": 0.0}
        pred.append({"run_id": run["run_id"], "predicted": c["point"], "model(ms)": p["step(ms)"],
                     "bias(%)": c["bias(%)"], "compute(ms)": p["compute(ms)"],
                     "comm(ms)": p["comm(ms)"], "exposed_comm(ms)": p["exposed_comm(ms)"],
                     "predicted_ci_low": c["low"], "predicted_ci_high": c["high"], "predicted_ci50_low": c["low50"],
                     "predicted_ci50_high": c["high50"], "sample": sample_of(cal, cfg), "refused": refused,
                     "inside": bool(c["low"] <= step <= c["high"]) if math.isfinite(c["low"]) else None,
                     "inside50": bool(c["low50"] <= step <= c["high50"]) if math.isfinite(c["low50"]) else None,
                     "half_width(%)": 50 * (c["high"] - c["low"]) / c["point"],
                     "sampling_half_width(%)": c["sampling_half_width(%)"],
                     "model_half_width(%)": c["model_half_width(%)"],
                     "extrapolation": unseen_share(p["exposed_comm(ms)"] / p["step(ms)"], seen_shares(cal))
                     or (NodeLink.of(cfg).namespaced and faster_link(NodeLink.of(cfg).gbps, cal.link_gbps))})
        meas.append({"run_id": run["run_id"], "measured": step, "measured_comm(ms)": summary.get(keys.COMM_TIME_MS),
                     "sync": cfg.get("sync"), "per_rank_batch": cfg["global_batch"] / n, "workers": n,
                     "accumulate": cfg.get("accumulate", 1), "bucket_mb": cfg.get("bucket_mb"),
                     "ddp_hook": cfg.get("ddp_hook"), "network": network_label(cfg),
                     "net_latency_ms": cfg.get("net_latency_ms", 0.0),
                     "net_bandwidth_gbps": cfg.get("net_bandwidth_gbps"), "measured_efficiency": one / step,
                     "measured_speedup": n * one / step})
    if not pred:
        out = pd.DataFrame(columns=VALIDATION_COLUMNS + ["workers"])
        out.attrs["median_abs_error(%)"] = float("nan")
        return out
    pred_frame, meas_frame = pd.DataFrame(pred), pd.DataFrame(meas)
    check = pm.validate(pred_frame, meas_frame, ["run_id"], predicted_col="predicted", measured_col="measured")
    out = check.merge(pred_frame.drop(columns="predicted"), on="run_id").merge(
        meas_frame.drop(columns="measured"), on="run_id")
    out = out[VALIDATION_COLUMNS + ["workers"]].sort_values(
        ["net_latency_ms", "sync", "per_rank_batch"], kind="stable").reset_index(drop=True)
    out.attrs["median_abs_error(%)"] = pm.median_abs_error(out)
    return out


# what an interval means, for every prediction row (the report's line)
INTERVALS = ("each predicted step has a 95 % and a 50 % interval that should hold the measured median step that "
             "often: the calibration's sampling noise (refits on resampled runs; on a preset or a hardware file only "
             "the compute varies) and the model's own error (its in-calibration misses: a bias per strategy, moved "
             "into this machine's predicted steps, and the spread around it), added in log step; ")


def validation_text(val: pd.DataFrame, where: str) -> str:
    """The validation in words: held-out runs apart from those the fit used, with the interval's coverage."""
    sample = val["sample"] if "sample" in val else pd.Series("in-sample", index=val.index)
    held, used = val[sample != "in-sample"], val[sample == "in-sample"]
    parts = []
    for name, part in (("held out", held), ("in-sample (runs at batches the fit used)", used)):
        if not len(part):
            continue
        err = part["error(%)"].abs()
        inside = part["inside"].dropna() if "inside" in part else pd.Series(dtype=bool)
        inside50 = part["inside50"].dropna() if "inside50" in part else pd.Series(dtype=bool)
        refused = int(part["refused"].notna().sum()) if "refused" in part else 0
        parts.append(f"{name}: {len(part)} run(s), median |error| {err.median():.1f} % (worst {err.max():.1f} %)"
                     + (f", measured step inside the predicted 95 % interval in {int(inside.sum())} of {len(inside)}"
                        f" and inside the 50 % interval in {int(inside50.sum())} of {len(inside50)}"
                        if len(inside) else "") + (f", {refused} refused (no interval)" if refused else ""))
    if not len(held):
        parts.append("no held-out run: every validation run was at a batch the calibration measured, so this is "
                     "not a test of the model")
    # a node count the calibration never ran (across a Slurm allocation's nodes: `prediction.held_out_nodes`)
    across = held[held["sample"].str.contains("nodes")] if {"workers", "sample"} <= set(held) else held.iloc[:0]
    for row in across.to_dict("records"):
        parts.append(f"across {int(row['workers'])} workers (a node count no calibration run used): error "
                     f"{row['error(%)']:+.1f} % (predicted {row['predicted']:.1f} ms, measured "
                     f"{row['measured']:.1f} ms)")
    return (f"Validation on measured runs of {where} (each prediction's 95 % and 50 % intervals carry the "
            "calibration's sampling noise and the model's own error, so each should hold the measured step that "
            "often): " + "; ".join(parts) + ".")
