"""The model's prediction for one stored run's config on the calibrated machine (pure): what the validation, the
in-calibration residuals (`modelerror`) and the protocol compare with a measured step."""
from __future__ import annotations

import pandas as pd

from scalelab.perf import perfmodel as pm
from scalelab.perf.calibration import Calibration
from scalelab.perf.links import NodeLink


def predict_run(cal: Calibration, config: dict) -> pd.Series | None:
    """The model's prediction for one stored run's config on this machine: the "measured" hardware (fitted α/β
    × comm_scale, compute × compute_scale where collectives run) over the run's own link (namespace nodes, a
    shaped rate: `links.link_hardware` when it is not the calibrated one) plus the run's padding (each
    collective takes max(fitted time, L + S·8/(bw·1e9)), see `perfmodel.Emulation`). None for what the model
    does not cover (PowerSGD)."""
    if config.get("ddp_hook", "none") == "powersgd":
        return None
    n = config["ranks"] * config.get("nnodes", 1)
    sync = config.get("sync", "auto")
    strategy = "ddp" if sync == "auto" else sync
    compression = config.get("ddp_hook", "none")
    emulation = pm.Emulation.from_config(config.get("net_latency_ms", 0.0), config.get("net_bandwidth_gbps"))
    link = NodeLink.of(config)
    hardware = cal.hardware(config["ranks"] if link.namespaced else 1, link=link, strategy=strategy)
    return pm.predict(cal.compute_model(), hardware, [n], param_bytes=cal.param_bytes, mode="weak",
                      per_rank_batch=config["global_batch"] / n, strategy=strategy if n > 1 else "noop",
                      bucket_bytes=config.get("bucket_mb", 25.0) * pm.MIB, compression=compression,
                      accumulate=config.get("accumulate", 1), emulation=emulation,
                      compute_scale=cal.compute_scale, alone=cal.lone_model()).iloc[0]
