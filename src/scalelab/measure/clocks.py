"""Each rank's clock offset to rank 0, estimated at start-up over the process group (ping-pong, minimum round trip).

Collectives are stamped on each rank's meter clock (`time.perf_counter`, CLOCK_MONOTONIC on Linux: seconds since
that machine booted). On one host, network namespaces included, all ranks read one clock and the offset is 0 by
construction; across machines the clocks differ by anything up to days, so arrival times can only be compared
once each rank's offset is known.

The estimator (Cristian's algorithm, the minimum-round-trip round): for each rank r > 0, `rounds` times, rank 0
reads its clock (t0), sends r a message, r reads its clock (t_r) on receipt and sends it back, rank 0 reads its
clock again (t1). The round with the smallest round trip t1 - t0 gives
    offset_r = t_r - (t0 + t1) / 2        (r's clock minus rank 0's)
    bound_r  = (t1 - t0) / 2             (|error| <= bound: t_r was read somewhere inside [t0, t1] on rank 0's clock)
and a time t on rank r's clock is t - offset_r on rank 0's. Drift over a run is not corrected (two monotonic
clocks drift apart by ~10-100 µs per second at worst: a long run across machines is aligned at its start only).

The messages go over gloo (the run's group, or a gloo group made for it when the run uses NCCL): host to host, no
device synchronisation in the measured round trip.

Test hook: SKEW_ENV ("1:0.05" or "1:0.05,2:-0.01": rank:seconds) adds that many seconds to the named ranks'
estimator clock only, so a test on one host can check that the estimator recovers a known offset.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

SKEW_ENV = "SCALELAB_TEST_CLOCK_SKEW"
ROUNDS = 20  # more rounds: more chances of one undisturbed round trip on a busy machine


def injected_skew(rank: int, env: dict | None = None) -> float:
    """Seconds SKEW_ENV adds to `rank`'s estimator clock (0 when it names no such rank); ValueError on bad text."""
    text = (os.environ if env is None else env).get(SKEW_ENV, "").strip()
    for item in filter(None, (part.strip() for part in text.split(","))):
        who, sep, seconds = item.partition(":")
        if not sep:
            raise ValueError(f"{SKEW_ENV}={text!r}: {item!r} is not rank:seconds")
        if int(who) == rank:
            return float(seconds)
    return 0.0


def estimator_clock(rank: int) -> Callable[[], float]:
    """The clock the estimator reads on `rank`: the meter's clock plus the injected skew (tests only)."""
    skew = injected_skew(rank)
    return (lambda: time.perf_counter() + skew) if skew else time.perf_counter


def offset_from_rounds(rounds: list[tuple[float, float, float]]) -> dict:
    """{offset(s), bound(s), rtt(s)} from ping-pong rounds (t0, t_peer, t1): the round of least round trip."""
    if not rounds:
        raise ValueError("rounds: empty; needs at least one (t0, t_peer, t1)")
    t0, peer, t1 = min(rounds, key=lambda r: r[2] - r[0])
    if t1 < t0:
        raise ValueError(f"rounds: t1 {t1} before t0 {t0}")
    return {"offset(s)": peer - (t0 + t1) / 2, "bound(s)": (t1 - t0) / 2, "rtt(s)": t1 - t0}


def estimate_offsets(rank: int, world: int, *, rounds: int = ROUNDS, clock: Callable[[], float] | None = None,
                     group=None) -> dict | None:
    """Ping-pong every rank against rank 0 over `group` (a gloo group; the default group when None). A
    collective in effect: every rank calls it. Returns, on rank 0, {"offsets(s)", "bounds(s)", "rtt(s)": one value
    per rank (rank 0: 0), "rounds", "clock"}; None on the other ranks."""
    import torch.distributed as dist

    clock = clock or estimator_clock(rank)
    buf = torch.zeros(1, dtype=torch.float64)
    found: list[dict] = [{"offset(s)": 0.0, "bound(s)": 0.0, "rtt(s)": 0.0}]
    for peer in range(1, world):
        if rank == 0:
            samples = []
            for _ in range(rounds):
                t0 = clock()
                dist.send(buf, peer, group=group)
                dist.recv(buf, peer, group=group)
                t1 = clock()
                samples.append((t0, float(buf[0]), t1))
            found.append(offset_from_rounds(samples))
        elif rank == peer:
            for _ in range(rounds):
                dist.recv(buf, 0, group=group)
                buf[0] = clock()  # read on receipt: the sample the round trip brackets
                dist.send(buf, 0, group=group)
    if rank != 0:
        return None
    return {"offsets(s)": [f["offset(s)"] for f in found], "bounds(s)": [f["bound(s)"] for f in found],
            "rtt(s)": [f["rtt(s)"] for f in found], "rounds": rounds, "clock": "perf_counter"}


def estimate_in_run(rank: int, world: int) -> dict | None:
    """The run's offsets at start-up, after the process group is made (run/worker.py): over the default group
    when it is gloo, else over a gloo group made for it and destroyed after. None on ranks other than 0, and
    for one rank."""
    import torch.distributed as dist

    if world < 2 or not dist.is_initialized():
        return None
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    try:
        return estimate_offsets(rank, world, group=group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
