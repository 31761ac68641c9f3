"""A Chrome / Perfetto trace of a run: every rank's stage spans and collectives on one timeline.

Open `trace.json` in https://ui.perfetto.dev or chrome://tracing. Each rank is a process row with two threads:
"stages" (data, h2d, forward, backward, comm, optimizer, eval, laid end to end from the step's start in the
order the loop runs them; micro-steps of accumulation are merged into one forward and one backward span) and
"collectives" (each collective from launch to completion as its caller saw it; they may overlap backward).
Times come from each rank's wall clock (unix time), so ranks on one host line up.
"""
from __future__ import annotations

from pathlib import Path

from scalelab.store import read_jsonl, write_json_atomic

ORDER = ("data", "h2d", "forward", "backward", "comm", "optimizer", "eval")


def trace_events(records: list[dict]) -> list[dict]:
    """Chrome trace events (complete events, microseconds) for the step records of any ranks."""
    events: list[dict] = []
    for rec in records:
        rank, end = rec["rank"], rec["t_end(unix_s)"]
        t = end - rec["wall(s)"]
        events.append({"name": f"step {rec['step']}", "ph": "X", "pid": rank, "tid": "steps", "ts": t * 1e6,
                       "dur": rec["wall(s)"] * 1e6, "args": {"warmup": rec.get("warmup", False)}})
        for stage in ORDER:
            dur = rec.get(f"{stage}(s)", 0.0)
            if dur > 0:
                events.append({"name": stage, "ph": "X", "pid": rank, "tid": "stages", "ts": t * 1e6,
                               "dur": dur * 1e6})
            t += dur
        perf_end = rec.get("t_end(perf_s)")
        for op, phase, start, seconds, nbytes in rec.get("comm_events", []) if perf_end is not None else []:
            events.append({"name": op, "ph": "X", "pid": rank, "tid": "collectives",
                           "ts": (end - (perf_end - start)) * 1e6, "dur": seconds * 1e6,
                           "args": {"phase": phase, "bytes": nbytes}})
    for rank in sorted({r["rank"] for r in records}):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}})
    return events


def write_trace(run_dir: Path) -> Path:
    """Write `trace.json` for a stored run from its step records alone."""
    records = [r for p in sorted(run_dir.glob("steps.rank*.jsonl")) for r in read_jsonl(p)]
    path = run_dir / "trace.json"
    write_json_atomic(path, {"traceEvents": trace_events(records), "displayTimeUnit": "ms"})
    return path
