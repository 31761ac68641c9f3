"""How far a calibration's predictions reach (pure): the prediction horizon.

A calibration measures a few worker counts on one machine; the model extrapolates from there. Three limits:

- **One host's loopback ends at its cores.** A calibration whose ranks talked over one host's loopback (no
  namespace nodes: `Calibration.nodes == 1`) describes ranks that share that host's cores and memory bus. More ranks
  than the host has cores is not a cluster of such hosts, it is an oversubscribed host, and the fitted α and β say
  nothing about it: the calibrated hardware's own rows (its "measured" links) are never predicted past the core
  count. The cores are those the calibration recorded ("16-core CPU", `calibration.device_name`), else, for a
  calibration made here, this machine's `os.cpu_count()`.
- **Beyond HORIZON x the largest measured scale, a prediction is extrapolation.** The largest measured scale is the
  most ranks any run behind the calibration used: its bench and compute (`Calibration.ranks`) and the validation
  runs. Such rows are kept and marked (the prediction table's `extrapolation` column, and the sentences say so),
  and no recommendation rests on them: what keeps the target efficiency is asked at the largest requested worker
  count within the horizon (`reach`).
- **A regime the model-error term never saw is extrapolation too.** The intervals' model-error part comes from
  in-calibration residuals (perf/modelerror.py), runs whose exposed communication took a certain share of the step.
  A prediction whose share is above that range (`unseen_share`: a slower link, many more workers) rests on an
  error term that was never checked there; it is marked `extrapolation` as well, and its interval may not hold.
- **So is a shaped link faster than the calibrated one** (`faster_link`). Its share of communication is smaller,
  yet the model's error there was never checked either: calibrated over 0.5 Gbit/s, a development run
  under-predicted 0.8 Gbit/s by 9-23 % with residuals of ±5 % (docs/model.md, "A slower calibration link"), while
  the 95 % intervals of links slower than the calibrated one held 124 of 128 points in the frozen runs of rounds
  4-7.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

HORIZON = 8  # predictions beyond this many times the largest measured scale are extrapolation

_CORES = re.compile(r"^(\d+)-core CPU$")


def measured_scale(calibrated_ranks: int, validated: Iterable[int] = ()) -> int:
    """The most ranks any run behind the prediction used: the calibration's, or a validation run's (at least 1)."""
    return max([1, int(calibrated_ranks), *(int(w) for w in validated)])


def extrapolated(workers: int, scale: int) -> bool:
    """Whether a prediction at `workers` is extrapolation: beyond HORIZON x the largest measured `scale`."""
    return workers > HORIZON * scale


def host_cores(device: str, here: bool) -> int | None:
    """The core count of the host a calibration ran on: from its recorded device ("16-core CPU"), else this
    machine's when it was calibrated `here`; None when unknown (a GPU host measured elsewhere)."""
    found = _CORES.match(device or "")
    if found:
        return int(found.group(1))
    return os.cpu_count() if here else None


def reach(workers: Sequence[int], scale: int, cores: int | None = None) -> int | None:
    """The largest of `workers` that is neither extrapolation nor, with `cores` (a one-host loopback calibration's
    own hardware), past the host's cores; None when there is none."""
    inside = [int(w) for w in workers if not extrapolated(int(w), scale) and (cores is None or int(w) <= cores)]
    return max(inside) if inside else None


def unseen_share(share: float, seen: tuple[float, float] | None) -> bool:
    """Whether a prediction whose exposed communication is `share` of its step is above the largest share `seen` in
    the runs behind the model-error term (`modelerror.seen_shares`). A smaller share is not: the model's error
    comes mostly from its communication, so less of it is within what was checked (one worker: compute only, fitted
    in-sample). False when none were seen (then there is no interval)."""
    return seen is not None and share > seen[1] * (1 + 1e-9)


def faster_link(gbps: float | None, calibrated_gbps: float | None) -> bool:
    """Whether a prediction over a link shaped to `gbps` Gbit/s runs over a faster rate than the shaped link the
    calibration's training crossed (`calibrated_gbps`); False when either is unshaped (an unshaped link has its own
    residuals, or is refused: perf/modelerror.py)."""
    return gbps is not None and calibrated_gbps is not None and gbps > calibrated_gbps * (1 + 1e-9)
